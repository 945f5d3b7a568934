"""How a number is said to a person: a latency in its unit, a probe metric by its name.

One place for the commands' tables, `status`, the journal and the alert's sentence
(verdicts/sentence.py), so that all of them say the same figure the same way.
"""
from __future__ import annotations

import math
from typing import Iterable


def human_seconds(seconds: float | None) -> str | None:
    """A latency as a person reads it: 85 µs, 1.25 ms, 2.5 s (not 0.00 seconds)."""
    if seconds is None or not math.isfinite(seconds):
        return None
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


METRIC_LABELS = {"read_iops": "read IOPS", "write_iops": "write IOPS", "read_bw_bytes": "read bandwidth",
                 "write_bw_bytes": "write bandwidth",
                 "delivered_iops": "IOPS the busy device delivered (probe and other work)"}


def metric_label(metric: str) -> str:
    """A probe metric's name for people, without the unit its key carries (clat_p99_seconds: p99 latency)."""
    if metric in METRIC_LABELS:
        return METRIC_LABELS[metric]
    if metric.startswith("clat_p") and metric.endswith("_seconds"):
        digits = metric[len("clat_p"):-len("_seconds")]
        return f"p{digits[:2]}{'.' + digits[2:] if len(digits) > 2 else ''} latency"
    return metric


def human_metric(metric: str, value: float | None) -> str | None:
    """A probe metric in its unit: IOPS, MiB/s, or a latency. No thousands separators: tables
    print numbers plain, as fio and iostat do."""
    if value is None or not math.isfinite(value):
        return None
    if metric.endswith("_iops"):
        return f"{value:.0f} IOPS"
    if metric.endswith("_bw_bytes"):
        return f"{value / (1 << 20):.1f} MiB/s"
    if metric.endswith("_seconds"):
        return human_seconds(value)
    return f"{value:.6g}"


def latency_unit(values_seconds: Iterable[float | None]) -> tuple[str, float]:
    """The unit of one latency column, chosen from all its values as fio chooses it for its
    percentiles (stat.c, show_clat_percentiles): msec when the smallest is over 2 ms and the
    largest over 100 ms, usec when over 2 µs and 100 µs, else nsec. Values then print as whole
    numbers of that unit, fio's precision."""
    ns = [v * 1e9 for v in values_seconds if v is not None and math.isfinite(v)]
    if ns and min(ns) > 2_000_000 and max(ns) > 99_999_999:
        return "msec", 1e-3
    if not ns or (min(ns) > 2_000 and max(ns) > 99_999):
        return "usec", 1e-6
    return "nsec", 1e-9


def latency_columns(columns: dict[str, list[float | None]]) -> tuple[list[str], list[list[int | None]]]:
    """Headers ("p99 usec") and whole-number cells for a table's latency columns. They share one
    unit, chosen from all their values, as fio's percentile list does: a row reads across
    without a change of scale."""
    unit, scale = latency_unit(v for values in columns.values() for v in values)
    cells = [[None if v is None or not math.isfinite(v) else round(v / scale) for v in values]
             for values in columns.values()]
    return [f"{name} {unit}" for name in columns], [list(row) for row in zip(*cells)]


def result_summary(r) -> str:
    """A probe's result in one line of the journal (a fio_run.ProbeResult)."""
    if not r.ok:
        return f"probe {r.target}/{r.profile} failed: {r.error}"
    p99 = r.clat_percentile_seconds(99.0)
    return (f"probe {r.target}/{r.profile} on {r.device}: read {r.iops('read'):.0f} IOPS, write "
            f"{r.iops('write'):.0f} IOPS, clat p99 {p99 * 1000 if p99 else float('nan'):.3f} ms"
            f"{' (contended, learned under load)' if r.learned_under_load else ' (contended)' if r.contended else ''}")


def duration_said(seconds: float) -> str:
    """How long something lasted, as a person says it: 45 s, 12 min, 3.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
