"""A burst bucket, learned from the volume's own traffic or given in the config, and the time its credits last
at the current draw (pure: windows in, a forecast and transitions out).

A burst-bucket volume (a cloud volume of gp2, st1 or sc1 type; a QEMU throttle group with a burst) runs at its
burst rate while its bucket holds credits and falls to its baseline when they are spent. The model: the balance
moves by (baseline - IOPS) x seconds each window, between 0 and the capacity; at a draw above the baseline it
lasts balance / (draw - baseline) seconds. Both clouds' gp2 buckets and QEMU's leaky bucket work so.

Learned in two steps:
- a fall: a steady higher rate, then straight after it a flat lower one held busy (a queue at full utilisation:
  the demand did not drop, the volume did; flat as a limit holds it, within a few per cent, where a demand
  wanders). The lower rate is the baseline; the higher the burst rate; what the
  stretches above the baseline drew before the fall, (rate - baseline) x their time, is the capacity (at least:
  the bucket may not have been full when they began). From the fall the balance is known to be 0.
- a recovery: after a quiet spell under the baseline, the volume delivers well past the baseline again. A fixed
  cap never does; a bucket refilled does. From then on the bucket is used.
A later fall anchors the balance at 0 again, and the capacity grows to what that drain shows when it was more.

How it can be wrong: a baseline that depends on the volume's size (gp2's is 3 IOPS per GiB: a volume grown
since is not the bucket learned); credits refilled while the host or the daemon was down (the balance saved at
the stop is refilled at the baseline rate for the time it was down, as if idle); a bucket by bytes rather than
requests (st1, sc1: this model counts IOPS only); a demand that itself fell by two thirds in one window to a
flat, busy rate (a job switching to larger requests) would look like a fall until no recovery comes, and a
candidate is never used before one does.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from iowarden.daemon.wording import duration_said


@dataclass(frozen=True)
class Bucket:
    burst_iops: float
    baseline_iops: float
    capacity_ios: float           # the I/Os above the baseline a full bucket lets through
    source: str                   # "configured", or "learned" (from a fall and a recovery)
    fell_at: float | None = None  # when the fall it was learned from began (Unix seconds)


@dataclass(frozen=True)
class BurstParams:
    horizon_seconds: float = 1800.0   # BurstCreditsLow when the credits last less than this at the current draw
    level_tolerance: float = 0.10     # windows within 10 % of a stretch's mean are one level
    fall_ratio: float = 1.5           # a fall: the burst rate at least this many times the baseline
    min_burst_windows: int = 4        # ... after at least this many windows at it
    flat_windows: int = 6             # ... held flat and busy at the lower rate this many windows
    flat_spread: float = 0.05         # ... its highest window and its lowest within this much of its mean (and
                                      # two requests a window: a count of a hundred is not finer than that)
    recover_ratio: float = 1.5        # a recovery: this many times the baseline again, after a quiet spell
    draw_windows: int = 4             # the current draw: the mean of the last windows
    raise_windows: int = 2            # the forecast under the horizon this many windows in a row
    clear_factor: float = 1.5         # cleared once the credits last this many horizons, or it stops drawing
    levels_kept: int = 16             # the stretches kept to measure what a drain drew


MAX_STEP_WINDOWS = 3   # windows between the burst rate and the baseline a fall may take
# A burst shorter than this is a job's spurt, not a bucket's credits: the shortest bucket shown (the lab's QEMU
# throttle group, 90 s at its burst rate) lasts longer, a cloud volume's minutes to hours. Eight seconds of an
# application unthrottled before a blkio cap read as "a burst bucket's credits spent, after 0 min at 27,539 IOPS".
MIN_BURST_SECONDS = 60.0


@dataclass(slots=True)   # up to levels_kept per device, on every device
class Level:
    """A stretch of windows at one rate. Its length is the windows' own seconds (the sampler's monotonic
    intervals); start and end are wall time, only to say when."""
    start: float
    end: float
    windows: int
    sum_iops: float
    busy_windows: int
    seconds: float = 0.0
    shape: tuple = ()     # the requests' direction and size: a fall is at one shape (backup reads, then
                          # compaction writes at a quarter of their IOPS, is a new job, not a bucket)
    lowest: float = 0.0   # its windows' lowest and highest IOPS: a volume held at a limit is flat, a demand
    highest: float = 0.0  # is not

    @property
    def mean(self) -> float:
        return self.sum_iops / self.windows


@dataclass(frozen=True)
class Forecast:
    """What the bucket has left, as iowarden estimates it (for /metrics, status and the alert's sentence)."""
    bucket: Bucket
    balance_ratio: float | None       # the estimated balance over the capacity; None where it cannot be known
    seconds_left: float | None        # at the current draw; None when not drawing on the credits
    draw_iops: float


@dataclass
class BurstTrack:
    """One volume's bucket, balance and stretches between windows."""
    bucket: Bucket | None = None      # in use: configured, or learned
    candidate: Bucket | None = None   # a fall seen, no recovery yet
    balance_ios: float | None = None  # from the last fall (0) or the configured full bucket on
    levels: deque = field(default_factory=deque)   # Level, oldest first; the last is the current one
    quiet_since_fall: bool = False
    draws: deque = field(default_factory=deque)
    low_windows: int = 0
    raised: bool = False
    forecast: Forecast | None = None


def configured(burst_iops: float, baseline_iops: float, capacity_ios: float) -> BurstTrack:
    """A bucket the config gives: used from the start, its balance taken as full (a volume starts with its
    credits; a restarted daemon loads the balance it saved instead)."""
    return BurstTrack(bucket=Bucket(burst_iops, baseline_iops, capacity_ios, "configured"), balance_ios=capacity_ios)


def learning() -> BurstTrack:
    """A volume with no bucket known yet: its falls and recoveries are watched."""
    return BurstTrack()


def step(t: BurstTrack, p: BurstParams, device: str, end: float, seconds: float, iops: float,
         busy: bool, shape: tuple = ()) -> list[tuple[str, str, dict]]:
    """One window of the volume's IOPS (both directions), whether it was held busy (a queue at full
    utilisation) and the shape of its requests (their main direction and size). Returns the transitions:
    ("raised" or "cleared", sentence, evidence)."""
    if t.levels.maxlen is None:
        t.levels, t.draws = deque(t.levels, maxlen=p.levels_kept), deque(t.draws, maxlen=p.draw_windows)
    _add_level(t, p, end, seconds, iops, busy, shape)
    t.draws.append(iops)
    fell = _fall(t, p)
    known = t.bucket or t.candidate
    if known is not None and t.balance_ios is not None and not fell:
        overdrawn = t.balance_ios <= 0 and iops > known.baseline_iops * (1 + p.level_tolerance)
        t.balance_ios = min(known.capacity_ios, max(0.0, t.balance_ios + (known.baseline_iops - iops) * seconds))
        if overdrawn and t.bucket is known and known.source == "learned":
            # still above the baseline with none left by the estimate: the bucket is larger than its first drain
            # showed (it was not full then); what it drew past zero is added
            t.bucket = Bucket(known.burst_iops, known.baseline_iops,
                              known.capacity_ios + (iops - known.baseline_iops) * seconds, "learned", known.fell_at)
    if t.candidate is not None and not fell:
        if iops < t.candidate.baseline_iops * (1 - p.level_tolerance):
            t.quiet_since_fall = True
        elif t.quiet_since_fall and iops >= p.recover_ratio * t.candidate.baseline_iops:
            t.bucket, t.candidate = t.candidate, None     # refilled: a bucket, not a fixed cap
    t.forecast = _forecast(t, p)
    return _verdict(t, p, device, fell, busy)


def _add_level(t: BurstTrack, p: BurstParams, end: float, seconds: float, iops: float, busy: bool,
               shape: tuple) -> None:
    cur = t.levels[-1] if t.levels else None
    if cur is not None and cur.shape == shape and abs(iops - cur.mean) <= p.level_tolerance * max(cur.mean, 1.0):
        cur.end, cur.windows, cur.sum_iops = end, cur.windows + 1, cur.sum_iops + iops
        cur.seconds += seconds
        cur.busy_windows += busy
        cur.lowest, cur.highest = min(cur.lowest, iops), max(cur.highest, iops)
    else:
        t.levels.append(Level(end - seconds, end, 1, iops, int(busy), seconds, shape, iops, iops))


def _fall(t: BurstTrack, p: BurstParams) -> bool:
    """A fall completed with this window: the current stretch has just become `flat_windows` long, every one
    of them busy, straight after stretches (at least `min_burst_windows` of windows and MIN_BURST_SECONDS, a
    window's step between them aside) at `fall_ratio` times its rate or more. Learns a candidate (or anchors a known bucket's balance
    at 0, and grows a learned one's capacity to what this drain drew, when more)."""
    low = t.levels[-1]
    if low.windows != p.flat_windows or low.busy_windows < low.windows or low.mean <= 0:
        return False
    count_step = 2 * low.windows / low.seconds if low.seconds > 0 else 0.0   # two requests a window, in IOPS
    if low.highest - low.lowest > p.flat_spread * low.mean + count_step:
        return False
    baseline = low.mean
    before = list(t.levels)[-2::-1]
    # the windows the fall came in, between the two rates: one on an idle machine, up to three on a loaded one
    # (a guest starved of CPU steps down over several 2 s windows: 150, 110, 70, then 50 IOPS)
    stepping = 0
    while (before and stepping + before[0].windows <= MAX_STEP_WINDOWS
           and baseline < before[0].mean < p.fall_ratio * baseline):
        stepping += before[0].windows
        before = before[1:]
    high = []
    for level in before:
        if level.mean < p.fall_ratio * baseline or level.shape != low.shape:
            break
        high.append(level)
    if sum(level.windows for level in high) < p.min_burst_windows or \
            sum(level.seconds for level in high) < MIN_BURST_SECONDS:
        return False
    burst = sum(level.mean * level.seconds for level in high) / sum(level.seconds for level in high)
    drawn = 0.0   # what the stretches above the baseline drew, back to the last one at or under it
    for level in list(t.levels)[-2::-1]:
        if level.mean <= baseline * (1 + p.level_tolerance):
            break
        drawn += (level.mean - baseline) * level.seconds
    known = t.bucket or t.candidate
    if t.bucket is not None and t.bucket.source == "configured":
        pass   # what the config says stands; the fall only anchors the balance
    elif known is not None and abs(known.baseline_iops - baseline) <= 2 * p.level_tolerance * known.baseline_iops:
        grown = Bucket(max(known.burst_iops, burst), known.baseline_iops, max(known.capacity_ios, drawn),
                       known.source, low.start)
        if t.bucket is not None:
            t.bucket = grown
        else:
            t.candidate = grown
    else:
        t.bucket, t.candidate = None, Bucket(burst, baseline, drawn, "learned", low.start)
    t.balance_ios = 0.0
    t.quiet_since_fall = False
    return True


def _forecast(t: BurstTrack, p: BurstParams) -> Forecast | None:
    b = t.bucket
    if b is None:
        return None
    draw = _draw(t, b, p)
    ratio = None if t.balance_ios is None or b.capacity_ios <= 0 else t.balance_ios / b.capacity_ios
    left = None
    if t.balance_ios is not None and t.balance_ios > 0 and draw > b.baseline_iops * (1 + p.level_tolerance):
        left = t.balance_ios / (draw - b.baseline_iops)
    return Forecast(b, ratio, left, draw)


def _draw(t: BurstTrack, b: Bucket, p: BurstParams) -> float:
    """The current draw: the mean of the last `draw_windows` windows, but while the volume draws on its credits
    only of the windows that did, its first one aside once another follows (a drain that began two windows ago
    is said at its own rate: with the quiet windows before it in the mean, its first forecast read twice the time
    it had)."""
    over = b.baseline_iops * (1 + p.level_tolerance)
    recent = list(t.draws)
    if recent[-1] > over:
        began = False
        while recent[0] <= over:
            recent.pop(0)
            began = True
        # the drain's first window holds the seconds before its load began: with it, the lab bucket's draw read
        # 133 IOPS of 150 and its credits 103 s where they lasted 84 s
        if began and len(recent) > 1:
            recent.pop(0)
    return sum(recent) / len(recent)


def _verdict(t: BurstTrack, p: BurstParams, device: str, fell: bool, busy: bool) -> list[tuple[str, str, dict]]:
    f = t.forecast
    if t.raised and fell:
        t.raised, t.low_windows = False, 0
        return [("cleared", f"{device}: its burst credits ran out at {_clock(t.levels[-1].start)}; it is held at its "
                 f"baseline (VolumeAtLimit names it)", {})]
    if f is None:
        t.low_windows = 0
        return []
    low = f.seconds_left is not None and f.seconds_left < p.horizon_seconds
    t.low_windows = t.low_windows + 1 if low else 0
    b = f.bucket
    if not t.raised and t.low_windows >= p.raise_windows:
        t.raised = True
        learned = (f"learned from its fall at {_clock(b.fell_at)}" if b.source == "learned" and b.fell_at
                   else b.source)
        ev = {"draw_iops": round(f.draw_iops, 1), "seconds_left": round(f.seconds_left, 1),
              "balance_ratio": round(f.balance_ratio or 0.0, 3), "baseline_iops": round(b.baseline_iops, 1),
              "burst_iops": round(b.burst_iops, 1), "capacity_ios": round(b.capacity_ios), "bucket": b.source}
        return [("raised", f"{device}: at {f.draw_iops:,.0f} IOPS its burst credits run out in about "
                 f"{duration_said(f.seconds_left)}; then it falls to its baseline of {b.baseline_iops:,.0f} IOPS "
                 f"(a bucket of {b.capacity_ios:,.0f} I/Os above the baseline, {learned})", ev)]
    if t.raised:
        # at its baseline with a queue is the fall under way (cleared when it is seen whole), not a draw that ended
        if f.seconds_left is None and f.draw_iops <= b.baseline_iops * (1 + p.level_tolerance) and not busy:
            t.raised = False
            return [("cleared", f"{device}: no longer drawing on its burst credits "
                     f"({f.draw_iops:,.0f} IOPS, its baseline {b.baseline_iops:,.0f})", {})]
        if f.seconds_left is not None and f.seconds_left >= p.clear_factor * p.horizon_seconds:
            t.raised = False
            return [("cleared", f"{device}: its burst credits last {duration_said(f.seconds_left)} at "
                     f"{f.draw_iops:,.0f} IOPS", {})]
    return []


def fall_clause(t: BurstTrack | None, ceiling_iops: float, tolerance: float = 0.2) -> str | None:
    """What VolumeAtLimit says of a ceiling at the bucket's baseline: "at its baseline of 300 IOPS since 14:05,
    its burst credits spent"; on a first fall, not yet seen to recover, that it may be either; None where no
    bucket explains it."""
    b = None if t is None else (t.bucket or t.candidate)
    if b is None or abs(ceiling_iops - b.baseline_iops) > tolerance * b.baseline_iops:
        return None
    since = _clock(t.levels[-1].start if t.levels else b.fell_at)
    if t.bucket is None:
        minutes = b.capacity_ios / max(b.burst_iops - b.baseline_iops, 1.0) / 60
        return (f"since {since}, after {minutes:,.0f} min at {b.burst_iops:,.0f} IOPS: a burst bucket's credits "
                f"spent (if it recovers after a quiet spell) or a limit set then")
    return (f"at its baseline of {b.baseline_iops:,.0f} IOPS since {since}, its burst credits spent "
            f"(it ran at {b.burst_iops:,.0f} IOPS before)")


def to_state(t: BurstTrack, now: float) -> dict | None:
    """The learned bucket and the balance, for the state database (a configured one is read from the config)."""
    if t.bucket is None and t.candidate is None:
        return None
    out = {"at": now, "balance_ios": t.balance_ios}
    for key, b in (("bucket", t.bucket), ("candidate", t.candidate)):
        if b is not None:
            out[key] = {"burst_iops": b.burst_iops, "baseline_iops": b.baseline_iops,
                        "capacity_ios": b.capacity_ios, "source": b.source, "fell_at": b.fell_at}
    return out


def from_state(st: dict, now: float, into: BurstTrack | None = None) -> BurstTrack:
    """A saved bucket, its balance refilled at the baseline for the time the daemon was down (as if the volume
    was idle then: a volume busy while iowarden was stopped has less than this says). A configured bucket in
    `into` keeps its parameters and takes the saved balance."""
    t = into or BurstTrack()
    for key in ("bucket", "candidate"):
        b = st.get(key)
        if b is not None and not (key == "bucket" and t.bucket is not None and t.bucket.source == "configured"):
            setattr(t, key, Bucket(float(b["burst_iops"]), float(b["baseline_iops"]), float(b["capacity_ios"]),
                                   str(b["source"]), None if b.get("fell_at") is None else float(b["fell_at"])))
    balance = st.get("balance_ios")
    active = t.bucket or t.candidate
    if balance is not None and active is not None:
        down = max(0.0, now - float(st.get("at", now)))
        t.balance_ios = min(active.capacity_ios, float(balance) + active.baseline_iops * down)
    return t


def _clock(unix: float | None) -> str:
    return "?" if unix is None else time.strftime("%H:%M", time.localtime(unix))
