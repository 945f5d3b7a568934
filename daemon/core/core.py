"""The daemon's core: the one thread that changes what the daemon knows, and publishes it.

Parts read the machine on threads of their own and post typed events (daemon/events.py). The core
applies them in the order they came, each by the one handler HANDLERS names for its type:

- everything the daemon knows lives here, in `Knowledge`: the latest results, the device view,
  rates and samples, settings and drift, XFS reports, passive views, each source's last reading;
- Health (baselines, alerts, pins) is changed only from these handlers;
- the state database is written only from this thread: State checks it (State.bind_writer);
- causes are computed from what Knowledge holds, with no I/O and no call into a part.

After each batch it builds one immutable Snapshot and publishes it by swapping one reference with a
version number; exporters, the InfluxDB writer and the status line read that and nothing else.
Counters the parts own (probe skips and budgets, part supervision, the InfluxDB writer) arrive as
events like everything else (ProbesCounted, PartsChecked, InfluxCounted): the core calls no part.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from types import MappingProxyType

from iowarden.daemon.core import effects, knowledge, retention, space
from iowarden.daemon.events import (DevicesRead, DisksSampled, Housekeeping, InfluxCounted, IntervalsFitted,
                                   PartsChecked, PassiveJudged, ProbeFinished, ProbesCounted, ProbeStarted,
                                   SettingsRead, SourceRead, TargetsChanged, XfsRead)
from iowarden.daemon.registry import PartStats
from iowarden.daemon.snapshot import Snapshot, Told, frozen
from iowarden.daemon.sources import cgroups
from iowarden.daemon.sources.sampler import SamplerReading
from iowarden.daemon.sources.registry import SOURCES
from iowarden.daemon.verdicts import advice, pages
from iowarden.daemon.verdicts.changes import BaselineSaved

log = logging.getLogger("iowarden")
_STOP = object()
SUMMARY_SECONDS = 15.0   # a source's summary for `status` is saved at most this often (a write to the database)
CORE_STUCK_SECONDS = 35.0        # the core gets a tick every second; a result's causes may read sysfs
# a handler keeps failing: its last events of one type all failed, this many and for this long. Then the core is
# failing like a part (iowarden_part_success{part="core"} 0, IowardenPartFailing) and the watchdog is withheld:
# a core that drops every probe result would otherwise look alive while it judges nothing
# Told kept in each snapshot: an output that takes them every flush (InfluxDB: 10 s) misses none unless over
# a thousand probe results and events come in one flush; one that finds a gap in the numbers counts it
TOLD_KEPT = 1024
FAILING_IN_A_ROW = 5
FAILING_SECONDS = 60.0


class Core:
    def __init__(self, state, health, version: str, retention_seconds: float = 90 * 86400, clock=time.monotonic,
                 sources=SOURCES, wall=time.time, boot_clock=lambda: time.clock_gettime(time.CLOCK_BOOTTIME),
                 boot_id: str | None = None):
        self.state, self.health, self.version = state, health, version
        self.clock = clock
        # what the outputs that keep records are told (probe results, alert and drift events), numbered and
        # published in each snapshot: an output takes what is past its last number, the core calls none of them
        self._told: collections.deque = collections.deque(maxlen=TOLD_KEPT)
        self._told_seq = 0
        self.wall, self.boot_clock = wall, boot_clock   # retention compares them (core/retention.py)
        # the last pass's clocks, this run's or (the same boot) the run before's: a clock stepped while the
        # daemon was down is caught at the first pass too
        self._retention_mark = retention.mark_of(state.mark("retention"), boot_id)
        self.boot_id = boot_id
        self.retention_seconds = retention_seconds
        self.sources = sources
        self._summary_saved: dict[str, tuple] = {}   # source -> (when its summary was last saved (monotonic), had rows)
        self.known = knowledge.Knowledge(last_settings=state.load_settings(),
                                         recent_drift=state.drift_events(limit=knowledge.RECENT_DRIFT))
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self.snapshot: Snapshot | None = None
        # pages sent and closed in the last pages.RIDER_GRACE_SECONDS: a verdict raised on their volume rides on them
        self.closed_pages: tuple = ()
        self.published: tuple[int, float] = (0, clock())   # (snapshot version, monotonic time), swapped as one
        self.last_batch_monotonic = clock()   # when the core last finished a batch (the watchdog's view)
        self.events_total = 0
        self.handler_errors_total = 0
        self._failing: dict[str, tuple[int, float, str]] = {}   # event type -> (failed in a row, since, last error)
        self._last_handled_wall: float | None = None
        self._thread: threading.Thread | None = None

    def latest(self) -> Snapshot | None:
        """The snapshot last published (None before the first): what every part and output reads of the core."""
        return self.snapshot

    def place_of(self, name: str, passive: bool) -> tuple[str | None, tuple[str, ...]]:
        """(mount point, devices) of a target (its last probe's path and device), or of a device (a target on
        it, else the XFS mounted from it: a peer group's slow member need not be a probe target, and the page
        still says where it is mounted)."""
        views = [v for (t, _), v in self.known.latest.items() if (v.result.device == name if passive else t == name)]
        if not views:
            if not passive:
                return None, ()
            mounts = sorted(m for m, (r, _) in self.known.xfs_at.items() if r.kernel_name == name)
            return (mounts[0] if mounts else None), (name,)
        r = views[-1].result
        return knowledge.mount_of(r.path, self.known.xfs_at) or r.path, (name,) if passive else (
            (r.device,) if r.device else ())

    def act(self, changes) -> list[str]:
        """What the health verdicts decided, acted on: written, said in the journal, sent to the outputs."""
        return effects.apply(changes, self.state, self.tell)

    def tell(self, what: str, fields: dict) -> None:
        """Something for the outputs that keep records (snapshot.Told), in the next snapshot."""
        self._told_seq += 1
        self._told.append(Told(self._told_seq, what, frozen(fields), time.time()))

    @property
    def last_result(self):
        return self.known.last_result

    # -- posting (any thread) -----------------------------------------------------------------
    def post(self, event) -> None:
        self._events.put(event)

    # -- the core thread --------------------------------------------------------------------------
    def start(self) -> None:
        self.publish()   # exporters have a snapshot before the first event
        self._thread = threading.Thread(target=self._run, name="iowarden-core", daemon=True)
        self._thread.start()
        self.state.bind_writer(self._thread.ident)   # from now on, a write from any other thread raises

    def stop(self, timeout: float) -> bool:
        """Handle what was posted before the stop (the last probes' results), close the database on the
        core thread, and end. False when the core had not finished within `timeout`: the database is then
        left to the process's exit (what SQLite committed is kept; the writes still queued are lost, and
        logged), never closed from another thread under the core's feet."""
        self._events.put(_STOP)
        if self._thread is None:
            self.state.close()
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("stopping: the core did not finish its last %d events within %g s; what it had not written "
                      "to the state database is lost", self._events.qsize(), timeout)
            return False
        return True

    def _run(self) -> None:
        while True:
            batch = [self._events.get()]
            while True:   # everything posted meanwhile, then one snapshot for the lot
                try:
                    batch.append(self._events.get_nowait())
                except queue.Empty:
                    break
            stopping = any(e is _STOP for e in batch)
            self.run_batch([e for e in batch if e is not _STOP])
            if stopping:
                try:
                    self.state.close()   # on the one thread that writes it, after its last write
                except Exception:   # noqa: BLE001 - the stop goes on; the log says what was lost
                    log.exception("stopping: closing the state database failed")
                return

    def run_batch(self, events: list) -> None:
        """Apply events in order and publish once. Tests call it directly, with no thread."""
        for event in events:
            kind = type(event).__name__
            try:
                self.handle(event)
            except Exception as exc:   # noqa: BLE001 - one bad event must not stop the core
                log.exception("core: handling %s failed", kind)
                self.handler_errors_total += 1
                n, since, _ = self._failing.get(kind, (0, self.clock(), ""))
                self._failing[kind] = (n + 1, since, f"handling {kind} failed: {type(exc).__name__}: {exc}"[:300])
            else:
                self._failing.pop(kind, None)
                self._last_handled_wall = self.wall()
            self.events_total += 1
        try:
            self.publish()
        except Exception:   # noqa: BLE001 - the last snapshot stays; the next batch tries again
            log.exception("core: building the snapshot failed")
        self.last_batch_monotonic = self.clock()

    def failing(self) -> list[str]:
        """The event types whose handler keeps failing (FAILING_IN_A_ROW times and FAILING_SECONDS in a row),
        each with its last error: the core is then unhealthy for the watchdog."""
        now = self.clock()
        return [f"{kind} ({n} in a row for {now - since:.0f} s; {error})"
                for kind, (n, since, error) in sorted(self._failing.items())
                if n >= FAILING_IN_A_ROW and now - since >= FAILING_SECONDS]

    def stats(self, deadline_seconds: float) -> PartStats:
        """The core as a part beside the others: events handled, handlers failed, failing or not."""
        failing = self.failing()
        return PartStats(runs_total=self.events_total, errors_total=self.handler_errors_total,
                         last_success_timestamp_seconds=self._last_handled_wall, deadline_seconds=deadline_seconds,
                         last_error="; ".join(failing) or None, last_completed_monotonic=self.last_batch_monotonic)

    def stuck_seconds(self) -> float:
        """How long since the core last finished a batch; samples come every second."""
        return self.clock() - self.last_batch_monotonic

    def handle(self, event) -> None:
        handler = HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"unknown event {event!r}")
        handler(self, event)

    def publish(self) -> None:
        k = self.known
        alerts = tuple(self.health.open_alert_views())
        # one fault on one volume is one page: decided here, beside the last decision, said by the outputs
        last, now = self.snapshot, time.time()
        target_device = {t: v.result.device for (t, _), v in k.latest.items() if v.result.device}
        if last is not None:
            self.closed_pages = pages.closed_pages(last.alerts, last.folds, last.taken_at, alerts,
                                                   self.closed_pages, k.devices, target_device, now)
        fold_of = pages.folds(alerts, k.devices, target_device, paging=pages.page_units(
            last.alerts, last.folds, last.taken_at) if last is not None else frozenset(),
            last=last.folds if last is not None else None, now=now, closed=self.closed_pages)
        self.snapshot = Snapshot(
            taken_at=now, version=self.version, probes=tuple(k.latest.values()),
            skipped_total=k.skipped_total, baselines=tuple(self.health.baseline_views()),
            short_on_busy=self.health.short_on_busy(),
            alerts=alerts, folds=frozen(fold_of), disk_reading=k.disk_reading,
            devices=frozen(k.devices), power=k.power, drift_total=frozen(k.drift_total),
            drift_last_at=frozen(k.drift_last_at), drift_last_change=frozen(k.drift_last_change),
            xfs=frozen(k.xfs_at), budget=k.budget,
            parts=frozen({**k.parts, "core": self.stats(CORE_STUCK_SECONDS)}),
            probe_intervals=frozen({(t.name, p): k.fitted_intervals.get((t.name, p), t.interval_seconds)
                                    for t in k.targets for p in t.profiles}),
            discovery_over_limit=k.discovery_over_limit,
            influx=k.influx, state=frozen(self.state.stats()), passive=k.passive_views,
            sources=frozen(k.sources), passive_host_ratio=k.passive_host_ratio, told=tuple(self._told),
            probe_latency=frozen(k.latency_totals), pins=frozen(self.health.pins), own_probes=frozen(k.own_probes()),
            classes=frozen({self.health.pins[t.name]: t.volume_class for t in k.targets
                            if t.volume_class and t.name in self.health.pins}))
        self.published = (self.published[0] + 1, self.clock())

    # -- the handlers: one per event type ---------------------------------------------------------
    def _on_probe(self, e: ProbeFinished) -> None:
        if not e.unmounted:   # an unmounted volume's refusal is not stored, judged or counted as a failure
            knowledge.apply_result(self, e)
        device = self.known.probing.pop((e.result.target, e.result.profile), None)
        self.known.probing_disks.pop((e.result.target, e.result.profile), None)
        if device:
            self.known.probe_ended_at[device] = self.clock()

    def _on_intervals(self, e: IntervalsFitted) -> None:
        self.known.fitted_intervals = e.intervals

    def _on_probes_counted(self, e: ProbesCounted) -> None:
        self.known.skipped_total, self.known.budget = e.skipped_total, e.budget

    def _on_parts_checked(self, e: PartsChecked) -> None:
        self.known.parts = e.parts
        # operators' requests (ack, baseline reset) every second on the supervising loop's tick, not on a
        # part's: with the sampler stopped they are still taken
        self.act(self.health.apply_requests(effects.requests_of(self.state), self.known.identity_of_target))

    def _on_influx_counted(self, e: InfluxCounted) -> None:
        self.known.influx = e.counters

    def _on_probe_started(self, e: ProbeStarted) -> None:
        self.known.probe_started(e.target, e.profile, e.device, e.disks)

    def _on_sample(self, e: DisksSampled) -> None:
        k = self.known
        k.sample, k.rates, k.io_pressure, k.cpu_pressure = e.sample, e.rates, e.io_pressure, e.cpu_pressure
        if e.sampled is not None:
            k.sampled = e.sampled
        k.keep_sample(e.unix_time, e.sample)
        # the reading as the parts read it in the snapshot (the passive windows, the scheduler's deferral, the
        # sources' disk reading): the same values the sampler posted, nothing recomputed
        k.disk_reading = SamplerReading(e.sample, e.rates, e.sampled if e.sampled is not None else frozenset(e.rates),
                                        e.io_pressure, e.recent_util_percent or MappingProxyType({}), e.cpu_pressure)

    def _on_devices(self, e: DevicesRead) -> None:
        self.known.take_devices(e)

    def _on_settings(self, e: SettingsRead) -> None:
        self.known.take_devices(e.devices)
        knowledge.apply_settings(self, e.power)

    def _on_xfs(self, e: XfsRead) -> None:
        self.known.xfs_at = e.reports_at
        for mount, (report, _) in e.reports_at.items():
            if report.frag is not None:
                self.known.xfs_first.setdefault(mount, report)   # growth is measured from the first good one

    def _on_passive(self, e: PassiveJudged) -> None:
        for transition, device in e.transitions:
            facts = advice.device_facts(device, self.known.devices, self.source_causes) \
                if transition.state != "cleared" else None
            self.act(self.health.on_passive(transition, device, self.passive_causes(transition, device), facts,
                                            self.place_of(device, True)))
        self.known.passive_views, self.known.passive_host_ratio = e.views, e.host_slowdown_ratio
        now = time.time()
        self.act([BaselineSaved(identity, knowledge.PASSIVE_PROFILE, metric, now, st)
                  for identity, metric, st in e.saves])

    def _on_source(self, e: SourceRead) -> None:
        self.known.sources[e.source] = e.value
        spec = next((s for s in self.sources if s.name == e.source), None)
        now = self.clock()
        if spec is None or spec.summary is None:
            return
        last, summary = self._summary_saved.get(e.source), spec.summary(e.value)
        # at most every SUMMARY_SECONDS, and at once when the last one saved had nothing to say and this one
        # has (the tracer's first timed requests: `status` would say "no request timed" for 15 s more)
        has_rows = bool(summary.get("rows")) if isinstance(summary, dict) else True
        if last is None or now - last[0] >= SUMMARY_SECONDS or (has_rows and not last[1]):
            self._summary_saved[e.source] = (now, has_rows)
            self.act([BaselineSaved(e.source, knowledge.SOURCE_PROFILE, "summary", time.time(), summary)])

    def _on_targets(self, e: TargetsChanged) -> None:
        self.known.targets = e.targets
        self.known.discovery_over_limit = e.discovery_over_limit
        for name, why in e.dropped:
            for key in [key for key in self.known.latest if key[0] == name]:
                del self.known.latest[key]
            for key in [key for key in self.known.latency_totals if key[0] == name]:
                del self.known.latency_totals[key]   # its histogram leaves /metrics with its other series
            self.known.full.pop(name, None)          # a volume gone is no cause of anything
            self.act(self.health.target_dropped(name, why))

    def _on_housekeeping(self, e: Housekeeping) -> None:
        if e.job == "retention":
            now = retention.ClockMark(self.wall(), self.boot_clock())
            decision = retention.plan(self._retention_mark, now, self.retention_seconds)
            self._retention_mark = now
            self.state.set_mark("retention", retention.mark_record(now, self.boot_id))
            if decision.refusal:
                log.warning("retention pass skipped: %s", decision.refusal)
            else:
                self.state.prune(decision.cutoff_wall_seconds)
        elif e.job == "retry_writes":
            self.state.retry_pending()
        else:
            raise ValueError(f"unknown housekeeping job {e.job!r}")

    def passive_causes(self, transition, device: str) -> list[str]:
        """A passive verdict's causes beyond its own finding: a cgroup limit on the device, a setting changed on it
        or below it, who does its I/O, what its drive says; with neither a limit nor a change, a device slower
        than its own curve or its peers is itself slow."""
        view = self.known.sources.get(cgroups.SPEC.name)
        limits = knowledge.limits_on_stack(self.known, {device}, anyone=True)
        full = space.causes(self.known.full, {device}, self.known.devices, self.clock())
        drift = knowledge.drift_on(self.known, {device}, self.wall(), knowledge.PASSIVE_DRIFT_SECONDS)
        out = full + limits + drift
        ev = getattr(transition, "evidence", None) or {}
        if transition.kind == "service" and ev.get("culprit_words"):
            # the cause of a service's wait is the other work, said first: the tracer's line that follows ("the
            # time goes to the device") says where the wait is spent, which a flood's queue in the device is
            out.insert(0, f"other work on {device}: {ev['culprit_words']} is doing "
                          f"{float(ev.get('culprit_share') or 0.0):.0%} of its requests or bytes, and "
                          f"{ev.get('victim_words') or ev.get('victim')} waits behind it")
        if not limits and not full and not drift and transition.kind in ("self", "peers"):
            out.append(f"the device itself: {device}'s own service time moved (the kernel's await, below any "
                       "cgroup limit), and no cgroup I/O limit is set on it")
        seen = cgroups.level_counted(view, {device}, knowledge.below_stack(self.known, {device}))
        # other work flooding the device: who it is, or why that cannot be said
        who = cgroups.who(view, seen) or (cgroups.not_counted(view, seen) if transition.kind == "contention" else None)
        return out + ([who] if who else []) + self.source_causes({device})

    def source_causes(self, disks: set[str]) -> list[str]:
        """What the registered sources say about these disks (pure functions of their last readings)."""
        out = []
        for spec in self.sources:
            value = self.known.sources.get(spec.name)
            if value is not None:
                out.extend(spec.causes(value, disks))
        return out


HANDLERS = {
    ProbeFinished: Core._on_probe, ProbeStarted: Core._on_probe_started, DisksSampled: Core._on_sample, DevicesRead: Core._on_devices,
    SettingsRead: Core._on_settings, XfsRead: Core._on_xfs, PassiveJudged: Core._on_passive,
    SourceRead: Core._on_source, TargetsChanged: Core._on_targets, Housekeeping: Core._on_housekeeping,
    IntervalsFitted: Core._on_intervals, ProbesCounted: Core._on_probes_counted,
    PartsChecked: Core._on_parts_checked, InfluxCounted: Core._on_influx_counted,
}
