"""What the core knows, and what a probe result and a settings poll do to it (core thread only).

`Knowledge` is the core's mutable state; nothing outside the core holds it. Values that leave it (into
a snapshot, to Health) are either immutable (tuples, mapping proxies, frozen dataclasses) or copies.
Evidence for causes is read from here: no sysfs, no database query, no call into a part.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import logging
import time
from dataclasses import dataclass, field
from types import MappingProxyType

from iowarden.probes import blockqueue
from iowarden.probes.blockqueue import identity_of, physical_devices
from iowarden.probes.diskstats import DiskSample, compute_rates
from iowarden.probes.vocabulary import DIRECTIONS

from iowarden.daemon.core import latency, space
from iowarden.daemon.events import DevicesRead, ProbeFinished
from iowarden.daemon.snapshot import ProbeView
from iowarden.daemon.wording import result_summary
from iowarden.daemon.sources.settings import known_settings, settings_changes, watched_settings
from iowarden.daemon.sources.xfs import mount_of
from iowarden.daemon.sources import cgroups
from iowarden.daemon.verdicts.causes import LIMIT_BELOW, Evidence, ProbeWindow, likely_causes
from iowarden.daemon.verdicts.changes import DriftFound, ProbeStored, SettingsSeen
from iowarden.daemon.verdicts.health import slowed_host
from iowarden.daemon.snapshot import PASSIVE_PROFILE, SOURCE_PROFILE

log = logging.getLogger("iowarden")
__all__ = ["Knowledge", "apply_result", "apply_settings", "PASSIVE_PROFILE", "SOURCE_PROFILE"]

RECENT_DRIFT = 1000          # drift events kept for causes (a baseline's window of history)
DRIFT_SPAN_SECONDS = 600.0   # a drift's page lasts this long after its change (IowardenSettingsDrift's ten minutes)
# a passive verdict names a setting changed this recently on its device or below it: the curve it is judged on
# was learned over hours and days before (a probe's cause looks back to its baseline's learning instead)
PASSIVE_DRIFT_SECONDS = 86400.0
SAMPLES_KEPT = 130           # two minutes of 1 Hz samples: what a disk did during a probe that just ended
# Only of the devices a probe runs on (ProbeStarted to ProbeFinished): 130 whole samples were 64 KiB a device,
# 260 MiB at 4,000 disks, for the two or three a probe was running on.
SAMPLE_BEFORE_SECONDS = 1.5   # the sampler's second and a margin: the sample before a probe began is its first
OWN_IO_KEPT = 16             # the last probes' seconds and bytes: iowarden's own share of a window's I/O
# Other work that moved this many times the probe's bytes a second in the probe's seconds, and at least the floor,
# made it a measurement beside that work, though the disk looked quiet when it began (a backup starting
# mid-probe): it is judged as a contended probe. 3x, not 1x: a mirror's members carry a write twice, and the
# sampler's seconds are wider than the probe's (the probe before it, prorated, is in them)
OTHER_WORK_RATIO = 3.0
OTHER_WORK_FLOOR_BYTES_PER_SECOND = 4 << 20


@dataclass
class Knowledge:
    last_settings: dict | None = None                       # (device, setting) -> value, from the last poll
    recent_drift: list = field(default_factory=list)        # (at, device, identity, setting, old, new)
    latest: dict = field(default_factory=dict)              # (target, profile) -> ProbeView
    last_result: object | None = None
    targets: tuple = ()
    discovery_over_limit: int = 0
    fitted_intervals: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))   # IntervalsFitted
    devices: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    devices_read_at: float = float("-inf")
    power: object | None = None
    rates: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    sample: object | None = None
    io_pressure: object | None = None
    cpu_pressure: object | None = None
    disk_reading: object | None = None                      # the sampler's last reading whole (SamplerReading)
    samples: collections.deque = field(default_factory=lambda: collections.deque(maxlen=SAMPLES_KEPT))
    xfs_at: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    xfs_first: dict = field(default_factory=dict)
    drift_total: collections.Counter = field(default_factory=collections.Counter)
    sampled: frozenset | None = None                        # the sampler's devices (None: not sampled yet)
    drift_last_at: dict = field(default_factory=dict)       # (device, volume, setting) -> unix time of the last change
    drift_last_change: dict = field(default_factory=dict)   # (device, volume, setting) -> (old, new) of the last
    passive_views: tuple = ()
    passive_host_ratio: float | None = None                 # PassiveJudged.host_slowdown_ratio
    sources: dict = field(default_factory=dict)
    latency_totals: dict = field(default_factory=dict)      # (target, profile, direction) -> LatencyTotal
    probing: dict = field(default_factory=dict)             # (target, profile) -> the device its probe runs on
    probing_disks: dict = field(default_factory=dict)       # (target, profile) -> the physical disks under it
    probe_ended_at: dict = field(default_factory=dict)      # device -> when its last probe ended (monotonic)
    sample_at: float = 0.0                                  # the Unix time of `sample`
    # (devices, started, ended (Unix), bytes moved) of the last probes: their share of a window is not other work
    own_io: collections.deque = field(default_factory=lambda: collections.deque(maxlen=OWN_IO_KEPT))
    full: dict = field(default_factory=dict)                # target -> space.Full: its probe refused for space
    # the parts' own counters, as they last posted them
    skipped_total: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))   # ProbesCounted
    budget: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))          # ProbesCounted
    parts: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))           # PartsChecked
    influx: MappingProxyType | None = None                                                   # InfluxCounted

    def __post_init__(self):
        self.recent_drift = collections.deque(self.recent_drift, maxlen=RECENT_DRIFT)

    def take_devices(self, e: DevicesRead) -> None:
        # two readers refresh the view, the settings poll and a uevent: the newest read wins, so a poll
        # that began before a hot-add cannot put back the view without the new disk
        if e.read_at_monotonic >= self.devices_read_at:
            self.devices, self.devices_read_at = e.devices, e.read_at_monotonic

    def identity_of_target(self, target: str) -> str | None:
        """The volume a target's last probe ran on (what the core has seen, not a fresh stat)."""
        views = [v for (t, _), v in self.latest.items() if t == target]
        return views[-1].volume if views else None

    def keep_sample(self, unix_time: float, sample) -> None:
        """Keep the counters of the devices probes run on now (none while no probe runs)."""
        self.sample_at = unix_time
        watched = {d for d in self.probing.values() if d} | {d for ds in self.probing_disks.values() for d in ds}
        if watched:
            self.samples.append((unix_time, DiskSample(sample.monotonic_seconds,
                                                       {d: c for d, c in sample.counters.items() if d in watched})))

    def own_probes(self) -> MappingProxyType:
        """Device -> when a probe last ran on it (monotonic; infinity while one runs): windows of real traffic
        that held iowarden's own fio are not evidence of a ceiling (a fixed-depth probe is flat by itself)."""
        out = dict(self.probe_ended_at)
        out.update({d: math.inf for d in self.probing.values() if d})
        return MappingProxyType(out)

    def probe_started(self, target: str, profile: str, device: str | None, disks: tuple[str, ...] = ()) -> None:
        """Watch the device and the disks under it from now, starting with the sample just before (fio starts
        within the second: what they did from then on is bracketed by that sample and the first after the
        probe's end)."""
        self.probing[(target, profile)] = device
        self.probing_disks[(target, profile)] = tuple(disks) + self.beneath(device, disks)
        names = {device, *self.probing_disks[(target, profile)]} - {None}
        if names and self.sample is not None:
            self.samples.append((self.sample_at, DiskSample(self.sample.monotonic_seconds, {
                n: self.sample.counters[n] for n in names if n in self.sample.counters})))

    def beneath(self, device: str | None, disks) -> tuple[str, ...]:
        """The disks a loop device's backing file is on (and what they are built on), beyond its own disks: a
        probe's device and disks can be quiet while the disk under its file is full of other work."""
        return tuple(sorted(below_stack(self, {device}) - set(disks))) if device else ()

    def moved(self, result, disks: tuple[str, ...]) -> None:
        """Keep what a probe moved, and where (its device, disks and the disks under a loop's file), in its
        seconds: its share of later windows is iowarden's own, not other work."""
        if result.device:
            self.own_io.append(({result.device, *disks, *self.beneath(result.device, disks)}, result.started_at,
                                result.started_at + result.duration_seconds, bytes_moved(result)))

    def _bracket(self, device: str, start: float, end: float):
        """The first and last samples of a device in a probe's seconds ((Unix time, sample) each), or None.

        From the sample just before its start (ProbeStarted keeps it; up to a sampler's second before): a probe is
        judged when it ends, before the sample after it arrives, and a 1.5 s probe whose sample before fell 0.6 s
        ahead of it had one sample inside and no total (the time-to-detect bench: three of four busy probes of a
        throttled volume unjudged). Samples kept for another device's probe, without this one, do not count."""
        inside = [(t, s) for t, s in self.samples if start - SAMPLE_BEFORE_SECONDS <= t <= end + 1.5
                  and device in s.counters]
        return (inside[0], inside[-1]) if len(inside) >= 2 else None

    def window(self, device: str, start: float, end: float) -> tuple[float, float] | None:
        """The Unix times of the samples that bracket a probe's seconds (what `delivered` reads), or None."""
        ends = self._bracket(device, start, end)
        return (ends[0][0], ends[1][0]) if ends and ends[1][0] > ends[0][0] else None

    def delivered(self, device: str, start: float, end: float):
        """iostat -x of one device between two Unix times (the samples nearest inside them), or None."""
        ends = self._bracket(device, start, end)
        if ends is None:
            return None
        (_, a), (_, b) = ends
        if b.monotonic_seconds <= a.monotonic_seconds:
            return None
        return compute_rates(a.counters[device], b.counters[device], b.monotonic_seconds - a.monotonic_seconds)


