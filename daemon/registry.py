"""One registry of the daemon's parts, each on its own supervised thread.

A part has a name, a cadence and a deadline: how long one step may take. Its
thread is supervised at two depths:
- a step that raises is counted (errors_total) and logged, and the next step
  runs on time;
- anything that escapes the loop around the steps (a bug in the wait, an
  OverflowError from a timeout) is counted (restarts_total), logged once with its
  traceback, and the loop started again after a backoff that doubles up to
  RESTART_BACKOFF_MAX_SECONDS.
`stuck()` names every part that is dead (its thread ended while the daemon runs),
inside one step for longer than its deadline, or that has not started a step
within its cadence plus its deadline of finishing the last. The watchdog ping is
withheld while any part is stuck, so systemd restarts a daemon with a part that
hangs or died. Nothing here cancels a step: a step that runs a tool bounds it
itself (run_tool's timeout).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

log = logging.getLogger("iowarden")

RESTART_BACKOFF_SECONDS = 1.0
RESTART_BACKOFF_MAX_SECONDS = 60.0
LONGEST_WAIT_SECONDS = 3600.0   # a wait is cut into pieces no longer than this (threading's TIMEOUT_MAX is far)


@dataclass(frozen=True)
class PartStats:
    """A part's counts: a value, replaced whole under the registry's lock, so a snapshot holding one keeps it."""
    runs_total: int = 0
    errors_total: int = 0
    restarts_total: int = 0          # the part's loop failed and was started again
    last_success_timestamp_seconds: float | None = None
    last_duration_seconds: float | None = None
    longest_duration_seconds: float = 0.0          # the longest step since the start
    deadline_seconds: float = 0.0                  # how long a step may take before the part is stuck
    last_error: str | None = None
    last_completed_monotonic: float = field(default_factory=time.monotonic)
    step_started_monotonic: float | None = None   # set while a step runs

    @property
    def success(self) -> bool:
        return self.runs_total > 0 and self.last_error is None


@dataclass
class Part:
    name: str
    cadence_seconds: float
    deadline_seconds: float          # how long one step may take before the part is stuck
    step: Callable[[], None]
    stats: PartStats = field(default_factory=PartStats)
    thread: threading.Thread | None = None
    vital: bool = False              # its last step failed: the daemon is not well (the watchdog is withheld)
    one_shot: bool = False           # no loop: short-lived threads started by run_task (the probe workers)
    tasks: dict = field(default_factory=dict)   # a running task -> (started, its deadline in seconds)


class Registry:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.parts: dict[str, Part] = {}
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None

    def add(self, name: str, cadence_seconds: float, deadline_seconds: float, step: Callable[[], None],
            vital: bool = False) -> Part:
        """vital: a failed step is a stuck part until a step succeeds (the /metrics watch: a daemon whose endpoint
        cannot be started again is restarted by systemd), where a failing SMART read is only a counted error."""
        part = Part(name, cadence_seconds, deadline_seconds, step, vital=vital,
                    stats=PartStats(last_completed_monotonic=self.clock(), deadline_seconds=deadline_seconds))
        self.parts[name] = part
        return part

    def add_tasks(self, name: str) -> Part:
        """A part whose threads are short-lived tasks (a probe worker per probe), started by run_task."""
        part = self.add(name, 0.0, 0.0, lambda: None)
        part.one_shot = True
        return part

    def run_task(self, name: str, deadline_seconds: float, fn: Callable, *args) -> threading.Thread:
        """Run fn(*args) on a thread of part `name` (add_tasks): each run counted in the part's stats, a
        crash counted and said with its traceback (never silent), and a task running past
        `deadline_seconds` makes the part stuck, so the watchdog sees a hung worker as it sees a hung loop."""
        part = self.parts[name]
        token = object()

        def run() -> None:
            started, wall = self.clock(), time.time()
            error = None
            try:
                fn(*args)
            except BaseException as exc:   # noqa: BLE001 - the supervisor: a task's end is never silent
                error = f"{type(exc).__name__}: {exc}"
                log.exception("part %s: a task crashed", name, extra={"PART": name, "REPEATS": True})
            finally:
                with self._lock:
                    part.tasks.pop(token, None)
                    part.stats = self._count(part.stats, started, wall, error)
        with self._lock:
            part.tasks[token] = (self.clock(), deadline_seconds)
            part.stats = replace(part.stats, deadline_seconds=deadline_seconds)
        thread = threading.Thread(target=run, name=f"iowarden-{name}", daemon=True)
        try:
            thread.start()
        except RuntimeError:   # no thread to be had (a task limit): the task never ran, so no deadline waits on it
            with self._lock:
                part.tasks.pop(token, None)
            raise
        return thread

    def run_once(self, part: Part) -> None:
        started, wall = self.clock(), time.time()
        with self._lock:
            part.stats = replace(part.stats, step_started_monotonic=started)
        _test_hang(part.name)
        try:
            part.step()
            error = None
        except Exception as exc:  # a failing part is a counted error, never a dead daemon
            error = f"{type(exc).__name__}: {exc}"
            log.exception("part %s failed", part.name, extra={"PART": part.name, "REPEATS": True})
        with self._lock:
            part.stats = self._count(replace(part.stats, step_started_monotonic=None), started, wall, error)

    def _count(self, s: PartStats, started: float, wall: float, error: str | None) -> PartStats:
        """One step or task done (called under the lock): its run, its time, its error or its success."""
        took = self.clock() - started
        return replace(s, runs_total=s.runs_total + 1, last_duration_seconds=took,
                       longest_duration_seconds=max(s.longest_duration_seconds, took),
                       last_completed_monotonic=self.clock(), last_error=error,
                       errors_total=s.errors_total + (1 if error else 0),
                       last_success_timestamp_seconds=s.last_success_timestamp_seconds if error else wall)

    def start(self, stop: threading.Event) -> None:
        self._stop = stop
        for part in self.parts.values():
            if part.one_shot:
                continue   # its threads are its tasks
            part.thread = threading.Thread(target=self._supervise, args=(part, stop), name=f"iowarden-{part.name}",
                                           daemon=True)
            part.thread.start()

    def _supervise(self, part: Part, stop: threading.Event) -> None:
        backoff = RESTART_BACKOFF_SECONDS
        while not stop.is_set():
            try:
                self._loop(part, stop)
                return
            except BaseException as exc:   # noqa: BLE001 - the supervisor: nothing may end a part in silence
                with self._lock:
                    part.stats = replace(part.stats, restarts_total=part.stats.restarts_total + 1,
                                         step_started_monotonic=None, last_error=f"{type(exc).__name__}: {exc}")
                log.exception("part %s crashed (restart %d, in %g s)", part.name, part.stats.restarts_total,
                              backoff, extra={"PART": part.name})
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                stop.wait(backoff)
                backoff = min(backoff * 2, RESTART_BACKOFF_MAX_SECONDS)

    def _loop(self, part: Part, stop: threading.Event) -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            _test_fault(part.name)
            self.run_once(part)
            next_at += part.cadence_seconds
            now = time.monotonic()
            if next_at < now:  # fell behind (a slow step): skip missed ticks rather than burst
                next_at = now + part.cadence_seconds
            while not stop.is_set() and now < next_at:
                stop.wait(min(next_at - now, LONGEST_WAIT_SECONDS))
                now = time.monotonic()

    def join(self, timeout_seconds: float) -> None:
        deadline = time.monotonic() + timeout_seconds
        for part in self.parts.values():
            if part.thread is not None:
                part.thread.join(max(0.0, deadline - time.monotonic()))

    def stuck(self) -> list[str]:
        """Parts that are dead, over their deadline in a step, not stepping on time, or vital and failing."""
        now = self.clock()
        running = self._stop is not None and not self._stop.is_set()
        out = []
        with self._lock:
            for p in self.parts.values():
                s = p.stats
                if p.one_shot:
                    if any(now - started > deadline for started, deadline in p.tasks.values()):
                        out.append(p.name)
                    continue
                dead = running and p.thread is not None and not p.thread.is_alive()
                over = s.step_started_monotonic is not None and now - s.step_started_monotonic > p.deadline_seconds
                late = s.step_started_monotonic is None and \
                    now - s.last_completed_monotonic > p.cadence_seconds + p.deadline_seconds
                failed = p.vital and s.last_error is not None
                if dead or over or late or failed:
                    out.append(p.name)
        return out

    def stats(self) -> dict[str, PartStats]:
        with self._lock:
            return {name: p.stats for name, p in self.parts.items()}   # values: handed out as they are


def _test_switch(variable: str, part_name: str) -> bool:
    """Test-only fault switches, unset in production: does the file named by $variable name this part?"""
    path = os.environ.get(variable)
    if not path:
        return False
    try:
        with open(path) as f:
            return f.read().strip() == part_name
    except OSError:
        return False


def _test_hang(part_name: str) -> None:
    """While the file named by IOWARDEN_TEST_HANG_FILE names this part, its step hangs, as a wedged
    disk read would: how the tests show that systemd's watchdog restarts a daemon whose part is stuck."""
    while _test_switch("IOWARDEN_TEST_HANG_FILE", part_name):
        log.warning("part %s hangs on purpose", part_name)
        time.sleep(1.0)


class InjectedFault(RuntimeError):
    pass


def fault_switch(part_name: str) -> None:
    """The test-only fault switch, for a task's own code to call where a crash must be handled (a probe
    worker records a crashed probe as a failed result before its part counts the crash)."""
    _test_fault(part_name)


def down_switch(what: str) -> bool:
    """Test-only: while the file named by IOWARDEN_TEST_DOWN_FILE names `what`, it is to be down and not to be
    had again (the metrics endpoint: how the service test shows the watchdog withheld while /metrics is down)."""
    return _test_switch("IOWARDEN_TEST_DOWN_FILE", what)


def _test_fault(part_name: str) -> None:
    """While the file named by IOWARDEN_TEST_FAULT_FILE names this part, its loop (not its step) raises:
    how the tests show that a part whose thread fails is restarted, counted and said."""
    if _test_switch("IOWARDEN_TEST_FAULT_FILE", part_name):
        raise InjectedFault(f"fault injected into part {part_name}")
