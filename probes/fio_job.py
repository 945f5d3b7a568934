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

from .common import ParseError, parse_size_bytes, printable, read_bounded

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
JOB_FILE_MAX_BYTES = 64 * 1024          # a probe's job file is a few lines; a larger file is not one
DEFAULT_MAX_BUFFER_BYTES = 256 << 20    # limits.max_job_buffers: what fio may allocate for I/O buffers
# I/Os in flight (iodepth x numjobs) at which a probe fills the device alone: run beside other work, what the device
# delivers in total then says what it can do (daemon/verdicts/contended.py), and a probe of this depth is the one
# that can show a volume held short; a shallower one waits behind the other work
SATURATING_QUEUE_DEPTH = 8
_SIZE_TOKEN = re.compile(r"[0-9]+(\.[0-9]+)?[kmgtp]?i?b?", re.I)


def largest_block_bytes(opts: dict[str, str]) -> int:
    """The largest block any of a job's block-size options names (bs, bsrange, bssplit; every direction)."""
    largest = 4096
    for key in ("bs", "bsrange", "bssplit"):
        for token in re.split(r"[-,:/]", opts.get(key, "")):
            if _SIZE_TOKEN.fullmatch(token):
                try:
                    largest = max(largest, parse_size_bytes(token))
                except ValueError:
                    pass
    return largest


def buffer_bytes(opts: dict[str, str]) -> int:
    """What fio allocates for one job's I/O buffers: its largest block x iodepth x numjobs."""
    return largest_block_bytes(opts) * int(opts.get("iodepth", "1")) * int(opts.get("numjobs", "1"))


def buffer_problem(name: str, opts: dict[str, str], max_bytes: int) -> str | None:
    need = buffer_bytes(opts)
    if need <= max_bytes:
        return None
    return (f"job {name!r}: block size {largest_block_bytes(opts)} x iodepth {opts.get('iodepth', '1')} x numjobs "
            f"{opts.get('numjobs', '1')} = {need >> 20} MiB of I/O buffers, more than limits.max_job_buffers "
            f"({max_bytes >> 20} MiB)")


def capped_seconds(opts: dict[str, str], max_runtime_seconds: float) -> tuple[float, float, float]:
    """(runtime, ramp_time, startdelay) of a job as fio will run them: no runtime is the longest allowed,
    and none of the three may be longer than max_runtime_seconds (a ramp of 1000 h is I/O too)."""
    runtime = seconds(opts.get("runtime", "0")) or max_runtime_seconds
    return (min(runtime, max_runtime_seconds), min(seconds(opts.get("ramp_time", "0")), max_runtime_seconds),
            min(seconds(opts.get("startdelay", "0")), max_runtime_seconds))


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

    def effective_runtime_seconds(self, max_runtime_seconds: float = 60.0) -> float:
        """Longest wall time the jobs may take (start delay, ramp and runtime as capped), for the timeout.
        Summed over jobs: a stonewall runs them one after another."""
        return sum(sum(capped_seconds(opts, max_runtime_seconds)) for _, opts in self.job_dicts())

    def buffer_bytes(self) -> int:
        """What fio allocates for I/O buffers when every job runs at once."""
        return sum(buffer_bytes(opts) for _, opts in self.job_dicts())

    def buffer_problem(self, max_bytes: int) -> str | None:
        for name, opts in self.job_dicts():
            problem = buffer_problem(name, opts, max_bytes)
            if problem:
                return problem
        if self.buffer_bytes() > max_bytes:
            return (f"the jobs together need {self.buffer_bytes() >> 20} MiB of I/O buffers, more than "
                    f"limits.max_job_buffers ({max_bytes >> 20} MiB)")
        return None

    def effective_size_bytes(self) -> int:
        return max(parse_size_bytes(opts.get("size", "0")) for _, opts in self.job_dicts())


def seconds(value: str) -> float:
    """fio time values: plain numbers are seconds; suffixes s, m, h, ms, us."""
    v = value.strip().lower()
    for suffix, factor in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if v.endswith(suffix):
            return float(v[: -len(suffix)]) * factor
    return float(v)


def parse_job_file(text: str, source: str = "<job file>",
                   max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES) -> list[tuple[str, dict[str, str]]]:
    """A fio job file ([global] plus job sections) as jobs with the global options folded in.

    Nothing of a file is quoted in an error until it has shown a job section: a file named
    by mistake (or by malice: /etc/shadow) is not a job file, and its lines are nobody's business.
    """
    global_opts: dict[str, str] = {}
    jobs: list[tuple[str, dict[str, str]]] = []
    current: dict[str, str] | None = None
    lines_of_key: dict[tuple[int, str], int] = {}   # (job index or -1 for global, option) -> line
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise ParseError(f"{source}:{lineno}: malformed section header" +
                                 (f" {printable(line, 80)!r}" if current is not None else " (not a fio job file?)"))
            name = line[1:-1].strip()
            if not _JOB_NAME.match(name):
                raise ParseError(f"{source}:{lineno}: job name {printable(name, 80)!r}: use letters, digits and "
                                 "_.:@+- (at most 64)" if current is not None else
                                 f"{source}:{lineno}: a job name that is not letters, digits and _.:@+- (not quoted: not a "
                                 "fio job file?)")
            if name == "global":
                current = global_opts
            else:
                current = {}
                jobs.append((name, current))
            continue
        if current is None:
            raise ParseError(f"{source}:{lineno}: an option before any [section]: not a fio job file "
                             "(nothing of it is quoted)")
        key, sep, value = line.partition("=")
        key = key.strip().lower()
        value = value.strip() if sep else "1"
        if not sep and key.split()[:1] == ["include"]:
            raise ParseError(f"{source}:{lineno}: {printable(line, 80)!r}: includes are not allowed in a probe job "
                             "file (iowarden reads the file whole and checks every option in it)")
        try:
            key, value = check_job_option(key, value)
        except ValueError as exc:
            raise ParseError(f"{source}:{lineno}: {printable(exc, 300)}") from None
        current[key] = value
        lines_of_key[(len(jobs) - 1 if current is not global_opts else -1, key)] = lineno
    if not jobs:
        raise ParseError(f"{source}: no job sections (only [global])")
    out = []
    for i, (name, opts) in enumerate(jobs):
        merged = {**global_opts, **opts}
        problem = buffer_problem(name, merged, max_buffer_bytes)
        if problem:
            line = max((lines_of_key.get((j, k), 0) for j in (i, -1) for k in ("bs", "bsrange", "bssplit",
                                                                                 "iodepth", "numjobs")), default=0)
            raise ParseError(f"{source}:{line or 1}: {problem}")
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


def profile_from_job_file(name: str, path: str | Path,
                          max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES) -> ProbeProfile:
    """A profile from a job file: a regular file (not a FIFO, a device or a link), of at most
    JOB_FILE_MAX_BYTES, of UTF-8 text."""
    p = Path(path)
    try:
        data = read_bounded(p, JOB_FILE_MAX_BYTES, follow_links=False)
    except OSError as exc:
        raise ParseError(f"cannot read job file {p}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ParseError(f"job file {p} is not UTF-8 text: not a fio job file") from None
    jobs = parse_job_file(text, str(p), max_buffer_bytes)
    return ProbeProfile(name=name, job_file=str(p),
                        jobs=tuple((n, tuple(sorted(o.items()))) for n, o in jobs))
