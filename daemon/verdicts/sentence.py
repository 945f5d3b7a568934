"""The sentence an alert says, wherever it is read: the page (Prometheus rule annotations read it from
`iowarden_alert_info`), `iowarden status`, the journal line and the InfluxDB event.

What happened, where, how much and why, from what the alert holds and nothing else (pure):

- where: the target, the mount point it is on, the device(s), the volume's stable identity;
- what moved: every metric past its normal, the worst first, as "now vs normal (ratio)";
- why: the likely causes, ranked as verdicts/causes.py ranks them, each with the figures it rests on.

Label values are bounded (MAX_TEXT_CHARS): a cause list of any length stays one bounded series.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from iowarden.daemon.sources.tracer_views import TIME_GOES_TO
from iowarden.daemon.verdicts.causes import ABOVE_BLOCK_LAYER
from iowarden.daemon.wording import human_metric, metric_label

MAX_TEXT_CHARS = 400       # per label value: Prometheus has no limit, Alertmanager's receivers (chat, SMS) do
MAX_MOVED = 4              # metrics named in `what`; the rest are counted
NO_CAUSE = "no cause found in settings, contention, cgroup limits, md state, fragmentation or drive health"
RUNBOOK_ANCHORS = {a: "iowarden" + a.lower() for a in (
    "VolumeDegraded", "DeviceSlow", "SlowMember", "VolumeAtLimit", "VolumeContended", "ServiceContended",
    "ProbeFailing", "BurstCreditsLow")}


@dataclass(frozen=True)
class Moved:
    metric: str
    now: float
    normal: float

    @property
    def worse_by(self) -> float:
        """How many times worse than normal: a latency's ratio, a throughput's inverse (always >= 0)."""
        if self.now <= 0 or self.normal <= 0:
            return math.inf
        r = self.now / self.normal
        return r if _higher_is_worse(self.metric) else 1 / r

    def says(self) -> str:
        worse = self.worse_by
        higher = _higher_is_worse(self.metric)
        if worse < 1:   # an open alert's metric back past its normal: "2.6x lower", never "0.38x higher"
            worse, higher = 1 / worse, not higher
        way = "higher" if higher else "lower"
        times = "∞" if math.isinf(worse) else (f"{worse:,.0f}" if worse >= 10 else f"{worse:.2g}")
        return (f"{metric_label(self.metric)} {_figure(self.metric, self.now)} vs normal "
                f"{_figure(self.metric, self.normal)} ({times}x {way})")


def _figure(metric: str, value: float) -> str:
    """A figure after its metric's name: IOPS without the unit said twice ("read IOPS 163"), others in units."""
    return f"{value:,.0f}" if metric.endswith("_iops") else human_metric(metric, value)


def _higher_is_worse(metric: str) -> bool:
    return metric.endswith("_seconds") or metric.endswith("_ms")


def moved_metrics(metrics: dict) -> list[Moved]:
    """An alert's evidence {metric: {"value", "baseline", ...}} as Moved, the worst first."""
    out = []
    for metric, m in (metrics or {}).items():
        try:
            now, normal = float(m["value"]), float(m["baseline"])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(now) and math.isfinite(normal):
            out.append(Moved(metric, now, normal))
    return sorted(out, key=lambda m: (-m.worse_by, m.metric))


@dataclass(frozen=True)
class AlertText:
    where: str
    what: str
    cause: str           # the likeliest cause, with its evidence
    more_causes: str     # the others, "; " between them
    runbook_anchor: str

    def sentence(self) -> str:
        return f"{self.where}: {self.what}" + (f". Likely cause: {self.cause}" if self.cause else "") + (
            f". Also: {self.more_causes}" if self.more_causes else "")


def cut(text: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    text = " ".join(str(text).split())   # one line: a label value, a journal field
    return text if len(text) <= max_chars else text[:max_chars - 1] + "…"


def alert_text(alert: str, target: str | None, mountpoint: str | None, devices: tuple[str, ...], volume: str,
               profile: str, metrics: dict, causes: tuple[str, ...] | list[str],
               max_chars: int = MAX_TEXT_CHARS) -> AlertText:
    """The parts of an alert's sentence. For a probe's alert `metrics` is its evidence; for a passive one
    the first cause is the detector's own finding (it carries the figures), so it is `what`, not a cause."""
    dev = ",".join(devices) if devices else "?"
    if target:
        place = f"{target} on {mountpoint}" if mountpoint else target
        where = f"{place} ({dev}, {volume})"
    else:
        where = f"{dev} ({volume})" + (f" under {mountpoint}" if mountpoint else "")
    causes = [c for c in causes if c]
    moved = moved_metrics(metrics)
    if moved:
        what = f"{profile} probe: " + "; ".join(m.says() for m in moved[:MAX_MOVED]) + (
            f"; {len(moved) - MAX_MOVED} more" if len(moved) > MAX_MOVED else "")
    elif causes and alert != "VolumeDegraded":
        what, causes = causes[0], causes[1:]
        if alert == "ProbeFailing":
            what = f"{profile} probes fail: {what}"
    else:
        what = f"{profile} probe deviates from its normal"
    # a finding that is its own cause (a drive at its limit, a probe that cannot run) has no cause line
    # beyond it; "no cause found" is said only of a probe that moved and nothing that explains it
    cause = causes[0] if causes else (NO_CAUSE if alert == "VolumeDegraded" else "")
    if cause.startswith(ABOVE_BLOCK_LAYER):
        # the tracer times requests from the block layer down: where it says that time goes leaves out the time
        # above it, and "the time goes to the device" beside a limit above the block layer contradicts the page
        causes = causes[:1] + [c for c in causes[1:] if TIME_GOES_TO not in c]
    return AlertText(where=cut(where, max_chars), what=cut(what, max_chars), cause=cut(cause, max_chars),
                     more_causes=cut("; ".join(causes[1:]), max_chars), runbook_anchor=RUNBOOK_ANCHORS.get(alert, alert.lower()))
