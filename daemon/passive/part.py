"""The daemon's passive part: windows from the sampler's counters, peers from the device view, verdicts out.

Every `window_seconds` it takes the sampler's latest diskstats sample, computes
iostat -x over the window exactly (the counters' difference, not a mean of 1 Hz
rates), keys each device by its stable identity and hands the batch to the pure
PassiveDetector. Transitions go to Health as alerts; the detector's views are
published as one immutable tuple that scrapes read; learned curves are saved to
the state database beside the probe baselines (profile "passive").
"""
from __future__ import annotations

import dataclasses
import fnmatch
import logging
import re
import threading
import time
from collections import defaultdict

from iowarden.probes import diskstats
from iowarden.probes.blockqueue import devices_below, identity_of

from iowarden.daemon.events import PassiveJudged
from iowarden.daemon.snapshot import CAPABILITY_PROFILE, PASSIVE_PROFILE, frozen
from iowarden.daemon.passive.detector import PassiveDetector
from iowarden.daemon.passive.values import PassiveParams, Window
from iowarden.daemon.sources import cgroups, tracer_views
from iowarden.daemon.sources.registry import TAILS_SOURCE

log = logging.getLogger("iowarden")
SAVE_EVERY_WINDOWS = 20
VIEWS_SAVE_EVERY_WINDOWS = 4    # a minute of 15 s windows: what `status` shows as the passive verdict's "as of"


def own_probed(since_monotonic: float, devices, probed) -> set[str]:
    """Kernel names a probe of ours ran on since the window began (probed: device -> when one last ran there,
    infinity while one runs), with every device under them (an array's members, a partition's disk, the device
    holding a loop device's file): they carried it too."""
    own = {d for d, last in (probed or {}).items() if last >= since_monotonic}
    for d in list(own):
        own.update(devices_below(d, devices))
    return own


