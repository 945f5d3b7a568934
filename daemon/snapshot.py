"""The latest view of everything the daemon knows: built by the core (Core.publish) after each batch.

Exporters, the InfluxDB writer and the status line read snapshots only: no fio, xfs_db or
sysfs work happens at scrape time, and no reader ever sees a part's internals. A Snapshot
is frozen all the way down (tests/unit/test_immutable.py walks one): its mappings are
read-only copies (`frozen`), its records frozen dataclasses, so nothing it references is
changed after it is published.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


def frozen(value):
    """A value for a snapshot: mappings read-only, lists tuples, sets frozensets, all the way down (None stays
    None). What a part or the core keeps changing is copied here, so a published snapshot never moves."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: frozen(v) for k, v in value.items()})
    if isinstance(value, list) or (type(value) is tuple):
        return tuple(frozen(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(value)
    return value


def _empty() -> Mapping:
    return MappingProxyType({})


# the profile of what is not a probe's: a passive verdict's alert, a characterized capability, a source's summary
PASSIVE_PROFILE = "passive"
CAPABILITY_PROFILE = "capability"
SOURCE_PROFILE = "source"        # a registered source's last summary, for `status` (sources/spec.py)
NOT_PROBE_PROFILES = (PASSIVE_PROFILE, CAPABILITY_PROFILE, SOURCE_PROFILE)


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
class Told:
    """One thing the core tells every output that keeps a record of them (InfluxDB's points), numbered: an
    output reads the snapshot's `told` and takes those past the last number it took."""
    seq: int
    what: str                  # "probe" (fields: record, identity) or "event" (fields: kind and its data)
    fields: Mapping
    unix_time: float


@dataclass(frozen=True)
class AlertView:
    alert: str                 # VolumeDegraded, ProbeFailing, DeviceSlow, SlowMember, VolumeAtLimit
    volume: str                # stable identity
    profile: str               # the probe profile, or "passive"
    target: str | None         # the target, or the device a passive verdict is on
    severity: str
    raised_at: float           # unix time
    id: int
    moved: tuple = ()          # (metric, now, normal) of each metric past its normal (a probe's alert)
    causes: tuple = ()         # likely causes, ranked; a passive alert's first is its own finding
    acked_by: str | None = None
    ack_note: str | None = None
    mountpoint: str | None = None   # where it was raised (the sentence's place)
    devices: tuple = ()
    acked_at: float | None = None   # when it was acknowledged (unix time)


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    version: str
    probes: tuple[ProbeView, ...] = ()
    skipped_total: Mapping = field(default_factory=_empty)    # (target, reason) -> count
    baselines: tuple[BaselineView, ...] = ()
    alerts: tuple[AlertView, ...] = ()                        # open alerts
    disk_reading: object | None = None                        # the sampler's last SamplerReading, whole
    devices: Mapping = field(default_factory=_empty)          # kernel name -> BlockDevice
    power: object | None = None                               # PowerSettings
    drift_total: Mapping = field(default_factory=_empty)      # (device, volume, setting) -> count
    drift_last_at: Mapping = field(default_factory=_empty)    # (device, volume, setting) -> unix time of the last
    drift_last_change: Mapping = field(default_factory=_empty)  # (device, volume, setting) -> (old, new) of the last
    xfs: Mapping = field(default_factory=_empty)              # mount -> (XfsReport, unix time of the report)
    budget: Mapping = field(default_factory=_empty)           # disk -> scheduler.BudgetStatus
    parts: Mapping = field(default_factory=_empty)            # name -> PartStats
    probe_intervals: Mapping = field(default_factory=_empty)  # (target, profile) -> seconds
    discovery_over_limit: int = 0                             # mounts past [scheduling] max_discovered_targets
    influx: Mapping | None = None                             # writer counters, when InfluxDB is on
    state: Mapping | None = None                              # state database: writable, pending, errors
    passive: tuple = ()                                       # (kernel name, identity, passive.DeviceView)
    passive_host_ratio: float | None = None                   # the host's disks' median slowdown (passive/host.py)
    sources: Mapping = field(default_factory=_empty)          # registered source -> its last reading
    probe_latency: Mapping = field(default_factory=_empty)    # (target, profile, direction) -> latency.LatencyTotal
    pins: Mapping = field(default_factory=_empty)             # target -> the volume it was first probed on
    classes: Mapping = field(default_factory=_empty)          # volume -> its fleet class as configured (`class`)
    own_probes: Mapping = field(default_factory=_empty)       # device -> when a probe last ran on it (monotonic, inf: now)
    folds: Mapping = field(default_factory=_empty)            # alert id -> verdicts.pages.Fold: said on another's page
    told: tuple = ()                                          # the last Told, oldest first (core.TOLD_KEPT)
    # (volume, profile): last probe short in total on a busy device, or collapsed and set aside on a starved CPU
    short_on_busy: frozenset = frozenset()

    # the sampler's reading in parts, as outputs name them: one copy, the reading's (disk_reading)
    @property
    def disk_rates(self) -> Mapping:
        """kernel name -> DiskRates since the sample before (sampled devices only)."""
        return self.disk_reading.rates if self.disk_reading is not None else _empty()

    @property
    def disk_sample(self):
        """The sampler's last DiskSample (raw counters); None before the first."""
        return self.disk_reading.sample if self.disk_reading is not None else None

    @property
    def io_pressure(self):
        """The host's I/O pressure (PSI) as the sampler last read it; None where the kernel has none."""
        return self.disk_reading.io_pressure if self.disk_reading is not None else None

    @property
    def cpu_pressure(self):
        """The host's CPU pressure (PSI) as the sampler last read it: a starved CPU stretches a probe's latency."""
        return self.disk_reading.cpu_pressure if self.disk_reading is not None else None
