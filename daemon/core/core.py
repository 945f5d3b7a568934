"""The daemon's core: the one thread that changes what the daemon knows, and publishes it.

Parts do their I/O on threads of their own (the sampler, pollers, probe workers, uevents,
discovery, the passive detector) and post typed events here. The core applies them in the
order they came: a result goes to the state database, the outputs and the detectors; a
passive verdict and a dropped target to Health; operators' `baseline accept|reset` requests
are taken on every tick. After each batch of events it builds a new Snapshot and publishes
it by swapping one reference, with a version number: exporters, the InfluxDB writer and
the status line read that snapshot and nothing else, and a renderer can tell a new
snapshot from one it has already rendered.

Health, the latest results and the snapshot change only here. Reads the core makes of the
parts (the sampler's rates, the XFS reports, the device view) are of values those parts
replace whole; budgets and skip counters are copied by the scheduler under its lock.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

from iowarden.probes import blockqueue
from iowarden.probes.fio_run import ProbeResult

from iowarden.daemon.core import snapshot as snapshotmod
from iowarden.daemon.verdicts.causes import Evidence, likely_causes
from iowarden.daemon.probing.scheduler import result_summary
from iowarden.daemon.core.snapshot import ProbeView, Snapshot

log = logging.getLogger("iowarden")


# ---- events: what a part tells the core (immutable; a part keeps no reference it changes) ----

@dataclass(frozen=True)
class ProbeFinished:
    """A probe worker's result, failed or not."""
    result: ProbeResult


@dataclass(frozen=True)
class PassiveVerdict:
    """The passive detector raised or cleared a verdict on a device (kernel name at the time)."""
    transition: object
    device: str


@dataclass(frozen=True)
class TargetDropped:
    """A discovered target is gone (its filesystem unmounted): its series leave /metrics."""
    target: str
    why: str


@dataclass(frozen=True)
class Tick:
    """The sampler took a sample (1 Hz): the rates changed; operator requests are taken."""


_STOP = object()


