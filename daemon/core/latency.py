"""Probe latency as a Prometheus histogram: every probe's I/Os added to one running total per
target, profile and direction, on fixed buckets (pure; the core keeps the totals).

Fixed buckets, the same on every host, so that histogram_quantile(0.99, rate(...[1h])) is the p99 of
the last hour's probes and aggregates across a fleet: half-octave steps from 1 us to ~134 s. fio's own
buckets are 1/64 octave; re-bucketing moves a sample up by at most 41 %, never down.
"""
from __future__ import annotations

from dataclasses import dataclass

LATENCY_BUCKETS_SECONDS = tuple(1e-6 * 2 ** (k / 2) for k in range(55))


def rebucket(cumulative: list[tuple[float, int]]) -> tuple[int, ...]:
    """fio's cumulative (le seconds, count) pairs onto LATENCY_BUCKETS_SECONDS: a cumulative count per
    bucket, then the total (+Inf)."""
    out, i, total = [], 0, cumulative[-1][1] if cumulative else 0
    for le in LATENCY_BUCKETS_SECONDS:
        while i < len(cumulative) and cumulative[i][0] <= le * (1 + 1e-9):
            i += 1
        out.append(cumulative[i - 1][1] if i else 0)
    out.append(total)
    return tuple(out)


@dataclass(frozen=True)
class LatencyTotal:
    """Cumulative bucket counts (the last is +Inf, the count) and the summed latency in seconds."""
    buckets: tuple[int, ...] = (0,) * (len(LATENCY_BUCKETS_SECONDS) + 1)
    sum_seconds: float = 0.0

    @property
    def count(self) -> int:
        return self.buckets[-1]

    def plus(self, fio_cumulative: list[tuple[float, int]], sum_seconds: float) -> "LatencyTotal":
        added = rebucket(fio_cumulative)
        return LatencyTotal(tuple(a + b for a, b in zip(self.buckets, added)), self.sum_seconds + sum_seconds)


def add_probe(totals: dict, target: str, profile: str, report) -> None:
    """Add a successful probe's I/Os (fio's clat histogram of each direction) to totals, in place."""
    for direction, d in report.directions.items():
        if not d.clat_histogram:
            continue
        count = d.clat_histogram[-1][1]
        mean = d.clat.mean_seconds if d.clat else 0.0
        key = (target, profile, direction)
        totals[key] = totals.get(key, LatencyTotal()).plus(d.clat_histogram, mean * count)