def peer_groups(devices: dict, stacked: dict | None = None, loop_peers: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Kernel names of devices that should behave alike: the members of one md array or striped dm
    device (partitions resolved to their disks), else whole disks of one model and size, else loop devices of
    one size whose backing files match one of `loop_peers` (a loop device is its file and the disk under it:
    by size alone, snap images and a database's volume would be peers). `stacked` is stacked_members(devices),
    when the caller has it already."""
    groups, in_stack = [], set()
    for members in (stacked if stacked is not None else stacked_members(devices)).values():
        groups.append(members)
        in_stack.update(members)
    alike = defaultdict(list)
    for d in devices.values():
        if not d.size_bytes or d.name in in_stack:
            continue
        if d.kind == "disk":
            alike[(d.kind, d.udev.get("ID_MODEL"), d.size_bytes)].append(d.name)
        elif d.kind == "loop" and d.loop_backing_file:
            pattern = next((p for p in loop_peers if fnmatch.fnmatchcase(d.loop_backing_file, p)), None)
            if pattern is not None:
                alike[(d.kind, pattern, d.size_bytes)].append(d.name)
    groups += [tuple(sorted(v)) for v in alike.values() if len(v) >= 2]
    return groups


def stacked_members(devices: dict) -> dict[str, tuple[str, ...]]:
    """md arrays and dm devices over two or more disks -> the whole disks under them."""
    def whole(name):
        d = devices.get(name)
        return d.parent if d is not None and d.parent else name

    out = {}
    for d in devices.values():
        if d.md is not None:
            out[d.name] = tuple(sorted({whole(m.name) for m in d.md.members}))
        elif d.kind == "dm" and len(d.slaves) >= 2:
            out[d.name] = tuple(sorted({whole(s) for s in d.slaves}))
    return {k: v for k, v in out.items() if len(v) >= 2}


NO_NEW_COUNTS = object()   # _services: the tracer has read nothing since the last step
IDLE_AFTER_WINDOWS = 3     # ... for this many windows (the longer of its and the tracer's): an idle window


class PassiveWatch:
    """The part: reads the sampler's reading and the device view in the core's snapshot, posts PassiveJudged.
    It writes nothing: what it learned goes to the core to be saved (every SAVE_EVERY_WINDOWS windows, on a
    verdict, and at the stop)."""

    def __init__(self, params: PassiveParams, snapshot_fn, state, post, buckets: dict | None = None):
        self.params = params
        # target -> (burst IOPS, baseline IOPS, capacity I/Os) the config gives; set on the volume the target was
        # first probed on (the core's pins) once it has been
        self.buckets = dict(buckets or {})
        # () -> the core's latest Snapshot, read once a window: the sampler's reading (disk_reading), the device
        # view, when our probes last ran on each device (own_probes) and the tracer's tails (sources), all of
        # one moment
        self.snapshot_fn = snapshot_fn
        self._trace_before: dict = {}         # (kernel name, direction) -> its cumulative histogram at the last step
        self._cgroups_before: dict = {}       # (kernel name, cgroup, direction) -> its cumulative counts, the same
        # when the counts used last were read by the tracer's loader (monotonic), or where it does not say, all
        # their requests summed (a reading that brings none new leaves it) and when the part first saw them
        self._cgroups_at: float | None = None
        self._cgroups_requests: int | None = None
        self._cgroups_seen_at: float | None = None
        self.state = state                    # read only: the saved curves at the start, characterize's capability
        self.post = post                      # a PassiveJudged event to the core
        saved = [(ident, metric, st) for ident, profile, metric, _, st in state.load_baselines()
                 if profile == PASSIVE_PROFILE]
        curves = {(ident, metric.split(":")[1], metric.split(":")[2]): st
                  for ident, metric, st in saved if metric.startswith("curve:") and metric.count(":") == 2}
        self.detector = PassiveDetector(params, curves)
        for ident, metric, st in saved:   # the evidence against its peers a drive had accumulated
            if metric == "evidence":
                try:
                    self.detector.evidence.load_state(ident, st)
                except (TypeError, ValueError, AttributeError):
                    self.detector.evidence.members.pop(ident, None)   # damaged: gathered again
            elif metric == "services":   # each service's normal on the device
                try:
                    self.detector.services.load_state(ident, st)
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    log.warning("the saved normals of the services on %s are damaged and are learned again (some "
                                "five minutes): %s", ident, e)
            elif metric == "burst":
                try:
                    self.detector.load_burst(ident, st, time.time())
                except (KeyError, TypeError, ValueError, AttributeError):
                    self.detector.devices[ident].burst = None   # damaged: learned again from the next fall
        self._load_capability()
        self._start: diskstats.DiskSample | None = None
        self._lock = threading.Lock()
        self._windows = 0
        self.views: tuple = ()                # (kernel name, identity, DeviceView), replaced whole
        self.windows_total = 0
        self._pattern_key: frozenset | None = None
        self._pattern_cached: re.Pattern | None = None

    def step(self) -> None:
        with self._lock:   # the stop saves from another thread; a step may still be under way
            self._step()

    def _step(self) -> None:
        snap = self.snapshot_fn()
        reading = snap.disk_reading if snap is not None else None
        if reading is None:
            return
        cur = reading.sample
        start, self._start = self._start, cur
        if start is None or cur.monotonic_seconds - start.monotonic_seconds < self.params.window_seconds * 0.5:
            if start is not None:
                self._start = start   # too short (the sampler lagged): extend this window
            return
        devices = snap.devices or {}
        # A disk newer than the device view (hot-added, udev still naming it) waits for the view: judged
        # under its kernel name now, its curve would be learned and saved under `kernel:sdd` and never found
        # again once udev gives its WWN (seen in the lab). With no view at all, kernel names are all there is.
        judged = [n for n in cur.counters if n in devices or not devices]
        ident = {n: identity_of(n, devices) for n in judged}
        now = time.time()
        rates = {n: r for n, r in diskstats.rates_between(start, cur).items() if n in reading.sampled and n in ident}
        tails = self._tails(snap.sources.get(TAILS_SOURCE))
        stacked = stacked_members(devices)
        own = own_probed(start.monotonic_seconds, devices, snap.own_probes)
        windows = [Window.from_rates(ident[n], now, r, tails.get(n), n in own) for n, r in rates.items()]
        groups = [tuple(ident[m] for m in g if m in ident)
                  for g in peer_groups(devices, stacked, self.params.loop_peers)]
        name_of = {ident[n]: n for n in rates}
        stacks = {ident[n]: tuple(ident[m] for m in members if m in ident)
                  for n, members in stacked.items() if n in ident}
        for target, bucket in self.buckets.items():
            volume = (snap.pins or {}).get(target)
            if volume is not None:
                self.detector.set_bucket(volume, *bucket)
        observed = self.detector.observe(windows, groups, stacks)
        trace = snap.sources.get(TAILS_SOURCE)
        services, seconds = self._services(trace, ident, cur.monotonic_seconds,
                                            cur.monotonic_seconds - start.monotonic_seconds)
        # without counts per cgroup (none yet, the tracer off or paused) every device is the device rule's again
        if services is not NO_NEW_COUNTS:
            limited = cgroups.limited_below_root(snap.sources.get(cgroups.SPEC.name))
            observed += self.detector.observe_services(
                services or {}, seconds, now,
                lambda path: tracer_views.cgroup_words(path, trace.cgroup_version if trace else None, unit=True),
                limited)
        transitions = [(_named(t, name_of, self._pattern(name_of)), name_of.get(t.device, t.device))
                       for t in observed]
        for gone in set(self.detector.devices) - set(name_of):
            if self.detector.devices[gone].flagged:
                transitions += [(t, gone) for t in self.detector.forget(gone)]
        self.views = tuple((name_of[v.device], v.device, v) for v in self.detector.views() if v.device in name_of)
        self.windows_total += 1
        self._windows += 1
        due = self._windows >= SAVE_EVERY_WINDOWS or transitions   # `status` sees a new verdict at once
        # the views alone (a row per device) every minute or so: `status`'s "as of" lagged the verdict by minutes
        saves = self._saves() if due else self._view_saves() if self._windows % VIEWS_SAVE_EVERY_WINDOWS == 0 else ()
        self.post(PassiveJudged(tuple(transitions), self.views, saves, self.detector.host_ratio))

    def _pattern(self, name_of: dict) -> re.Pattern | None:
        """The identities' regex, compiled again only when the devices change (34 ms an alert at 1,024 disks
        when compiled per alert: a whole group slowing together took half a minute)."""
        if not name_of:
            return None
        key = frozenset(name_of)
        if self._pattern_key != key:
            self._pattern_key, self._pattern_cached = key, identities_pattern(key)
        return self._pattern_cached

    def _tails(self, reading) -> dict[str, dict]:
        """Per kernel name, direction -> the tracer's histogram of total latency since the last step (reading:
        the tracer's latest TraceReading, or None)."""
        if reading is None or not reading.up:
            self._trace_before = {}
            return {}
        out: dict[str, dict] = {}
        now = {}
        for (name, direction, stage), h in reading.total.items():
            if stage != "total":
                continue
            now[(name, direction)] = h
            if (name, direction) in self._trace_before:   # the first step only sets the start
                since = h.minus(self._trace_before[(name, direction)])
                if since.counts:
                    out.setdefault(name, {})[direction] = since
        self._trace_before = now
        return out

    def _services(self, reading, ident: dict, now_monotonic: float, window_seconds: float) -> tuple:
        """(per device (its identity), {(cgroup, direction): the tracer's counts since the ones used last}, the
        seconds they cover) for every disk it counts per cgroup; (None, window) while it counts none (off,
        bpftrace, [tracer] per_cgroup = false), and the first step after only sets the start; (NO_NEW_COUNTS, 0)
        when the tracer has brought nothing new since the last step.

        Three clocks of the same period meet here: the loader prints its counts every [tracer] interval_seconds,
        the tracer source reads them every interval_seconds, and this part steps every window_seconds. A window
        that took whatever had arrived saw, as they drifted, no counts in one window and two prints' in the next,
        judged as twice the service's rate (and the time between two sightings was as wrong): a service's normal
        was learned over three octaves of its rate at a third of the pace each, and ServiceContended stayed
        blind for a quarter of an hour after a start, not five minutes. The counts are judged when they arrive,
        over the time between the loader's two reads of its map (`cgroups_at`); from a loader that does not
        say, over the time between the part's sightings. Nothing new for IDLE_AFTER_WINDOWS windows (the part's
        or the tracer's, the longer) is an idle window: a raised service clears when every request stops."""
        if reading is None or not reading.up or not reading.cgroups:
            self._cgroups_before, self._cgroups_at = {}, None
            self._cgroups_requests, self._cgroups_seen_at = None, None
            return None, window_seconds
        at = getattr(reading, "cgroups_at", None)
        requests = sum(total.requests for total, _ in reading.cgroups.values())
        news = at != self._cgroups_at if at is not None else requests != self._cgroups_requests
        idle_after = IDLE_AFTER_WINDOWS * max(window_seconds, reading.window_seconds)
        if not news and self._cgroups_seen_at is not None and now_monotonic - self._cgroups_seen_at < idle_after:
            return NO_NEW_COUNTS, 0.0
        if news and at is not None and self._cgroups_at is not None:
            seconds = at - self._cgroups_at
        elif self._cgroups_seen_at is not None:
            seconds = now_monotonic - self._cgroups_seen_at
        else:
            seconds = reading.window_seconds
        if seconds <= 0:   # a loader's time out of order: a window's, not a rate of thousands a second
            seconds = reading.window_seconds
        self._cgroups_at, self._cgroups_requests, self._cgroups_seen_at = at, requests, now_monotonic
        now = {key: total for key, (total, _) in reading.cgroups.items() if key[0] in ident}
        out: dict = {}
        first = not self._cgroups_before
        for (name, cgroup, direction), total in now.items():
            out.setdefault(ident[name], {})[(cgroup, direction)] = total.minus(self._cgroups_before.get(
                (name, cgroup, direction)))
        self._cgroups_before = now
        return (None if first else out), max(seconds, 1e-3)

    def _load_capability(self) -> None:
        """What `iowarden characterize -c` measured, per identity (it may run while the daemon does)."""
        self.detector.capability = {
            ident: (st.get("saturation_iops"), st.get("bandwidth_bytes"))
            for ident, profile, metric, _, st in self.state.load_baselines() if profile == CAPABILITY_PROFILE}

    def final_event(self) -> PassiveJudged:
        """What was learned since the last save, for the core to write at the stop (the part has ended)."""
        with self._lock:
            return PassiveJudged((), self.views, self._saves())

    def _saves(self) -> tuple:
        """(identity, metric, state) to save: curves, accumulated evidence, the latest views (for `status`)."""
        self._windows = 0
        self._load_capability()
        out = [(ident, f"curve:{direction}:{unit}", st)
               for (ident, direction, unit), st in self.detector.curves_state().items()]
        out += [(ident, "evidence", self.detector.evidence.to_state(ident)) for ident in self.detector.evidence.members]
        out += [(ident, "burst", st) for ident, st in self.detector.bursts_state(time.time()).items()]
        out += [(ident, "services", st) for ident in sorted(self.detector.services.of_device)
                if (st := self.detector.services.to_state(ident)) is not None]
        # posted to the core, which writes them while this part learns on: copies, read-only
        return tuple((ident, metric, frozen(st)) for ident, metric, st in out) + self._view_saves()

    def _view_saves(self) -> tuple:
        """The latest verdicts, for `iowarden status` (a separate process reading the database)."""
        return tuple((ident, "view", frozen({
            "device": name, "slowdown_ratio": v.slowdown_ratio, "expected_await_ms": v.expected_await_ms,
            "learned_windows": v.learned_windows, "peer_ratio": v.peer_ratio, "ceiling": v.ceiling,
            "flagged": list(v.flagged), "headroom_ratio": v.headroom_ratio,
            "burst": None if v.burst is None else {
                "balance_ratio": v.burst.balance_ratio, "seconds_left": v.burst.seconds_left,
                "draw_iops": v.burst.draw_iops, "baseline_iops": v.burst.bucket.baseline_iops,
                "burst_iops": v.burst.bucket.burst_iops, "capacity_ios": v.burst.bucket.capacity_ios,
                "source": v.burst.bucket.source},
            "knee": {direction: {"load": k.load, "unit": k.unit, "seen_up_to": k.seen_up_to, "why_none": k.why_none}
                     for direction, k in v.knee.items()},
            "tail": None if v.tail is None else {"direction": v.tail.direction, "tail_ms": v.tail.tail_ms,
                                                 "peers_tail_ms": v.tail.peers_tail_ms}})) for name, ident, v in self.views)


def identities_pattern(identities) -> re.Pattern:
    """One regex matching any of the identities, longest first (one may be a prefix of another)."""
    return re.compile("|".join(re.escape(k) for k in sorted(identities, key=len, reverse=True)))


def _named(t, name_of: dict, pattern: re.Pattern | None):
    """The transition's sentence with kernel names where the detector knew devices by identity."""
    if not name_of or pattern is None:
        return t
    summary = pattern.sub(lambda m: name_of.get(m.group(0), m.group(0)), t.summary)
    return dataclasses.replace(t, summary=summary)
