"""Whether a path answers: stat(2) made by a child process, with a deadline.

A filesystem that stops answering (a dead hard-mounted NFS or CIFS server, a FUSE daemon that blocks)
holds whoever touches it in the kernel, uninterruptibly once its server has the request. A thread of the
daemon held so is one the watchdog sees stuck, and keeps the whole process from exiting (its other threads
are gone, the process is not). So the daemon's first touch of a target's path is made by a child, coreutils'
`stat` (about a millisecond), that it can walk away from: past the deadline the child is killed (it dies when
the filesystem lets it go) and the path is said to be hung.

At most one child per path is outstanding: while one is stuck, the path is answered "hung" without asking
again, so a dead mount costs one process, not one per second. Paths are asked all at once, so ten hung
mounts cost one deadline, not ten.
"""
from __future__ import annotations

import errno
import os
import select
import subprocess
import threading
import time
from dataclasses import dataclass

from .common import TASK_LIMIT_TEXT

HUNG_AFTER_SECONDS = 5.0             # a stat unanswered this long: its filesystem is hung
# %d st_dev, %f st_mode (hex), %t %T a device node's major and minor (hex)
STAT_ARGV = ("stat", "-L", "--printf", "%d %f %t %T\\n", "--")
MAX_ANSWER_BYTES = 4096


@dataclass(frozen=True)
class PathAnswer:
    path: str
    at: float                        # monotonic: when the answer came (or the deadline passed)
    st_dev: int | None = None
    st_mode: int | None = None
    st_rdev: int | None = None
    error: str | None = None         # what stat said (No such file or directory), or why it was not asked
    hung: bool = False
    asked: bool = True               # False: no child could be started, so the path's own state is unknown

    @property
    def ok(self) -> bool:
        return not self.hung and self.error is None

    def hung_text(self, deadline_seconds: float = HUNG_AFTER_SECONDS) -> str:
        return f"{self.path} did not answer within {deadline_seconds:g} s: its filesystem is hung"


def parse(path: str, stdout: bytes, stderr: bytes, returncode: int, at: float) -> PathAnswer:
    """A `stat` child's answer. Its error is the tool's last line without the tool's name and the path."""
    if returncode == 0:
        try:
            dev, mode, major, minor = stdout.decode().split()
            return PathAnswer(path, at, int(dev), int(mode, 16), os.makedev(int(major, 16), int(minor, 16)))
        except ValueError:
            return PathAnswer(path, at, error=f"unexpected answer from stat: {stdout[:100]!r}")
    said = stderr.decode("utf-8", "replace").strip().splitlines()
    text = said[-1] if said else f"stat exited with {returncode}"
    return PathAnswer(path, at, error=text.rsplit(": ", 1)[-1] if ": " in text else text)


def not_started_text(exc: OSError) -> str:
    """Why a child could not be started, in terms an operator acts on: out of tasks is a limit of the daemon's
    (the unit's TasksMax, its cgroup's pids.max) or of the machine's, not anything about the target."""
    if exc.errno == errno.EAGAIN:
        return f"iowarden cannot start a process: {TASK_LIMIT_TEXT}"
    return f"iowarden cannot start stat: {exc.strerror or exc}"


