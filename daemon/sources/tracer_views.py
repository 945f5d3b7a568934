"""What the tracer's reading says: its metric families, the cause line (where the time of real I/O went), and
the summary `status` shows. Pure functions of a TraceReading (sources/tracer.py reads it)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from iowarden.probes import blocktrace
from iowarden.probes.blockqueue import identity_of
from iowarden.probes.common import printable

from iowarden.daemon.wording import human_seconds, latency_columns

TRACE_BUCKETS_SECONDS = tuple(2 ** k / 1e9 for k in range(12, 36))
MIN_TAIL_SAMPLES = 200      # timed I/Os in a window before its p99 is quoted as a cause
OTHER = "other"                 # a disk's cgroups past [tracer] max_cgroup_series, or past the program's map
NO_CGROUP = "(no cgroup)"       # requests the kernel charged to none (no bio: a flush's own request)
GONE = "(removed cgroups)"      # cgroups removed since they did I/O


@dataclass(frozen=True)
class TraceReading:
    unix_time: float
    up: bool
    reason: str | None                                   # why it is off (or what went wrong last)
    window_seconds: float
    sampled_share: MappingProxyType                      # kernel name -> share of requests timed
    total: MappingProxyType                              # (name, direction, stage) -> StageHistogram
    sums_seconds: MappingProxyType                       # the same keys -> summed latency (approximate)
    window: MappingProxyType                             # the same keys -> this window's StageHistogram
    unknown_keys_dropped: int = 0                        # entries naming a disk the program was not given
    engine: str = ""                                     # compiled or bpftrace: the one chosen last
    cost_per_io_ns: float = 0.0                          # what its budget takes the engine to cost per request
    cost_source: str = ""                                # measured (bpf_stats), bench, or configured
    # (name, cgroup path or OTHER, direction) -> (CgroupCounts since the daemon started, this window's)
    cgroups: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    cgroup_version: int | None = None                    # the I/O controller's hierarchy: 1 (blkio) or 2
    # the program's map (entries, capacity, evicted) and what the reader's bounds left out: cgroups folded into
    # "other" past max_cgroup_series, ids no walk named (unnamed), a walk cut at its bound (walk_cut)
    cgroup_map: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    cgroups_at: float | None = None                      # when the loader read the counts in `cgroups` (monotonic)


def add_histograms(a: blocktrace.StageHistogram | None, b: blocktrace.StageHistogram | None) -> blocktrace.StageHistogram:
    """Two processes' (or a process's and the earlier ones') counts as one histogram."""
    if a is None or b is None:
        return a or b or blocktrace.StageHistogram(())
    merged = dict(a.counts)
    for i, c in b.counts:
        merged[i] = merged.get(i, 0) + c
    return blocktrace.StageHistogram(tuple(sorted(merged.items())))


def octave_buckets(h: blocktrace.StageHistogram) -> list[tuple[str, int]]:
    """Cumulative counts on TRACE_BUCKETS_SECONDS (exact: every fine bucket lies inside one octave)."""
    out, running, counts, i = [], 0, list(h.counts), 0
    for le in TRACE_BUCKETS_SECONDS:
        le_ns = le * 1e9
        while i < len(counts) and blocktrace.bucket_upper_ns(counts[i][0]) <= le_ns * (1 + 1e-9):
            running += counts[i][1]
            i += 1
        out.append((repr(le), running))
    out.append(("+Inf", h.total))
    return out


