"""Routine probes fitted to their budget, from what they were measured to cost.

A profile's cost is not its runtime: fio starts, ramps and ends, and the device is busy for all of it (the
example's 1 s + 0.5 s ramp measured 1.8-2.0 s). Planned from the runtime, four profiles every 300 s asked
89 s an hour of a 72 s budget, the budget ran dry 45 minutes in and nothing was probed for a quarter of an
hour. Here each (target, profile) keeps the device time its probes took (a moving average), each physical
disk sums what its routine probes ask per budget window, and where that is more than FIT_ROOM of the routine
share, every routine interval on that disk is stretched by the same factor: the probes are spread over the
window, not run until the budget is spent. Warm-up and confirming probes have shares of their own.
"""
from __future__ import annotations

import logging

log = logging.getLogger("iowarden")

FIT_ROOM = 0.9          # routine probes planned to at most this share of their budget: room for jitter and a slow run
COST_WEIGHT = 0.3       # the moving average's weight of a new probe's device time
STARTUP_SECONDS = 0.4   # fio's start and end beside runtime and ramp (measured here: 0.3-0.5 s), before any run


def nominal_cost_seconds(profile, max_runtime_seconds: float) -> float:
    """A profile's device time before it has run: runtime, ramp and fio's start."""
    return profile.effective_runtime_seconds(max_runtime_seconds) + STARTUP_SECONDS


def updated_cost(previous: float | None, seconds: float) -> float:
    return seconds if previous is None else previous + COST_WEIGHT * (seconds - previous)


def demand_seconds(entries, window_seconds: float) -> float:
    """Device seconds a window of routine probes asks: entries of (cost seconds, interval seconds)."""
    return sum(cost * window_seconds / interval for cost, interval in entries if interval > 0)


def stretch(demand: float, allowed_seconds: float) -> float:
    """By how much routine intervals must grow for their probes to fit FIT_ROOM of the budget (1: they fit)."""
    if allowed_seconds <= 0 or demand <= FIT_ROOM * allowed_seconds:
        return 1.0
    return demand / (FIT_ROOM * allowed_seconds)


# What the journal and check-config say of a schedule over its budget, and what would fit it. A template, so the
# journal's repeat filter takes each disk's sentence as one message whatever its figures (daemon/logs.py).
FIT_TEMPLATE = ("routine probes on %s ask %.0f s of device time per %.0f s (%d probes of %.2f s each), over %.0f%% "
                "of the budget's %.0f s (device_time_ratio %g): they run %.2fx less often (every %.0f s at the "
                "shortest); device_time_ratio = %.3g, or intervals %.2fx as long, would fit them")


def fit_args(where: str, demand: float, allowed: float, ratio: float, window: float, entries) -> tuple:
    factor = stretch(demand, allowed)
    shortest = min((interval for _, interval in entries), default=0.0)
    return (where, demand, window, len(entries), sum(c for c, _ in entries) / max(1, len(entries)), FIT_ROOM * 100,
            allowed, ratio, factor, shortest * factor, ratio * factor, factor)


def fit_sentence(where: str, demand: float, allowed: float, ratio: float, window: float, entries) -> str:
    return FIT_TEMPLATE % fit_args(where, demand, allowed, ratio, window, entries)


class Fit:
    """What each (target, profile) costs, and each disk's stretch as last said (the scheduler's thread only)."""

    def __init__(self, history=()):
        self._cost: dict[tuple[str, str], float] = {}
        self.intervals: dict[tuple[str, str], float] = {}   # (target, profile) -> the interval last posted
        for r in history:   # stored results, oldest first: the costs a restart starts from
            if r.get("ok") and r.get("duration_seconds"):
                self.observe(r["target"], r["profile"], r["duration_seconds"])
        self._said: dict[str, float] = {}

    def observe(self, target: str, profile: str, seconds: float) -> None:
        key = (target, profile)
        self._cost[key] = updated_cost(self._cost.get(key), seconds)

    def cost(self, target: str, profile, max_runtime_seconds: float) -> float:
        return self._cost.get((target, profile.name)) or nominal_cost_seconds(profile, max_runtime_seconds)

    def stretches(self, per_disk: dict[str, list], ratio: float, window: float) -> dict[str, float]:
        """disk -> the stretch of its routine intervals, from (cost, interval) per routine probe on it; the
        journal hears when a disk's changes."""
        out = {}
        for disk, entries in per_disk.items():
            demand = demand_seconds(entries, window)
            out[disk] = stretch(demand, ratio * window)
            if abs(out[disk] - self._said.get(disk, 1.0)) > 0.05:
                # a condition that holds while the costs move with the load: said again at most once a minute
                extra = {"DEVICE": disk, "REPEATS": True}
                if out[disk] > 1.0:
                    log.warning(FIT_TEMPLATE, *fit_args(disk, demand, ratio * window, ratio, window, entries),
                                extra=extra)
                else:
                    log.info("routine probes on %s fit their budget again: they run at their intervals", disk,
                             extra=extra)
                self._said[disk] = out[disk]
        return out


def log_hold(dec, disks, load) -> None:
    """A probe held back, said once a minute (a condition, not an event)."""
    extra = {"TARGET": dec.target, "PROBE": dec.profile, "REPEATS": True}
    if dec.reason in ("budget_time", "budget_bytes"):
        log.info("probe %s/%s waits: %s budget spent on %s", dec.target, dec.profile,
                 "device-time" if dec.reason == "budget_time" else "write", ",".join(disks), extra=extra)
    elif dec.reason == "busy":
        util = max((load.util_percent.get(x, 0.0) for x in disks), default=0.0)
        log.info("probe %s/%s deferred: device busy (%.0f%% util)", dec.target, dec.profile, util, extra=extra)
    elif dec.reason == "io_pressure":
        log.info("probe %s/%s deferred: I/O pressure (full avg10 %.0f%%)", dec.target, dec.profile,
                 load.io_full_avg10_percent or 0.0, extra=extra)
