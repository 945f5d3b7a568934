"""The probe processes the scheduler started: tracked by the disks they probe, killed when one of those disks
is removed or the daemon stops, and how long each may take.

Each probe runs in a process of its own (probes/probe_child.py) with fio under it; killing one kills its
whole tree (fio's job processes leave its group). A probe killed because its disk went is recorded as
aborted, one killed at the stop as interrupted: the worker asks here which it was.
"""
from __future__ import annotations

import logging
import threading

from iowarden.probes.common import kill_group

log = logging.getLogger("iowarden")

CHILD_REAP_SECONDS = 15.0   # past a probe's deadline: its process killed and waited for (common._reap's 10 s)


def probe_deadline_seconds(cfg, profile) -> float:
    """How long a probe's process may take: fio's own timeout, and the layout of its file at a slow disk's
    4 MiB/s. Past it the process is left to the kernel and the probe is a failure on record."""
    return (profile.effective_runtime_seconds(cfg.limits.max_runtime_seconds) + cfg.limits.timeout_margin_seconds
            + 60.0 + min(profile.effective_size_bytes(), cfg.limits.max_size_bytes) / (4 << 20))


class ProbeProcesses:
    def __init__(self):
        self._lock = threading.Lock()
        self._procs: dict = {}              # running probe Popen -> the physical disks it probes
        self._aborted_disks: set[str] = set()
        self.stopping = False

    def track(self, proc, disks=()) -> None:
        with self._lock:
            self._procs = {p: d for p, d in self._procs.items() if p.poll() is None}
            self._procs[proc] = tuple(disks)
            stopping = self.stopping
        if stopping:
            kill_group(proc)

    def abort_on(self, disk: str) -> int:
        """Kill probes running on a disk that was removed; their results record the failure."""
        with self._lock:
            victims = [p for p, disks in self._procs.items() if disk in disks and p.poll() is None]
        for p in victims:
            kill_group(p)
        if victims:
            with self._lock:
                self._aborted_disks.add(disk)
        return len(victims)

    def aborted(self, disks) -> set[str]:
        """Which of these disks were removed during the probe (each said once)."""
        with self._lock:
            gone = self._aborted_disks & set(disks)
            self._aborted_disks -= gone
        return gone

    def stop(self) -> int:
        """Kill every running probe (and what it started); how many."""
        with self._lock:
            self.stopping = True
            procs = [p for p in self._procs if p.poll() is None]
        for p in procs:
            kill_group(p)
        return len(procs)
