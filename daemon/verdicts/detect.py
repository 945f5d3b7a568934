"""Is this volume slower than its own normal? One detector per (volume, profile, metric).

Design, and why:
- Log space: storage numbers are multiplicative (a volume is "2x slower"), and
  their noise is roughly log-normal.
- Robust baseline: median and 1.4826*MAD of the last `window` accepted values,
  with a floor on the spread, so one wild probe moves nothing and a very quiet
  volume does not page on a 3 % wobble.
- Direction: the deviation is signed so that positive is worse (IOPS and
  bandwidth down, latency up). Improvements never alert.
- One-sided CUSUM over z-scores capped at `z_cap`: a single spike adds at most
  z_cap - k, so isolated spikes, pairs and a few scattered spikes cannot reach
  the threshold h, while a sustained shift adds z_cap - k every probe and does.
- Hysteresis: an alert clears only after `clear_probes` probes in a row back
  within `clear_z` spreads of the baseline. clear_z equals k: a value below k
  pulls the CUSUM down and could never raise an alert, so an alert held open
  for it would be stale (a volume back at 93 % of its median after an outage
  would stay "critical" until an operator accepted a new normal). The
  hysteresis is the CUSUM itself: raising again takes a sum above h.
- Frozen while degraded: values are not learned while the CUSUM is above h/2
  or an alert is open, so a degradation is never learned as the new normal. A
  new normal is accepted by an operator, or automatically after
  `auto_accept_probes` probes of stable degradation (0: never), and that is
  reported as a baseline change.
- Slow drift: the rolling median would follow a change spread over days, so
  the centre is also compared with where it stood when this normal was learned
  (the anchor); creeping more than `drift_ratio` away alerts too.
- Collapse: a value 10x worse than normal and 2.5x worse than anything the volume has shown, confirmed
  by the next probe, raises at once (a 1000-fold collapse is not a spike to be waited out for five
  probes); a single such value never raises.
- Outside its range: on a volume whose probes scatter widely (a busy host: 230 to 1,700 IOPS while it
  learned), a steady fall to 87 IOPS is barely a spread off and the CUSUM never moves, while every probe sits
  below anything the volume showed. outside_run probes in a row 2x off normal and 1.25x beyond the worst it
  has learned raise; the run is not learned, and the alert does not clear while probes stay outside.
- Warm-up: no statistical alert before `warmup_probes` values are learned.
- A floor: a latency less than `latency_floor_seconds` (50 µs) above its normal is judged as normal (and
  learned as it was), however large the ratio: on a RAM-fast volume a busy CPU doubles a 14 µs read.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from iowarden.probes.vocabulary import BASELINED_LATENCIES, HIGHER_IS_WORSE, LOWER_IS_WORSE

from iowarden.daemon.alert_kinds import severity_of
from iowarden.daemon.verdicts.window import SortedWindow

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class DetectorParams:
    window: int = 288            # about a day of probes at a 5 min interval
    warmup_probes: int = 12
    min_spread_log: float = 0.05  # ~5 %: below this, variation is not evidence
    z_cap: float = 5.0
    k: float = 1.5               # allowance per probe: drift below 1.5 spreads is noise
    h: float = 11.0              # > 3 capped values (3 * 3 = 9) and a gapped 4 (10), < 4 of a clear shift (12)
    extreme_ratio: float = 2.5   # a value this many times worse *and* extreme_z spreads off is a spike
    extreme_z: float = 10.0      # until it repeats in extreme_run probes in a row: then it is the
    extreme_run: int = 5         # volume's state (on a quiet volume a 3x spike is 20 spreads out)
    collapse_ratio: float = 10.0  # a value this many times worse than normal, and extreme_ratio worse than
    collapse_run: int = 2        # anything the volume has shown, is a collapse once the next probe confirms it
    outside_ratio: float = 2.0   # outside_run probes in a row this many times worse than normal and
    outside_margin: float = 1.25  # this many times worse than the worst value learned: the volume left its
    outside_run: int = 5         # range, however widely its probes scatter (a CUSUM of z-scores cannot see it)
    drift_probes: int = 24       # the recent median the drift rule compares with the anchor (2 h at 5 min)
    cooldown_probes: int = 48    # after a clear, raising again takes twice h for this long: a volume that
                                 # settled just off its normal does not page, clear and page again
    clear_z: float = 1.5         # = k: back within what could never raise an alert (see the docstring)
    clear_probes: int = 3
    auto_accept_probes: int = 0  # 0: a new normal needs an operator
    critical_ratio: float = 2.0  # severity "critical" when the value is this many times worse
    drift_ratio: float = 1.5     # the baseline may creep this far from where it was learned
    # a latency less than this above its normal is no evidence, whatever the ratio: a RAM-fast volume's 14 µs
    # p50 read 34 µs while the host's two CPUs were busy (2.5x: paged critical) and a device 2x slower than an
    # NVMe drive's 80 µs still moves by more. The passive detector's floor is 20 µs of await (floor_ms)
    latency_floor_seconds: float = 50e-6

    @classmethod
    def from_config(cls, detector) -> "DetectorParams":
        """From the [detector] section: what the daemon judges with and `status` reports with."""
        return cls(**{name: getattr(detector, key) for key, name in DETECTOR_KEYS.items()})


# The [detector] keys and the fields they set: what an operator may tune, each with its range in the schema.
DETECTOR_KEYS = {"warmup_probes": "warmup_probes", "window_probes": "window", "drift_ratio": "drift_ratio",
                 "auto_accept_probes": "auto_accept_probes"}
# Internal: the CUSUM's allowance and threshold, the spike and clear rules, chosen on the recorded traces
# (bench/detector_traces.py, docs/detector.md); changing one changes the false-alarm and delay figures there.
DETECTOR_INTERNAL = frozenset({"min_spread_log", "z_cap", "k", "h", "extreme_ratio", "extreme_z", "extreme_run",
                               "collapse_ratio", "collapse_run", "outside_ratio", "outside_margin", "outside_run",
                               "drift_probes", "cooldown_probes", "clear_z", "clear_probes", "critical_ratio",
                               "latency_floor_seconds"})


@dataclass
class Verdict:
    value: float
    baseline: float | None       # the baseline centre, in the metric's own units
    z: float                     # signed, positive = worse, uncapped
    cusum: float
    alerting: bool
    changed: str | None = None   # "raised", "cleared", "accepted" on a transition
    severity: str | None = None  # "warning" or "critical" while alerting
    learning: bool = False       # still in warm-up
    reason: str | None = None    # "shift" (a sudden change) or "drift" (the normal crept away)


@dataclass
class Detector:
    metric: str
    params: DetectorParams = field(default_factory=DetectorParams)
    values: deque = field(default_factory=deque)     # accepted log-values, newest last
    recent: deque = field(default_factory=deque)     # last raw values, accepted or not
    anchor: float | None = None                      # log centre when this normal was learned
    cusum: float = 0.0
    shift_alerting: bool = False
    drift_alerting: bool = False
    calm_streak: int = 0
    degraded_streak: int = 0
    extreme_streak: int = 0
    collapse_streak: int = 0
    outside_streak: int = 0
    cooldown: int = 0
    shown: deque = field(default_factory=deque)      # signed log-values of every probe seen (spikes too), a window
    pending: list = field(default_factory=list)      # collapse candidates not yet confirmed (shown once they are not)
    short: deque = field(default_factory=deque)      # the last drift_probes log-values, learned or not

    def __post_init__(self):
        # the metric's floor in its own units (a latency in seconds, or the kernel's await in ms)
        self.floor = (self.params.latency_floor_seconds if self.metric in BASELINED_LATENCIES else
                      self.params.latency_floor_seconds * 1e3 if self.metric == "await_ms" else 0.0)
        if self.metric in HIGHER_IS_WORSE:
            self.sign = 1.0
        elif self.metric in LOWER_IS_WORSE:
            self.sign = -1.0
        else:
            raise ValueError(f"unknown metric direction for {self.metric!r}")
        self.values = SortedWindow(self.values, maxlen=self.params.window)
        self.recent = deque(self.recent, maxlen=max(self.params.warmup_probes, 1))
        self.short = deque(self.short, maxlen=self.params.drift_probes)
        self.shown = deque(self.shown, maxlen=self.params.window)

    @property
    def alerting(self) -> bool:
        return self.shift_alerting or self.drift_alerting

    def baseline(self) -> tuple[float, float] | None:
        """(centre, spread) in log units, or None during warm-up."""
        if len(self.values) < self.params.warmup_probes:
            return None
        vals = self.values
        centre = vals.median()
        mad = vals.mad(centre)
        # a MAD of a dozen autocorrelated values often reads low: widen it while the sample is small
        # (x1.67 at 12 values, x1.16 at 50, x1.03 at a day of probes), or the first hour after warm-up
        # pages on noise
        small_sample = 1 + 8 / len(vals)
        return centre, max(MAD_TO_SIGMA * mad * small_sample, self.params.min_spread_log)

    def _worst_learned(self) -> float:
        """The worst learned value, signed (positive is worse)."""
        return self.values.highest() if self.sign > 0 else -self.values.lowest()

    def deviation(self) -> float | None:
        """The last value's distance from the baseline in spreads (positive is worse); None while learning.

        Read from the detector's own state, so it is there again after a restart."""
        return self.spreads_from_normal(self.recent[-1]) if self.recent else None

    def spreads_from_normal(self, value: float) -> float | None:
        """A value's distance from the learned normal in spreads (positive is worse), the detector unchanged;
        None while learning."""
        base = self.baseline()
        if base is None:
            return None
        value = value if value > 0 and math.isfinite(value) else 1e-9
        return self.sign * (math.log(value) - base[0]) / base[1]

    def accept_new_normal(self, recent: list[float]) -> None:
        """Forget the old normal; learn again from these values (operator's accept)."""
        self.values.clear()
        for v in recent:
            if v > 0:
                self.values.append(math.log(v))
        self.anchor = None
        self.cusum, self.calm_streak, self.degraded_streak = 0.0, 0, 0
        self.shift_alerting = self.drift_alerting = False

    def update(self, value: float) -> Verdict:
        p = self.params
        if not (value > 0 and math.isfinite(value)):
            # zero IOPS is the worst case, not a value to take the log of
            value = 1e-9
        x = math.log(value)
        self.recent.append(value)
        base = self.baseline()
        if base is None:
            self.values.append(x)
            self.short.append(x)
            return Verdict(value, math.exp(self.values.median()), 0.0, 0.0, False, learning=True)
        centre, spread = base
        if self.anchor is None or (len(self.values) < p.window and not self.alerting):
            # the anchor settles as the first window fills: a median of a dozen probes is too rough
            # a reference for a drift rule that compares medians, not single probes
            self.anchor = centre
        was_alerting = self.alerting
        x_learned = x
        if self.floor and x > centre and value - math.exp(centre) < self.floor:
            x = centre   # judged as normal (learned as it was): too little above it to be evidence
        z = self.sign * (x - centre) / spread

        # fast: a shift, by CUSUM over capped z-scores. A value far beyond the volume's noise and
        # at least 2.5x off is a spike and adds nothing, until it repeats for extreme_run probes:
        # then it is where the volume is, and alerts at once.
        # A collapse is not a spike: 10x worse than normal and far beyond the worst the volume has shown,
        # twice in a row (the next probe, minutes later, confirms it), raises at once; a single one never does.
        # "Anything the volume has shown" counts its spikes: on a volume whose probes spike 100x now and then,
        # a 100x probe is one more of them. A candidate is kept out of it until the next probe says whether it
        # was a collapse (then it stays out: the collapse is not what the volume shows when healthy).
        worst_shown = max(self._worst_learned(), max(self.shown, default=float("-inf")))
        collapse = (self.sign * (x - centre) > math.log(p.collapse_ratio)
                    and self.sign * x - worst_shown > math.log(p.extreme_ratio))
        if collapse:
            self.collapse_streak += 1
            self.pending.append(self.sign * x_learned)
        else:
            if self.collapse_streak < p.collapse_run:
                self.shown.extend(self.pending)   # it was a spike after all: the volume has shown it
            self.collapse_streak, self.pending = 0, []
            if not self.alerting:
                self.shown.append(self.sign * x_learned)
        if self.collapse_streak >= p.collapse_run:
            self.cusum = max(self.cusum, p.h + p.z_cap)
        # outside: the run of probes beyond anything learned, on a volume too noisy for the CUSUM to see it. Its
        # range is the learned values only (spikes are not learned), and the run is not learned either
        worst_learned = self._worst_learned()
        outside = (self.sign * (x - centre) > math.log(p.outside_ratio)
                   and self.sign * x - worst_learned > math.log(p.outside_margin))
        self.outside_streak = self.outside_streak + 1 if outside else 0
        if self.outside_streak >= p.outside_run:
            self.cusum = max(self.cusum, p.h + p.z_cap)
        if self.sign * (x - centre) > math.log(p.extreme_ratio) and z > p.extreme_z:
            self.extreme_streak += 1
            if self.extreme_streak >= p.extreme_run:
                self.cusum = max(self.cusum, p.h + p.z_cap)
        else:
            self.extreme_streak = 0
            self.cusum = max(0.0, self.cusum + min(z, p.z_cap) - p.k)
        h = p.h * 2 if self.cooldown > 0 else p.h
        self.cooldown = max(0, self.cooldown - 1)
        if not self.shift_alerting and self.cusum > h:
            self.shift_alerting, self.calm_streak = True, 0
        elif self.shift_alerting:
            self.calm_streak = self.calm_streak + 1 if z < p.clear_z and not outside else 0
            if self.calm_streak >= p.clear_probes:
                self.shift_alerting, self.cusum = False, 0.0
                self.cooldown = p.cooldown_probes

        # slow: the recent median has crept away from where the normal was learned (a drift too
        # gradual for the CUSUM, which the day-long rolling median would absorb and, lagging half a
        # window behind, see only after the drift ended)
        drift = (self.sign * (statistics.median(self.short) - self.anchor)
                 if len(self.short) >= p.drift_probes else 0.0)   # a median of a few probes is no drift
        if drift > 0 and self.floor and math.exp(statistics.median(self.short)) - math.exp(self.anchor) < self.floor:
            drift = 0.0   # crept, but by less than the floor: no evidence either
        # on a volume whose probes scatter sevenfold, a median of 24 probes wanders past 1.5x by itself: the
        # drift must also be five standard errors of that median (1.2533 spreads / sqrt n) to be one
        drift_limit = max(math.log(p.drift_ratio), 5 * 1.2533 * spread / math.sqrt(p.drift_probes))
        if not self.drift_alerting and drift > drift_limit:
            self.drift_alerting = True
        elif self.drift_alerting and drift < drift_limit / 2:
            self.drift_alerting = False

        if self.shift_alerting or self.cusum > p.h / 2 or self.extreme_streak or self.outside_streak:
            self.degraded_streak += 1
        else:
            self.degraded_streak = 0
            self.values.append(x_learned)
            self.short.append(x_learned)   # learned values only: a shift alert's own probes are not a drift
        changed = None
        if self.alerting and not was_alerting:
            changed = "raised"
        elif was_alerting and not self.alerting:
            changed = "cleared"
        if self.alerting and p.auto_accept_probes and self.degraded_streak >= p.auto_accept_probes:
            # stable for long enough at the new level: that is the volume's normal now
            self.accept_new_normal(list(self.recent))
            changed = "accepted"
        severity = None
        if self.alerting:
            worst = max(self.sign * (x - centre), drift)
            severity = "critical" if worst >= math.log(p.critical_ratio) else "warning"
        reason = ("shift" if self.shift_alerting else "drift") if self.alerting else None
        return Verdict(value, math.exp(centre), z, self.cusum, self.alerting, changed, severity, reason=reason)

    def to_state(self) -> dict:
        return {"metric": self.metric, "values": list(self.values), "recent": list(self.recent),
                "anchor": self.anchor, "cusum": self.cusum, "shift_alerting": self.shift_alerting,
                "drift_alerting": self.drift_alerting, "calm_streak": self.calm_streak,
                "degraded_streak": self.degraded_streak, "extreme_streak": self.extreme_streak,
                "collapse_streak": self.collapse_streak, "outside_streak": self.outside_streak,
                "shown": list(self.shown), "pending": list(self.pending),
                "cooldown": self.cooldown,
                "short": list(self.short)}

    @classmethod
    def from_state(cls, state: dict, params: DetectorParams | None = None) -> "Detector":
        fields_ = {k: v for k, v in state.items() if k not in ("values", "recent", "metric", "short", "shown")}
        # a state saved before `short` existed: the recent raw values stand in for it
        short = state.get("short") or [math.log(v) for v in state.get("recent", []) if v > 0]
        return cls(state["metric"], params or DetectorParams(), deque(state["values"]),
                   deque(state.get("recent", [])), short=deque(short), shown=deque(state.get("shown", [])), **fields_)


def replay(values: list[tuple[float, float]], metric: str, params: DetectorParams = DetectorParams()) -> list[dict]:
    """Run a detector over (timestamp, value) pairs; the alert intervals as {start, end, severity}."""
    det = Detector(metric, params)
    intervals: list[dict] = []
    open_iv = None
    for ts, v in values:
        verdict = det.update(v)
        if verdict.changed == "raised":
            # what the daemon would have raised: VolumeDegraded, with its one severity
            open_iv = {"start": ts, "end": None, "severity": severity_of("VolumeDegraded")}
            intervals.append(open_iv)
        elif open_iv is not None:
            if verdict.changed in ("cleared", "accepted"):
                open_iv["end"] = ts
                open_iv = None
    return intervals
