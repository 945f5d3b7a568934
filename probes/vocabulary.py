"""The names of what a probe measures, in one place: every layer (the probe's record, the
detector, health, InfluxDB points, replay) imports them from here.

A record's figures are `<direction>_iops`, `<direction>_bw_bytes` and the completion-latency
percentiles `clat_p<NN>_seconds` (the worse of read and write: what an application waits for).
"""
from __future__ import annotations

DIRECTIONS = ("read", "write")
THROUGHPUT_METRICS = tuple(f"{d}_{m}" for d in DIRECTIONS for m in ("iops", "bw_bytes"))
# fio's percentile -> the record's key for it
CLAT_PERCENTILE_KEYS = {50.0: "clat_p50_seconds", 90.0: "clat_p90_seconds", 99.0: "clat_p99_seconds",
                        99.9: "clat_p999_seconds", 99.99: "clat_p9999_seconds"}
# every figure a measured probe carries (a failed probe carries none)
MEASURED_METRICS = THROUGHPUT_METRICS + tuple(CLAT_PERCENTILE_KEYS.values())
# the latencies a baseline is learned for (p90 and p99.99 are exported, not judged: too few
# samples in a short probe for p99.99 to be steady, and p90 adds nothing to p50 and p99)
BASELINED_LATENCIES = ("clat_p50_seconds", "clat_p99_seconds", "clat_p999_seconds")

# which way is worse, for the detector (replay's series names included)
HIGHER_IS_WORSE = frozenset(BASELINED_LATENCIES) | {"await_ms"}
LOWER_IS_WORSE = frozenset(THROUGHPUT_METRICS) | {"iops", "bandwidth"}

# Block-queue settings, by their /sys/block/X/queue file name (= the QueueSettings field of that name).
QUEUE_WORD_SETTINGS = ("scheduler", "write_cache")
QUEUE_INT_SETTINGS = ("rotational", "nr_requests", "read_ahead_kb", "max_sectors_kb", "wbt_lat_usec",
                      "nomerges", "rq_affinity", "logical_block_size", "physical_block_size")
# the ones whose change is recorded as drift (block sizes are the hardware's, not a setting)
WATCHED_QUEUE_SETTINGS = ("scheduler", "nr_requests", "read_ahead_kb", "max_sectors_kb", "write_cache",
                          "wbt_lat_usec", "nomerges", "rq_affinity", "rotational")


def metrics_of(record: dict) -> dict[str, float]:
    """The baselined numbers of one probe result: IOPS and bandwidth per direction that did I/O, latencies."""
    out = {}
    for d in DIRECTIONS:
        if record[f"{d}_iops"] > 0:
            out[f"{d}_iops"] = record[f"{d}_iops"]
            out[f"{d}_bw_bytes"] = record[f"{d}_bw_bytes"]
    for m in BASELINED_LATENCIES:
        if record.get(m):
            out[m] = record[m]
    return out
