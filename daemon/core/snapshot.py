"""The latest view of everything the daemon knows: built by the core after each batch of events.

Exporters, the InfluxDB writer and the status line read snapshots only: no fio, xfs_db or
sysfs work happens at scrape time, and no reader ever sees a part's internals. A Snapshot
is frozen and is never changed after it is published; the values it holds are either
replaced whole by their parts (the device view, the latest rates, power settings, the
passive views) or copied by their owners under their locks (budgets, skip counters, part
and database counters), so nothing it references is changed in place afterwards.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProbeView:
    target: str
    profile: str
    volume: str
    result: object                      # the last ProbeResult (ok or not)
    last_success_timestamp: float | None


@dataclass(frozen=True)
class BaselineView:
    volume: str
    profile: str
    metric: str
    baseline: float | None
    spread_log: float | None              # robust spread of log(value)
    deviation_score: float | None        # None while learning: absent from /metrics, not 0
    samples: int
    learning: bool


@dataclass(frozen=True)
class AlertView:
    alert: str                 # VolumeDegraded, ProbeFailing, DeviceSlow, SlowMember, VolumeAtLimit
    volume: str                # stable identity
    profile: str               # the probe profile, or "passive"
    target: str | None         # the target, or the device a passive verdict is on
    severity: str
    raised_at: float           # unix time
    id: int


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    version: str
    probes: tuple[ProbeView, ...] = ()
    skipped_total: dict = field(default_factory=dict)       # (target, reason) -> count
    baselines: tuple[BaselineView, ...] = ()
    alerts: tuple[AlertView, ...] = ()                       # open alerts
    disk_rates: dict = field(default_factory=dict)           # kernel name -> DiskRates
    disk_sample: object | None = None                        # the sampler's last DiskSample (raw counters)
    devices: dict = field(default_factory=dict)              # kernel name -> BlockDevice
    power: object | None = None                              # PowerSettings
    drift_total: dict = field(default_factory=dict)          # (device, volume, setting) -> count
    xfs: dict = field(default_factory=dict)                  # mount -> (XfsReport, unix time of the report)
    budget: dict = field(default_factory=dict)               # disk -> scheduler.BudgetStatus
    parts: dict = field(default_factory=dict)                # name -> PartStats
    io_pressure: object | None = None
    probe_intervals: dict = field(default_factory=dict)      # (target, profile) -> seconds
    influx: dict | None = None                               # writer counters, when InfluxDB is on
    state: dict | None = None                                # state database: writable, pending, errors
    passive: tuple = ()                                      # (kernel name, identity, passive.DeviceView)


def build(parts, version: str, probes: tuple) -> Snapshot:
    """parts: the daemon's parts (see core.Core); probes: the core's latest ProbeViews."""
    disks = {}
    targets = parts.targets()
    for t in targets:
        for disk in parts.scheduler.physical_disks_cached(t):
            disks[disk] = parts.scheduler.budget.status(disk)
    return Snapshot(
        taken_at=time.time(),
        version=version,
        probes=probes,
        skipped_total=parts.scheduler.skipped(),
        baselines=tuple(parts.health.baseline_views()),
        alerts=tuple(parts.health.open_alert_views()),
        disk_rates=parts.sampler.rates,
        disk_sample=parts.sampler.last_sample,
        devices=parts.settings.devices,
        power=parts.settings.power,
        drift_total=dict(parts.settings.drift_total),
        xfs=dict(parts.xfs.reports_at),
        budget=disks,
        parts=parts.registry.stats(),
        io_pressure=parts.sampler.io_pressure,
        probe_intervals={(t.name, p): t.interval_seconds for t in targets for p in t.profiles},
        influx=_influx_stats(parts.influx.writer) if parts.influx is not None else None,
        state=parts.state.stats(),
        passive=parts.passive.views if parts.passive is not None else (),
    )


def _influx_stats(w) -> dict:
    return {"written": w.points_written_total, "spooled": w.points_spooled_total, "dropped": w.points_dropped_total,
            "errors": w.write_errors_total, "spool_bytes": w.spool_bytes, "rejected": w.points_rejected_total}
