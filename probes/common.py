"""What every probe shares: root paths, the parse error, sizes, and running a tool safely.

Probes never hard-code /proc or /sys: a `Roots` value says where the kernel's
files are, so every reader runs against a fixture tree in tests.
"""
from __future__ import annotations

import os
import re
import shutil
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


def read_text(path: Path) -> str | None:
    """The file's text, or None when it is absent or unreadable (absent is not zero)."""
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
        return None
    except OSError:
        # sysfs attributes can fail with EINVAL/EIO for devices that are going away
        return None


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


@dataclass(frozen=True)
class ToolRun:
    """The outcome of one external command; `error` is None when it ran and exited 0."""
    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    duration_seconds: float
    error: str | None


def run_tool(argv: list[str], timeout_seconds: float, idle_io: bool = False,
             env: dict | None = None, on_start=None, die_with_parent: bool = False) -> ToolRun:
    """Run a command (argument list, never a shell) in its own process group.

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
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, errors="replace",
                                start_new_session=True, env=env)
    except FileNotFoundError:
        return ToolRun(argv, None, "", "", 0.0, f"{argv[0]} not found (is it installed?)")
    except OSError as exc:
        return ToolRun(argv, None, "", "", 0.0, f"cannot start {tool}: {exc}")
    if on_start is not None:
        on_start(proc)
    try:
        out, err = proc.communicate(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        return ToolRun(argv, proc.returncode, out, err, time.monotonic() - started,
                       f"{os.path.basename(tool)} timed out after {timeout_seconds:g} s and was killed")
    except BaseException:
        kill_group(proc)
        proc.wait()
        raise
    duration = time.monotonic() - started
    error = None
    if proc.returncode != 0:
        tail = (err.strip().splitlines() or ["no message"])[-1]
        error = f"{os.path.basename(tool)} exited with {proc.returncode}: {tail}"
    return ToolRun(argv, proc.returncode, out, err, duration, error)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process, its process group, and every descendant.

    The group alone is not enough: fio's job processes leave their parent's
    process group (seen with fio 3.33), and would go on hammering the device for
    the rest of their runtime after their parent was killed. Descendants are
    listed before anything is killed, while they are still linked to the parent.
    """
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
