"""A host's disk history made twice from one set of /proc/diskstats counters: as `iowarden iostat --json` would
have printed it (the daemon's own diskstats.rates_between and as_sysstat), and as node_exporter would have
exported it (its node_disk_* counters, scraped at the same instants) for a Prometheus backfill
(OpenMetrics, for `promtool tsdb create-blocks-from openmetrics`) or a VictoriaMetrics import (its
/api/v1/import/prometheus text). `replay --passive` reads the first, `replay --prometheus` the server: the
same verdicts from both are the claim tested.

The history: four drives of one model ("SYNTH"), one of them three times slower than the others for part of
it (or none); an LVM volume (dm-0) that a batch job keeps 12 deep, healthy and steady (node-mixin's NodeDiskIOSaturation
fires on it, 30 minutes in); one drive re-created part way (its counters start again from zero); and a gap
in the scrapes (nothing recorded for a few minutes).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from iowarden.probes.diskstats import DiskCounters, DiskSample, rates_between

MODEL = "SYNTH"
# node_exporter's diskstats collector: each series from the /proc/diskstats line (sectors of 512 bytes, times in ms)
NODE_EXPORTER_COUNTERS = (("node_disk_reads_completed_total", lambda c: c.reads),
                          ("node_disk_writes_completed_total", lambda c: c.writes),
                          ("node_disk_read_bytes_total", lambda c: c.sectors_read * 512),
                          ("node_disk_written_bytes_total", lambda c: c.sectors_written * 512),
                          ("node_disk_read_time_seconds_total", lambda c: c.read_ms / 1000),
                          ("node_disk_write_time_seconds_total", lambda c: c.write_ms / 1000),
                          ("node_disk_io_time_seconds_total", lambda c: c.io_ms / 1000),
                          ("node_disk_io_time_weighted_seconds_total", lambda c: c.weighted_io_ms / 1000))
DRIVES = ("sda", "sdb", "sdc", "sdd")


@dataclass
class History:
    start: float                     # the first scrape (Unix seconds)
    scrape_seconds: float
    samples: list = field(default_factory=list)     # [(unix seconds, {device: DiskCounters})]
    instance: str = "db-1:9100"
    slow: tuple = ()                 # (device, from, to) in Unix seconds

    @property
    def end(self) -> float:
        return self.samples[-1][0]

    def iostat_lines(self) -> str:
        """`iowarden iostat --json` over the history, one line per device per scrape, with the drives' model;
        across the gap none (iostat was not running) and the first after it from a fresh pair of readings."""
        out = []
        for (t0, a), (t1, b) in zip(self.samples, self.samples[1:]):
            if t1 - t0 > 1.5 * self.scrape_seconds:
                continue
            rates = rates_between(DiskSample(t0, a), DiskSample(t1, b))
            for name in sorted(rates):
                row = {"timestamp": round(t1, 3), **rates[name].as_sysstat()}
                if name in DRIVES:
                    row["model"] = MODEL
                out.append(json.dumps(row))
        return "\n".join(out) + "\n"

    def _series(self):
        """(metric name, labels text, [(t, value)]) per node_exporter series of the history."""
        devices = sorted({d for _, c in self.samples for d in c})
        for dev in devices:
            base = f'device="{dev}",instance="{self.instance}",job="node"'
            for name, get in NODE_EXPORTER_COUNTERS:
                yield name, base, [(t, get(c[dev])) for t, c in self.samples if dev in c]
            info = base + (f',model="{MODEL}"' if dev in DRIVES else "")
            yield "node_disk_info", info, [(t, 1) for t, c in self.samples if dev in c]

    def openmetrics(self) -> str:
        out = []
        for name, labels, points in self._series():
            out += [f"{name}{{{labels}}} {v!r} {t:.3f}" for t, v in points]
        return "\n".join(out) + "\n# EOF\n"

    def prometheus_text(self) -> str:
        """VictoriaMetrics' /api/v1/import/prometheus: the exposition format with a timestamp in ms per sample."""
        out = []
        for name, labels, points in self._series():
            out += [f"{name}{{{labels}}} {v!r} {round(t * 1000)}" for t, v in points]
        return "\n".join(out) + "\n"


def synthetic(seed: int, start: float, scrapes: int = 1600, scrape_seconds: float = 15.0, slow: bool = True,
              instance: str = "db-1:9100") -> History:
    """A host's history as in the module's docstring: the slow drive from 50 % to 85 % of it (none with
    slow=False), sdb re-created at 62 %, no scrapes from 69 % for 20 scrapes."""
    rng = random.Random(seed)
    slow_from, slow_to = (int(scrapes * 0.5), int(scrapes * 0.85)) if slow else (scrapes, scrapes)
    reset_at, gap = int(scrapes * 0.62), range(int(scrapes * 0.69), int(scrapes * 0.69) + 20)
    h = History(start, scrape_seconds, instance=instance)
    h.slow = ("sdc", start + slow_from * scrape_seconds, start + slow_to * scrape_seconds) if slow else ("", 0, 0)
    totals = {d: [0] * 11 for d in (*DRIVES, "dm-0")}
    for i in range(scrapes):
        t = start + i * scrape_seconds
        if i == reset_at:
            totals["sdb"] = [0] * 11
        for dev, c in totals.items():
            if dev == "dm-0":       # a batch job's deep queue: 300 reads/s at 40 ms, 12 in flight
                r, w, r_ms, w_ms = 300, 20, 40.0, 45.0
            else:                   # a database's drives: 4 KiB reads, 16 KiB writes, sub-millisecond
                r, w, r_ms, w_ms = 300, 50, 0.5, 1.0
                if dev == h.slow[0] and slow_from <= i < slow_to:
                    r_ms, w_ms = r_ms * 3, w_ms * 3
            noise = 1 + 0.1 * (rng.random() - 0.5)
            reads, writes = round(r * scrape_seconds * noise), round(w * scrape_seconds * noise)
            read_ms = round(reads * r_ms * (1 + 0.1 * (rng.random() - 0.5)))
            write_ms = round(writes * w_ms * (1 + 0.1 * (rng.random() - 0.5)))
            c[0] += reads
            c[1] += reads * 8                     # sectors read: 4 KiB each
            c[2] += read_ms
            c[3] += writes
            c[4] += writes * 32                   # 16 KiB each
            c[5] += write_ms
            c[6] += min(round(scrape_seconds * 1000), round((read_ms + write_ms) * 0.9))   # io_ms
            c[7] += read_ms + write_ms            # weighted: every request's time in the queue
        if i in gap:
            continue
        h.samples.append((t, {dev: DiskCounters(
            major=8, minor=16 * k, name=dev, reads=c[0], sectors_read=c[1], read_ms=c[2], writes=c[3],
            sectors_written=c[4], write_ms=c[5], io_ms=c[6], weighted_io_ms=c[7])
            for k, (dev, c) in enumerate(totals.items())}))
    return h