def apply_result(core, e: ProbeFinished) -> None:
    """Store, publish and judge one probe result."""
    k, result = core.known, e.result
    identity = identity_of(result.device, k.devices) if result.device else f"target:{result.target}"
    k.moved(result, e.disks)
    beside = other_work(k, result, e.disks) if result.ok and not result.contended and result.device else None
    verdicts = core.health.latest.get((identity, result.profile))
    if not verdicts or any(v.learning for v in verdicts.values()):
        beside = None   # a warm-up probe is left to the scheduler's own rules for learning under load
    if beside is not None:
        # a quiet disk when it began, and most of its seconds' I/O someone else's: measured beside that work
        result = dataclasses.replace(result, contended=True)
        e = dataclasses.replace(e, result=result)
    record = result.to_json()
    core.act([ProbeStored(identity, MappingProxyType(record))])   # kept before it is judged: its row, its record
    k.last_result = result
    # a target dropped while its probe ran is stored, but gets no series back
    if result.target in {t.name for t in k.targets}:
        key = (result.target, result.profile)
        prev = k.latest.get(key)
        last_ok = result.started_at + result.duration_seconds if result.ok else (
            prev.last_success_timestamp if prev else None)
        k.latest[key] = ProbeView(result.target, result.profile, identity, result, last_ok)
        space.note(k.full, result, core.clock())
        if result.ok and result.report is not None:
            latency.add_probe(k.latency_totals, result.target, result.profile, result.report)
    rates = k.rates.get(result.device) if result.device else None
    context = {"disk_util_percent": rates.util_percent, "disk_read_await_ms": rates.read_await_ms,
               "disk_write_await_ms": rates.write_await_ms} if rates else {}
    total_said = ""
    # the passive detector's view of the same device: its own latency at its load, and its host's
    view = next((v for name, _, v in k.passive_views if name == result.device), None) if result.device else None
    if result.contended and result.device:
        context["probe_queue_depth"] = result.queue_depth
        total = delivered_in_total(k, result.device, e.disks, result.started_at,
                                   result.started_at + result.duration_seconds,
                                   (sum(result.iops(d) or 0.0 for d in DIRECTIONS),
                                    sum(result.bw_bytes(d) or 0.0 for d in DIRECTIONS)))
        if total is not None:
            context["delivered_iops"], context["delivered_bytes_per_second"], context["delivered_on"] = total
            # said in the probe's one line: a line of its own every probe is the chatter a journal must not carry
            total_said = (f": the busy disk delivered {total[0]:.0f} IOPS, {total[1] / (1 << 20):.1f} MiB/s in "
                          f"total on {total[2]}, the probe and the other work")
        if view is not None and view.slowdown_ratio and not view.flagged:
            # the passive view of the same device: is it serving the load it carries at its normal latency?
            context["passive_slowdown"] = round(max(view.slowdown_ratio.values()), 2)
    if view is not None and view.neighbours_ratio is not None:
        context["host_slowdown"] = round(view.neighbours_ratio, 2)
    if view is not None and view.slowdown_ratio:   # the device's own latency at its load: slower than its host, or with it
        context["own_slowdown"] = round(max(view.slowdown_ratio.values()), 2)
    if view is not None and view.window_ratio is not None:
        # the same in the last window alone: a collapse moves the load into a bin the curve has not learned, and
        # the last judged ratio (0.71x) stayed the device's for the three minutes a volume delivered 5 % of its load
        context["own_slowdown_now"] = round(view.window_ratio, 2)
    under = [(name, v.window_ratio) for name, _, v in k.passive_views
             if name in e.disks and name != result.device and v.window_ratio is not None]
    if result.device and under:
        # the disks under the volume's device (an array's members): the slowest is what the array waits on
        context["slowest_member_now"] = max(under, key=lambda x: x[1])
    if k.cpu_pressure is not None:
        context["cpu_pressure_some_percent"] = k.cpu_pressure.some_avg10_percent
    if result.contended and total_said:
        # what a contended judgement's thresholds are chosen on, probe by probe, in the soaks' journals: the device's
        # own latency for its load in the last window (a collapse's is many times its normal, a starved CPU's about
        # 1x; not said where that window was not judged) and the CPU
        if context.get("own_slowdown_now") is not None:
            total_said += f"; the device at {context['own_slowdown_now']:.2f}x its normal latency for its load"
        if context.get("cpu_pressure_some_percent") is not None:
            total_said += f"; tasks waited for a CPU {context['cpu_pressure_some_percent']:.0f} % of the time"
    if result.device and limits_on_stack(k, {result.device, *e.disks}):
        context["cgroup_limited"] = True
    held = slowed_host(context)
    if held and not result.contended:
        total_said += "; " + held
    if beside is not None:
        total_said += f"; other work began during it: {beside / (1 << 20):.1f} MiB/s beside it"
    fields = {"TARGET": result.target, "PROBE": result.profile, "DEVICE": result.device or ""}
    full = None if result.ok else getattr(result, "space_used_ratio", None)
    if full is not None:
        # a full volume's probes are tried again every minute (suspicion.py), each profile: said once a minute
        # per volume, with how often since, not four lines a minute for as long as it stays full
        log.warning("probes of %s refused (each tried again every minute while it is full): %s",
                    result.target, result.error or "", extra={**fields, "REPEATS": True})
    else:
        log.log(logging.INFO if result.ok else logging.WARNING, result_summary(result) + total_said, extra=fields)
    # the evidence is gathered before the judgement: health judges on what it is given, and never calls back
    # into the core (a callback that read health again was the reason for a re-entrant lock)
    causes = causes_of(core, e, core.health.baseline_since(identity, result.profile))
    core.act(core.health.on_result(record, identity, lambda since: causes, context,
                                   core.place_of(result.target, False)))