class PathWatch:
    """The latest answer per path, and the one child per path that may be asking."""

    def __init__(self, clock=time.monotonic, argv=STAT_ARGV):
        self.clock = clock
        self.argv = tuple(argv)
        self._lock = threading.Lock()
        self._asking: dict[str, tuple[subprocess.Popen, float]] = {}   # path -> (child, when it was asked)
        self._latest: dict[str, PathAnswer] = {}
        self._killed: set[int] = set()   # children killed at their deadline, still held by the kernel
        self.hung_children_total = 0     # children left to the kernel past their deadline

    def latest(self, path: str) -> PathAnswer | None:
        with self._lock:
            return self._latest.get(path)

    def check(self, paths, timeout_seconds: float = HUNG_AFTER_SECONDS) -> dict[str, PathAnswer]:
        """A fresh answer for every path, waiting at most `timeout_seconds` in all; a path whose child from an
        earlier check is still stuck is answered hung at once, unless that child has answered since."""
        paths = list(dict.fromkeys(paths))
        started = self.clock()
        with self._lock:
            stuck = {p for p in paths if p in self._asking and started - self._asking[p][1] >= timeout_seconds}
            for p in paths:
                if p not in self._asking:
                    self._ask(p, started)
        deadline = started + timeout_seconds
        out: dict[str, PathAnswer] = {}
        for p in paths:
            answer = self._harvest(p, 0 if p in stuck else max(0.0, deadline - self.clock()))
            if answer is None:
                answer = self._hung(p)
            out[p] = answer
        return out

    def poll(self, paths, max_age_seconds: float, deadline_seconds: float = HUNG_AFTER_SECONDS,
             wait_seconds: float = 0.1) -> dict[str, PathAnswer]:
        """Each path's latest answer (absent until one comes); a path whose answer is older than
        `max_age_seconds` is asked again, and one asked longer than `deadline_seconds` ago is hung. The paths
        asked now are waited for `wait_seconds` in all (a stat that answers does so in a millisecond): the
        caller's cadence is never held longer, whatever hangs."""
        now = self.clock()
        with self._lock:
            asked_now = [p for p in dict.fromkeys(paths) if p not in self._asking and (
                p not in self._latest or now - self._latest[p].at >= max_age_seconds)]
            for p in asked_now:
                self._ask(p, now)
        until = time.monotonic() + wait_seconds
        for p in asked_now:
            self._harvest(p, max(0.0, until - time.monotonic()))
        out: dict[str, PathAnswer] = {}
        for p in dict.fromkeys(paths):
            with self._lock:
                asking = self._asking.get(p)
            if asking is not None:
                self._harvest(p, 0)
                with self._lock:
                    still = self._asking.get(p) is asking
                if still and now - asking[1] >= deadline_seconds:
                    self._hung(p)
            with self._lock:
                latest = self._latest.get(p)
                if p not in self._asking and (latest is None or now - latest.at >= max_age_seconds):
                    self._ask(p, now)
            if latest is not None:
                out[p] = latest
        return out

    def close(self) -> None:
        """Kill every child still asking (each ends when its filesystem lets it go)."""
        with self._lock:
            children = [child for child, _ in self._asking.values()]
            self._asking.clear()
        for child in children:
            try:
                child.kill()
                child.wait(timeout=1)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def _ask(self, path: str, now: float) -> None:
        try:
            child = subprocess.Popen([*self.argv, path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        except OSError as exc:
            self._latest[path] = PathAnswer(path, now, error=not_started_text(exc), asked=False)
            return
        self._asking[path] = (child, now)

    def _harvest(self, path: str, wait_seconds: float) -> PathAnswer | None:
        """The child's answer once it has exited (waiting up to wait_seconds), else None. Any thread may ask:
        the one that finds the child ended reads it, under the lock (its pipes are at their end then), and
        the others read the answer it left."""
        with self._lock:
            asking = self._asking.get(path)
            if asking is None:
                return self._latest.get(path)
        child, _ = asking
        if wait_seconds > 0:
            _wait_exit(child, wait_seconds)
        with self._lock:
            # under the lock: Popen.poll answers None while another thread reaps the same child
            if child.poll() is None:
                return None
            if self._asking.get(path) is not asking:       # another thread read it
                latest = self._latest.get(path)
                return latest if latest is not None and not latest.hung else None
            del self._asking[path]
            self._killed.discard(child.pid)
            out = child.stdout.read(MAX_ANSWER_BYTES) if child.stdout else b""
            err = child.stderr.read(MAX_ANSWER_BYTES) if child.stderr else b""
            for f in (child.stdout, child.stderr):
                if f:
                    f.close()
            if child.returncode < 0:   # killed at its deadline, and let go since: not an answer about the path
                return None
            answer = parse(path, out, err, child.returncode, self.clock())
            self._latest[path] = answer
            return answer

    def _hung(self, path: str) -> PathAnswer:
        """The deadline passed: kill the child (the kernel ends it when the filesystem lets go) and keep it,
        so the path is not asked again while it is stuck."""
        now = self.clock()
        with self._lock:
            asking = self._asking.get(path)
            answer = PathAnswer(path, now, hung=True)
            self._latest[path] = answer
            if asking is not None and asking[0].pid not in self._killed:
                self._killed.add(asking[0].pid)
                self.hung_children_total += 1
                try:
                    asking[0].kill()
                except OSError:
                    pass
        return answer


def _wait_exit(child: subprocess.Popen, seconds: float) -> None:
    """Until the child exits or `seconds` pass, on a pidfd: Popen.wait(timeout) sleeps in steps with
    time.sleep, which fails under a shifted wall clock (libfaketime's clock_nanosleep: EINVAL)."""
    try:
        fd = os.pidfd_open(child.pid)
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            return   # gone already
        # no pidfds here (an older kernel, a seccomp filter): short waits that a shifted clock does not break
        pause, until = threading.Event(), time.monotonic() + seconds
        while child.poll() is None and time.monotonic() < until:
            pause.wait(0.005)
        return
    try:
        p = select.poll()
        p.register(fd, select.POLLIN)
        p.poll(max(1, int(seconds * 1000)))
    finally:
        os.close(fd)


# One per process: the children a dead mount holds are bounded per path across every part that asks
# (the configuration's load, discovery, the scheduler, check-config).
WATCH = PathWatch()
