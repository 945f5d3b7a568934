"""fio's JSON output (`--output-format=json+`) as typed records, in seconds and bytes.

fio 3.x reports latencies in ns (`clat_ns`, ...) and bandwidth in B/s
(`bw_bytes`); fio 2.x used `clat`/`slat`/`lat` in microseconds, `bw` in KiB/s
and `io_bytes` in KiB. Both are read; the records never carry fio's units.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from types import MappingProxyType

from .common import ParseError

DIRECTIONS = ("read", "write", "trim", "mixed")  # "mixed": unified_rw_reporting
# The percentiles users compare (p50 .. p99.99); fio's keys are strings like "99.900000".
PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99)


@dataclass(frozen=True)
class LatencyStats:
    min_seconds: float
    mean_seconds: float
    stddev_seconds: float
    max_seconds: float
    count: int


@dataclass(frozen=True)
class DirectionResult:
    """One direction (read, write or trim) summed over a run's jobs."""
    iops: float
    bw_bytes: float
    io_bytes: int
    runtime_seconds: float
    total_ios: int
    slat: LatencyStats | None
    clat: LatencyStats | None
    lat: LatencyStats | None
    # percentile (e.g. 99.9) -> seconds
    clat_percentiles_seconds: dict[float, float] = field(default_factory=dict)
    # cumulative histogram: (upper bound in seconds, count of samples <= it), ascending
    clat_histogram: tuple[tuple[float, int], ...] = ()

    def __post_init__(self):
        # a report travels in events and snapshots read by other threads: frozen all the way down
        object.__setattr__(self, "clat_percentiles_seconds", MappingProxyType(dict(self.clat_percentiles_seconds)))
        object.__setattr__(self, "clat_histogram", tuple((le, n) for le, n in self.clat_histogram))


@dataclass(frozen=True)
class FioReport:
    fio_version: str
    jobs: int
    error: int  # first non-zero job errno, 0 when every job succeeded
    directions: MappingProxyType[str, DirectionResult]
    disk_util_percent: MappingProxyType[str, float]

    def __post_init__(self):
        object.__setattr__(self, "directions", MappingProxyType(dict(self.directions)))
        object.__setattr__(self, "disk_util_percent", MappingProxyType(dict(self.disk_util_percent)))


def bin_upper_edge_ns(value_ns: int) -> float:
    """Upper bound of the fio latency bucket whose representative value is `value_ns`.

    fio keeps 64 buckets per power of two (stat.h FIO_IO_U_PLAT_BITS = 6): values
    below 128 are exact; above, a bucket is 2**e wide with e = floor(log2 v) - 6,
    and fio prints its midpoint (plat_idx_to_val), so the upper edge is v + 2**(e-1).
    """
    if value_ns < 128:
        return float(value_ns)
    e = int(math.floor(math.log2(value_ns))) - 6
    return value_ns + 2 ** (e - 1)


def cumulative_histogram(bins: dict[str, int], unit_seconds: float) -> list[tuple[float, int]]:
    """fio's sparse `bins` (representative value -> count) as cumulative (le_seconds, count)."""
    try:
        items = sorted((int(k), int(_num(bins, k))) for k in bins)
    except ValueError:
        raise ParseError("fio clat bins have a non-numeric key") from None
    out, total = [], 0
    for value, count in items:
        if count < 0:
            raise ParseError("fio clat bins have a negative count")
        total += count
        out.append((bin_upper_edge_ns(value) * unit_seconds, total))
    return out


def _num(obj: dict, key: str, default=0.0) -> float:
    v = obj.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ParseError(f"fio field {key!r} is not a finite number: {v!r}")
    return float(v)


def _obj(parent: dict, key: str, required: bool = False) -> dict:
    v = parent.get(key)
    if v is None and not required:
        return {}
    if not isinstance(v, dict):
        raise ParseError(f"fio field {key!r} is not an object: {str(v)[:40]!r}")
    return v


def _latency(obj: dict | None, unit_seconds: float) -> LatencyStats | None:
    if not obj or not _num(obj, "N", 1):
        return None
    std = _num(obj, "stddev", obj.get("stdev", 0.0))  # some fio versions spelt it "stdev"
    return LatencyStats(
        min_seconds=_num(obj, "min") * unit_seconds,
        mean_seconds=_num(obj, "mean") * unit_seconds,
        stddev_seconds=std * unit_seconds,
        max_seconds=_num(obj, "max") * unit_seconds,
        count=int(_num(obj, "N", 0)),
    )


def _direction(d: dict) -> tuple[dict, float, bool]:
    """The clat object, its unit in seconds, and whether this is fio 3 (ns) output."""
    if "clat_ns" in d:
        return _obj(d, "clat_ns", True), 1e-9, True
    if "clat" in d:
        return _obj(d, "clat", True), 1e-6, False
    raise ParseError("fio direction has neither clat_ns (fio 3) nor clat (fio 2)")