def bytes_moved(result) -> float:
    """Everything a probe read and wrote: fio's measured bytes, its ramp's at the measured rate, its layout."""
    directions = result.report.directions.values() if result.report else ()
    return result.layout_bytes + sum(d.io_bytes + d.bw_bytes * result.ramp_seconds for d in directions)


def other_work(k: Knowledge, result, disks: tuple[str, ...]) -> float | None:
    """Bytes a second of I/O not iowarden's on the probe's device or the disks under it in the probe's seconds,
    when that is OTHER_WORK_RATIO times the probe's own and above the floor; else None.

    The disk a loop device's backing file is on counts too, on its own (it carries every file on it), unless a
    cgroup limit holds the stack: a probe held at a limit is slow by that limit, not by the disk's other work."""
    start, end = result.started_at, result.started_at + result.duration_seconds
    span = k.window(result.device, start, end)
    if span is None:
        return None
    (a, b) = span

    def beside(names: set, total_bytes_per_second: float) -> float:
        # iowarden's probes in those seconds, each taken as even over its own (the one before runs into them)
        own = sum(moved * max(0.0, min(e, b) - max(s, a)) / max(e - s, 1e-3)
                  for on, s, e, moved in k.own_io if on & names)
        return total_bytes_per_second - own / (b - a)

    seen = []
    total = delivered_in_total(k, result.device, disks, start, end)
    if total is not None:
        seen.append(beside({result.device, *disks}, total[1]))
    loop_disks = k.beneath(result.device, disks)
    if loop_disks and not limits_on_stack(k, {result.device, *disks}):
        for name in loop_disks:
            rates = k.delivered(name, start, end)
            if rates is not None:
                seen.append(beside({name}, (rates.read_kib_per_second + rates.write_kib_per_second) * 1024))
    if not seen:
        return None
    other = max(seen)
    probe = bytes_moved(result) / max(result.duration_seconds, 1e-3)
    return other if other >= max(OTHER_WORK_RATIO * probe, OTHER_WORK_FLOOR_BYTES_PER_SECOND) else None


