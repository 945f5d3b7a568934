"""Running one probe profile against one target, safely, with every failure as a result.

The rules, enforced here and not left to configuration:
- A directory target is probed only through a file in `<target>/.iowarden/`,
  a root-owned 0700 directory that is never a symlink. fio reaches the file
  through our open directory handle (/proc/PID/fd/N/...), so swapping the
  directory for a symlink after the check leads nowhere.
- A block-device target is only ever read: fio gets `--readonly`, and a
  profile that writes is refused before fio starts.
- Size and runtime are capped by the limits; a probe that would leave less
  free space than the floor does not start.
- The probe file is laid out once with real data (not fallocate: XFS unwritten
  extents make a first write run several times slower) and reused; leftovers
  of other sizes and interrupted layouts are removed, never accumulated.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import stat
import time
from dataclasses import dataclass, field

from .common import ParseError, Roots, parse_size_bytes, run_tool
from .fio import FioReport, parse
from .fio_job import DEFAULT_MAX_BUFFER_BYTES, READ_ONLY_RW, ProbeProfile, capped_seconds
from .vocabulary import CLAT_PERCENTILE_KEYS, DIRECTIONS
from .probe_dir import PROBE_DIR_NAME, ProbeRefused, VolumeFull, device_name_for, open_probe_dir

# Set in every probe's fio environment (its job processes inherit it): which iowarden
# (by state directory) started it, so a restarted daemon can find a fio its
# predecessor left running and end it before it probes that disk again.
OWNER_ENV = "IOWARDEN_PROBE_OWNER"
PROBE_FILE_PREFIX = "probe-"   # the daemon's (the name it has always had: an upgrade lays nothing out again)
# Each user of a probe directory has files of its own and removes only those: characterize's 1 GiB file and
# the daemon's 256 MiB one live side by side, and neither's clean-up touches the other's.
FILE_PREFIXES = {"daemon": PROBE_FILE_PREFIX, "characterize": "characterize-", "probe": "adhoc-"}
LAYOUT_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class ProbeLimits:
    max_size_bytes: int = 1 << 30
    max_runtime_seconds: float = 60.0
    min_free_bytes: int = 1 << 30
    min_free_ratio: float = 0.10
    timeout_margin_seconds: float = 30.0
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES   # bs x iodepth x numjobs, summed over a profile's jobs


@dataclass(frozen=True)
class ProbeResult:
    target: str
    path: str
    device: str | None
    profile: str
    ok: bool
    error: str | None
    started_at: float
    duration_seconds: float
    report: FioReport | None = None
    layout_bytes: int = 0  # bytes written to lay out the probe file (counts against a budget)
    contended: bool = False
    ramp_seconds: float = 0.0  # the profile's warm-up: I/O fio issues and leaves out of its report
    foreign_util_percent: float | None = None  # the device's %util from other work just before the probe
    learned_under_load: bool = False  # contended, and learned all the same: its volume was busy for every warm-up
    argv: tuple[str, ...] = ()
    needs_root: bool = False   # failed on a permission that root would have had (the CLI's exit 77)
    space_used_ratio: float | None = None   # refused because the volume is full: how full (0..1)

    def __post_init__(self):
        # posted to the core and kept in its snapshots, read by other threads: a value, never changed
        if not isinstance(self.argv, tuple):
            object.__setattr__(self, "argv", tuple(self.argv))

    def _dir(self, name: str):
        return self.report.directions.get(name) if self.report else None

    def iops(self, direction: str) -> float:
        d = self._dir(direction)
        return d.iops if d else 0.0

    def bw_bytes(self, direction: str) -> float:
        d = self._dir(direction)
        return d.bw_bytes if d else 0.0

    @property
    def write_io_bytes(self) -> int:
        """Bytes the probe wrote (what a write budget counts, beside the layout): fio's measured bytes and
        its ramp's, which fio leaves out of the report, taken at the measured rate."""
        d = self._dir("write")
        return int(d.io_bytes + d.bw_bytes * self.ramp_seconds) if d else 0

    @property
    def queue_depth(self) -> int | None:
        """I/Os the probe kept in flight (its largest iodepth x numjobs, from its fio command), or None unknown."""
        depths = [int(a.split("=", 1)[1]) for a in self.argv if a.startswith("--iodepth=") and a[10:].isdigit()]
        jobs = [int(a.split("=", 1)[1]) for a in self.argv if a.startswith("--numjobs=") and a[10:].isdigit()]
        return max(depths) * max(jobs or [1]) if depths else None

    def clat_percentile_seconds(self, pct: float) -> float | None:
        """The worse (higher) of the read and write percentile: what an application waits for."""
        vals = [d.clat_percentiles_seconds.get(pct) for d in (self._dir("read"), self._dir("write")) if d]
        vals = [v for v in vals if v is not None]
        return max(vals) if vals else None

    def to_json(self) -> dict:
        return {
            "target": self.target, "path": self.path, "device": self.device, "profile": self.profile,
            "ok": self.ok, "error": self.error, "started_at": self.started_at,
            "duration_seconds": round(self.duration_seconds, 3), "contended": self.contended,
            "learned_under_load": self.learned_under_load,
            "foreign_util_percent": self.foreign_util_percent,
            **{f"{d}_iops": self.iops(d) for d in DIRECTIONS},
            **{f"{d}_bw_bytes": self.bw_bytes(d) for d in DIRECTIONS},
            **{key: self.clat_percentile_seconds(pct) for pct, key in CLAT_PERCENTILE_KEYS.items()},
            "layout_bytes": self.layout_bytes,
            "write_io_bytes": self.write_io_bytes,
            "fio_version": self.report.fio_version if self.report else None,
            "disk_util_percent": dict(self.report.disk_util_percent) if self.report else {},
        }


