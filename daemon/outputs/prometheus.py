"""The Prometheus collector: metric families built from a Snapshot on each scrape, nothing else.

Names follow the exporter guidelines: prefix iowarden_, base units (seconds,
bytes), ratios not percentages, _total only on counters, no timestamps on
samples (times are _timestamp_seconds gauges). A source the daemon has not read
(absent C-state sysfs, no XFS mount) leaves its metrics out instead of exporting 0.

Volumes carry their stable identity (`volume`) as well as the kernel name (`device`).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import platform
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from iowarden.probes.blockqueue import identity_of
from iowarden.probes.vocabulary import CLAT_PERCENTILE_KEYS

from iowarden.daemon.core.latency import LATENCY_BUCKETS_SECONDS
from iowarden.daemon.outputs.alert_metrics import DEFAULT_RUNBOOK_URL, alert_families
from iowarden.daemon.outputs.exposition import TextFamily, for_keeping, label_text, sample_line
from iowarden.daemon.outputs.host_metrics import settings_families, xfs_families
from iowarden.daemon.passive.metrics import passive_families
from iowarden.daemon.sources.registry import SOURCES

log = logging.getLogger("iowarden")

DISK_LABELS = ("device", "volume")
BAND_SPREADS = 2.0  # the detector's allowance k: deviations inside the band never accumulate
SKIP_REASONS = ("busy", "io_pressure", "budget_time", "budget_bytes", "unmounted", "waiting_for_disk")


def _le(x: float) -> str:
    return f"{x:.9g}"


# A baseline's metric (probes/vocabulary.py) -> the unit of its family, and the name it goes by there.
BASELINE_UNITS = {"_iops": ("iops", " I/O operations per second"), "_bw_bytes": ("bytes_per_second", " bytes per second"),
                  "_seconds": ("seconds", " seconds")}


def baseline_unit(metric: str) -> tuple[str, str]:
    """read_iops -> (iops, read_iops); read_bw_bytes -> (bytes_per_second, read_bw); clat_p99_seconds ->
    (seconds, clat_p99)."""
    for suffix, (unit, _) in BASELINE_UNITS.items():
        if metric.endswith(suffix):
            # a label says what the number is in the families that hold every unit (deviation, learning):
            # read_bw, never a bare "read" that reads as IOPS
            return unit, metric if unit == "iops" else metric[:-len("_bytes")] if suffix == "_bw_bytes" \
                else metric[:-len(suffix)]
    raise ValueError(f"baseline metric {metric!r} has no unit iowarden exports")


# What each section reads of a Snapshot. A section whose inputs equal the last render's is not built
# again: its families (the same objects) are served, and the renderer reuses their text. The parts
# replace their values whole, so the settings, XFS, passive and probe sections are rebuilt only when
# those change (every 30 s to hours), not on every snapshot (every second). test_exporter checks
# that no section reads a field it does not list.
SECTION_INPUTS = {
    "self": ("version", "taken_at", "parts", "state", "influx"),
    "probes": ("probes", "probe_intervals", "skipped_total", "budget", "probe_latency", "discovery_over_limit"),
    "baselines": ("baselines", "alerts", "folds", "probes", "xfs", "devices", "sources"),
    "disks": ("disk_sample", "disk_rates", "devices", "io_pressure", "cpu_pressure"),
    "settings": ("devices", "drift_total", "drift_last_at", "drift_last_change", "power"),
    "xfs": ("xfs", "devices"),
    "passive": ("passive", "passive_host_ratio", "devices", "classes"),
    # a registered source's section (sources/registry.py) reads its own reading and the device view
    **{spec.name: ("sources", "devices") for spec in SOURCES},
}


class SnapshotCollector:
    def __init__(self, get_snapshot, read_disk_sample=None, runbook_url: str = DEFAULT_RUNBOOK_URL,
                 sources=SOURCES):
        """read_disk_sample: reads /proc/diskstats at scrape time, as node_exporter does. Counters a second
        old (the sampler's last reading) put up to a second of I/O in the wrong window at each end of a
        rate(); None serves the snapshot's sample (tests, and a reader that failed).
        sources: the registered sources whose sections it serves (all of them; a test pins its own)."""
        self.get_snapshot = get_snapshot
        self.sources = tuple(sources)
        self.runbook_url = runbook_url.rstrip("/#")
        self.read_disk_sample = read_disk_sample
        self._built: dict[str, tuple[tuple, list]] = {}   # section -> (its inputs, its families)
        self._disk_rows: tuple[object, dict] = (None, {})   # (the device view, kernel name -> (counters, its rows))

    def describe(self):
        return []  # families vary with the host: no up-front description (auto_describe off)

    def sections(self):
        return (("self", self._self_metrics), ("probes", self._probes), ("baselines", self._baselines),
                ("disks", self._disks), ("settings", settings_families), ("xfs", xfs_families),
                ("passive", passive_families),
                *((spec.name, lambda s, spec=spec: spec.families(s.sources.get(spec.name), s)) for spec in self.sources))

    def collect(self):
        s = self.get_snapshot()
        if s is None:
            return
        if self.read_disk_sample is not None and s.disk_reading is not None:
            try:   # the counters as of this scrape, the rest of the sampler's reading as published
                s = dataclasses.replace(s, disk_reading=dataclasses.replace(s.disk_reading,
                                                                            sample=self.read_disk_sample()))
            except Exception:   # noqa: BLE001 - the sampler's last reading is a second old, not wrong
                # a condition that lasts (every scrape would say it): once a minute, with how often
                log.exception("reading /proc/diskstats at scrape failed; serving the sampler's last reading",
                              extra={"REPEATS": True})
        # One section per source, each built whole before any of it is sent: a section that
        # fails (a value of a shape nobody foresaw) is left out and says so in
        # iowarden_scrape_collector_success, and the rest of the scrape is intact.
        success = GaugeMetricFamily("iowarden_scrape_collector_success",
                                    "1 if the section of this scrape was built, 0 if it failed (logged)",
                                    labels=["collector"])
        duration = GaugeMetricFamily("iowarden_scrape_collector_duration_seconds",
                                     "Time taken to build the section of this scrape", labels=["collector"])
        for name, build in self.sections():
            started = time.perf_counter()
            inputs = tuple(getattr(s, field) for field in SECTION_INPUTS[name])
            built = self._built.get(name)
            if built is not None and built[0] == inputs:
                families = built[1]
                # equal, not the same: the device view is read again every pass, whole. Kept as the new
                # inputs, the next scrape finds them identical (a compare of 1,024 devices per section was
                # 8 % of the daemon's CPU)
                self._built[name] = (inputs, families)
            else:
                try:
                    families = [for_keeping(f) for f in build(s)]
                    self._built[name] = (inputs, families)
                except Exception:   # noqa: BLE001 - one source's fault must not fail the scrape
                    log.exception("metrics section %s failed; left out of this scrape", name, extra={"REPEATS": True})
                    families = None
            duration.add_metric([name], time.perf_counter() - started)
            success.add_metric([name], 0 if families is None else 1)
            yield from families or ()
        yield success
        yield duration

    def _disk_rows_for(self, devices) -> dict:
        """Each disk's rows as last written, for the device view they were written under (a view is replaced
        whole when it changes; a device gone from /proc/diskstats is dropped with the next view)."""
        if self._disk_rows[0] is not devices:
            self._disk_rows = (devices, {})
        return self._disk_rows[1]

    # -- self ---------------------------------------------------------------------------------
    def _self_metrics(self, s):
        info = GaugeMetricFamily("iowarden_build_info", "iowarden version and Python it runs on",
                                 labels=["version", "python"])
        info.add_metric([s.version, platform.python_version()], 1)
        yield info
        taken = GaugeMetricFamily("iowarden_snapshot_timestamp_seconds",
                                  "When the daemon's view in this scrape was taken (its core publishes one after each "
                                  "batch of events, every second or sooner)")
        taken.add_metric([], s.taken_at)
        yield taken
        dur = GaugeMetricFamily("iowarden_part_duration_seconds", "Duration of the part's last step",
                                labels=["part"])
        ok = GaugeMetricFamily("iowarden_part_success", "1 if the part's last step succeeded", labels=["part"])
        err = CounterMetricFamily("iowarden_part_errors", "Steps of the part that failed", labels=["part"])
        restarts = CounterMetricFamily("iowarden_part_restarts", "Times the part's thread failed outside a step and "
                                       "was started again", labels=["part"])
        last = GaugeMetricFamily("iowarden_part_last_success_timestamp_seconds",
                                 "When the part last completed a step without error", labels=["part"])
        longest = GaugeMetricFamily("iowarden_part_longest_duration_seconds", "The part's longest step since the "
                                    "daemon started", labels=["part"])
        deadline = GaugeMetricFamily("iowarden_part_deadline_seconds", "How long one step of the part may take "
                                     "before it counts as stuck (the watchdog ping is withheld)", labels=["part"])
        for name, st in sorted(s.parts.items()):
            deadline.add_metric([name], st.deadline_seconds)
            longest.add_metric([name], st.longest_duration_seconds)
            if st.last_duration_seconds is not None:
                dur.add_metric([name], st.last_duration_seconds)
            ok.add_metric([name], 1 if st.success else 0)
            err.add_metric([name], st.errors_total)
            restarts.add_metric([name], st.restarts_total)
            if st.last_success_timestamp_seconds:
                last.add_metric([name], st.last_success_timestamp_seconds)
        yield from (dur, longest, deadline, ok, err, restarts, last)
        if s.state is not None:
            g = GaugeMetricFamily("iowarden_state_writable",
                                  "1 if the state database took the last write; 0 while writes wait in memory "
                                  "(filesystem full, database locked)")
            g.add_metric([], 1 if s.state["writable"] else 0)
            yield g
            g = GaugeMetricFamily("iowarden_state_pending_writes", "Writes waiting in memory for the state database")
            g.add_metric([], s.state["pending_writes"])
            yield g
            for key, help_ in (("write_errors", "Failed attempts to write the state database"),
                               ("writes_dropped", "Writes lost because too many were waiting in memory")):
                c = CounterMetricFamily(f"iowarden_state_{key}", help_)
                c.add_metric([], s.state[key])
                yield c
            for key, help_ in (("recovered_rows", "Rows of a damaged state database copied into the fresh one when "
                                                  "it was moved aside at this start, per table"),
                               ("lost_rows", "Rows of the state database known lost since this start, per table: not "
                                             "recovered from a damaged file, or set aside as unreadable")):
                g = GaugeMetricFamily(f"iowarden_state_{key}", help_, labels=["table"])
                for table, n in sorted(s.state.get(key, {}).items()):
                    g.add_metric([table], n)
                yield g
        if s.influx is not None:
            for key, help_ in (("written", "Points InfluxDB accepted"),
                               ("spooled", "Points kept on disk while InfluxDB was unreachable"),
                               ("dropped", "Points lost because the spool was full"),
                               ("rejected", "Points in batches InfluxDB refused as invalid (set aside, not retried)"),
                               ("errors", "Failed writes to InfluxDB")):
                name = "write_errors" if key == "errors" else f"points_{key}"
                c = CounterMetricFamily(f"iowarden_influxdb_{name}", help_)
                c.add_metric([], s.influx[key])
                yield c
            g = GaugeMetricFamily("iowarden_influxdb_spool_bytes", "Size of the InfluxDB spool on disk")
            g.add_metric([], s.influx["spool_bytes"])
            yield g

    # -- probes -------------------------------------------------------------------------------
    def _probes(self, s):
        labels = ["target", "profile", "device", "volume"]
        dl = labels + ["direction"]
        iops = GaugeMetricFamily("iowarden_probe_iops", "I/O operations per second in the last probe", labels=dl)
        bw = GaugeMetricFamily("iowarden_probe_bandwidth_bytes_per_second", "Bytes per second moved in the last probe",
                               labels=dl)
        # fio's exact percentiles of the last probe, as gauges (the histogram's buckets are half an
        # octave wide; these are what fio printed)
        pct = GaugeMetricFamily("iowarden_probe_last_latency_seconds",
                                "fio's exact completion-latency percentile of the last probe", labels=dl + ["percentile"])
        success = GaugeMetricFamily("iowarden_probe_success", "1 if the last probe succeeded", labels=labels)
        last_ok = GaugeMetricFamily("iowarden_probe_last_success_timestamp_seconds",
                                    "When a probe of this profile last succeeded", labels=labels)
        dur = GaugeMetricFamily("iowarden_probe_duration_seconds", "Wall time of the last probe", labels=labels)
        cont = GaugeMetricFamily("iowarden_probe_contended",
                                 "1 if the last probe ran while the disk was busy with other work", labels=labels)
        for p in s.probes:
            r = p.result
            base = [p.target, p.profile, r.device or "", p.volume]
            success.add_metric(base, 1 if r.ok else 0)
            dur.add_metric(base, r.duration_seconds)
            cont.add_metric(base, 1 if r.contended else 0)
            if p.last_success_timestamp:
                last_ok.add_metric(base, p.last_success_timestamp)
            if not r.ok or r.report is None:
                continue  # a failed probe's numbers are not measurements
            for direction, d in sorted(r.report.directions.items()):
                lab = base + [direction]
                iops.add_metric(lab, d.iops)
                bw.add_metric(lab, d.bw_bytes)
                for q, v in sorted(d.clat_percentiles_seconds.items()):
                    if q in CLAT_PERCENTILE_KEYS:
                        pct.add_metric(lab + [f"{q:g}"], v)
        # every successful probe's I/Os, added up: histogram_quantile(0.99, rate(..._bucket[1h])) is the
        # p99 of the last hour's probes, on this host or summed over a fleet
        hist = HistogramMetricFamily("iowarden_probe_latency_seconds", "Completion latency of every I/O of the "
                                     "probes since iowarden started (fio clat)",
                                     labels=["target", "profile", "direction"])
        for (t, prof, direction), total in sorted(s.probe_latency.items()):
            buckets = [(_le(le), n) for le, n in zip(LATENCY_BUCKETS_SECONDS, total.buckets)]
            hist.add_metric([t, prof, direction], buckets + [("+Inf", total.count)], sum_value=total.sum_seconds)
        interval = GaugeMetricFamily("iowarden_probe_interval_seconds", "How often the profile runs on the target",
                                     labels=["target", "profile"])
        for (t, prof), sec in sorted(s.probe_intervals.items()):
            interval.add_metric([t, prof], sec)
        yield interval
        over = GaugeMetricFamily("iowarden_discovery_targets_over_limit", "Mount points [[discover]] rules match "
                                 "past [scheduling] max_discovered_targets, not probed")
        over.add_metric([], s.discovery_over_limit)
        yield over
        skipped = CounterMetricFamily("iowarden_probe_skipped", "Probes deferred or skipped, by reason",
                                      labels=["target", "reason"])
        targets = sorted({p.target for p in s.probes} | {t for t, _ in s.skipped_total})
        for t in targets:
            for reason in SKIP_REASONS:
                skipped.add_metric([t, reason], s.skipped_total.get((t, reason), 0))
        budget_used = GaugeMetricFamily("iowarden_budget_device_time_used_seconds",
                                        "Probe device-time spent on the disk in the budget window", labels=["device"])
        routine_used = GaugeMetricFamily("iowarden_budget_routine_device_time_used_seconds",
                                         "The share of it spent by armed volumes' probes: what counts against "
                                         "iowarden_budget_device_time_allowed_seconds", labels=["device"])
        warmup_allowed = GaugeMetricFamily("iowarden_budget_warmup_device_time_allowed_seconds",
                                           "Probe device-time a volume still learning may use in the budget window",
                                           labels=["device"])
        budget_allowed = GaugeMetricFamily("iowarden_budget_device_time_allowed_seconds",
                                           "Probe device-time allowed in the budget window", labels=["device"])
        written = GaugeMetricFamily("iowarden_budget_written_bytes", "Bytes probes wrote to the disk in 24 h",
                                    labels=["device"])
        written_allowed = GaugeMetricFamily("iowarden_budget_written_allowed_bytes",
                                            "Bytes probes may write to the disk in 24 h", labels=["device"])
        for disk, b in sorted(s.budget.items()):
            budget_used.add_metric([disk], b.device_seconds_used)
            budget_allowed.add_metric([disk], b.device_seconds_allowed)
            routine_used.add_metric([disk], b.routine_seconds_used)
            warmup_allowed.add_metric([disk], b.warmup_seconds_allowed)
            written.add_metric([disk], b.written_bytes_24h)
            written_allowed.add_metric([disk], b.written_bytes_allowed)
        yield from (iops, bw, hist, pct, success, last_ok, dur, cont, skipped,
                    budget_used, routine_used, budget_allowed, warmup_allowed, written, written_allowed)

    # -- baselines and alerts -----------------------------------------------------------------
    def _baselines(self, s):
        labels = ["volume", "profile", "metric"]
        # one family per unit: a baseline of IOPS, of bytes per second, of seconds
        fams = {}
        for unit, what in BASELINE_UNITS.values():
            fams[unit] = tuple(GaugeMetricFamily(f"iowarden_baseline{part}_{unit}", help_ + what, labels=labels)
                               for part, help_ in (
                                   ("", "The volume's normal (median of recent probes) of "),
                                   ("_band_lower", "Lower edge of the normal band (baseline / e^(2 spreads)) of "),
                                   ("_band_upper", "Upper edge of the normal band (baseline * e^(2 spreads)) of ")))
        dev = GaugeMetricFamily("iowarden_deviation_score", "How far the last probe is from the baseline, in "
                                "robust standard deviations; positive is worse", labels=labels)
        learning = GaugeMetricFamily("iowarden_baseline_learning", "1 while the baseline is still warming up",
                                     labels=labels)
        for b in s.baselines:
            unit, name = baseline_unit(b.metric)
            lab = [b.volume, b.profile, name]
            if b.baseline is not None:
                base, lower, upper = fams[unit]
                base.add_metric(lab, b.baseline)
                lower.add_metric(lab, b.baseline * math.exp(-BAND_SPREADS * b.spread_log))
                upper.add_metric(lab, b.baseline * math.exp(BAND_SPREADS * b.spread_log))
            if b.deviation_score is not None:
                dev.add_metric(lab, b.deviation_score)
            learning.add_metric(lab, 1 if b.learning else 0)
        for trio in fams.values():
            yield from trio
        yield from (dev, learning)
        # `target` is a configured target, `device` a kernel name: a passive verdict is on a device and
        # has no target; a probe's alert names its target and the device its last probe ran on
        yield from alert_families(s, self.runbook_url)

    # -- the kernel's disk counters ----------------------------------------------------------
    # /proc/diskstats as counters (node_exporter's set, sectors as bytes, milliseconds as seconds), so
    # that rate() over any window is exact; the recording rules in iowarden.rules.yml make iostat -x's
    # r/s, r_await, aqu-sz and %util of them. The 1 Hz rates stay inside the daemon (the passive
    # detector, `iowarden iostat`): a gauge of the last second, scraped every 15 s, keeps one second
    # in fifteen. The kernel's time fields wrap at 2^32 ms (49.7 days); rate() takes the wrap for a
    # reset, as it does node_exporter's.
    DISK_COUNTERS = (
        # (name, field, help, scale, only if the kernel has the field)
        ("reads_completed", "reads", "Reads completed", 1, None),
        ("reads_merged", "reads_merged", "Adjacent reads merged into one request", 1, None),
        ("read_bytes", "sectors_read", "Bytes read", 512, None),
        ("read_time_seconds", "read_ms", "Time reads took, queue and service, summed over reads", 1e-3, None),
        ("writes_completed", "writes", "Writes completed", 1, None),
        ("writes_merged", "writes_merged", "Adjacent writes merged into one request", 1, None),
        ("written_bytes", "sectors_written", "Bytes written", 512, None),
        ("write_time_seconds", "write_ms", "Time writes took, queue and service, summed over writes", 1e-3, None),
        ("discards_completed", "discards", "Discards completed", 1, "has_discards"),
        ("discards_merged", "discards_merged", "Adjacent discards merged into one request", 1, "has_discards"),
        ("discarded_bytes", "sectors_discarded", "Bytes discarded", 512, "has_discards"),
        ("discard_time_seconds", "discard_ms", "Time discards took, summed over discards", 1e-3, "has_discards"),
        ("flush_requests", "flushes", "Flush requests completed", 1, "has_flushes"),
        ("flush_requests_time_seconds", "flush_ms", "Time flushes took, summed over flushes", 1e-3, "has_flushes"),
        ("io_time_seconds", "io_ms", "Time the device had I/O in flight (rate: iostat %util / 100)", 1e-3, None),
        ("io_time_weighted_seconds", "weighted_io_ms",
         "Time I/Os spent in flight, summed over I/Os (rate: iostat aqu-sz)", 1e-3, None),
    )

    def _disks(self, s):
        sample = s.disk_sample
        known = self._disk_rows_for(s.devices)
        fams = [(f"iowarden_disk_{name}", attr, help_, scale, present) for name, attr, help_, scale, present
                in self.DISK_COUNTERS] + [("iowarden_disk_io_now", "in_flight", "I/Os in flight now", 1, None)]
        lines: list[list] = [[] for _ in fams]
        written: list[tuple] = []
        # the devices the sampler watches (whole devices less the excluded, by default)
        for dev in sorted(s.disk_rates):
            c = sample.counters.get(dev) if sample is not None else None
            if c is None:
                continue
            kept = known.get(dev)
            if kept is None or kept[0] is not c:
                # an idle disk's counters are the same object scrape after scrape (diskstats.parse keeps a
                # line it has seen): its lines are kept, and only the disks that moved are written. One tuple of
                # lines a disk (None where the kernel lacks the counter), not a row object a sample: at 1,024
                # disks the rows were 2.4 MB kept for nothing but a test's generate_latest. Its labels come from
                # the device view, and `known` lasts no longer than the view: a disk seen before keeps its text
                values, text = kept[1:3] if kept is not None else ((dev, identity_of(dev, s.devices)), None)
                text = text or label_text(DISK_LABELS, values)
                kept = known[dev] = (c, values, text, tuple(
                    sample_line(name + ("_total" if i < len(self.DISK_COUNTERS) else ""), text,
                                getattr(c, attr) * scale) if present is None or getattr(c, present) else None
                    for i, (name, attr, _, scale, present) in enumerate(fams)))
            written.append(kept)
            for i, line in enumerate(kept[3]):
                if line is not None:
                    lines[i].append(line)
        for i, (name, attr, help_, scale, _) in enumerate(fams):
            def rows(i=i, attr=attr, scale=scale):
                return [(text, values, getattr(c, attr) * scale) for c, values, text, ls in written
                        if ls[i] is not None]
            yield TextFamily(name, help_, "counter" if i < len(self.DISK_COUNTERS) else "gauge", DISK_LABELS,
                             rows, lines[i])
        if s.io_pressure is not None:
            psi = GaugeMetricFamily("iowarden_io_pressure_ratio", "Share of time tasks stalled on I/O, 10 s "
                                    "average (/proc/pressure/io)", labels=["kind"])
            psi.add_metric(["some"], s.io_pressure.some_avg10_percent / 100)
            if s.io_pressure.full_avg10_percent is not None:
                psi.add_metric(["full"], s.io_pressure.full_avg10_percent / 100)
            yield psi
        if s.cpu_pressure is not None:
            # beside a probe's latency: over half the time waiting for a CPU, its qd1 reads are not judged
            yield GaugeMetricFamily("iowarden_cpu_pressure_ratio", "Share of time at least one runnable task "
                                    "waited for a CPU, 10 s average (/proc/pressure/cpu \"some\")",
                                    value=s.cpu_pressure.some_avg10_percent / 100)

    # -- settings -----------------------------------------------------------------------------
