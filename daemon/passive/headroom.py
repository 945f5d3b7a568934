"""How far a device's load can grow before its latency turns up: the knee of its learned latency-vs-load
curve, and the headroom of its recent peak against it (pure).

The knee is the load at which the curve's median await reaches `multiple` (2x by default) times its
unloaded await: the median of the lightest load bin it has learned. It is read between the two learned bins
around it (linear in log load and log await), as a queue-depth sweep's knee is read between its steps, each bin
at its own load (the geometric mean of its windows'), not its centre: a volume held at a ceiling of 2,400 IOPS
fills the bin of 2,048-2,896 at its top, and read at the centres its knee came out at 1,816 (24 % under the
ceiling characterize found). No figure is better than an invented one, so there is none (and the reason is
said) where:
- fewer than two load bins are learned;
- the curve never reaches the multiple: the knee lies beyond the highest load the device has carried
  (`seen_up_to` says how far it is known to be at least); or, by IOPS, reaches it with no queue formed
  (below);
- the learned bins around the crossing are more than an octave apart: the curve has not seen loads near it;
- the lightest learned load is within two octaves of the knee: no load light enough to call unloaded.
By IOPS the knee is also where a queue has formed: at least `multiple` - 1 requests in the device on average
(load times await, Little's law), as many as a single queue fed at random holds at that multiple. A device
whose unloaded await is tens of microseconds (a loop device, an NVMe read) doubles it with no request waiting
behind another, as the CPU's share of it moves: a stacked loop volume under a ceiling of 2,400 IOPS, read one
request at a time, awaited 0.06 ms at 150 IOPS and 0.02 ms at 1,800 on one machine; on another its 1,800-IOPS
bin went over twice its lightest (one request at a time: under one in the device) and its knee read 1,586 IOPS,
where its queue formed at 2,400 (1.7 ms, four requests in it).
The headroom is the knee over the peak load of the last half hour to hour, held for three windows (1.8: the
peak could grow 1.8x before the knee). How it can be wrong: a curve learned at one request size read at
another (a device's load mix changes over the day: the knee of 4 KiB reads is not that of 1 MiB writes, and
both fill one curve by IOPS); a cache that serves the light loads and not the heavy ones makes the knee look
earlier than the device's own; a device that serves one request at a time fed in bursts (a disk) queues with
fewer requests in it on average, and its knee reads later than the load where its await doubled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from iowarden.daemon.passive.curve import BINS_PER_OCTAVE, LatencyCurve

KNEE_MULTIPLE = 2.0
MAX_GAP_BINS = BINS_PER_OCTAVE          # learned bins at most an octave apart around the crossing
MIN_OCTAVES_BELOW = 2.0                 # the unloaded bin at least two octaves under the knee


@dataclass(frozen=True)
class Knee:
    load: float | None            # the load at the knee (in `unit`); None where the curve cannot say
    unit: str                     # "iops" or "kib" (KiB/s), the curve's load
    unloaded_ms: float | None     # the median await at the lightest learned load
    seen_up_to: float | None      # the centre of the heaviest learned load bin
    why_none: str | None = None


def bin_centre(b: int) -> float:
    return 2 ** ((b + 0.5) / BINS_PER_OCTAVE)


def queue_floor(multiple: float) -> float:
    """The fewest requests in a device, on average, whose await has reached `multiple` times its unloaded
    await by queueing: a single queue fed at random (M/M/1), the least parallel a device can be, reaches m
    times its service time with m - 1 requests in it (one at 2x); a device that serves several at once, or
    requests that arrive more evenly, hold more there."""
    return max(multiple - 1.0, 0.0)


def _crossing(below: float, above: float, target: float) -> float:
    """Where between two bins (0 at the lighter, 1 at the heavier, linear in logs) a rising figure reaches
    target; 0 where the lighter bin has reached it already."""
    if below >= target or above <= below:
        return 0.0
    return (math.log(target) - math.log(below)) / (math.log(above) - math.log(below))


def knee_of(curve: LatencyCurve, unit: str, min_windows: int, multiple: float = KNEE_MULTIPLE) -> Knee:
    learned = sorted(b for b, total in curve.totals.items() if total >= min_windows)
    if len(learned) < 2:
        return Knee(None, unit, None, bin_centre(learned[-1]) if learned else None, "too few loads learned")
    medians = [curve.bin_median(b) for b in learned]
    loads = [curve.bin_load(b) for b in learned]
    unloaded, top = medians[0], loads[-1]
    target = multiple * unloaded
    # by IOPS, the requests in the device at each bin (Little's law: load times await); a bytes curve knows
    # no request count, and its crossing stands on the await alone
    floor = queue_floor(multiple) if unit == "iops" else 0.0
    in_flight = [load * ms / 1000.0 for load, ms in zip(loads, medians)] if floor else [math.inf] * len(loads)
    for i in range(1, len(learned)):
        if medians[i] < target or in_flight[i] < floor:
            continue
        lo, hi = learned[i - 1], learned[i]
        if hi - lo > MAX_GAP_BINS:
            return Knee(None, unit, unloaded, top, "no loads learned near the knee")
        # the lightest load between the two bins where both hold: the await at the multiple, and a queue
        f = max(_crossing(medians[i - 1], medians[i], target), _crossing(in_flight[i - 1], in_flight[i], floor))
        load = math.exp(math.log(loads[i - 1]) + f * (math.log(loads[i]) - math.log(loads[i - 1])))
        if math.log2(load / loads[0]) < MIN_OCTAVES_BELOW:
            return Knee(None, unit, unloaded, top, "no load light enough learned to call unloaded")
        return Knee(load, unit, unloaded, top)
    if any(m >= target for m in medians[1:]):
        return Knee(None, unit, unloaded, top, f"no queue where its latency reached {multiple:g}x its unloaded "
                                               f"(under {floor:g} request in the device at every load seen)")
    return Knee(None, unit, unloaded, top, f"under {multiple:g}x its unloaded latency at every load seen")


def headroom_ratio(knee: Knee, peak_load: float | None) -> float | None:
    """The knee over the recent peak load: how many times the peak could grow before the knee."""
    if knee.load is None or not peak_load or peak_load <= 0:
        return None
    return knee.load / peak_load


@dataclass(slots=True)
class PeakLoad:
    """The peak load of the last `blocks` blocks of `block_windows` windows (by default 30 min to an hour at
    15 s): a few numbers per device and direction, not a ring of every window.

    The peak is the load held for `held_windows` windows running (the least of them), not one window's: a
    writer that stalls and catches up puts one window at 1.4x its rate (fio at 1,016 IOPS read 1,422 for a
    second on a loaded host), and a burst of one window neither holds a queue long enough to matter nor is the
    load to plan for; a load held for 45 s at 15 s windows is."""
    block_windows: int = 120
    held_windows: int = 3
    blocks: tuple = ()
    current: float = 0.0
    count: int = 0
    recent: tuple = ()

    def add(self, load: float) -> None:
        self.recent = (self.recent + (load,))[-self.held_windows:]
        if len(self.recent) == self.held_windows:
            self.current = max(self.current, min(self.recent))
        self.count += 1
        if self.count >= self.block_windows:
            self.blocks = (self.blocks + (self.current,))[-1:]
            self.current, self.count = 0.0, 0

    def peak(self) -> float | None:
        seen = self.blocks + ((self.current,) if self.count else ())
        return max(seen) if seen and max(seen) > 0 else None