def probe_file_name(size_bytes: int, user: str = "daemon") -> str:
    return f"{FILE_PREFIXES[user]}{size_bytes}.dat"


def is_file_of(name: str, user: str) -> bool:
    """A probe file (or an interrupted layout) of this user's: its prefix, then a size."""
    prefix = FILE_PREFIXES[user]
    stem = name[len(prefix):-4] if name.startswith(prefix) and name.endswith((".dat", ".tmp")) else ""
    return stem.isdigit()


def clean_leftovers(dir_fd: int, keep_sizes: set[int], user: str = "daemon") -> list[str]:
    """Remove this user's interrupted layouts and probe files of sizes it no longer uses (never another's)."""
    keep = {probe_file_name(s, user) for s in keep_sizes}
    removed = []
    for name in os.listdir(dir_fd):
        ours = is_file_of(name, user)
        if ours and name not in keep:
            os.unlink(name, dir_fd=dir_fd)
            removed.append(name)
    return removed


SMALL_VOLUME_FLOOR_RATIO = 0.05   # min_free_bytes never asks more than this share of a filesystem


def free_space_floor(total_bytes: int, limits: ProbeLimits) -> int:
    """The free space a probe must leave: min_free_ratio of the filesystem, and min_free_bytes but never more
    than 5 % of it. A 1 GiB floor on a 4 GiB volume refused probes at 75 % full: the probe, not the volume,
    was the problem. On large filesystems the ratio governs (10 % of 1 TiB is 102 GiB)."""
    return max(int(limits.min_free_ratio * total_bytes),
               min(limits.min_free_bytes, int(SMALL_VOLUME_FLOOR_RATIO * total_bytes)))


def free_space_check(dir_fd: int, extra_bytes: int, limits: ProbeLimits) -> None:
    sv = os.fstatvfs(dir_fd)
    total, free = sv.f_blocks * sv.f_frsize, sv.f_bavail * sv.f_frsize
    floor = free_space_floor(total, limits)
    if free - extra_bytes < floor:
        used = 1 - free / total if total else 1.0
        raise VolumeFull(f"the volume is full, not slow: {used:.0%} used, {free >> 20} MiB free; the probe's "
                         f"file would leave {max(0, free - extra_bytes) >> 20} MiB, below the floor of "
                         f"{floor >> 20} MiB (limits.min_free_bytes / min_free_ratio). Free space on it, or "
                         "shrink the profile's size", used)