def _parse_direction(d: dict) -> DirectionResult:
    clat, unit, v3 = _direction(d)
    if v3:
        bw_bytes, io_bytes = _num(d, "bw_bytes", _num(d, "bw") * 1024), int(_num(d, "io_bytes"))
        slat, lat = _obj(d, "slat_ns"), _obj(d, "lat_ns")
    else:
        bw_bytes, io_bytes = _num(d, "bw") * 1024, int(_num(d, "io_bytes")) * 1024
        slat, lat = _obj(d, "slat"), _obj(d, "lat")
    pct_raw = _obj(clat, "percentile")
    percentiles: dict[float, float] = {}
    for key in pct_raw:
        try:
            pct = round(float(key), 6)
        except ValueError:
            raise ParseError(f"fio percentile key {key!r} is not numeric") from None
        percentiles[pct] = _num(pct_raw, key) * unit
    bins = _obj(clat, "bins")
    return DirectionResult(
        iops=_num(d, "iops"), bw_bytes=bw_bytes, io_bytes=io_bytes,
        runtime_seconds=_num(d, "runtime") / 1000.0,
        total_ios=int(_num(d, "total_ios", 0)),
        slat=_latency(slat, unit), clat=_latency(clat, unit), lat=_latency(lat, unit),
        clat_percentiles_seconds=percentiles,
        clat_histogram=cumulative_histogram(bins, unit),
    )


def _merge(results: list[DirectionResult]) -> DirectionResult:
    """Sum jobs the way fio's group_reporting does: rates add, latencies pool."""
    if len(results) == 1:
        return results[0]
    def pooled(attr: str) -> LatencyStats | None:
        stats = [getattr(r, attr) for r in results if getattr(r, attr)]
        if not stats:
            return None
        n = sum(s.count for s in stats) or len(stats)
        w = [(s.count or 1) / n for s in stats]
        mean = sum(wi * s.mean_seconds for wi, s in zip(w, stats))
        var = sum(wi * (s.stddev_seconds ** 2 + (s.mean_seconds - mean) ** 2) for wi, s in zip(w, stats))
        return LatencyStats(min(s.min_seconds for s in stats), mean, math.sqrt(var),
                            max(s.max_seconds for s in stats), sum(s.count for s in stats))

    # Histograms add bucket by bucket; percentiles are then read from the merged histogram.
    counts: dict[float, int] = {}
    for r in results:
        prev = 0
        for le, cum in r.clat_histogram:
            counts[le] = counts.get(le, 0) + cum - prev
            prev = cum
    hist, total = [], 0
    for le in sorted(counts):
        total += counts[le]
        hist.append((le, total))
    percentiles = {p: histogram_quantile(hist, p / 100) for p in results[0].clat_percentiles_seconds} if hist else {}
    return DirectionResult(
        iops=sum(r.iops for r in results), bw_bytes=sum(r.bw_bytes for r in results),
        io_bytes=sum(r.io_bytes for r in results),
        runtime_seconds=max(r.runtime_seconds for r in results),
        total_ios=sum(r.total_ios for r in results),
        slat=pooled("slat"), clat=pooled("clat"), lat=pooled("lat"),
        clat_percentiles_seconds=percentiles, clat_histogram=hist,
    )


def histogram_quantile(hist: list[tuple[float, int]], q: float) -> float:
    """The upper edge of the first bucket holding the q-th sample (q in 0..1)."""
    if not hist:
        return float("nan")
    total = hist[-1][1]
    rank = max(1, math.ceil(q * total))
    for le, cum in hist:
        if cum >= rank:
            return le
    return hist[-1][0]


def parse(text: str) -> FioReport:
    """Parse fio's JSON. fio may print warnings before the JSON object; they are skipped."""
    start = text.find("{")
    if start < 0:
        raise ParseError("no JSON object in fio output" + (f": {text.strip()[:200]!r}" if text.strip() else " (empty)"))
    try:
        doc = json.loads(text[start:])
    except json.JSONDecodeError as exc:
        raise ParseError(f"fio output is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list) or not doc["jobs"]:
        raise ParseError("fio JSON has no jobs")
    per_dir: dict[str, list[DirectionResult]] = {}
    error = 0
    for job in doc["jobs"]:
        if not isinstance(job, dict):
            raise ParseError("fio job entry is not an object")
        err = int(_num(job, "error", 0))
        if err and not error:
            error = err
        for name in DIRECTIONS:
            d = job.get(name)
            if not isinstance(d, dict):
                continue
            r = _parse_direction(d)
            if r.total_ios or r.io_bytes or r.iops:
                per_dir.setdefault(name, []).append(r)
    util: dict[str, float] = {}
    disk_util = doc.get("disk_util") or []
    if not isinstance(disk_util, list):
        raise ParseError("fio disk_util is not a list")
    for entry in disk_util:
        if isinstance(entry, dict) and "name" in entry:
            util[str(entry["name"])] = _num(entry, "util")
    return FioReport(
        fio_version=str(doc.get("fio version", "unknown")),
        jobs=len(doc["jobs"]),
        error=error,
        directions={k: _merge(v) for k, v in per_dir.items()},
        disk_util_percent=util,
    )
