"""Probe profiles: what fio is asked to do, from config keys or from a user's fio job file.

A profile becomes a list of fio jobs (option dicts). Whatever a job file says,
iowarden decides where the I/O goes: options that name files or directories,
run commands, or write logs are refused, because a probe must touch nothing but
its own probe file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .common import ParseError, parse_size_bytes

READ_ONLY_RW = ("read", "randread")
ALLOWED_RW = ("read", "write", "randread", "randwrite", "randrw", "readwrite", "rw", "trim", "randtrim")
PROFILE_RW = ("read", "write", "randread", "randwrite", "randrw")

# Options iowarden owns or that reach outside the probe file. Refused in job files.
FORBIDDEN_JOB_OPTIONS = {
    "filename": "iowarden chooses the probe file",
    "directory": "iowarden chooses the probe directory",
    "filename_format": "iowarden chooses the probe file",
    "opendir": "probes use one file",
    "nrfiles": "probes use one file",
    "exec_prerun": "probes never run commands",
    "exec_postrun": "probes never run commands",
    "write_iolog": "writes a file outside the probe directory",
    "read_iolog": "reads a file outside the probe directory",
    "write_bw_log": "writes a file outside the probe directory",
    "write_lat_log": "writes a file outside the probe directory",
    "write_iops_log": "writes a file outside the probe directory",
    "write_hist_log": "writes a file outside the probe directory",
    "output": "iowarden reads fio's output itself",
    "output-format": "iowarden reads fio's output itself",
    "unlink": "iowarden keeps the preconditioned probe file",
    "create_serialize": "iowarden lays out the probe file itself",
    "allow_file_create": "iowarden lays out the probe file itself",
    "include": "job files are read whole, without includes",
}
FORBIDDEN_ENGINES = {"sg", "exec", "filecreate", "filestat", "filedelete", "dircreate", "dirstat", "dirdelete"}
# Options iowarden sets from its limits after the job file's own (the job file cannot raise them).
CAPPED = ("size", "runtime")


@dataclass(frozen=True)
class ProbeProfile:
    """A named probe. Either the keyword fields, or `jobs` taken from a fio job file."""
    name: str
    rw: str = "randread"
    bs_bytes: int = 4096
    iodepth: int = 32
    numjobs: int = 1
    ioengine: str = "libaio"
    direct: bool = True
    size_bytes: int = 256 * 1024 * 1024
    runtime_seconds: float = 5.0
    ramp_time_seconds: float = 1.0
    rate_iops: int = 0  # 0: as fast as the device goes
    job_file: str | None = None
    jobs: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = field(default=())

    def __post_init__(self):
        if not self.jobs:
            problems = []
            if self.rw not in PROFILE_RW:
                problems.append(f"rw must be one of {', '.join(PROFILE_RW)}, not {self.rw!r}")
            for attr in ("bs_bytes", "iodepth", "numjobs", "size_bytes"):
                if getattr(self, attr) <= 0:
                    problems.append(f"{attr} must be positive")
            if self.runtime_seconds <= 0 or self.ramp_time_seconds < 0 or self.rate_iops < 0:
                problems.append("runtime must be positive, ramp_time and rate_iops not negative")
            if self.size_bytes % self.bs_bytes:
                problems.append(f"size ({self.size_bytes}) must be a multiple of bs ({self.bs_bytes})")
            if problems:
                raise ValueError(f"profile {self.name!r}: " + "; ".join(problems))

    @property
    def writes(self) -> bool:
        """Does any job of this profile write or trim?"""
        return any(opts.get("rw", opts.get("readwrite", "read")) not in READ_ONLY_RW
                   for _, opts in self.job_dicts())

    def job_dicts(self) -> list[tuple[str, dict[str, str]]]:
        """The profile as fio jobs: [(job name, {option: value})]."""
        if self.jobs:
            return [(name, dict(opts)) for name, opts in self.jobs]
        opts = {
            "rw": self.rw, "bs": str(self.bs_bytes), "iodepth": str(self.iodepth),
            "numjobs": str(self.numjobs), "ioengine": self.ioengine, "direct": "1" if self.direct else "0",
            "size": str(self.size_bytes), "runtime": f"{self.runtime_seconds:g}",
            "ramp_time": f"{self.ramp_time_seconds:g}", "time_based": "1",
        }
        if self.rate_iops:
            opts["rate_iops"] = str(self.rate_iops)
        return [(self.name, opts)]

    def effective_runtime_seconds(self) -> float:
        """Longest wall time the jobs may take (runtime + ramp), for the timeout."""
        longest = 0.0
        for _, opts in self.job_dicts():
            longest = max(longest, seconds(opts.get("runtime", "0")) + seconds(opts.get("ramp_time", "0")))
        return longest

    def effective_size_bytes(self) -> int:
        return max(parse_size_bytes(opts.get("size", "0")) for _, opts in self.job_dicts())


def seconds(value: str) -> float:
    """fio time values: plain numbers are seconds; suffixes s, m, h, ms, us."""
    v = value.strip().lower()
    for suffix, factor in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if v.endswith(suffix):
            return float(v[: -len(suffix)]) * factor
    return float(v)


def parse_job_file(text: str, source: str = "<job file>") -> list[tuple[str, dict[str, str]]]:
    """A fio job file ([global] plus job sections) as jobs with the global options folded in."""
    global_opts: dict[str, str] = {}
    jobs: list[tuple[str, dict[str, str]]] = []
    current: dict[str, str] | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise ParseError(f"{source}:{lineno}: malformed section header {line!r}")
            name = line[1:-1].strip()
            if name == "global":
                current = global_opts
            else:
                current = {}
                jobs.append((name, current))
            continue
        if current is None:
            raise ParseError(f"{source}:{lineno}: option {line!r} before any [section]")
        key, sep, value = line.partition("=")
        key = key.strip().lower()
        value = value.strip() if sep else "1"
        if key in FORBIDDEN_JOB_OPTIONS:
            raise ParseError(f"{source}:{lineno}: option {key!r} is not allowed in a probe job file: "
                             f"{FORBIDDEN_JOB_OPTIONS[key]}")
        if key == "ioengine" and value.split(":")[0] in FORBIDDEN_ENGINES | {"external"}:
            raise ParseError(f"{source}:{lineno}: ioengine {value!r} is not allowed in a probe")
        if key in ("rw", "readwrite") and value.split(":")[0] not in ALLOWED_RW:
            raise ParseError(f"{source}:{lineno}: rw={value!r} is not a workload iowarden can probe "
                             f"(one of {', '.join(ALLOWED_RW)})")
        current[key] = value
    if not jobs:
        raise ParseError(f"{source}: no job sections (only [global])")
    out = []
    for name, opts in jobs:
        merged = {**global_opts, **opts}
        merged.setdefault("size", "256m")
        try:
            parse_size_bytes(merged["size"])
        except ValueError as exc:
            raise ParseError(f"{source}: job {name!r}: {exc}") from None
        for key in ("runtime", "ramp_time"):
            if key in merged:
                try:
                    seconds(merged[key])
                except ValueError:
                    raise ParseError(f"{source}: job {name!r}: {key}={merged[key]!r} is not a time") from None
        out.append((name, merged))
    return out


def profile_from_job_file(name: str, path: str | Path) -> ProbeProfile:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ParseError(f"cannot read job file {p}: {exc.strerror or exc}") from None
    jobs = parse_job_file(text, str(p))
    return ProbeProfile(name=name, job_file=str(p),
                        jobs=tuple((n, tuple(sorted(o.items()))) for n, o in jobs))