def lay_out(dir_fd: int, name: str, size_bytes: int) -> int:
    """Write the probe file once with incompressible data; returns bytes written (0 if reused)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise ProbeRefused(f"probe file {name} is not a regular file")
        if st.st_size == size_bytes:
            return 0
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    tmp = name[:-4] + ".tmp"
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        left = size_bytes
        while left:
            # urandom, not zeros: compressing or deduplicating arrays would
            # otherwise serve the probe from metadata.
            chunk = os.urandom(min(LAYOUT_CHUNK_BYTES, left))
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
            left -= len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    # Renamed only when complete: a crash mid-layout leaves a .tmp, never a short .dat.
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)
    return size_bytes


def build_argv(profile: ProbeProfile, filename: str, limits: ProbeLimits, readonly: bool,
               fio_binary: str = "fio", file_bytes: int | None = None) -> list[str]:
    """fio's arguments. file_bytes: the probe file's size, which each job's offset + size must fit in
    (fio would otherwise lay the file out afresh, unlinking it first)."""
    # --thread: jobs as threads of one fio process, not forked processes, so the kernel's
    # parent-death signal (see run_tool) ends every job at once; a forked job process outlives
    # a fio main that dies, and a main that gets SIGTERM mid-start-up was seen to hang.
    argv = [fio_binary, "--output-format=json+", "--thread"]
    if readonly:
        argv.append("--readonly")
    for name, opts in profile.job_dicts():
        argv.append(f"--name={name}")
        opts = dict(opts)
        size = min(parse_size_bytes(opts.get("size", "0")) or limits.max_size_bytes, limits.max_size_bytes)
        if file_bytes is not None and "offset" in opts:
            offset = parse_size_bytes(opts["offset"])
            if offset >= file_bytes:
                raise ProbeRefused(f"job {name!r}: offset={opts['offset']} is past the end of the probe file "
                                   f"({file_bytes} bytes)")
            size = min(size, file_bytes - offset)
        opts["size"] = str(size)
        runtime, ramp, delay = capped_seconds(opts, limits.max_runtime_seconds)
        # fio reads a bare number as whole seconds; milliseconds keep fractions exact.
        opts["runtime"] = f"{round(runtime * 1000)}ms"
        if "ramp_time" in opts:
            opts["ramp_time"] = f"{round(ramp * 1000)}ms"
        if "startdelay" in opts:
            opts["startdelay"] = f"{round(delay * 1000)}ms"
        # runtime above is a cap; time_based only where the job asks for it (the built-in profiles do): a job
        # file that reads 8 MiB and stops must stop, not loop over its file for the whole cap
        opts.setdefault("ioengine", "libaio")
        if int(opts.get("numjobs", "1")) > 1:
            opts["group_reporting"] = "1"
        for key, value in opts.items():
            argv.append(f"--{key}={value}")
        argv += [f"--filename={filename}", "--allow_file_create=0", "--fallocate=none"]
    return argv


def run_probe(target: str, path: str, profile: ProbeProfile, limits: ProbeLimits = ProbeLimits(),
              roots: Roots = Roots(), fio_binary: str = "fio", keep_sizes: set[int] | None = None,
              on_start=None, expect_dev: int | None = None, owner: str | None = None,
              files_of: str = "daemon") -> ProbeResult:
    """Run one profile once. Never raises for a probe's failure: the result says what went wrong.

    files_of: whose probe files these are ("daemon", "characterize", "probe"): each user lays out and
    removes only its own in the probe directory.
    expect_dev: for a directory target, the filesystem (st_dev) it must still be on.
    """
    result, stdout, run_error = measure(target, path, profile, limits, roots, fio_binary, keep_sizes, on_start,
                                        expect_dev, owner, files_of)
    return interpret_output(result, stdout, run_error) if stdout is not None else result


def measure(target: str, path: str, profile: ProbeProfile, limits: ProbeLimits = ProbeLimits(),
            roots: Roots = Roots(), fio_binary: str = "fio", keep_sizes: set[int] | None = None,
            on_start=None, expect_dev: int | None = None, owner: str | None = None,
            files_of: str = "daemon") -> tuple[ProbeResult, str | None, str | None]:
    """Everything of a probe but reading fio's report: (the result so far, fio's stdout, fio's run error).
    stdout is None when fio did not run (the result's error says why)."""
    started_wall, started = time.time(), time.monotonic()
    # what the probe found, field by field, into the one result it returns
    got: dict = {"ramp_seconds": max(capped_seconds(o, limits.max_runtime_seconds)[1] for _, o in profile.job_dicts())}
    stdout = run_error = None
    dir_fd = None
    try:
        try:
            st = os.stat(path)
        except OSError as exc:
            got["needs_root"] = bool(_root_hint(exc))
            raise ProbeRefused(f"target {path}: {exc.strerror}{_root_hint(exc)}") from None
        size = min(profile.effective_size_bytes(), limits.max_size_bytes)
        problem = profile.buffer_problem(limits.max_buffer_bytes)
        if problem:
            raise ProbeRefused(problem)
        if stat.S_ISBLK(st.st_mode):
            got["device"] = device_name_for(st.st_rdev, roots)
            if profile.writes:
                raise ProbeRefused(f"profile {profile.name!r} writes, and {path} is a raw block device: "
                                   f"iowarden only reads devices (use rw={'/'.join(READ_ONLY_RW)}, "
                                   "or probe a directory on its filesystem)")
            filename = os.path.realpath(path)
            readonly = True
        elif stat.S_ISDIR(st.st_mode):
            got["device"] = device_name_for(st.st_dev, roots)
            dir_fd = open_probe_dir(path, expect_dev)
            name = probe_file_name(size, files_of)
            clean_leftovers(dir_fd, (keep_sizes or set()) | {size}, files_of)
            try:
                exists = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size == size
            except FileNotFoundError:
                exists = False
            free_space_check(dir_fd, 0 if exists else size, limits)
            got["layout_bytes"] = lay_out(dir_fd, name, size)
            filename = f"/proc/{os.getpid()}/fd/{dir_fd}/{name}"
            readonly = False
        else:
            raise ProbeRefused(f"target {path} is neither a directory nor a block device")
        argv = build_argv(profile, filename, limits, readonly, fio_binary, file_bytes=None if readonly else size)
        got["argv"] = tuple(argv)
        runtime = profile.effective_runtime_seconds(limits.max_runtime_seconds)
        env = {**os.environ, OWNER_ENV: owner} if owner else None
        run = run_tool(argv, timeout_seconds=runtime + limits.timeout_margin_seconds, on_start=on_start,
                       env=env, die_with_parent=True)
        stdout, run_error = run.stdout, run.error
    except ProbeRefused as exc:
        got["error"] = f"refused: {exc}"
        got["space_used_ratio"] = getattr(exc, "used_ratio", None)
    except (ValueError, ParseError) as exc:
        got["error"] = f"invalid profile: {exc}"
    except OSError as exc:
        got["error"] = f"{exc.filename or path}: {exc.strerror or exc}{_root_hint(exc)}"
        got["needs_root"] = bool(_root_hint(exc))
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    result = ProbeResult(**{"target": target, "path": path, "device": None, "profile": profile.name, "ok": False,
                            "error": None, "started_at": started_wall,
                            "duration_seconds": time.monotonic() - started, **got})
    return result, stdout, run_error


def _root_hint(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM) and os.geteuid() != 0:
        return " (probing needs root: run iowarden as root, as its service does)"
    return ""


def interpret_output(result: ProbeResult, stdout: str, run_error: str | None) -> ProbeResult:
    """The result with fio's report read into it: ok, or the error that says why not."""
    report = None
    try:
        report = parse(stdout)
    except ParseError as exc:
        if run_error is None:
            return dataclasses.replace(result, error=f"unparsable fio output: {exc}")
    if run_error is not None:
        return dataclasses.replace(result, report=report, error=run_error)
    if report.error:
        return dataclasses.replace(result, report=report,
                                   error=f"fio job error {report.error} ({os.strerror(report.error)})")
    if not report.directions:
        return dataclasses.replace(result, report=report, error="fio finished without doing any I/O")
    return dataclasses.replace(result, report=report, ok=True)


def end_leftover_probes(owner: str, wait_seconds: float = 5.0) -> list[int]:
    """End fio processes a previous run of this iowarden (same `owner`) left behind; returns their pids.

    Normally none: fio gets SIGTERM when the daemon dies. This covers what that cannot:
    a fio that ignored it, or one started by a version without it.
    """
    import psutil
    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid", "ppid", "name"]):
        if p.info["pid"] == me or p.info["ppid"] == me or p.info["name"] not in ("fio", "setpriv"):
            continue
        try:
            if p.environ().get(OWNER_ENV) == owner:
                found.append(p)
        except psutil.Error:
            continue
    for p in found:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(found, timeout=wait_seconds)
    return [p.pid for p in found]


def remove_probe_dir(target_dir: str, user: str = "daemon") -> list[str]:
    """Remove one user's probe files from `<target_dir>/.iowarden`, and the directory if nothing else is in it
    (a running daemon's file keeps it, and characterize's --cleanup leaves the daemon's alone).

    Only files of that user's naming are removed, never through a symlink.
    """
    path = os.path.join(target_dir, PROBE_DIR_NAME)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return []
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        removed = [os.path.join(path, n) for n in clean_leftovers(fd, set(), user)]
        left = os.listdir(fd)
    finally:
        os.close(fd)
    if not left:
        os.rmdir(path)
        removed.append(path)
    return removed
