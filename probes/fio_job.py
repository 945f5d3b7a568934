"""Probe profiles: what fio is asked to do, from config keys or from a user's fio job file.

A profile becomes a list of fio jobs (option dicts). Whatever a job file says,
iowarden decides where the I/O goes: only options on an allowlist (ALLOWED_JOB_OPTIONS),
with values of a checked form, ever reach fio, because a probe running as root must
touch nothing but its own probe file. Anything else is refused with its line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .common import ParseError, parse_size_bytes

READ_ONLY_RW = ("read", "randread")
ALLOWED_RW = ("read", "write", "randread", "randwrite", "randrw", "readwrite", "rw", "trim", "randtrim")
PROFILE_RW = ("read", "write", "randread", "randwrite", "randrw")
# Engines that do plain I/O on the one file they are given. Everything else (sg,
# exec, external:LIB.so, the file*/dir* engines, network engines) reaches outside it.
ALLOWED_ENGINES = ("libaio", "io_uring", "psync", "sync", "pvsync", "pvsync2", "posixaio", "mmap")

# The options a measurement needs, and nothing else. fio has hundreds of options and
# gains more each release; some run commands (trigger, exec_*), load code
# (ioengine=external:), change the host (ioscheduler, cpus_allowed) or write files
# (write_*_log). An option not named here is refused, so a new fio option is closed
# until someone decides it is safe. Aliases map to the name fio documents.
_SIZE_LIST = r"[0-9]+(\.[0-9]+)?[kmgtp]?i?b?"
_VALUE_FORMS = {
    "uint": re.compile(r"^[0-9]{1,9}$"),
    "bool": re.compile(r"^[01]$"),
    "size": re.compile(rf"^{_SIZE_LIST}$", re.I),
    # 4k | 4k-64k | 4k,8k (read,write) | bssplit 4k/10:64k/50 | rate 10m,5m
    "sizes": re.compile(rf"^{_SIZE_LIST}([-,:/]({_SIZE_LIST})?)*$", re.I),
    "time": re.compile(r"^[0-9]+(\.[0-9]+)?(us|ms|s|m|h)?$", re.I),
    "percent": re.compile(r"^[0-9]{1,3}(\.[0-9]+)?$"),
    "percents": re.compile(r"^[0-9.:,]{1,200}$"),
    "distribution": re.compile(r"^(random|zipf|pareto|normal|gauss|zoned|zoned_abs)(:[0-9.:,/]+)?$"),
    "text": re.compile(r"^[A-Za-z0-9 _.,:/+-]{0,200}$"),
}
ALLOWED_JOB_OPTIONS: dict[str, str] = {
    # what to do
    "rw": "rw", "rwmixread": "percent", "rwmixwrite": "percent", "ioengine": "engine",
    "bs": "sizes", "bsrange": "sizes", "bssplit": "sizes", "blockalign": "sizes", "bs_unaligned": "bool",
    "iodepth": "uint", "iodepth_batch_submit": "uint", "iodepth_batch_complete_min": "uint",
    "iodepth_batch_complete_max": "uint", "iodepth_low": "uint", "numjobs": "uint",
    "direct": "bool", "buffered": "bool", "sync": "bool", "fsync": "uint", "fdatasync": "uint",
    "end_fsync": "bool", "fsync_on_close": "bool", "invalidate": "bool", "overwrite": "bool",
    "hipri": "bool", "fixedbufs": "bool", "registerfiles": "bool", "nonvectored": "bool",
    # how much and how long (size and runtime are then capped by [limits])
    "size": "size", "io_size": "size", "offset": "size", "number_ios": "uint", "loops": "uint",
    "runtime": "time", "ramp_time": "time", "time_based": "bool", "startdelay": "time",
    # pace
    "rate": "sizes", "rate_min": "sizes", "rate_iops": "sizes", "rate_iops_min": "sizes",
    "rate_process": "rate_process", "rate_cycle": "uint",
    "thinktime": "time", "thinktime_blocks": "uint", "thinktime_spin": "time",
    # where in the file, and with what data
    "norandommap": "bool", "randrepeat": "bool", "randseed": "uint", "random_distribution": "distribution",
    "random_generator": "random_generator", "percentage_random": "percents",
    "refill_buffers": "bool", "scramble_buffers": "bool", "zero_buffers": "bool",
    "buffer_compress_percentage": "percent", "buffer_compress_chunk": "size", "dedupe_percentage": "percent",
    # reporting
    "group_reporting": "bool", "stonewall": "bool", "new_group": "bool", "lat_percentiles": "bool",
    "clat_percentiles": "bool", "slat_percentiles": "bool", "percentile_list": "percents",
    "disable_lat": "bool", "disable_clat": "bool", "disable_slat": "bool", "gtod_reduce": "bool",
    "unified_rw_reporting": "bool", "description": "text",
}
OPTION_ALIASES = {"readwrite": "rw", "blocksize": "bs", "blocksize_range": "bsrange", "ba": "blockalign",
                  "iodepth_batch": "iodepth_batch_submit", "iodepth_batch_complete": "iodepth_batch_complete_min",
                  "timeout": "runtime", "io_limit": "io_size", "wait_for_previous": "stonewall"}
_CHOICES = {"rate_process": ("linear", "poisson"), "random_generator": ("tausworthe", "lfsr", "tausworthe64"),
            "engine": ALLOWED_ENGINES}
# Numbers a probe has no use for past these: a job file must not fork a thousand jobs.
_UPPER_BOUNDS = {"numjobs": 128, "iodepth": 4096, "loops": 1000}
# Why the best-known refused options are refused, for a message that says more than "not allowed".
_REFUSED_WHY = {
    "filename": "iowarden chooses the probe file", "filename_format": "iowarden chooses the probe file",
    "directory": "iowarden chooses the probe directory", "opendir": "probes use one file",
    "nrfiles": "probes use one file", "exec_prerun": "probes never run commands",
    "exec_postrun": "probes never run commands", "trigger": "probes never run commands",
    "trigger_cmd": "probes never run commands", "ioscheduler": "a probe never changes the host's settings",
    "write_iolog": "writes a file outside the probe directory", "read_iolog": "reads a file outside the probe directory",
    "write_bw_log": "writes a file outside the probe directory", "write_lat_log": "writes a file outside the probe directory",
    "write_iops_log": "writes a file outside the probe directory", "write_hist_log": "writes a file outside the probe directory",
    "output": "iowarden reads fio's output itself", "unlink": "iowarden keeps the preconditioned probe file",
}
_FORM_WORDS = {"uint": "a whole number", "bool": "0 or 1", "size": "a size", "sizes": "a size or list of sizes",
               "time": "a time", "percent": "a percentage", "percents": "a list of percentages",
               "distribution": "a random distribution", "text": "plain text"}
_JOB_NAME = re.compile(r"^[A-Za-z0-9_.:@+-]{1,64}$")
# Options iowarden sets from its limits after the job file's own (the job file cannot raise them).
CAPPED = ("size", "runtime")


def check_job_option(key: str, value: str) -> tuple[str, str]:
    """(fio's name for the option, the value) when a probe may use it; ValueError saying why not."""
    key = OPTION_ALIASES.get(key, key)
    form = ALLOWED_JOB_OPTIONS.get(key)
    if form is None:
        why = _REFUSED_WHY.get(key, "iowarden accepts only the options a measurement needs: workload, "
                                    "block size, depth, jobs, size, time, rate, mixes")
        raise ValueError(f"option {key!r} is not allowed in a probe job file: {why}")
    if form == "rw":
        if value.split(":")[0] not in ALLOWED_RW or not re.fullmatch(r"[a-z]+(:[0-9]+[kmg]?)?", value):
            raise ValueError(f"rw={value!r} is not a workload iowarden can probe (one of {', '.join(ALLOWED_RW)})")
    elif form in _CHOICES:
        if value not in _CHOICES[form]:
            raise ValueError(f"{key}={value!r} is not allowed in a probe (one of {', '.join(_CHOICES[form])})")
    elif not _VALUE_FORMS[form].match(value):
        raise ValueError(f"{key}={value!r} is not {_FORM_WORDS[form]}")
    if key in _UPPER_BOUNDS and int(value) > _UPPER_BOUNDS[key]:
        raise ValueError(f"{key}={value} is more than a probe needs (at most {_UPPER_BOUNDS[key]})")
    return key, value


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
            if not _JOB_NAME.match(name):
                raise ParseError(f"{source}:{lineno}: job name {name!r}: use letters, digits and _.:@+- "
                                 "(at most 64)")
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
        if not sep and key.split()[0] == "include":
            raise ParseError(f"{source}:{lineno}: {line!r}: includes are not allowed in a probe job file "
                             "(iowarden reads the file whole and checks every option in it)")
        try:
            key, value = check_job_option(key, value)
        except ValueError as exc:
            raise ParseError(f"{source}:{lineno}: {exc}") from None
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