def families(r: TraceReading | None, snap):
    up = GaugeMetricFamily("iowarden_tracer_up", "1 while the block-layer tracer runs; 0 when it is "
                           "off (iowarden_tracer_off_reason says why)")
    why = GaugeMetricFamily("iowarden_tracer_off_reason", "Why the tracer is off (value 1)", labels=["reason"])
    if r is None:
        up.add_metric([], 0)
        why.add_metric(["no reading yet, or [tracer] enabled = false"], 1)
        yield from (up, why)
        return
    up.add_metric([], 1 if r.up else 0)
    if not r.up:
        why.add_metric([r.reason or "unknown"], 1)
    labels = ["device", "volume", "direction", "stage"]
    hist = HistogramMetricFamily("iowarden_io_latency_seconds", "Latency of the timed requests of real I/O, per "
                                 "disk, direction and stage (queue: submission to issue; device: issue to "
                                 "completion; total), since the daemon started", labels=labels)
    last = GaugeMetricFamily("iowarden_io_latency_last_window_seconds", "Latency percentiles (50, 99, 99.9) of the "
                             "last window's timed requests", labels=labels + ["percentile"])
    share = GaugeMetricFamily("iowarden_io_latency_timed_ratio", "The share of a disk's requests that are timed "
                              "(sampled by a hash of the sector above [tracer] max_timed_iops)", labels=["device"])
    for (name, direction, stage), h in sorted(r.total.items()):
        lv = [name, identity_of(name, snap.devices), direction, stage]
        hist.add_metric(lv, octave_buckets(h), r.sums_seconds.get((name, direction, stage), 0.0))
        w = r.window.get((name, direction, stage))
        if w is not None and w.total:
            for pct in ("50", "99", "99.9"):
                last.add_metric(lv + [pct], w.quantile_seconds(float(pct) / 100))
    for name, s in sorted(r.sampled_share.items()):
        share.add_metric([name], s)
    dropped = CounterMetricFamily("iowarden_tracer_unknown_keys_dropped", "Map entries bpftrace printed for a "
                                  "disk it was not told to trace, dropped (none from a sound program)")
    dropped.add_metric([], r.unknown_keys_dropped)
    cost = GaugeMetricFamily("iowarden_tracer_cost_per_io_seconds", "What the tracer's CPU budget takes its engine "
                             "to cost per request of any disk ([tracer] max_cpu_cores): source measured (the "
                             "compiled program's run time from the kernel's bpf_stats, a second a minute, plus its "
                             "tracepoint), bench (bench/tracer_overhead.py's figure) or configured",
                             labels=["engine", "source"])
    if r.engine:
        cost.add_metric([r.engine, r.cost_source], r.cost_per_io_ns / 1e9)
    yield from (up, why, hist, last, share, dropped, cost)
    yield from cgroup_families(r, snap)


SYSTEMD_UNIT_SUFFIXES = (".service", ".scope", ".slice", ".socket", ".mount", ".swap")