def delivered_in_total(k: Knowledge, device: str, disks: tuple[str, ...], start: float, end: float,
                       probe_moved: tuple[float, float] = (0.0, 0.0)):
    """What was done in the probe's seconds, all work counted: (IOPS, bytes a second, where), or None.

    A probe is contended by the load on the physical disks under its device (plan.py), and where those are
    shared (LVs on one disk, partitions, an array's members) the other work is on them, not on the probe's
    device: a backup on the next LV fills the disk while the probe's own device carries the probe alone,
    which is short of the volume's quiet normal on a healthy disk. So the larger of the device's total and
    the disks' (summed: an array's members together), each of IOPS and bytes; a disk held at a limit is short
    in both.

    Never less than `probe_moved`, what the probe itself did (IOPS, bytes a second): its I/O is part of the total.
    On a host whose tasks waited for a CPU 92-98 % of the time the sampler's windows fell out of step with a
    probe of two seconds, and a probe that got 12,000 IOPS, its normal, read a total of 0: a recovered volume's
    alert stayed open on probes that were all back."""
    def figures(rates):
        return (sum(r.reads_per_second + r.writes_per_second for r in rates),
                sum((r.read_kib_per_second + r.write_kib_per_second) * 1024 for r in rates))
    own = k.delivered(device, start, end)
    below = [k.delivered(d, start, end) for d in disks if d != device]
    choices = [] if own is None else [(figures([own]), device)]
    if below and None not in below:
        choices.append((figures(below), ",".join(d for d in disks if d != device)))
    if not choices:
        return None
    iops = max(max(c[0][0] for c in choices), probe_moved[0])
    bw = max(max(c[0][1] for c in choices), probe_moved[1])
    where = max(choices, key=lambda c: (c[0][0], c[0][1]))[1]
    return iops, bw, where


