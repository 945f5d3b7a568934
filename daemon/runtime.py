"""`iowarden run`: wires the parts together and talks to systemd.

Flow: sampler (1 Hz) and pollers feed the scheduler's decisions and the
snapshot; probe results go to the state database and the log. Readiness is
READY=1 after the first diskstats sample; WATCHDOG=1 is sent only while no part
is stuck; SIGHUP reloads the config atomically (an invalid one is logged and the
old one kept); SIGTERM stops within 5 s, killing fio.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from iowarden.probes.common import Roots

from . import config as configmod
from .pollers import SettingsPoller, XfsPoller
from .registry import Registry
from .sampler import Sampler
from .scheduler import Scheduler, result_summary
from .state import State

log = logging.getLogger("iowarden")
STOP_TIMEOUT_SECONDS = 4.0
RESULT_RETENTION_SECONDS = 90 * 86400


def notify(message: str) -> None:
    """sd_notify; a no-op outside systemd (no NOTIFY_SOCKET)."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return
    try:
        from systemd import daemon as sd_daemon
        sd_daemon.notify(message)
    except ImportError:  # systemd-python missing: speak the datagram protocol ourselves
        import socket
        addr = os.environ["NOTIFY_SOCKET"]
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(message.encode(), addr)


def setup_logging(level: str) -> None:
    root = logging.getLogger("iowarden")
    root.handlers.clear()
    root.setLevel(level.upper())
    handler: logging.Handler
    if os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"):
        try:
            from systemd.journal import JournalHandler
            # extra={"DEVICE": ...} fields become journal fields (DEVICE=, TARGET=, PROBE=)
            handler = JournalHandler(SYSLOG_IDENTIFIER="iowarden")
        except ImportError:
            handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root.addHandler(handler)


class Daemon:
    def __init__(self, config_path: str, roots: Roots = Roots()):
        self.config_path = config_path
        self.roots = roots
        self.cfg = configmod.load(config_path)
        setup_logging(self.cfg.section("daemon")["log_level"])
        state_dir = self.cfg.section("daemon")["state_dir"]
        self.state = State(os.path.join(state_dir, "state.db"))
        self.stop_event = threading.Event()
        self.reload_requested = threading.Event()
        self.sampler = Sampler(roots, self.cfg.section("sampler")["devices"])
        self.settings = SettingsPoller(roots, self.state)
        self.xfs = XfsPoller(roots, self.cfg.section("xfs")["timeout_seconds"])
        self.scheduler = Scheduler(self.cfg, roots, self.sampler, self._on_result)
        self.registry = Registry()
        c = self.cfg
        self.registry.add("sampler", c.section("sampler")["interval_seconds"], 0.5, self.sampler.step)
        self.registry.add("scheduler", 1.0, 5.0, self.scheduler.step)
        self.registry.add("settings", c.section("settings")["interval_seconds"], 5.0, self.settings.step)
        self.registry.add("xfs", c.section("xfs")["interval_seconds"], c.section("xfs")["timeout_seconds"],
                          self.xfs.step)
        self.registry.add("retention", 3600.0, 60.0, lambda: self.state.prune(RESULT_RETENTION_SECONDS))
        self.last_result = None

    def _on_result(self, result) -> None:
        identity = None
        dev = self.settings.devices.get(result.device) if result.device else None
        if dev is not None:
            identity = dev.identity
        self.state.add_probe_result(result.to_json(), identity)
        self.last_result = result
        level = logging.INFO if result.ok else logging.WARNING
        log.log(level, result_summary(result),
                extra={"TARGET": result.target, "PROBE": result.profile, "DEVICE": result.device or ""})

    def reload(self) -> None:
        notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            new = configmod.load(self.config_path)
        except configmod.ConfigError as exc:
            log.error("reload rejected, keeping the running configuration:\n%s", "\n".join(exc.errors))
        else:
            self.cfg = new
            self.scheduler.configure(new)
            log.info("configuration reloaded from %s (%d targets)", self.config_path, len(new.targets))
        notify("READY=1")

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGHUP, lambda *_: self.reload_requested.set())
        log.info("iowarden starting: %d targets, state in %s", len(self.cfg.targets), self.state.path)
        self.registry.start(self.stop_event)
        ready = False
        while not self.stop_event.is_set():
            if not ready and self.sampler.first_sample_done.wait(0.2):
                ready = True
                notify("READY=1")
            if self.reload_requested.is_set():
                self.reload_requested.clear()
                self.reload()
            stuck = self.registry.stuck()
            if stuck:
                log.error("parts not completing: %s (watchdog ping withheld)", ", ".join(stuck))
            elif ready:
                notify("WATCHDOG=1")
            notify(f"STATUS={self.status_line(stuck)}")
            self.stop_event.wait(1.0)
        notify("STOPPING=1")
        log.info("iowarden stopping")
        self.scheduler.stop(STOP_TIMEOUT_SECONDS)
        self.registry.join(0.5)
        self.state.close()
        return 0

    def status_line(self, stuck: list[str]) -> str:
        r = self.last_result
        last = f"last probe {r.target}/{r.profile} {'ok' if r.ok else 'failed'}" if r else "no probe yet"
        return (f"{len(self.sampler.rates)} devices sampled, {len(self.cfg.targets)} targets, {last}"
                + (f"; STUCK: {', '.join(stuck)}" if stuck else ""))


def main(config_path: str) -> int:
    return Daemon(config_path).run()