def unit_of(path: str) -> str:
    """The systemd unit a cgroup path is ("/system.slice/postgresql.service" -> postgresql.service), or "" where its
    last part is not a unit's name (a container runtime's own cgroup, the root)."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    return last if last.endswith(SYSTEMD_UNIT_SUFFIXES) else ""


def cgroup_words(path: str, version: int | None, unit: bool = False) -> str:
    """A cgroup as `status` and a page say it (unit: by its systemd unit's name where it is one). On cgroup v1 dirty
    pages have no owner: writeback is charged to whoever does it, so the root is charged with all the kernel's
    flusher writes (an fsync's writes are its caller's), and its requests are not its own processes' alone."""
    if path == "/" and version == 1:
        return "/ (the root; on cgroup v1 also the page-cache writeback the kernel's flusher does for every cgroup)"
    if path == "/":
        return "/ (the root)"
    if path == OTHER:
        return "other cgroups (past [tracer] max_cgroup_series)"
    return (unit_of(path) or path) if unit else path


def cgroup_families(r: TraceReading, snap):
    """Per disk, direction and cgroup (the named ones and "other"): the latency histogram of its timed requests,
    their count and bytes, and its share of the disk's in the last window."""
    labels = ["device", "volume", "direction", "cgroup", "unit"]
    hist = HistogramMetricFamily("iowarden_cgroup_io_latency_seconds", "Latency (total: submission to completion) "
                                 "of the timed requests each cgroup was charged for, per disk and direction, since "
                                 "the daemon started ([tracer] max_cgroup_series named per disk, the rest "
                                 "cgroup=\"other\")", labels=labels)
    requests = CounterMetricFamily("iowarden_cgroup_io_requests", "Timed requests each cgroup was charged for (of "
                                   "iowarden_io_latency_timed_ratio of the disk's requests)", labels=labels)
    nbytes = CounterMetricFamily("iowarden_cgroup_io_bytes", "Bytes of the timed requests each cgroup was charged for",
                                 labels=labels)
    share = GaugeMetricFamily("iowarden_cgroup_io_share_ratio", "Each cgroup's share of its disk's timed requests "
                              "and bytes in the last window", labels=labels + ["of"])
    window_all: dict = {}
    for (name, _, direction), (_, w) in r.cgroups.items():
        a = window_all.setdefault((name, direction), [0, 0])
        a[0], a[1] = a[0] + w.requests, a[1] + w.bytes
    for (name, path, direction), (total, w) in sorted(r.cgroups.items()):
        lv = [name, identity_of(name, snap.devices), direction, path, unit_of(path)]
        hist.add_metric(lv, octave_buckets(total.hist), total.ns / 1e9)
        requests.add_metric(lv, total.requests)
        nbytes.add_metric(lv, total.bytes)
        all_requests, all_bytes = window_all[(name, direction)]
        if all_requests:
            share.add_metric(lv + ["requests"], w.requests / all_requests)
        if all_bytes:
            share.add_metric(lv + ["bytes"], w.bytes / all_bytes)
    entries = GaugeMetricFamily("iowarden_tracer_cgroup_map_entries", "The compiled program's map of (disk, cgroup) "
                                "counts: entries used and its capacity ([tracer] max_cgroups and one \"other\" per "
                                "disk); when full, a new cgroup's requests count as its disk's other", labels=["kind"])
    evicted = CounterMetricFamily("iowarden_tracer_cgroup_map_evicted", "Entries of idle cgroups freed from the "
                                  "program's map to make room (their counts are kept)")
    left = GaugeMetricFamily("iowarden_tracer_cgroups_left_out", "Cgroups the bounds leave out of the series per "
                             "cgroup: folded (summed as cgroup=\"other\" past [tracer] max_cgroup_series on a "
                             "disk), unnamed (ids no walk of the cgroup hierarchy named: removed, or past its bound), "
                             "walk_cut (1: the last walk stopped at its bound)", labels=["why"])
    if r.cgroup_map:
        entries.add_metric(["used"], r.cgroup_map.get("entries", 0))
        entries.add_metric(["capacity"], r.cgroup_map.get("capacity", 0))
        evicted.add_metric([], r.cgroup_map.get("evicted", 0))
        for why in ("folded", "unnamed", "walk_cut"):
            left.add_metric([why], r.cgroup_map.get(why, 0))
    yield from (hist, requests, nbytes, share, entries, evicted, left)


def cgroup_rows(r: TraceReading) -> list[dict]:
    """Per disk and direction, each cgroup's last window: its share of the disk's timed requests and its p50/p99,
    busiest first (what `status` and a page say of who is hurt and who does the I/O)."""
    totals: dict = {}
    for (name, _, direction), (_, w) in r.cgroups.items():
        totals[(name, direction)] = totals.get((name, direction), 0) + w.requests
    rows = []
    for (name, path, direction), (_, w) in r.cgroups.items():
        if not w.requests:
            continue
        rows.append({"device": name, "direction": direction, "cgroup": path, "unit": unit_of(path),
                     "requests": w.requests, "bytes": w.bytes, "share": w.requests / totals[(name, direction)],
                     "p50_seconds": w.hist.quantile_seconds(0.5), "p99_seconds": w.hist.quantile_seconds(0.99)})
    return sorted(rows, key=lambda x: (x["device"], x["direction"], -x["requests"]))


# ---- causes ------------------------------------------------------------------------------------

TIME_GOES_TO = "the time goes to "   # how the tracer's cause says where (the sentence's Also line reads it)


def where_the_time_goes(r: TraceReading, disk: str, direction: str) -> str | None:
    """"p99 read 180 ms, 97 % of it in the device", from the last window, or None with too few I/Os."""
    total = r.window.get((disk, direction, "total"))
    device = r.window.get((disk, direction, "device"))
    if total is None or device is None or total.total < MIN_TAIL_SAMPLES:
        return None
    p99, dev99 = total.quantile_seconds(0.99), device.quantile_seconds(0.99)
    if not p99:
        return None
    in_device = min(1.0, dev99 / p99)
    where = ("the device" if in_device >= 0.8 else
             "the kernel's queue in front of the device (I/O scheduler, nr_requests, writeback throttling)"
             if in_device <= 0.5 else "both the device and the kernel's queue")
    return (f"{disk}: p99 {direction} {human_seconds(p99)} over the last {r.window_seconds:.0f} s, "
            f"{in_device:.0%} of it in the device: {TIME_GOES_TO}{where}")


def causes(r: TraceReading | None, disks: set[str]) -> list[str]:
    if r is None or not r.up:
        return []
    return [text for disk in sorted(disks) for direction in blocktrace.DIRECTIONS
            if (text := where_the_time_goes(r, disk, direction))]


def summary(r: TraceReading) -> dict:
    """For `iowarden status`: per disk and direction, the last window's tail and its share in the device."""
    rows = []
    for (disk, direction, stage), total in sorted(r.window.items()):
        if stage != "total" or not total.total:
            continue
        device = r.window.get((disk, direction, "device"))
        p99, dev99 = total.quantile_seconds(0.99), device.quantile_seconds(0.99) if device else None
        rows.append({"device": disk, "direction": direction, "timed": total.total,
                     "p50_seconds": total.quantile_seconds(0.5), "p99_seconds": p99,
                     "p999_seconds": total.quantile_seconds(0.999),
                     "in_device_p99": min(1.0, dev99 / p99) if p99 and dev99 is not None else None,
                     "sampled_share": r.sampled_share.get(disk)})
    return {"up": r.up, "reason": r.reason, "window_seconds": r.window_seconds, "unix_time": r.unix_time,
            "rows": rows, "cgroup_rows": cgroup_rows(r), "cgroup_version": r.cgroup_version}


def status_text(t: dict, table) -> str:
    """Where the time of real I/O went in the tracer's last window: per disk and direction, the tail of
    the timed requests and how much of their p99 the device itself took."""
    as_of = time.strftime("%H:%M:%S", time.localtime(t["at"]))
    if not t.get("up"):
        return f"where the time goes: the tracer is off ({printable(t.get('reason') or 'no reason given')}), as of {as_of}"
    rows = [r for r in t.get("rows", ()) if r.get("timed")]
    if not rows:
        return f"where the time goes: no request timed in the last {t['window_seconds']:.0f} s, as of {as_of}"
    headers, cells = latency_columns({k: [r.get(f"{k}_seconds") for r in rows] for k in ("p50", "p99", "p999")})
    headers = [h.replace("p999", "p99.9") for h in headers]
    text = (f"where the time goes (real I/O, the last {t['window_seconds']:.0f} s, as of {as_of}):\n" +
            table(["device", "direction", "timed", *headers, "p99 in device"],
                  [[printable(r["device"]), r["direction"], r["timed"], *lat,
                    f"{r['in_device_p99']:.0%}" if r.get("in_device_p99") is not None else "-"]
                   for r, lat in zip(rows, cells)]))
    cg = [r for r in t.get("cgroup_rows", ()) if r.get("requests")]
    if cg:
        headers, cells = latency_columns({k: [r.get(f"{k}_seconds") for r in cg] for k in ("p50", "p99")})
        text += ("\nwho is charged for it (per cgroup, the same window):\n" +
                 table(["device", "direction", "cgroup", "share", "timed", *headers],
                       [[printable(r["device"]), r["direction"],
                         printable(cgroup_words(r["cgroup"], t.get("cgroup_version"))), f"{r['share']:.0%}",
                         r["requests"], *lat] for r, lat in zip(cg, cells)]))
    return text
