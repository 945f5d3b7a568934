"""What the probing layer reads of the rest of the daemon: the core's latest snapshot, and nothing else.

One typed reader stands for every input the scheduler has from outside itself: the disks' recent %util and
the host's I/O pressure it defers a probe on, the device view it maps a target to its disks with, where a fault
is suspected (a probe there is the evidence), and the volume each target was first probed on (its pin). Each
is a read of the snapshot the core last published; none calls a part.
"""
from __future__ import annotations

from collections.abc import Mapping

from iowarden.probes import blockqueue
from iowarden.probes.blockqueue import identity_of
from iowarden.probes.common import Roots

from iowarden.daemon.probing.pins import pin_refusal
from iowarden.daemon.probing.suspicion import slow_directions, struck_on_busy, suspected_fault


class Published:
    """The scheduler's inputs, read in the core's latest snapshot (`snapshot_fn()`; None before the first)."""

    def __init__(self, snapshot_fn, roots: Roots = Roots()):
        self.snapshot_fn = snapshot_fn
        self.roots = roots
        self._learning: tuple = (None, frozenset())   # (the snapshot, its (target, profile) still learning)

    def _reading(self):
        snap = self.snapshot_fn()
        return snap.disk_reading if snap is not None else None

    @property
    def io_pressure(self):
        """The host's I/O pressure (PSI) as the sampler last read it; None where the kernel has none."""
        r = self._reading()
        return r.io_pressure if r is not None else None

    def recent_util_percent(self, device: str) -> float | None:
        """The device's mean %util over the sampler's last few seconds; None when it is not sampled."""
        r = self._reading()
        return r.recent_util_percent.get(device) if r is not None else None

    def devices(self) -> Mapping:
        """The device view (kernel name -> BlockDevice) from the settings poller's reads and the uevents alike.
        Before the core's first snapshot holds one, sysfs is read here (the start's replay of the budget)."""
        snap = self.snapshot_fn()
        if snap is not None and snap.devices:
            return snap.devices
        return blockqueue.read_sysfs_and_superblocks(self.roots)

    def still_learning(self, target: str, profile: str) -> bool:
        """Whether the profile's normal, as the core judges it, has not yet learned enough probes to arm (its
        IOPS baselines learning): a warm-up probe the core set aside (a busy device short of the quiet probes'
        figure: verdicts/health.py) was counted by the scheduler but not learned. False where not known."""
        snap = self.snapshot_fn()
        if snap is None:
            return False
        if self._learning[0] is not snap:   # once per snapshot: the scheduler asks for every due probe each tick
            learning = {(b.volume, b.profile) for b in snap.baselines
                        if b.learning and b.metric in ("read_iops", "write_iops")}
            self._learning = (snap, frozenset((p.target, p.profile) for p in snap.probes
                                              if (p.volume, p.profile) in learning))
        return (target, profile) in self._learning[1]

    def suspected(self, target: str, profile: str) -> str | None:
        return suspected_fault(self.snapshot_fn(), target, profile)

    def struck_on_busy(self, target: str) -> bool:
        """Whether the target's volume has one strike on a busy device: its next probe is the second."""
        return struck_on_busy(self.snapshot_fn(), target)

    def slow_directions(self, target: str) -> frozenset:
        """The directions the passive view finds the target's device far slower than its normal in now."""
        return slow_directions(self.snapshot_fn(), target)

    def pin_refusal(self, target, device: str | None) -> str | None:
        """Why probing `target` on `device` is refused (another volume than it was first probed on), or None."""
        if target.found_on_dev is not None:
            # a discovered target is whatever its rule finds mounted there (the scheduler checks that it still
            # is); its baselines follow the volume's identity, so no pin
            return None
        snap = self.snapshot_fn()
        if snap is None:
            return None
        return pin_refusal(snap.pins, target.name, identity_of(device, self.devices()) if device else None)
