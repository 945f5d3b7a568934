"""What every probe shares: root paths, the parse error, sizes, and running a tool safely.

Probes never hard-code /proc or /sys: a `Roots` value says where the kernel's
files are, so every reader runs against a fixture tree in tests.
"""
from __future__ import annotations

import errno
import os
import re
import selectors
import shutil
import stat
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


class ParseError(ValueError):
    """Input that does not have the documented format of its source."""


@dataclass(frozen=True)
class Roots:
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    dev: Path = Path("/dev")
    etc: Path = Path("/etc")
    run: Path = Path("/run")

    @classmethod
    def under(cls, base: str | os.PathLike) -> "Roots":
        """A fixture tree laid out like a real root: base/proc, base/sys, ..."""
        b = Path(base)
        return cls(b / "proc", b / "sys", b / "dev", b / "etc", b / "run")


# Why no process or thread could be started (EAGAIN from fork or clone): a limit of the daemon's or the machine's,
# never anything about a target, and what the operator raises to end it
TASK_LIMIT_TEXT = ("a task limit is reached (the unit's TasksMax, its cgroup's pids.max, or the machine's "
                   "kernel.pid_max / kernel.threads-max)")
KERNEL_FILE_MAX_BYTES = 16 << 20   # /proc and /sys: the largest table read (mounts of a busy host are < 1 MiB)


def read_bounded(path: str | os.PathLike, max_bytes: int, follow_links: bool = True) -> bytes:
    """A regular file's bytes, at most max_bytes of them. OSError saying why not: absent, a link
    (with follow_links=False), not a regular file (a FIFO would hang the reader, /dev/zero never end),
    or larger than the bound. Opened non-blocking, so nothing here waits on a writer."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise OSError(errno.ELOOP, "is a symbolic link (iowarden reads only the file itself)", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes, the most iowarden reads of it", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: Path, max_bytes: int = KERNEL_FILE_MAX_BYTES, errors: str = "replace") -> str | None:
    """A kernel file's text, or None when it is absent or unreadable (absent is not zero).

    Bytes that are not UTF-8 never raise: they become U+FFFD, or with errors="surrogateescape"
    (the mount table, whose paths must be opened again) surrogate escapes, so one odd name
    costs its own line, never the table. Callers split on "\\n" only (lines_of).
    """
    try:
        return read_bounded(path, max_bytes).decode("utf-8", errors)
    except OSError:
        # absent, or a sysfs attribute failing with EINVAL/EIO for a device that is going away
        return None


def lines_of(text: str) -> list[str]:
    """The lines of a kernel table: split on line feeds only (str.splitlines() also splits on the
    CR, FF and other characters a name may hold, and the kernel escapes only space, tab, LF and \\)."""
    return text.split("\n")


def is_utf8(text: str) -> bool:
    """False for text read with surrogate escapes from bytes that are not UTF-8."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7f, *range(0x80, 0xa0)]}
_CONTROL.update({ord("\\"): "\\\\"})


_CONTROL_BUT_LINES = {c: v for c, v in _CONTROL.items() if c not in (0x0a, 0x09, ord("\\"))}


def printable(text, max_chars: int = 200) -> str:
    """Text safe for a terminal and a log line: control characters (LF, CR, ESC, NUL, C1) and
    undecodable bytes escaped as \\xNN, backslashes doubled, and cut at max_chars with a count."""
    s = str(text).translate(_CONTROL)
    s = s.encode("utf-8", "backslashreplace").decode("utf-8")  # surrogate escapes: \udcff
    if len(s) > max_chars:
        s = f"{s[:max_chars]}...(+{len(s) - max_chars} chars)"
    return s


def printable_lines(text: str) -> str:
    """A whole report for a terminal, its own line feeds and tabs kept: every other control character and
    undecodable byte escaped (the last wall behind the escaping of each name where it is put in)."""
    return text.translate(_CONTROL_BUT_LINES).encode("utf-8", "backslashreplace").decode("utf-8")


def read_str(path: Path) -> str | None:
    text = read_text(path)
    return None if text is None else text.strip()


def read_int(path: Path) -> int | None:
    text = read_str(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)
