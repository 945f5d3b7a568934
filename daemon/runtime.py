"""`iowarden run`: wires the parts together and talks to systemd.

Flow: the parts (sampler, pollers, scheduler and its probe workers, passive
detector, discovery, uevents) post events to the core (core/core.py), which owns
health and the latest results and publishes a snapshot after each batch; the
exporters read that snapshot. Readiness is
READY=1 after the first diskstats sample; WATCHDOG=1 is sent only while no part
is stuck; SIGHUP reloads the config atomically (an invalid one is logged and the
old one kept); SIGTERM stops within 5 s, killing fio.
"""
from __future__ import annotations

import dataclasses

import importlib.metadata
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from types import MappingProxyType

from iowarden.probes.common import Roots, printable, read_str
from iowarden.probes.fio_run import end_leftover_probes

from iowarden.daemon.logs import setup_logging
from iowarden.daemon import config as configmod
from iowarden.daemon.config import Target
from iowarden.daemon.core.core import CORE_STUCK_SECONDS, Core
from iowarden.daemon.events import Housekeeping, PartsChecked, SourceRead, TargetsChanged, frozen_map
from iowarden.daemon.probing.discovery import discover
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.core.effects import health_from
from iowarden.daemon.outputs.web_config import WebConfigError
from iowarden.daemon.sources.inventory import Inventory, device_changes
from iowarden.daemon.outputs import influx
from iowarden.daemon.outputs.wiring import InfluxOutput, reload_prometheus, start_prometheus, watch_endpoint
from iowarden.daemon.passive.values import PassiveParams
from iowarden.daemon.passive.part import PassiveWatch
from iowarden.daemon.sources.registry import SOURCES
from iowarden.daemon.sources.settings import SettingsPoller
from iowarden.daemon.sources.xfs import XfsPoller
from iowarden.daemon.registry import Registry, down_switch
from iowarden.daemon.wiring import part_named
from iowarden.daemon.service import notify
from iowarden.daemon.sources.sampler import Sampler, selected
from iowarden.daemon.probing.published import Published
from iowarden.daemon.probing.scheduler import PROBE_PART, Scheduler
from iowarden.daemon.core import statedir
from iowarden.daemon.core.opening import (EXIT_CONFIG, STATE_RETRY_SECONDS, StartRefused, StopRequested, open_state_waiting,
                                          own_state_dir)

log = logging.getLogger("iowarden")
STOP_TIMEOUT_SECONDS = 3.0       # fio killed, workers joined; with the rest, exit well within 5 s
CORE_STOP_SECONDS = 4.0          # the core's last batch: a write may wait out SQLite's busy timeout (2 s) once
RESULT_RETENTION_SECONDS = 90 * 86400
UEVENTS_DEADLINE_SECONDS = 60.0  # one burst of hotplug events and the re-read of every device it causes
HTTP_WATCH_SECONDS = 5.0


def sampler_filter(section, sampler):
    """One device filter for every source: a source whose own `devices` is empty watches the sampler's."""
    if getattr(section, "devices", None) == () and sampler.devices:
        return dataclasses.replace(section, devices=tuple(sampler.devices))
    return section


