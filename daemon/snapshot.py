"""The latest view of everything the daemon knows, taken in one go for the exporters.

Exporters read snapshots only: no fio, xfs_db or sysfs work happens at scrape
time. Building one is cheap: values a part replaces whole (the device view, the
latest rates, power settings) are referenced; those parts change in place (health,
budgets, skip counters, latest results, the state database's counters) are copied
by their owners under their own locks, so a scrape never iterates a collection a
worker is changing.
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
class Snapshot:
    taken_at: float
    version: str
    probes: tuple[ProbeView, ...] = ()
    skipped_total: dict = field(default_factory=dict)       # (target, reason) -> count
    baselines: tuple[BaselineView, ...] = ()
    alerts: tuple[dict, ...] = ()                            # open alerts
    disk_rates: dict = field(default_factory=dict)           # kernel name -> DiskRates
    devices: dict = field(default_factory=dict)              # kernel name -> BlockDevice
    power: object | None = None                              # PowerSettings
    drift_total: dict = field(default_factory=dict)          # (device, volume, setting) -> count
    xfs: dict = field(default_factory=dict)                  # mount -> (XfsReport, unix time of the report)
    budget: dict = field(default_factory=dict)               # disk -> Budget.status()
    parts: dict = field(default_factory=dict)                # name -> PartStats
    io_pressure: object | None = None
    probe_intervals: dict = field(default_factory=dict)      # (target, profile) -> seconds
    influx: dict | None = None                               # writer counters, when InfluxDB is on
    state: dict | None = None                                # state database: writable, pending, errors
    passive: tuple = ()                                      # (kernel name, identity, passive.DeviceView)


def take(daemon) -> Snapshot:
    health = daemon.health
    baselines = health.baseline_views()
    disks = {}
    for t in daemon.targets():
        for disk in daemon.scheduler.physical_disks_cached(t):
            disks[disk] = daemon.scheduler.budget.status(disk)
    return Snapshot(
        taken_at=time.time(),
        version=daemon.version,
        probes=daemon.latest_probe_views(),
        skipped_total=daemon.scheduler.skipped(),
        baselines=tuple(baselines),
        alerts=tuple(health.open_alert_views()),
        disk_rates=daemon.sampler.rates,
        devices=daemon.settings.devices,
        power=daemon.settings.power,
        drift_total=dict(daemon.settings.drift_total),
        xfs=dict(daemon.xfs.reports_at),
        budget=disks,
        parts=daemon.registry.stats(),
        io_pressure=daemon.sampler.io_pressure,
        probe_intervals={(t.name, p): t.interval_seconds for t in daemon.targets() for p in t.profiles},
        influx=_influx_stats(daemon.influx.writer) if daemon.influx is not None else None,
        state=daemon.state.stats(),
        passive=daemon.passive.views if daemon.passive is not None else (),
    )


def _influx_stats(w) -> dict:
    return {"written": w.points_written_total, "spooled": w.points_spooled_total, "dropped": w.points_dropped_total,
            "errors": w.write_errors_total, "spool_bytes": w.spool_bytes, "rejected": w.points_rejected_total}
