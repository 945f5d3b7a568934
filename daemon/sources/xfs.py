"""The XFS poller: fragmentation and free-space reports of every mounted XFS, hourly, posted to the core."""
from __future__ import annotations

import logging
import os
import time
from types import MappingProxyType

from iowarden.probes import xfs
from iowarden.probes.common import Roots, is_utf8

from iowarden.daemon.events import XfsRead

log = logging.getLogger("iowarden")


def mount_of(path: str, mounts) -> str | None:
    """The mount point (of those given) holding this path: the longest prefix."""
    best = None
    for mnt in mounts:
        if path == mnt or path.startswith(mnt.rstrip("/") + "/"):
            if best is None or len(mnt) > len(best):
                best = mnt
    return best


class XfsPoller:
    def __init__(self, roots: Roots, timeout_seconds: float, post, wanted=lambda kernel_name: True):
        """wanted: whether a device is one the daemon watches ([sampler] devices / exclude_devices: one filter
        for every source); another user's filesystem is neither read nor reported."""
        self.roots = roots
        self.timeout_seconds = timeout_seconds
        self.post = post
        self.wanted = wanted
        self._unnameable_said: set[str] = set()

    def step(self) -> None:
        reports = {}
        for dev, mnt in xfs.xfs_mounts(self.roots):
            if not self.wanted(os.path.basename(os.path.realpath(dev)) if dev.startswith("/dev/") else dev):
                continue
            if not is_utf8(mnt):   # no label, tag or key can carry it; said once per name
                if mnt not in self._unnameable_said:
                    self._unnameable_said.add(mnt)
                    log.warning("xfs: %s is not UTF-8, so it has no name in metrics; not reported", mnt)
                continue
            r = xfs.read(mnt, dev, self.timeout_seconds)
            for e in r.errors:
                log.warning("xfs report for %s: %s", mnt, e, extra={"MOUNT": mnt})
            reports[mnt] = r
        now = time.time()
        self.post(XfsRead(MappingProxyType({m: (r, now) for m, r in reports.items()})))
