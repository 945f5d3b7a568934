"""The settings poller: block-queue / md / power settings every 30 s.

Settings drift is its own signal: a change of scheduler, queue setting, md
state, PM QoS request, governor or tuned profile is recorded with its old and
new value and time, whether or not performance moved.
"""
from __future__ import annotations

import logging
import threading
import time
from types import MappingProxyType

from iowarden.probes import blockqueue, cpupower
from iowarden.probes.common import Roots
from iowarden.probes.vocabulary import WATCHED_QUEUE_SETTINGS

from iowarden.daemon.events import DevicesRead, SettingsRead

log = logging.getLogger("iowarden")

QUEUE_FIELDS = WATCHED_QUEUE_SETTINGS


# array_state values an array in service moves between on its own, many times a minute: md marks it
# active for a write and clean once idle. Recorded as drift they named "clean -> active" as a cause
# of every slow probe on an array that had been written to (seen in the lab).
MD_IN_SERVICE = frozenset({"clean", "active", "active-idle", "write-pending"})


def md_array_mode(array_state: str | None) -> str | None:
    """An md array's state as far as an operator changes it: read-write in service, else the kernel's
    word for what it is (readonly, read-auto, inactive, suspended, broken, clear)."""
    return "read-write" if array_state in MD_IN_SERVICE else array_state


IDENTITY = "identity"   # not a setting: what the name held at that poll (a change makes it another device)


def watched_settings(devices: dict, power: cpupower.PowerSettings,
                     wanted=None) -> dict[tuple[str, str], object]:
    """(device or 'host', setting) -> value: everything whose change is recorded as drift. `wanted`: the
    device names to watch (the sampler's: one device filter for every source), None for every device."""
    out: dict[tuple[str, str], object] = {}
    for name, d in devices.items():
        if d.kind == "partition" or (d.kind == "loop" and not d.size_bytes):
            continue
        if wanted is not None and name not in wanted:
            continue   # another's device ([sampler] devices / exclude_devices leave it out)
        out[(name, IDENTITY)] = d.identity
        if d.queue:
            for f in QUEUE_FIELDS:
                out[(name, f)] = getattr(d.queue, f)
        if d.md:
            out[(name, "md.degraded")] = d.md.degraded
            out[(name, "md.array_mode")] = md_array_mode(d.md.array_state)
            out[(name, "md.faulty_members")] = ",".join(m.name for m in d.md.members if m.faulty) or "none"
    out[("host", "pm_qos_cpu_dma_latency_usec")] = power.pm_qos_cpu_dma_latency_usec
    out[("host", "cpufreq_governors")] = ",".join(sorted(set(power.cpufreq_governors.values()))) or None
    out[("host", "tuned_profile")] = power.tuned.active_profile
    out[("host", "idle_disabled_states")] = ",".join(
        sorted({s.name for c in power.cpus for s in c.states if s.disabled})) or "none"
    return out


def known_settings(last: dict | None, now: dict) -> dict:
    """This poll's settings with each one it could not read (None) kept at its last known value: a read that
    failed (out of file descriptors, a sysfs file gone for a moment) is unknown, not a change, and the same value
    read again later is no drift back. A device's identity is never carried (a new device is a new device)."""
    if not last:
        return now
    return {key: (last.get(key) if value is None and key[1] != IDENTITY else value) for key, value in now.items()}


def settings_changes(last: dict, now: dict) -> list[tuple[str, str, object, object]]:
    """(device, setting, old, new) for every watched setting whose value changed between two polls
    (a setting new to this poll is no change: a device that appeared brings its settings with it; nor is a
    name that now holds another device: a loop device detached and attached to another image between two
    polls is a new device with the kernel's defaults, not a drifted one)."""
    replaced = {key[0] for key, new in now.items() if key[1] == IDENTITY and last.get(key, new) != new}
    out = []
    for key, new in now.items():
        if key[1] == IDENTITY or key[0] in replaced:
            continue
        old = last.get(key, new)
        if old != new and new is not None:   # unreadable now is unknown, not a change (known_settings)
            out.append((key[0], key[1], old, new))
    return out


class SettingsPoller:
    """Reads the device view and the power settings; posts them (DevicesRead, SettingsRead) to the core,
    which diffs them into drift. `devices` is the last view, replaced whole: parts read it (the scheduler's
    topology, the passive part's identities) without a lock."""

    def __init__(self, roots: Roots, post, clock=time.monotonic):
        self.roots = roots
        self.post = post
        self.clock = clock
        self.devices: MappingProxyType = MappingProxyType({})
        # two readers refresh the device view, this poller and a uevent: the newest read wins
        self._devices_lock = threading.Lock()
        self._devices_read_at = float("-inf")

    def read_devices(self, changed: frozenset[str] | None = None) -> DevicesRead:
        """Read the device view now and publish it unless a newer read already was; returns this read.
        `changed`: the names a burst of uevents carried, the only devices read again (the rest as last read)."""
        read_at = self.clock()
        with self._devices_lock:
            previous = self.devices
        view = (blockqueue.read_sysfs_and_superblocks(self.roots, previous, changed) if changed and previous
                else blockqueue.read_sysfs_and_superblocks(self.roots))
        with self._devices_lock:
            # the same view as the last read is the same object: what is kept per view downstream (a scrape's
            # sections, each disk's label text) is kept while no device changes, not redone every pass
            devices = DevicesRead(self.devices if view == self.devices else MappingProxyType(view), read_at)
            if read_at >= self._devices_read_at:
                self.devices, self._devices_read_at = devices.devices, read_at
        return devices

    def step(self) -> None:
        devices = self.read_devices()
        self.post(SettingsRead(devices, cpupower.read_power_settings(self.roots, run_tuned_adm_verify=True)))
