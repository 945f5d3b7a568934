"""Scheduling policy as a pure function: which due probes run now, which wait, and why.

plan() reads nothing but its arguments: the time, the due probes (what each needs and
where), the disks our own probes hold, the budget's answer, the disks' load and the
rules. It returns one decision per probe; the scheduler carries them out (threads,
counters, log lines). So every rule is unit-tested with a clock passed in, no root.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

DEFER_IO_PRESSURE_FULL_PERCENT = 20.0  # /proc/pressure/io "full avg10": every task stalled on I/O
OWN_PRESSURE_SECONDS = 15.0            # PSI is system-wide: ignore it this long after a probe of ours
PRESSURE_DEFERRAL_SECONDS = 60.0       # host-wide pressure alone holds a probe this long at most
BUDGET_RETRY_SECONDS = 60.0
DEFER_RETRY_SECONDS = 5.0
UNMOUNTED_RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class Candidate:
    """One due probe, as the planner sees it."""
    target: str
    profile: str
    due_at: float                       # when it fell due (the oldest is served first)
    disks: tuple[str, ...]              # the physical disks under its target
    mounted: bool                       # a discovered target still has its filesystem
    needed_seconds: float               # device time it will spend (runtime + ramp, capped)
    interval_seconds: float
    deferred_since: float | None = None
    waiting: bool = False               # already held back by another probe (counted once)
    warming_up: bool = False            # its volume is still learning: the warm-up's budget applies
    suspected: bool = False             # an alert is open on it, or its last probe was far off its normal
    volume_unprobed_seconds: float | None = None   # since a probe of any profile of its target last started (None:
                                                   # its only profile, which waits max_deferral_seconds as set)
    struck_on_busy: bool = False        # its volume's last probe of a profile ran on a busy device and came short,
                                        # the device agreeing: this one is the second strike
    volume_interval_seconds: float | None = None   # its target's own interval, unstretched by the budget's fit
                                                   # (None: the same as interval_seconds)


@dataclass(frozen=True)
class Load:
    util_percent: Mapping[str, float]   # recent %util per disk, from other work
    io_full_avg10_percent: float | None  # /proc/pressure/io "full avg10"
    seconds_since_own_probe: float


@dataclass(frozen=True)
class Rules:
    defer_util_percent: float
    max_deferral_seconds: float
    jitter_ratio: float
    suspect_deferral_seconds: float = float("inf")   # a suspected or learning volume's probe waits no longer for a busy disk


@dataclass(frozen=True)
class Decision:
    target: str
    profile: str
    action: str                         # "run", or "hold": look again at next_at (or next tick)
    reason: str | None                  # why it is held: the iowarden_probe_skipped_total reason
    counted: bool                       # count the reason this time (a wait for a disk counts once)
    next_at: float | None               # when it is due next; None: unchanged (look again next tick)
    deferred_since: float | None
    waiting: bool
    contended: bool = False
    util_percent: float = 0.0


def plan(now: float, due: list[Candidate], busy_disks: set[str],
         budget_refusal: Callable[[tuple[str, ...], float, bool], str | None], load: Load, rules: Rules,
         jitter: Callable[[float], float]) -> list[Decision]:
    """Decide every due probe, the longest-waiting first.

    `budget_refusal(disks, seconds, warming_up, confirming)`: None, or "budget_time" / "budget_bytes".
    `jitter(ratio)`: a random factor in [-ratio, ratio] (the caller's RNG).
    """
    held = set(busy_disks)
    out = []
    for c in sorted(due, key=lambda c: c.due_at):
        def hold(reason, counted=True, next_at=None, deferred_since=c.deferred_since, waiting=c.waiting):
            out.append(Decision(c.target, c.profile, "hold", reason, counted, next_at, deferred_since, waiting))

        if not c.mounted:
            # unmounted since discovery found it: the next discovery pass drops it; a probe
            # now would write into the directory underneath
            hold("unmounted", next_at=now + UNMOUNTED_RETRY_SECONDS)
            continue
        if held & set(c.disks):
            # another probe holds one of its disks: it runs when that one ends, before anything
            # that fell due later; counted once per time it has to wait
            hold("waiting_for_disk", counted=not c.waiting, waiting=True)
            continue
        refusal = budget_refusal(c.disks, c.needed_seconds, c.warming_up, c.suspected)
        if refusal:
            hold(refusal, next_at=now + BUDGET_RETRY_SECONDS)
            continue
        util = max((load.util_percent.get(x) or 0.0 for x in c.disks), default=0.0)
        # PSI is the whole host's: it holds routine probes only. A volume still learning is unprotected until
        # it is armed, and one under suspicion needs its probe as evidence; a host whose other disks stall all
        # day would keep both waiting for ever (twelve warm-up probes, each held max_deferral_seconds: two
        # hours). Their own disks' util still defers them, and marks them contended when it does.
        stalled = ((load.io_full_avg10_percent or 0.0) > DEFER_IO_PRESSURE_FULL_PERCENT and not busy_disks
                   and load.seconds_since_own_probe > OWN_PRESSURE_SECONDS
                   and not c.warming_up and not c.suspected)
        busy = util > rules.defer_util_percent
        if busy or stalled:
            since = c.deferred_since if c.deferred_since is not None else now
            # a probe of a volume under suspicion is the evidence: deferred one interval at most (and no longer
            # than the warm-up's interval: a minute), not the whole max_deferral_seconds a routine probe may
            # wait for a busy disk; a volume held at a limit is busy because of the fault
            # A volume still learning is unprotected until armed: its warm-up probe waits as long, then runs
            # contended (a volume busy from its first minute: see Scheduler, learned under load)
            limit = min(rules.max_deferral_seconds, c.interval_seconds, rules.suspect_deferral_seconds) \
                if c.suspected or c.warming_up else rules.max_deferral_seconds
            if c.volume_unprobed_seconds is not None and busy:
                # every volume is measured at least once an interval, busy or not: its other profiles may wait
                # out max_deferral_seconds, but when this one would leave the volume unmeasured past its interval
                # it runs now, contended (a volume busy with backups by night went 1.5 intervals unmeasured).
                # The volume's own interval, not this profile's as the budget stretched it: the stretch spaces
                # each profile's runs, and the volume's profiles between them still fall due every quarter of
                # it; held to the stretched one, a volume on a starved host's busy disk (each probe 3.7 s of
                # device time where 1.8 s was its cost, the profiles 1.36x apart) went 408 s unmeasured.
                cover_s = min(c.interval_seconds, c.volume_interval_seconds or c.interval_seconds)
                if c.volume_unprobed_seconds + c.needed_seconds + DEFER_RETRY_SECONDS >= cover_s:
                    limit = 0.0
            if c.struck_on_busy and c.suspected and busy:
                # its volume's last probe waited for this busy device, ran on it and came short with the device
                # agreeing: the device is busy because the volume is slow, and waiting for it again only puts the
                # second strike a minute later (a collapse of 272 s was paged at 220 s, its second probe having
                # waited 67 s for the device the collapse kept busy)
                limit = 0.0
            if not busy:
                # the stall is the host's, its own disk is quiet: a short stall is waited out, a long one (the
                # other disks busy all afternoon) would leave this volume unwatched for max_deferral_seconds
                # every interval, and a throttle on it paged an hour late
                limit = min(limit, PRESSURE_DEFERRAL_SECONDS)
            if now - since < limit:
                hold("busy" if busy else "io_pressure", next_at=now + DEFER_RETRY_SECONDS, deferred_since=since)
                continue
        contended = busy   # waited long enough for a busy disk: run, and say it was measured under load
        held |= set(c.disks)
        # at its rate, not an interval after it was let run: scheduled from its run, each deferral for a busy disk
        # would push every later probe back (a profile of a volume busy by day then ran every 1.5-2 intervals in
        # the soak bench); never sooner than half an interval after this one
        nominal = c.due_at if now - c.due_at < c.interval_seconds else now
        next_at = max(nominal + c.interval_seconds * (1 + jitter(rules.jitter_ratio)), now + c.interval_seconds / 2)
        out.append(Decision(c.target, c.profile, "run", None, False, next_at, None, False, contended, util))
    return out


SPREAD_STEPS = 16   # candidate times looked at within a probe's slot


def spread_next(next_at: float, now: float, interval_seconds: float, siblings: list[float]) -> float:
    """The next run of one profile of a target, moved within its slot (the interval over the target's profiles)
    to where it is farthest from the target's other profiles' next runs.

    A volume's profiles fall due together after their warm-up (each ran every minute, then each every interval
    from about the same moment), and jitter alone leaves them so: a fault that began just after them was first
    probed an interval later, and paged that much later (the example's four profiles at 300 s: 214 s to the
    first probe of a quarter throttle). Spread, the first probe after any moment comes within a slot (75 s).
    Each run moves at most half a slot, never sooner than half an interval after this run."""
    if not siblings or interval_seconds <= 0:
        return next_at
    slot = interval_seconds / (len(siblings) + 1)
    low = max(next_at - slot / 2, now + interval_seconds / 2)
    high = max(next_at + slot / 2, low)

    def clearance(t: float) -> float:   # to the nearest sibling, on the interval's circle
        return min(min(abs(t - s) % interval_seconds, interval_seconds - abs(t - s) % interval_seconds)
                   for s in siblings)

    candidates = [low + (high - low) * i / SPREAD_STEPS for i in range(SPREAD_STEPS + 1)]
    # the clearest, and of equally clear ones the nearest to where it would have run (a whole slot clear is
    # enough: no move for nothing)
    return max(candidates, key=lambda t: (min(round(clearance(t), 6), slot), -abs(t - next_at)))


def within_cover(next_ats: Mapping[str, float], now: float, cover_seconds: float,
                 margin_seconds: float) -> dict[str, float]:
    """A volume's profiles' next runs (profile -> when), just after one of them started at `now`, with the
    earliest drawn back so that the volume is measured again within cover_seconds (its interval as configured)
    less margin_seconds (a probe's cost and a step's retry: the run must have ended by then). Only the earliest
    moves, and only earlier; the others keep the budget's spacing.

    The budget's fit stretches every profile of a volume at once, and the spread moves a run at most half a slot:
    after a warm-up's probes ran a minute apart and spent the budget, each profile's next run came 427 s on, and
    the volume went 346-357 s unmeasured at a 300 s interval (two of five two-hour soak seeds)."""
    if not next_ats:
        return dict(next_ats)
    latest = now + max(cover_seconds - margin_seconds, 0.0)
    earliest = min(next_ats, key=lambda p: (next_ats[p], p))
    out = dict(next_ats)
    if out[earliest] > latest:
        out[earliest] = latest
    return out
