"""The probe budget: device time per window and bytes written per day, per physical disk.

The routine budget ([budget] device_time_ratio of window_seconds) counts the probes of armed volumes; a
volume still learning its normal probes every minute under the warm-up's share (warmup_device_time_ratio),
which counts every probe on the disk. So the total an hour is bounded by the two shares together, and a
warm-up, once done, leaves the routine budget whole.

A reserve (reserve_device_time_ratio) beside the routine share is for the probes that confirm a suspected
fault or its end, and only for them: a fault found must never burn the budget its alert needs to clear, and
routine probes can never spend it. The clock is monotonic and passed in.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

from iowarden.probes import blockqueue

DAY_SECONDS = 86400.0
ROUTINE, WARMUP, CONFIRM = "routine", "warmup", "confirm"     # whose share a probe's device time is counted in


@dataclass(frozen=True)
class BudgetStatus:
    """One physical disk's budget as it stands: device-time in the window (every probe's) and bytes written in a
    day. The routine budget (device_seconds_allowed) counts the probes of armed volumes (routine_seconds_used);
    the warm-up's (its own, stated share) counts every probe."""
    device_seconds_used: float
    device_seconds_allowed: float
    written_bytes_24h: int
    written_bytes_allowed: int
    routine_seconds_used: float = 0.0
    warmup_seconds_allowed: float = 0.0
    confirm_seconds_used: float = 0.0         # probes that confirmed a suspected fault or its end
    reserve_seconds_allowed: float = 0.0      # what those may use beyond the routine share


class Budget:
    """Per physical disk: probe device-time as a share of wall time, and bytes written per day.

    Cloud volumes bill per I/O and burst-credit volumes pay for every probe in
    credits: a monitor must not become the load it is watching.

    Probe workers record, the scheduler and every scrape read: one lock guards the
    history, so a reader never iterates a deque a worker is appending to.
    """

    def __init__(self, time_ratio: float, window_seconds: float, write_bytes_per_day: int, clock=time.monotonic,
                 wall=time.time):
        """clock: the budget's time, monotonic: a wall clock stepped back an hour must not hold a spent budget
        for an hour more, nor one stepped forward a day hand out a new day's writes. `wall` only dates the
        stored results that replay() converts."""
        self.time_ratio, self.window_seconds = time_ratio, window_seconds
        self.write_bytes_per_day = write_bytes_per_day
        self.clock, self.wall = clock, wall
        self.warmup_time_ratio = 0.0   # the share a volume still learning may use ([budget] warmup_device_time_ratio)
        self.reserve_time_ratio = 0.0  # the confirmations' own share ([budget] reserve_device_time_ratio)
        # disk -> (clock time, device seconds, bytes written, ROUTINE / WARMUP / CONFIRM)
        self.spent: dict[str, collections.deque] = {}
        self._lock = threading.Lock()

    def configure(self, section) -> None:
        """Take the [budget] section of a (re)loaded configuration."""
        self.time_ratio, self.window_seconds = section.device_time_ratio, section.window_seconds
        self.write_bytes_per_day = section.write_bytes_per_day
        self.warmup_time_ratio = section.warmup_device_time_ratio
        self.reserve_time_ratio = section.reserve_device_time_ratio

    def replay(self, records: list[dict], devices: dict, warmup_probes: int = 0) -> None:
        """Count stored probe results (from the state database, dated by the wall clock, oldest first) against
        their disks, each at its age on the budget's clock. A result dated in the future (the wall clock was
        stepped back since) counts as spent now: the budget errs towards probing less. The probes of a
        profile before it had `warmup_probes` learned (ok, uncontended) were its warm-up's."""
        now, wall_now = self.clock(), self.wall()
        learned: collections.Counter = collections.Counter()
        for rec in sorted(records, key=lambda r: r["started_at"]):
            key = (rec.get("target"), rec.get("profile"))
            warmup = learned[key] < warmup_probes
            if rec.get("ok") and not rec.get("contended"):
                learned[key] += 1
            if rec.get("device"):
                disks = blockqueue.physical_devices(rec["device"], devices) or (rec["device"],)
                age = max(0.0, wall_now - rec["started_at"])
                self.record(disks, now - age, rec["duration_seconds"],
                            rec.get("write_io_bytes", 0) + rec.get("layout_bytes", 0), warmup,
                            bool(rec.get("confirming")))

    def record(self, disks, at: float, seconds: float, written: int, warmup: bool = False,
               confirm: bool = False) -> None:
        """`at`: when the probe started, on the budget's clock; `warmup`: a probe of a volume still learning;
        `confirm`: one that confirmed a suspected fault or its end (the reserve's)."""
        kind = WARMUP if warmup else CONFIRM if confirm else ROUTINE
        with self._lock:
            for disk in disks:
                self.spent.setdefault(disk, collections.deque()).append((at, seconds, written, kind))

    def disks(self) -> list[str]:
        with self._lock:
            return sorted(self.spent)

    def _trim(self, disk: str, now: float) -> collections.deque:
        q = self.spent.setdefault(disk, collections.deque())
        while q and q[0][0] < now - max(self.window_seconds, DAY_SECONDS):
            q.popleft()
        return q

    def status(self, disk: str, now: float | None = None) -> BudgetStatus:
        now = self.clock() if now is None else now
        with self._lock:
            q = self._trim(disk, now)
            recent = [(sec, kind) for at, sec, _, kind in q if at >= now - self.window_seconds]
            written = sum(b for at, _, b, _ in q if at >= now - DAY_SECONDS)
        return BudgetStatus(sum(sec for sec, _ in recent), self.time_ratio * self.window_seconds, written,
                            self.write_bytes_per_day, sum(sec for sec, kind in recent if kind == ROUTINE),
                            max(self.time_ratio, self.warmup_time_ratio) * self.window_seconds,
                            sum(sec for sec, kind in recent if kind == CONFIRM),
                            self.reserve_time_ratio * self.window_seconds)

    def refuses(self, disks, needed_seconds: float, now: float | None = None, warming_up: bool = False,
                confirming: bool = False) -> str | None:
        """Why these disks cannot take a probe of `needed_seconds` now, or None. A volume still learning its
        normal may use `warmup_time_ratio` of the window, all probes counted (the warm-up's own, stated budget);
        a routine probe counts only the routine ones: a warm-up just spent must not hold the armed volume's
        first probes back for the rest of the hour (the first half hour's test: armed at minute 12, then no
        probe until minute 60). A probe confirming a suspected fault (or its end) may also use the reserve, which
        nothing else spends."""
        for disk in disks:
            st = self.status(disk, now)
            if warming_up:
                used, allowed = st.device_seconds_used, st.warmup_seconds_allowed
            elif confirming:
                used = st.routine_seconds_used + st.confirm_seconds_used
                allowed = st.device_seconds_allowed + st.reserve_seconds_allowed
            else:
                used, allowed = st.routine_seconds_used, st.device_seconds_allowed
            if used + needed_seconds > allowed:
                return "budget_time"
            if st.written_bytes_24h >= st.written_bytes_allowed:
                return "budget_bytes"
        return None
