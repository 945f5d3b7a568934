"""Hotplug: block devices that come and go while the daemon runs, from netlink uevents via pyudev.

With udevd running, its events (source 'udev') arrive after udev has named the
device, so identities (WWN, serial, by-id) are complete. Without udevd (some
containers, minimal hosts) the kernel's own events (source 'kernel') still
arrive, and identity falls back to what sysfs says.
"""
from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("iowarden")


def udevd_running(run_root: str = "/run") -> bool:
    return os.path.exists(os.path.join(run_root, "udev", "control"))


class Inventory:
    def __init__(self, on_change, run_root: str = "/run"):
        """on_change(action, kernel_name) for every uevent of a block device ('add', 'remove', 'change')."""
        self.on_change = on_change
        self.source = "udev" if udevd_running(run_root) else "kernel"
        self.events_total = 0
        self._monitor = None
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        import pyudev
        try:
            monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source=self.source)
            monitor.filter_by("block")
            monitor.start()
        except Exception as exc:  # no netlink (a restricted sandbox): polling still sees devices
            log.warning("hotplug events unavailable (%s); devices are picked up by the pollers only", exc)
            return
        self._monitor = monitor
        self._thread = threading.Thread(target=self._loop, args=(stop,), name="iowarden-inventory", daemon=True)
        self._thread.start()
        log.info("listening for block device events (source: %s)", self.source)

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            device = self._monitor.poll(timeout=0.5)
            if device is None:
                continue
            self.events_total += 1
            name = device.sys_name
            try:
                self.on_change(device.action, name)
            except Exception:
                log.exception("handling %s of %s failed", device.action, name)