def causes_of(core, e: ProbeFinished, since: float) -> list[str]:
    k, result = core.known, e.result
    disks = e.disks or (physical_devices(result.device, k.devices) if result.device else ())
    mount = mount_of(result.path, k.xfs_at)
    stack = {result.device, *disks} - {None}
    drift = [(at, dev, setting, old, new) for at, dev, ident, setting, old, new in k.recent_drift
             if at >= since and (dev in k.devices or dev == "host") and drift_holds(k, dev, ident, setting, new)]
    ev = Evidence(physical_disks=tuple(disks), below=tuple(sorted(below_stack(k, stack))), device=result.device,
                  devices=k.devices,
                  passive=core.health.passive_findings(stack), drift=drift, contended=result.contended,
                  foreign_util_percent=result.foreign_util_percent,
                  disk_await_ms={n: max(r.read_await_ms, r.write_await_ms) for n, r in k.rates.items()},
                  xfs_now=k.xfs_at[mount][0] if mount else None,
                  xfs_then=k.xfs_first.get(mount) if mount else None,
                  budget_exhausted=e.budget_exhausted, sources=core.source_causes(set(disks)),
                  window=probe_window(k, result), full=space.causes(k.full, stack, k.devices, core.clock()),
                  **cgroup_evidence(k, stack))
    return likely_causes(ev)


def drift_holds(k: Knowledge, device: str, identity: str | None, setting: str, new: str) -> bool:
    """Whether a change still holds: the setting's open drift ends at this value (one put back has none)."""
    open_drift = k.drift_last_change.get((device, identity or device, setting))
    return open_drift is not None and open_drift[1] == new


