"""A device's own latency-vs-load curve, learned from the traffic it carries.

Why this shape:
- Bins of log load (half an octave each): latency depends on load, and load
  spans decades (a disk idles at 5 IOPS at night and carries 5,000 at noon).
  A window is compared only with windows that carried about the same load.
- A histogram of log latency per bin (eighth-octave buckets), not a mean: the
  quantiles are robust to the outliers that are the faults themselves, and a
  histogram is a few dozen integers however many windows it has seen.
- Forgetting by halving: when a bin holds more than `cap` windows every count is
  halved, so the curve follows a device that changes over weeks, and a bin's
  state stays bounded (about 60 buckets at most).
- Unlearned load: a window at a load no bin has learned yet is compared with
  the nearest learned bin at a *higher* load (latency grows with load, so that
  bin's normal is an upper bound for this one: the same latency at a lower load
  is a fault), within four octaves (further below, a lightly loaded device's
  power states may make it slower than at its usual load), or within eight for a
  device busy all the window (a saturated device is never idle long enough for a
  power state; a volume collapsed to 5 % of its load kept its device 99 % busy at
  4.3 octaves below its lightest learned bin, and went unjudged). Only higher load
  than ever seen is not judged: that is new territory along the curve, learned,
  not alerted on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

BINS_PER_OCTAVE = 2
BUCKETS_PER_OCTAVE = 8
LOOK_UP_BINS = 8          # an upper bound from at most 4 octaves above: further away it says nothing
SATURATED_LOOK_UP_BINS = 16   # for a window its device was busy all of (SATURATED_UTIL_PERCENT): 8 octaves
SATURATED_UTIL_PERCENT = 90.0
MIN_AWAIT_MS = 0.001


def load_bin(load: float) -> int:
    return math.floor(math.log2(max(load, 1e-3)) * BINS_PER_OCTAVE)


def _bucket(await_ms: float) -> int:
    return round(math.log2(max(await_ms, MIN_AWAIT_MS)) * BUCKETS_PER_OCTAVE)


def _await_of(bucket: int) -> float:
    return 2 ** (bucket / BUCKETS_PER_OCTAVE)


@dataclass(frozen=True)
class Normal:
    """What the curve allows at one load."""
    median_ms: float
    high_ms: float           # the bin's 99th percentile: the top of its normal spread
    windows: int             # windows the bin has learned (after forgetting)
    exact: bool              # False: an upper bound borrowed from a bin at higher load


@dataclass
class LatencyCurve:
    bins: dict[int, dict[int, float]] = field(default_factory=dict)   # load bin -> latency bucket -> weight
    cap: int = 400
    totals: dict[int, float] = field(default_factory=dict)       # load bin -> its weight, kept beside it
    # load bin -> the weighted sum of its windows' log2 loads: where in its half octave the bin's load lies (a
    # ceiling's windows sit at its top edge, a walk's steps anywhere), for the knee read between bins
    load_logs: dict[int, float] = field(default_factory=dict)
    _normals: dict = field(default_factory=dict, repr=False)       # load bin -> Normal, until it learns again
    _medians: dict = field(default_factory=dict, repr=False)       # load bin -> median_along's median, likewise
    _octaves: dict = field(default_factory=dict, repr=False)       # load octave -> (median, windows), likewise

    def __post_init__(self):
        self.totals = {b: sum(h.values()) for b, h in self.bins.items()}

    def learn(self, load: float, await_ms: float, weight: float = 1.0) -> None:
        lb = load_bin(load)
        hist = self.bins.setdefault(lb, {})
        b = _bucket(await_ms)
        hist[b] = hist.get(b, 0.0) + weight
        self.totals[lb] = self.totals.get(lb, 0.0) + weight
        self.load_logs[lb] = self.load_logs.get(lb, 0.0) + weight * math.log2(max(load, 1e-3))
        self._normals.pop(lb, None)
        self._medians.pop(lb, None)
        self._octaves.pop(lb // BINS_PER_OCTAVE, None)
        if self.totals[lb] > self.cap:
            mean_log = self.load_logs[lb] / self.totals[lb]
            for k in list(hist):
                hist[k] /= 2
                if hist[k] < 0.25:
                    del hist[k]
            self.totals[lb] = sum(hist.values())
            self.load_logs[lb] = mean_log * self.totals[lb]

    def windows(self) -> int:
        return round(sum(self.totals.values()))

    def _normal_of(self, lb: int, exact: bool) -> Normal:
        n = self._normals.get(lb)
        if n is None:
            hist = self.bins[lb]
            n = self._normals[lb] = Normal(_quantile(hist, 0.5), _quantile(hist, 0.99), round(self.totals[lb]), True)
        return n if exact else Normal(n.median_ms, n.high_ms, n.windows, False)

    def normal_at(self, load: float, min_windows: int, reach_bins: int = LOOK_UP_BINS) -> Normal | None:
        """The normal latency at this load, or None where the curve cannot say (`reach_bins`: how far above an
        unlearned load a learned bin may lend its normal as a bound)."""
        b = load_bin(load)
        for step in range(reach_bins + 1):
            if self.totals.get(b + step, 0.0) >= min_windows:
                return self._normal_of(b + step, exact=step == 0)
        return None

    def median_along(self, load: float, min_windows: int) -> float | None:
        """The curve's median latency at this load, read between the centres of the two learned bins around
        it (linear in log load and log latency); None unless both are learned. A bin is half an octave
        wide: without reading between bins, loads 1.3x apart would mostly read the same latency; and a
        bin's own median at the edge of what the device has carried is learned from the loads below."""
        x = math.log2(max(load, 1e-3)) * BINS_PER_OCTAVE - 0.5   # in bins, 0 at a bin's centre
        lo = math.floor(x)
        known = {}
        for b in (lo, lo + 1):
            if self.totals.get(b, 0.0) >= min_windows:
                known[b] = self.bin_median(b)
        if len(known) < 2:
            return None
        f = x - lo
        return math.exp((1 - f) * math.log(known[lo]) + f * math.log(known[lo + 1]))

    def bin_load(self, b: int) -> float:
        """A bin's load: the geometric mean of its windows' loads, or its centre where a curve saved without them
        says nothing more."""
        total, logs = self.totals.get(b, 0.0), self.load_logs.get(b)
        if logs is None or total <= 0:
            return 2 ** ((b + 0.5) / BINS_PER_OCTAVE)
        return 2 ** (logs / total)

    def bin_median(self, b: int) -> float:
        """A learned bin's median await (read inside its bucket), kept until the bin learns again."""
        m = self._medians.get(b)
        if m is None:
            m = self._medians[b] = median_between_buckets(self.bins[b])
        return m

    def octave_medians(self, min_windows: int, most: int) -> dict[int, tuple[float, int]]:
        """The median latency of each whole octave of load (2^k to 2^(k+1)) it has learned at least min_windows
        windows in, the `most` most learned: {k: (median ms, windows)}. A level to compare with other devices
        of its class at the same loads (the fleet's): a device slow from its first day has learned a slow normal,
        and only its peers say so. Whole octaves, not the bins, so that few series are enough."""
        out = {}
        for k in {b // BINS_PER_OCTAVE for b in self.totals}:
            got = self._octaves.get(k)
            if got is None:
                merged: dict[int, float] = {}
                for b in range(k * BINS_PER_OCTAVE, (k + 1) * BINS_PER_OCTAVE):
                    for bucket, w in self.bins.get(b, {}).items():
                        merged[bucket] = merged.get(bucket, 0.0) + w
                windows = round(sum(merged.values()))
                got = self._octaves[k] = (median_between_buckets(merged) if merged else 0.0, windows)
            if got[1] >= min_windows:
                out[k] = got
        return dict(sorted(out.items(), key=lambda kv: (-kv[1][1], kv[0]))[:most])

    def lowest_load_normal(self, min_windows: int) -> Normal | None:
        """The device's latency at the lightest load it has learned: what a request costs without a queue."""
        for b in sorted(self.totals):
            if self.totals[b] >= min_windows:
                return self._normal_of(b, exact=True)
        return None

    def to_state(self) -> dict:
        return {"cap": self.cap, "bins": {str(b): {str(k): v for k, v in h.items()} for b, h in self.bins.items()},
                "loads": {str(b): round(self.load_logs[b] / self.totals[b], 6) for b in self.bins
                          if self.totals.get(b, 0.0) > 0 and b in self.load_logs}}

    @classmethod
    def from_state(cls, st: dict) -> "LatencyCurve":
        curve = cls({int(b): {int(k): float(v) for k, v in h.items()} for b, h in st["bins"].items()},
                    int(st.get("cap", 400)))
        # each bin's mean log load, kept only where it lies inside its own bin (the state is read back as input;
        # a curve saved before the loads were kept reads its bins' centres)
        for b, mean_log in (st.get("loads") or {}).items():
            b, mean_log = int(b), float(mean_log)
            if b in curve.totals and b <= mean_log * BINS_PER_OCTAVE < b + 1:
                curve.load_logs[b] = mean_log * curve.totals[b]
        return curve


def _quantile(hist: dict[int, float], q: float) -> float:
    total = sum(hist.values())
    seen = 0.0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= q * total:
            return _await_of(b)
    return _await_of(max(hist))


def median_between_buckets(hist: dict[int, float]) -> float:
    """The median read inside its bucket (its weight spread evenly across the bucket): a ratio of two bins'
    medians then moves by less than the bucket's 9 % step when the load does."""
    half, seen = sum(hist.values()) / 2, 0.0
    for b in sorted(hist):
        if seen + hist[b] >= half:
            return 2 ** ((b - 0.5 + (half - seen) / hist[b]) / BUCKETS_PER_OCTAVE)
        seen += hist[b]
    return _await_of(max(hist))