class Daemon:
    def __init__(self, config_path: str, roots: Roots = Roots(), listen_address: str | None = None):
        self.config_path, self.listen_address = config_path, listen_address   # run --web.listen-address
        self.roots = roots
        self.cfg = configmod.load(config_path, listen_address)
        setup_logging(self.cfg.section("daemon").log_level)
        state_dir = self.cfg.section("daemon").state_dir
        self.stop_event = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())   # also while the database is awaited
        signal.signal(signal.SIGINT, lambda *_: self.stop_event.set())
        # before anything else touches it: another daemon's fio is no leftover of ours
        self.state_dir = own_state_dir(state_dir, self.stop_event)
        self.state = open_state_waiting(os.path.join(state_dir, "state.db"), self.stop_event,
                                        self.state_dir.at("state.db"))
        self.reload_requested = threading.Event()
        self._http_lock = threading.Lock()   # the endpoint is replaced by a reload (main) or its watch (a part)
        c = self.cfg
        self.health = health_from(self.state, DetectorParams.from_config(c.section("detector")))
        try:
            version = importlib.metadata.version("iowarden")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        # first: every part is given the core's `post` and its reader of the latest snapshot (`latest`), nothing
        # else of the daemon (daemon/wiring.py declares what each reads and posts)
        self.core = Core(self.state, self.health, version,
                         retention_seconds=RESULT_RETENTION_SECONDS, boot_id=read_str(roots.proc / "sys" / "kernel" /
                                                                                     "random" / "boot_id"))
        post, latest = self.core.post, self.core.latest
        self.influx = None
        if c.section("influxdb").enabled:
            try:
                spool = self.state_dir.subdir("influx-spool")
            except statedir.StateDirRefused as exc:
                raise StartRefused(f"refusing to start: {exc}", EXIT_CONFIG) from None
            self.influx = InfluxOutput(c.section("influxdb"), spool, latest, post)
        self.sampler = Sampler(roots, c.section("sampler").devices, post, c.section("sampler").exclude_devices)
        self.settings = SettingsPoller(roots, post)
        self.xfs = XfsPoller(roots, c.section("xfs").timeout_seconds, post, wanted=self._watched)
        self.scheduler = Scheduler(self.cfg, roots, Published(latest, roots), post,
                                   history=self.state.probe_results(limit=5000))
        self.registry = Registry()
        self.registry.add_tasks(PROBE_PART)        # each probe worker: a task the watchdog sees (deadline per probe)
        self.scheduler.spawn = self.registry.run_task
        # the last argument: how long one step may take before the part is stuck (see registry.py)
        self._add("sampler", c.section("sampler").interval_seconds, 5.0, self.sampler.step)
        self.passive = None
        if c.section("passive").enabled:
            self.passive = PassiveWatch(PassiveParams.from_config(c.section("passive")), latest, self.state, post,
                                        {t.name: t.bucket for t in c.targets if t.bucket is not None})
            self._add("passive", c.section("passive").window_seconds, 10.0, self.passive.step)
        self._add("scheduler", 1.0, 10.0, self.scheduler.step)
        self.discovered: tuple[Target, ...] = ()
        self._discovery_lock = threading.Lock()
        self._read_only_warned: set[str] = set()
        self._unnameable_warned: set[str] = set()
        self._over_limit_said = False
        self.discovery_over_limit = 0   # posted with TargetsChanged
        self._add("discovery", c.section("scheduling").discover_interval_seconds, 10.0, self.rediscover)
        # stuck after 35 s: a step may run `tuned-adm verify`, which run_tool bounds at 30 s
        self._add("settings", c.section("settings").interval_seconds, 35.0, self.settings.step)
        # three tools in a step, each bounded by the timeout
        self._add("xfs", c.section("xfs").interval_seconds, 3 * c.section("xfs").timeout_seconds + 10,
                  self.xfs.step)
        self.source_readers: list = []
        for spec in SOURCES:   # the registered sources (sources/registry.py): read on their thread, posted
            section = c.section(spec.name)
            if section.enabled:
                section = sampler_filter(section, c.section("sampler"))
                read = spec.start(section, roots, self._disk_reading)
                self.source_readers.append((spec.name, read))
                self._add(spec.name, section.interval_seconds, spec.deadline_seconds(section),
                          lambda name=spec.name, read=read: post(SourceRead(name, read())))
        # the database is written on the core only: these parts just say when
        self._add("retention", 3600.0, 60.0, lambda: post(Housekeeping("retention")))
        self._add("state", STATE_RETRY_SECONDS, 30.0, lambda: post(Housekeeping("retry_writes")))
        # SQLite's whole-file check, off the start's path (65 s on a 9 GB database held the start past
        # systemd's timeout): at start and daily, read-only beside the core's writes
        self._add("state-check", 86400.0, 3600.0, self._check_state)
        if self.influx is not None:
            self._add("influxdb", c.section("influxdb").flush_interval_seconds,
                      # every write has a whole deadline of timeout_seconds; a flush replays at most a few
                      c.section("influxdb").timeout_seconds * (influx.MAX_WRITES_PER_FLUSH + 1) + 5,
                      self.influx.step)
        self.core.post(TargetsChanged(self.targets()))
        self.inventory = Inventory(self._on_device_change, str(roots.run))
        self._devices_seen: dict[str, str] = {}   # {name: identity} as the last uevent burst found them

    def _add(self, name: str, cadence_seconds: float, deadline_seconds: float, step, vital: bool = False):
        """Register a supervised part, which must be declared in daemon/wiring.py (what it reads and posts)."""
        part_named(name, {spec.name for spec in SOURCES})
        return self.registry.add(name, cadence_seconds, deadline_seconds, step, vital=vital)

    def _check_state(self) -> None:
        problem = self.state.check_integrity()
        if problem:
            log.error("state database %s is damaged (%s): the daemon goes on with it, and the next start moves it "
                      "aside and starts fresh (restart iowarden to do it now)", self.state.path, problem)

    def _disk_reading(self):
        """The sampler's latest reading (SamplerReading) as the core last published it; None before the first."""
        snap = self.core.latest()
        return snap.disk_reading if snap is not None else None

    def _device_view(self) -> Mapping:
        """The device view (kernel name -> BlockDevice) as the core last published it, from the settings poller's
        reads and the uevents alike; empty before its first snapshot. Parts read it there, not from the poller."""
        snap = self.core.latest()
        return snap.devices if snap is not None else MappingProxyType({})

    def targets(self) -> tuple[Target, ...]:
        """The configured targets and the ones [[discover]] rules found mounted."""
        return self.cfg.targets + self.discovered

    def _watched(self, name: str) -> bool:
        """The sampler's filter for a device or the disk it is a partition of (the XFS poller's devices)."""
        dev = self._device_view().get(name)
        s = self.cfg.section("sampler")
        return any(selected(n, s.devices, s.exclude_devices) for n in (name, dev.parent if dev else None) if n)

    def rediscover(self, reconfigure: bool = False) -> None:
        """Match the rules against the mount table; hand the scheduler the new targets if they changed."""
        with self._discovery_lock:
            cfg = self.cfg
            d = discover(cfg, self.roots, self.discovered)
            found, read_only, unnameable = d.targets, d.read_only, d.unnameable
            if d.over_limit and not self._over_limit_said:
                log.warning("[[discover]] rules match %d mount points past [scheduling] max_discovered_targets = %d; "
                            "those are not probed (raise the cap, or narrow the rules' mountpoints)", d.over_limit,
                            cfg.section("scheduling").max_discovered_targets)
            over_changed = d.over_limit != self.discovery_over_limit
            self._over_limit_said = bool(d.over_limit)
            self.discovery_over_limit = d.over_limit
            for mountpoint in sorted(set(unnameable) - self._unnameable_warned):
                log.warning("%s is mounted but its name is not UTF-8, so it cannot be a target's name "
                            "(a label, a tag, a key); discovery passes over it", mountpoint)
            self._unnameable_warned = set(unnameable)
            for mountpoint in sorted(set(read_only) - self._read_only_warned):
                log.warning("%s matches a [[discover]] rule but is read-only here, so it is not probed; under "
                            "systemd, ReadWritePaths= must name it or a directory above it (see the unit)",
                            mountpoint, extra={"TARGET": mountpoint})
            self._read_only_warned = set(read_only)
            before = {t.name: t for t in self.discovered}
            after = {t.name: t for t in found}
            if not reconfigure and before == after and not over_changed:
                return
            for name in sorted(after.keys() - before.keys()):
                log.info("target %s discovered: %s is mounted", name, after[name].path, extra={"TARGET": name})
            for name in sorted(before.keys() - after.keys()):
                log.info("target %s dropped: %s is no longer mounted", name, before[name].path,
                         extra={"TARGET": name})
            for name in sorted(before.keys() & after.keys()):
                if before[name] != after[name]:
                    log.info("target %s: another filesystem is mounted at %s now", name, after[name].path,
                             extra={"TARGET": name})
            self.discovered = found
            # after the targets changed: a result of a dropped target handled later gets no series back
            self.core.post(TargetsChanged(self.targets(), tuple(
                (name, "target dropped: no longer mounted") for name in sorted(before.keys() - after.keys())),
                d.over_limit))
            self.scheduler.configure(cfg, self.targets())

    def _on_device_change(self, action: str, name: str, names: frozenset[str] | None = None) -> None:
        """Re-read the devices the burst named (`names`; all of them without) and diff what is present (a device
        with a size).

        Diffing, not trusting the action: a loop device that gets a backing file
        or loses it sends 'change', not 'add' or 'remove', and so do media changes.
        """
        read = self.settings.read_devices(names)
        self.core.post(read)   # before any probe on it ends: its result finds the new device's identity
        devices = read.devices
        # against what the last event saw, not the settings poll's view: a poll between the attach and
        # this handler would already hold the new device, and its arrival would go unsaid
        present = {n: d.identity for n, d in devices.items() if d.size_bytes}
        added, removed = device_changes(self._devices_seen, present)
        self._devices_seen = present
        sampler = self.cfg.section("sampler")

        def level(name: str) -> int:
            # another's device ([sampler] devices, exclude_devices) comes and goes unsaid: other software's
            # loop devices would fill the log (the probe on it, if any, is aborted all the same)
            return logging.INFO if selected(name, sampler.devices, sampler.exclude_devices) else logging.DEBUG
        for gone in removed:
            log.log(level(gone), "block device removed: %s", gone, extra={"DEVICE": gone})
            if gone not in present and self.scheduler.abort_on(gone):
                log.warning("probe on %s aborted: the device was removed", gone, extra={"DEVICE": gone})
        for new in added:
            log.log(level(new), "block device added: %s (%s)", new, present[new],
                    extra={"DEVICE": new, "VOLUME": present[new]})
        if self.cfg.discover:
            self.rediscover()

    def _watch_http(self) -> None:
        with self._http_lock:
            if self.http is None:
                return
            if down_switch("metrics-endpoint"):
                self.http.shutdown()
                raise RuntimeError("the metrics endpoint is down and cannot be started again (test switch)")
            self.http, problem = watch_endpoint(self.http, lambda: start_prometheus(
                self.cfg.section("prometheus"), self.core, self.roots), HTTP_WATCH_SECONDS)
        if problem:
            raise RuntimeError(problem)   # counted by the registry as the part's error; it is serving again

    def reload(self) -> None:
        notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            new = configmod.load(self.config_path, self.listen_address)
        except configmod.ConfigError as exc:
            log.error("reload rejected, keeping the running configuration: %s",
                      "; ".join(e[:300] for e in exc.errors[:5])
                      + (f"; and {len(exc.errors) - 5} more" if len(exc.errors) > 5 else ""))
        except Exception as exc:   # noqa: BLE001 - no reload may end the daemon
            log.error("reload failed, keeping the running configuration: %s: %s", type(exc).__name__,
                      str(exc)[:300])
        else:
            refused = None
            if self.http is not None or new.section("prometheus").enabled:
                with self._http_lock:
                    self.http, refused = reload_prometheus(self.http, self.cfg.section("prometheus"),
                                                           new.section("prometheus"), self.core, self.roots)
            if refused:   # the endpoint as it was, with the [prometheus] it was started with
                log.error("reload: the metrics endpoint keeps its address, TLS and auth as they were: %s", refused)
                new = new.with_section("prometheus", self.cfg.section("prometheus"))
            gone = {t.name for t in self.cfg.targets} - {t.name for t in new.targets}
            self.cfg = new
            self.rediscover(reconfigure=True)
            # its series leave /metrics, its alerts close
            self.core.post(TargetsChanged(self.targets(), tuple(
                (name, "target removed from the configuration") for name in sorted(gone)), self.discovery_over_limit))
            log.info("configuration reloaded from %s (%d targets, %d discovery rules)%s", self.config_path,
                     len(new.targets), len(new.discover), ", except [prometheus] (see above)" if refused else "")
        notify("READY=1")

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGHUP, lambda *_: self.reload_requested.set())
        log.info("iowarden starting: %d targets, %d discovery rules, state in %s", len(self.cfg.targets),
                 len(self.cfg.discover), self.state.path)
        self.core.start()
        self.http = None
        if self.cfg.section("prometheus").enabled:
            try:
                self.http = start_prometheus(self.cfg.section("prometheus"), self.core, self.roots)
            except (OSError, WebConfigError) as exc:
                log.error("cannot serve metrics on %s: %s", self.cfg.section("prometheus").listen_address, exc)
                self.core.stop(CORE_STOP_SECONDS)   # it closes the database on its own thread
                return 1
        ended = end_leftover_probes(self.scheduler.owner)
        if ended:
            log.warning("ended %d fio process(es) a previous run of iowarden left running (pids %s), before "
                        "probing their disks again", len(ended), ", ".join(map(str, ended)))
        self.rediscover()  # what is mounted already is a target from the start
        # the devices, known to the core before any probe ends: a result on a device the view lacks would get
        # the fallback identity kernel:NAME
        read = self.settings.read_devices()
        self.core.post(read)
        self._devices_seen = {n: d.identity for n, d in read.devices.items() if d.size_bytes}
        if self.inventory.open():   # a part like the others: its failures counted, a hang withholds the watchdog
            self._add("uevents", 0.0, UEVENTS_DEADLINE_SECONDS, lambda: self.inventory.step(self.stop_event))
        if self.http is not None:   # the endpoint's loop runs on a thread of its own; this part watches it
            self._add("metrics-endpoint", HTTP_WATCH_SECONDS, HTTP_WATCH_SECONDS * 2, self._watch_http, vital=True)
        self.registry.start(self.stop_event)
        ready = False
        while not self.stop_event.is_set():
            self.core.post(PartsChecked(frozen_map(self.registry.stats())))   # the parts' stats, every second
            if not ready and self.sampler.first_sample_done.wait(0.2):
                ready = True
                notify("READY=1")
            if self.reload_requested.is_set():
                self.reload_requested.clear()
                self.reload()
            stuck = self.registry.stuck() + (["core"] if self.core.stuck_seconds() > CORE_STUCK_SECONDS else []) \
                + [f"core: {f}" for f in self.core.failing()]   # a handler that keeps failing, like a part
            if stuck:
                log.error("parts not completing: %s (watchdog ping withheld)", ", ".join(stuck))
            elif ready:
                notify("WATCHDOG=1")
            notify(f"STATUS={self.status_line(stuck)}")
            self.stop_event.wait(1.0)
        notify("STOPPING=1")
        log.info("iowarden stopping")
        # every step runs whatever the one before it did: a stop always closes everything
        _stop_step("probes", lambda: self.scheduler.stop(STOP_TIMEOUT_SECONDS))
        _stop_step("parts", lambda: self.registry.join(0.5))
        for name, read in self.source_readers:   # a source with a process of its own (the tracer) stops it
            if hasattr(read, "stop"):
                _stop_step(name, read.stop)
        if self.passive is not None:   # the curves learned since the last save, written by the core
            _stop_step("passive curves", lambda: self.core.post(self.passive.final_event()))
        # the results of the probes just stopped reach the database, which the core then closes
        _stop_step("core", lambda: self.core.stop(CORE_STOP_SECONDS))
        if self.influx is not None:
            # no network on the way out: a server that hangs must not hold up the stop
            def spool():
                self.influx.take_told()   # what the core told in its last batch, the stopped probes' results
                n = self.influx.writer.spool_pending()
                log.info("InfluxDB: %d unsent points kept in the spool for the next start", n)
            _stop_step("InfluxDB spool", spool)
        if self.http is not None:
            _stop_step("metrics endpoint", self.http.shutdown)
        return 0

    def status_line(self, stuck: list[str]) -> str:
        r = self.core.last_result
        # escaped: STATUS= is one line of a newline-separated message, so a name with a line feed could
        # otherwise send systemd WATCHDOG=1 or READY=1 of its own
        last = (f"last probe {printable(r.target, 120)}/{printable(r.profile, 60)} {'ok' if r.ok else 'failed'}"
                if r else "no probe yet")
        snap = self.core.latest()   # as published: the sampler's own state is the sampler's
        sampled = len(snap.disk_reading.rates) if snap is not None and snap.disk_reading is not None else 0
        return (f"{sampled} devices sampled, {len(self.targets())} targets, {last}"
                + (f"; STUCK: {', '.join(stuck)}" if stuck else ""))


def _stop_step(what: str, step) -> None:
    try:
        step()
    except Exception:   # noqa: BLE001 - logged; the next step of the stop still runs
        log.exception("stopping: %s failed", what)


def main(config_path: str, listen_address: str | None = None) -> int:
    try:
        daemon = Daemon(config_path, listen_address=listen_address)
    except StopRequested:
        return 0
    except StartRefused as exc:
        log.error("%s", exc)
        return exc.code
    return daemon.run()