_SIZE_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size_bytes(text: str | int) -> int:
    """'4k', '256MiB', '1G', 4096 -> bytes.

    Binary multiples throughout, as fio reads them by default (kb_base=1024):
    a user copying '4k' from a fio job file means 4096.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (expected e.g. 4k, 256MiB, 1G)")
    number, unit = float(m.group(1)), m.group(2).lower()
    value = number * (1024 ** _SIZE_POWER[unit])
    if value != int(value):
        raise ValueError(f"size is not a whole number of bytes: {text!r}")
    return int(value)


TOOL_OUTPUT_MAX_BYTES = 16 << 20     # stdout of any tool: fio's JSON with latency histograms is < 2 MiB
TOOL_STDERR_MAX_BYTES = 1 << 20      # what a tool says of its failure; more is not a message
TOOL_LINGER_SECONDS = 1.0            # output still arriving after the tool exited (a child holds the pipe)


@dataclass(frozen=True)
class ToolRun:
    """The outcome of one external command; `error` is None when it ran and exited 0."""
    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    duration_seconds: float
    error: str | None

    @property
    def cut_short(self) -> bool:
        """Not started, killed at a bound, or ended by a signal: its output is not whole, whatever it holds."""
        return self.error is not None and (self.returncode is None or self.returncode < 0)


def run_tool(argv: list[str], timeout_seconds: float, idle_io: bool = False,
             env: dict | None = None, on_start=None, die_with_parent: bool = False,
             max_output_bytes: int = TOOL_OUTPUT_MAX_BYTES) -> ToolRun:
    """Run a command (argument list, never a shell) in its own process group, its output bounded
    while it is read.

    Bounds, each enforced as the bytes arrive, not after: `max_output_bytes` of stdout (and
    TOOL_STDERR_MAX_BYTES of stderr), and `timeout_seconds` for the whole run, reading included.
    Past either the whole group is killed and the run is an error that says which bound: a tool
    printing 600 MB costs at most the cap in memory. A tool that exits while a child it left behind
    (`setsid sleep 240 &`) still holds its stdout is waited for TOOL_LINGER_SECONDS more, not for the
    child's life: what it printed is whole when it exits.

    On timeout the whole group is killed: fio forks one process per job, and
    killing only the parent would leave its children hammering the device.
    `idle_io` runs it in the idle I/O class so an expensive read (xfs_db walking
    every inode) yields to the real workload. `on_start(proc)` lets a caller that
    must stop quickly (the daemon on SIGTERM) kill the group itself.
    `die_with_parent`: the kernel kills the tool (SIGKILL) when the thread that started
    it dies, kill -9 of the daemon included (PR_SET_PDEATHSIG, set by util-linux's
    setpriv just before it execs the tool: preexec_fn is unsafe in a threaded daemon).
    It reaches that one process only: fio runs its jobs as threads (--thread) for it.
    """
    tool = argv[0]
    if die_with_parent:
        if shutil.which(tool) is None:
            return ToolRun(argv, None, "", "", 0.0, f"{tool} not found (is it installed?)")
        argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
    if idle_io:
        argv = ["ionice", "-c", "3", *argv]
    started = time.monotonic()
    # Every tool speaks the C locale to us, whatever the host's: systemd hands a service the LANG of
    # /etc/locale.conf, and under de_DE xfs_db's "fragmentation factor 12.34%" comes translated with a decimal
    # comma, tuned-adm's lines translated: what is parsed is the tool's own words in its own notation.
    env = {**(os.environ if env is None else env), "LC_ALL": "C"}
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    except FileNotFoundError:
        return ToolRun(argv, None, "", "", 0.0, f"{argv[0]} not found (is it installed?)")
    except OSError as exc:
        return ToolRun(argv, None, "", "", 0.0, f"cannot start {tool}: {exc}")
    if on_start is not None:
        on_start(proc)
    try:
        out, err, over = _collect(proc, started + timeout_seconds, max_output_bytes)
    except BaseException:
        kill_group(proc)
        _close_pipes(proc)
        proc.wait()
        raise
    name = os.path.basename(tool)
    duration = time.monotonic() - started
    out_text, err_text = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    if over is not None:
        kill_group(proc)
        _reap(proc)
        if over == "timeout":
            message = f"{name} timed out after {timeout_seconds:g} s and was killed"
        else:
            message = f"{name} printed more than {over} bytes on its {'stdout' if over == max_output_bytes else 'stderr'}" \
                      " (the most iowarden reads of a tool) and was killed"
        return ToolRun(argv, proc.returncode, out_text, err_text, duration, message)
    _reap(proc)
    return _finished(argv, tool, proc, out_text, err_text, duration)


def _collect(proc: subprocess.Popen, deadline: float, max_out: int) -> tuple[bytes, bytes, object]:
    """Read both pipes as the bytes arrive until both close, the tool has been gone TOOL_LINGER_SECONDS,
    a cap is passed or the deadline comes. The third value: None (whole), "timeout", or the cap passed."""
    caps = {proc.stdout: max_out, proc.stderr: TOOL_STDERR_MAX_BYTES}
    got: dict = {proc.stdout: [], proc.stderr: []}
    sizes = {proc.stdout: 0, proc.stderr: 0}
    sel = selectors.DefaultSelector()
    for stream in caps:
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ)
    exited_at = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            limit = deadline if exited_at is None else min(deadline, exited_at + TOOL_LINGER_SECONDS)
            if now >= limit:
                if exited_at is None:
                    return b"".join(got[proc.stdout]), b"".join(got[proc.stderr]), "timeout"
                # exited; a child it left may keep the pipe open: what the tool printed is in it now
                # (also when this process was stopped past the deadline while the tool finished)
                for key in list(sel.get_map().values()):
                    if _drain_now(key.fileobj, got, sizes, caps):
                        return b"".join(got[proc.stdout])[:max_out], \
                            b"".join(got[proc.stderr])[:TOOL_STDERR_MAX_BYTES], caps[key.fileobj]
                break
            # woken at least every 0.1 s to notice the tool's exit while a child holds the pipe
            for key, _ in sel.select(min(limit - now, 0.1)):
                stream = key.fileobj
                try:
                    chunk = os.read(stream.fileno(), 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(stream)
                    continue
                got[stream].append(chunk)
                sizes[stream] += len(chunk)
                if sizes[stream] > caps[stream]:
                    return b"".join(got[proc.stdout])[:max_out], b"".join(got[proc.stderr])[:TOOL_STDERR_MAX_BYTES], \
                        caps[stream]
    finally:
        sel.close()
        _close_pipes(proc)
    return b"".join(got[proc.stdout]), b"".join(got[proc.stderr]), None


def _drain_now(stream, got: dict, sizes: dict, caps: dict) -> bool:
    """What the pipe holds now, without waiting; True when it passes its cap."""
    while True:
        try:
            chunk = os.read(stream.fileno(), 1 << 16)
        except (BlockingIOError, OSError):
            return False
        if not chunk:
            return False
        got[stream].append(chunk)
        sizes[stream] += len(chunk)
        if sizes[stream] > caps[stream]:
            return True


def _close_pipes(proc: subprocess.Popen) -> None:
    for stream in (proc.stdout, proc.stderr):
        try:
            stream.close()
        except OSError:
            pass


def _reap(proc: subprocess.Popen) -> None:
    """Wait for the tool itself (its pipes already closed). Killed or exited, it is gone within moments;
    the bound only guards against a process the kernel cannot end (D state on a dying disk)."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _finished(argv, tool, proc, out, err, duration) -> ToolRun:
    error = None
    if proc.returncode is None:
        error = f"{os.path.basename(tool)} did not exit after its output closed"
    elif proc.returncode != 0:
        tail = (err.strip().split("\n") or ["no message"])[-1]
        error = f"{os.path.basename(tool)} exited with {proc.returncode}: {tail[:300]}"
    return ToolRun(argv, proc.returncode, out, err, duration, error)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process, its process group, and every descendant.

    The group alone is not enough: fio's job processes leave their parent's
    process group (seen with fio 3.33), and would go on hammering the device for
    the rest of their runtime after their parent was killed. Descendants are
    listed before anything is killed, while they are still linked to the parent.

    A process already reaped is left alone: its pid, and the group of that number, may be another process's
    by now (pid_max is 32768 on this kind of host, and a busy one reuses pids within minutes).
    """
    if proc.returncode is not None:
        return
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for child in descendants:
        try:
            child.kill()
        except psutil.Error:
            pass
