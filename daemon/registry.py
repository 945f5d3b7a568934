"""One registry of the daemon's parts: each has a name, a cadence, a stuck threshold and its own thread.

A part's step may fail; the failure is counted and logged and the next step runs
on time. A slow part delays only itself. Nothing here cancels a step: a step that
runs a tool bounds it itself (run_tool's timeout). `stuck()` names the parts that
have not completed a step for longer than twice their cadence plus their stuck
threshold: the watchdog ping is withheld while any part is stuck, so systemd
restarts a daemon that hangs.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("iowarden")


@dataclass
class PartStats:
    runs_total: int = 0
    errors_total: int = 0
    last_success_timestamp_seconds: float | None = None
    last_duration_seconds: float | None = None
    last_error: str | None = None
    last_completed_monotonic: float = field(default_factory=time.monotonic)

    @property
    def success(self) -> bool:
        return self.runs_total > 0 and self.last_error is None


@dataclass
class Part:
    name: str
    cadence_seconds: float
    stuck_after_seconds: float       # beyond two cadences: how long a step may take before the part is stuck
    step: Callable[[], None]
    stats: PartStats = field(default_factory=PartStats)


class Registry:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.parts: dict[str, Part] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def add(self, name: str, cadence_seconds: float, stuck_after_seconds: float, step: Callable[[], None]) -> Part:
        part = Part(name, cadence_seconds, stuck_after_seconds, step)
        part.stats.last_completed_monotonic = self.clock()
        self.parts[name] = part
        return part

    def run_once(self, part: Part) -> None:
        started, wall = self.clock(), time.time()
        _test_hang(part.name)
        try:
            part.step()
            error = None
        except Exception as exc:  # a failing part is a counted error, never a dead daemon
            error = f"{type(exc).__name__}: {exc}"
            log.exception("part %s failed", part.name, extra={"PART": part.name})
        with self._lock:
            s = part.stats
            s.runs_total += 1
            s.last_duration_seconds = self.clock() - started
            s.last_completed_monotonic = self.clock()
            s.last_error = error
            if error:
                s.errors_total += 1
            else:
                s.last_success_timestamp_seconds = wall

    def start(self, stop: threading.Event) -> None:
        for part in self.parts.values():
            t = threading.Thread(target=self._loop, args=(part, stop), name=f"iowarden-{part.name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _loop(self, part: Part, stop: threading.Event) -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            self.run_once(part)
            next_at += part.cadence_seconds
            now = time.monotonic()
            if next_at < now:  # fell behind (a slow step): skip missed ticks rather than burst
                next_at = now + part.cadence_seconds
            stop.wait(next_at - now)

    def join(self, timeout_seconds: float) -> None:
        deadline = time.monotonic() + timeout_seconds
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def stuck(self) -> list[str]:
        now = self.clock()
        with self._lock:
            return [p.name for p in self.parts.values()
                    if now - p.stats.last_completed_monotonic > 2 * p.cadence_seconds + p.stuck_after_seconds]

    def stats(self) -> dict[str, PartStats]:
        with self._lock:
            return {name: PartStats(**vars(p.stats)) for name, p in self.parts.items()}


def _test_hang(part_name: str) -> None:
    """Test-only fault switch: while the file named by IOWARDEN_TEST_HANG_FILE exists and names
    this part, its step hangs, as a wedged disk read would. This is how the tests show that
    systemd's watchdog kills and restarts a daemon whose part is stuck. Unset in production."""
    path = os.environ.get("IOWARDEN_TEST_HANG_FILE")
    if not path:
        return
    while True:
        try:
            with open(path) as f:
                if f.read().strip() != part_name:
                    return
        except OSError:
            return
        log.warning("part %s hangs on purpose (%s)", part_name, path)
        time.sleep(1.0)