def drift_on(k: Knowledge, devices: set[str], now: float, within_seconds: float) -> list[str]:
    """The settings changed within the last `within_seconds` on these devices, on what they are built on (a
    loop device's file's disk, an array's members) or on the host, that still hold, as causes."""
    where = devices | below_stack(k, devices) | {"host"}
    out = []
    for key, (old, new, _) in sorted(k.drift_last_change.items()):
        device, _, setting = key
        at = k.drift_last_at.get(key)
        if device in where and at is not None and now - at <= within_seconds:
            out.append(f"a setting changed {_ago(now - at)} ago and still holds: {device} {setting} {old} -> {new}")
    return out


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def probe_window(k: Knowledge, result) -> ProbeWindow | None:
    """The probe's median wait per I/O beside its device's await and util in the same seconds."""
    if not result.device:
        return None
    seen = k.delivered(result.device, result.started_at, result.started_at + result.duration_seconds)
    if seen is None:
        # a probe shorter than the sampler's second has no sample after it yet: the last second's view,
        # which overlaps it, says as much of where the time went
        seen = k.rates.get(result.device)
    if seen is None:
        return None
    ios = seen.reads_per_second + seen.writes_per_second
    await_ms = ((seen.read_await_ms * seen.reads_per_second + seen.write_await_ms * seen.writes_per_second) / ios
                if ios else 0.0)
    return ProbeWindow(result.device, result.clat_percentile_seconds(50.0), await_ms, seen.util_percent)


def limits_on_stack(k: Knowledge, devices: set[str], anyone: bool = False) -> list[str]:
    """The cgroup limits holding these devices (cgroups.limits_holding), or else those on what they are built
    on (a loop device's file system, a member), which hold them too."""
    view = k.sources.get(cgroups.SPEC.name)
    limits = cgroups.limits_holding(view, devices, anyone)
    if limits:
        return limits
    below = below_stack(k, devices)
    return [f"{LIMIT_BELOW}{', '.join(sorted(devices))}: {held}"
            for held in cgroups.limits_holding(view, below, anyone)]


def mounts_over(k: Knowledge, device: str) -> str:
    """Where a device's change is felt: the XFS mounted from it or from a device built on it (an array over it,
    a loop device over a file on it), as the XFS poller last saw them; "" where it knows none."""
    over = sorted(m for m, (r, _) in k.xfs_at.items()
                  if r.kernel_name == device or device in below_stack(k, {r.kernel_name}))
    return ", ".join(over[:3]) + (f" and {len(over) - 3} more" if len(over) > 3 else "")


def below_stack(k: Knowledge, devices: set[str]) -> set[str]:
    """The devices these are built on (a loop device's backing file's device included), not themselves."""
    return {b for d in devices for b in blockqueue.devices_below(d, k.devices or {})} - devices


def cgroup_evidence(k: Knowledge, devices: set[str]) -> dict:
    """The cgroup source's last reading, on these devices: the limits on iowarden's own I/O, who else did I/O
    (on the devices, or where v1 counted none of it there, on the ones below)."""
    view = k.sources.get(cgroups.SPEC.name)
    seen = cgroups.level_counted(view, devices, below_stack(k, devices))
    return {"cgroup_limits": limits_on_stack(k, devices), "who": cgroups.who(view, seen),
            "who_unseen": cgroups.not_counted(view, seen), "foreign_share": cgroups.foreign_share(view, seen)}


def apply_settings(core, power) -> None:
    """Record every watched setting that changed since the last poll (drift), whether or not it hurt."""
    k = core.known
    # the sampler's devices, once it has sampled: [sampler] devices and exclude_devices govern drift too
    now = known_settings(k.last_settings, watched_settings(k.devices, power, wanted=k.sampled))
    changes = []
    if k.last_settings is not None:
        for device, setting, old, new in settings_changes(k.last_settings, now):
            ident = k.devices[device].identity if device in k.devices else None
            key, at = (device, ident or device, setting), core.wall()
            open_drift = k.drift_last_change.get(key)
            undone = open_drift is not None and open_drift[0] == str(new)
            changes.append(DriftFound(device, ident, setting, str(old), str(new), undone))
            k.recent_drift.append((at, device, ident, setting, str(old), str(new)))
            k.drift_total[key] += 1
            if undone:
                # back to what it was before its drift: the drift is over (its page clears), and putting a
                # setting back is no drift of its own (else the fix pages for ten minutes after the volume recovered)
                del k.drift_last_at[key], k.drift_last_change[key]
                continue
            # a second change within a drift's span continues it: the page says where it started from
            since = k.drift_last_at.get(key)
            was = open_drift[0] if open_drift is not None and since is not None and \
                at - since < DRIFT_SPAN_SECONDS else str(old)
            k.drift_last_at[key] = at
            k.drift_last_change[key] = (was, str(new), mounts_over(k, device))
    if now != k.last_settings:
        changes.append(SettingsSeen(MappingProxyType(dict(now))))
    core.act(changes)
    k.last_settings, k.power = now, power