class Core:
    def __init__(self, parts, version: str, clock=time.monotonic):
        """parts: the daemon's parts, read for the snapshot and the evidence of causes (state, health,
        sampler, scheduler, settings, xfs, registry, passive, influx, targets())."""
        self.parts = parts
        self.version = version
        self.clock = clock
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._latest: dict = {}            # (target, profile) -> ProbeView
        self.last_result: ProbeResult | None = None
        self.snapshot: Snapshot | None = None
        self.published: tuple[int, float] = (0, clock())   # (snapshot version, monotonic time), swapped as one
        self.last_batch_monotonic = clock()   # when the core last finished a batch (the watchdog's view)
        self.events_total = 0
        self._thread: threading.Thread | None = None

    # -- posting (any thread) -----------------------------------------------------------------
    def post(self, event) -> None:
        self._events.put(event)

    # -- the core thread --------------------------------------------------------------------------
    def start(self) -> None:
        self.publish()   # exporters have a snapshot before the first event
        self._thread = threading.Thread(target=self._run, name="iowarden-core", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Handle what was posted before the stop (the last probes' results), then end."""
        self._events.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout)

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
                return

    def run_batch(self, events: list) -> None:
        """Apply events in order and publish once. Tests call it directly, with no thread."""
        for event in events:
            try:
                self.handle(event)
            except Exception:   # noqa: BLE001 - one bad event must not stop the core
                log.exception("core: handling %s failed", type(event).__name__)
            self.events_total += 1
        try:
            self.publish()
        except Exception:   # noqa: BLE001 - the last snapshot stays; the next batch tries again
            log.exception("core: building the snapshot failed")
        self.last_batch_monotonic = self.clock()

    def stuck_seconds(self) -> float:
        """How long since the core last finished a batch; ticks come every second."""
        return self.clock() - self.last_batch_monotonic

    def handle(self, event) -> None:
        p = self.parts
        if isinstance(event, ProbeFinished):
            self._on_result(event.result)
        elif isinstance(event, PassiveVerdict):
            p.health.on_passive(event.transition, event.device)
        elif isinstance(event, TargetDropped):
            for key in [k for k in self._latest if k[0] == event.target]:
                del self._latest[key]
            p.health.target_dropped(event.target, event.why)
        elif isinstance(event, Tick):
            p.health.apply_requests(self.identity_of_target)   # a reset may re-pin a target
        else:
            raise TypeError(f"unknown event {event!r}")

    def publish(self) -> None:
        self.snapshot = snapshotmod.build(self.parts, self.version, tuple(self._latest.values()))
        self.published = (self.published[0] + 1, self.clock())

    # -- what a result does -----------------------------------------------------------------------
    def identity_of_device(self, device: str | None) -> str | None:
        if device is None:
            return None
        dev = self.parts.settings.devices.get(device)
        if dev is None:  # a device newer than the last settings poll
            dev = blockqueue.read_sysfs_and_superblocks(self.parts.roots).get(device)
        return dev.identity if dev else f"kernel:{device}"

    def identity_of_target(self, target_name: str) -> str | None:
        for t in self.parts.targets():
            if t.name == target_name:
                return self.identity_of_device(self.parts.scheduler.device_of(t))
        return None

    def _on_result(self, result: ProbeResult) -> None:
        p = self.parts
        record = result.to_json()
        identity = self.identity_of_device(result.device) or f"target:{result.target}"
        p.state.add_probe_result(record, identity)
        if p.influx is not None:
            p.influx.probe_result(record, identity)
        self.last_result = result
        # a discovered target dropped while its probe ran is stored, but gets no series back
        if result.target in {t.name for t in p.targets()}:
            key = (result.target, result.profile)
            prev = self._latest.get(key)
            last_ok = result.started_at + result.duration_seconds if result.ok else (
                prev.last_success_timestamp if prev else None)
            self._latest[key] = ProbeView(result.target, result.profile, identity, result, last_ok)
        log.log(logging.INFO if result.ok else logging.WARNING, result_summary(result),
                extra={"TARGET": result.target, "PROBE": result.profile, "DEVICE": result.device or ""})
        rates = p.sampler.rates.get(result.device) if result.device else None
        context = {"disk_util_percent": rates.util_percent, "disk_read_await_ms": rates.read_await_ms,
                   "disk_write_await_ms": rates.write_await_ms} if rates else {}
        if result.contended and result.device:
            total = p.sampler.delivered(result.device, result.started_at,
                                        result.started_at + result.duration_seconds)
            if total is not None:
                context["delivered_iops"] = total.reads_per_second + total.writes_per_second
                context["delivered_bytes_per_second"] = (total.read_kib_per_second + total.write_kib_per_second) * 1024
        p.health.on_result(record, identity, lambda since: self._causes(result, since), context)

    def _causes(self, result: ProbeResult, since: float) -> list[str]:
        p = self.parts
        target = next((t for t in p.targets() if t.name == result.target), None)
        devices = p.settings.devices or blockqueue.read_sysfs_and_superblocks(p.roots)
        disks = p.scheduler.physical_disks(target) if target else ()
        waits = {n: max(r.read_await_ms, r.write_await_ms) for n, r in p.sampler.rates.items()}
        mount = p.xfs.mount_of(result.path)
        stack = {result.device, *disks} - {None}
        ev = Evidence(physical_disks=disks, device=result.device, devices=devices,
                      passive=p.health.passive_findings(stack),
                      drift=p.state.drift_since(since, set(devices)), contended=result.contended,
                      foreign_util_percent=result.foreign_util_percent, disk_await_ms=waits,
                      xfs_now=p.xfs.reports.get(mount) if mount else None,
                      xfs_then=p.xfs.first.get(mount) if mount else None,
                      budget_exhausted=p.scheduler.budget_exhausted(disks))
        return likely_causes(ev)
