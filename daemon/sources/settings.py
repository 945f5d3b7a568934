"""The slow pollers: block-queue / md / power settings every 30 s, XFS reports hourly.

Settings drift is its own signal: a change of scheduler, queue setting, md
state, PM QoS request, governor or tuned profile is recorded with its old and
new value and time, whether or not performance moved.
"""
from __future__ import annotations

import collections
import logging
import threading
import time

from iowarden.probes import blockqueue, cpupower, xfs
from iowarden.probes.common import Roots, is_utf8
from iowarden.probes.vocabulary import WATCHED_QUEUE_SETTINGS

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


def watched_settings(devices: dict, power: cpupower.PowerSettings) -> dict[tuple[str, str], object]:
    """(device or 'host', setting) -> value: everything whose change is recorded as drift."""
    out: dict[tuple[str, str], object] = {}
    for name, d in devices.items():
        if d.kind == "partition" or (d.kind == "loop" and not d.size_bytes):
            continue
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


class SettingsPoller:
    def __init__(self, roots: Roots, state, on_event=None, clock=time.monotonic):
        self.roots = roots
        self.state = state
        self.on_event = on_event or (lambda **event: None)
        self.clock = clock
        self.devices: dict = {}
        # two readers refresh the device view, this poller and a uevent: the newest read wins, so a
        # poll that began before a hot-add cannot put back the view without the new disk
        self._devices_lock = threading.Lock()
        self._devices_read_at = float("-inf")
        self.power: cpupower.PowerSettings | None = None
        self._last: dict | None = state.load_settings()  # from before a restart
        self.drift_total: collections.Counter = collections.Counter()  # (device, volume, setting)

    def read_devices(self) -> dict:
        """Read the device view now and publish it unless a newer read already was; returns this read."""
        read_at = self.clock()
        devices = blockqueue.read_sysfs_and_superblocks(self.roots)
        with self._devices_lock:
            if read_at >= self._devices_read_at:
                self.devices, self._devices_read_at = devices, read_at
        return devices

    def step(self) -> None:
        devices = self.read_devices()
        power = cpupower.read_power_settings(self.roots, run_tuned_adm_verify=True)
        now = watched_settings(devices, power)
        drift = collections.Counter(self.drift_total)   # replaced whole below: snapshots copy it while we count
        if self._last is not None:
            for key, new in now.items():
                old = self._last.get(key, new)
                if old != new:
                    device, setting = key
                    ident = devices[device].identity if device in devices else None
                    self.state.add_drift(device, ident, setting, old, new)
                    drift[(device, ident or device, setting)] += 1
                    self.on_event(kind="drift", device=device, volume=ident or device, setting=setting,
                                  old=str(old), new=str(new))
                    log.warning("setting drift on %s: %s changed from %s to %s", device, setting, old, new,
                                extra={"DEVICE": device, "SETTING": setting})
        if now != self._last:
            self.state.save_settings(now)
        self._last = now
        self.power, self.drift_total = power, drift


class XfsPoller:
    def __init__(self, roots: Roots, timeout_seconds: float):
        self.roots = roots
        self.timeout_seconds = timeout_seconds
        self.reports: dict[str, xfs.XfsReport] = {}
        self.first: dict[str, xfs.XfsReport] = {}   # the first good report per mount: growth is measured from it
        self.reports_at: dict[str, tuple] = {}      # mount -> (report, unix time), for the exporters
        self._unnameable_said: set[str] = set()

    def step(self) -> None:
        reports = {}
        for dev, mnt in xfs.xfs_mounts(self.roots):
            if not is_utf8(mnt):   # no label, tag or key can carry it; said once per name
                if mnt not in self._unnameable_said:
                    self._unnameable_said.add(mnt)
                    log.warning("xfs: %s is not UTF-8, so it has no name in metrics; not reported", mnt)
                continue
            r = xfs.read(mnt, dev, self.timeout_seconds)
            for e in r.errors:
                log.warning("xfs report for %s: %s", mnt, e, extra={"MOUNT": mnt})
            reports[mnt] = r
            if r.frag is not None:
                self.first.setdefault(mnt, r)
        self.reports = reports
        now = time.time()
        self.reports_at = {m: (r, now) for m, r in reports.items()}

    def mount_of(self, path: str) -> str | None:
        """The XFS mount point holding this path (longest prefix), if any."""
        best = None
        for mnt in self.reports:
            if path == mnt or path.startswith(mnt.rstrip("/") + "/"):
                if best is None or len(mnt) > len(best):
                    best = mnt
        return best
