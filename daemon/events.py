"""What a part tells the core: immutable values, one type per kind of news.

A part builds an event from what it read and posts it (Core.post, any thread); the core applies it on
its own thread. An event holds no reference the part goes on changing: tuples, frozen dataclasses and
mappings the part has replaced, never updated. Each type has exactly one handler in core.py
(HANDLERS), which test_core_ownership.py checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


def frozen_map(d: dict | None = None) -> MappingProxyType:
    """A read-only view of a dict no one else holds: what an event or a snapshot carries."""
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class ProbeFinished:
    """A probe worker's result, failed or not, with what the worker knew when it ended."""
    result: object                       # fio_run.ProbeResult (not changed after it is posted)
    disks: tuple[str, ...] = ()          # the physical disks it ran on
    budget_exhausted: bool = False       # their budget was spent when it ended (a cause: at its limit)
    unmounted: bool = False              # its volume was unmounted as it began: no result, a volume gone


@dataclass(frozen=True)
class ProbeStarted:
    """A probe worker is about to run fio on `device`: the core keeps that device's counters, and those of the
    physical disks under it, from now until the probe's ProbeFinished (what they did meanwhile: contention),
    and no other device's."""
    target: str
    profile: str
    device: str | None
    disks: tuple[str, ...] = ()          # the physical disks under it (a partition's disk, an LV's PVs)


@dataclass(frozen=True)
class IntervalsFitted:
    """The interval each probe runs at now: its own, the warm-up's, or stretched to fit its disks' budget
    (probing/fit.py). Posted when one changes; /metrics says it, and the ProbeStale rule allows for it."""
    intervals: MappingProxyType          # (target, profile) -> seconds


@dataclass(frozen=True)
class DisksSampled:
    """The sampler's 1 Hz reading: raw counters, iostat -x rates of the sampled devices, PSI."""
    sample: object                       # diskstats.DiskSample
    rates: MappingProxyType              # kernel name -> DiskRates
    io_pressure: object | None
    unix_time: float
    sampled: frozenset | None = None     # the devices the sampler watches (its filter, which drift follows too)
    # kernel name -> mean %util over the last RECENT_UTIL_SECONDS samples (what the scheduler defers on)
    recent_util_percent: MappingProxyType | None = None
    cpu_pressure: object | None = None   # /proc/pressure/cpu (probes/pressure.py)


@dataclass(frozen=True)
class DevicesRead:
    """The block devices as read from sysfs (a settings poll or a uevent): the device view."""
    devices: MappingProxyType            # kernel name -> BlockDevice
    read_at_monotonic: float


@dataclass(frozen=True)
class SettingsRead:
    """The settings poll: the device view and the host's power settings, read together."""
    devices: DevicesRead
    power: object                        # cpupower.PowerSettings


@dataclass(frozen=True)
class XfsRead:
    """One XFS poll: mount -> (XfsReport, unix time of the report)."""
    reports_at: MappingProxyType


@dataclass(frozen=True)
class PassiveJudged:
    """One passive window: verdict transitions (transition, kernel name), the detector's views
    (kernel name, identity, DeviceView), and, when due, what to save: (identity, metric, state)."""
    transitions: tuple = ()
    views: tuple = ()
    saves: tuple = ()
    host_slowdown_ratio: float | None = None   # the host's disks' median latency over their normals (passive/host.py)


@dataclass(frozen=True)
class SourceRead:
    """A registered source's reading (sources/registry.py): the value its spec's pure functions take."""
    source: str
    value: object


@dataclass(frozen=True)
class TargetsChanged:
    """The targets now (configured and discovered), and the ones gone with why: their series leave."""
    targets: tuple
    dropped: tuple[tuple[str, str], ...] = ()
    discovery_over_limit: int = 0        # mounts [[discover]] would take past max_discovered_targets


@dataclass(frozen=True)
class Housekeeping:
    """Time to prune old results (retention) or to write what waits (the database was busy)."""
    job: str                             # "retention" | "retry_writes"


@dataclass(frozen=True)
class ProbesCounted:
    """The scheduler's own counters after a step in which they moved: skips per (target, reason), and each
    probed disk's budget as it stood (budget.BudgetStatus)."""
    skipped_total: MappingProxyType
    budget: MappingProxyType


@dataclass(frozen=True)
class PartsChecked:
    """Every supervised part's stats (registry.PartStats) as the supervisor saw them, every second."""
    parts: MappingProxyType


@dataclass(frozen=True)
class InfluxCounted:
    """The InfluxDB writer's counters after a flush in which they moved."""
    counters: MappingProxyType
