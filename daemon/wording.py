"""How a number is said to a person: a latency in its unit, a probe metric by its name.

One place for the commands' tables, `status`, the journal and the alert's sentence
(verdicts/sentence.py), so that all of them say the same figure the same way.
"""
from __future__ import annotations

import math


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
