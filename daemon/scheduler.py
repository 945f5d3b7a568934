"""The probe scheduler: each target's profiles at their interval with jitter, one probe per physical device.

Every second it looks for due probes. A probe waits while another probe runs on
any of the same physical disks (a filesystem on md0 shares md0's members), and
is deferred while the disk is busy with other work, up to a maximum deferral;
then it runs and is marked contended. Every deferral and skip is counted by
reason. Probes run in worker threads, so the scheduler and the sampler keep
their cadence while fio runs.
"""
from __future__ import annotations

import collections
import logging
import os
import random
import stat
import threading
import time
from dataclasses import dataclass

from iowarden.probes import blockqueue
from iowarden.probes.common import Roots, kill_group
from iowarden.probes.fio_run import ProbeResult, device_name_for, run_probe

from .config import Config, Target

log = logging.getLogger("iowarden")

DEFER_UTIL_PERCENT = 50.0
MAX_DEFERRAL_SECONDS = 600.0
JITTER_RATIO = 0.1


@dataclass
class Due:
    target: Target
    profile: str
    next_at: float
    deferred_since: float | None = None


class Scheduler:
    def __init__(self, cfg: Config, roots: Roots, sampler, on_result, rng: random.Random | None = None):
        self.roots = roots
        self.sampler = sampler
        self.on_result = on_result
        self.rng = rng or random.Random()
        self.skipped_total: collections.Counter = collections.Counter()
        self._busy_disks: set[str] = set()
        self._procs: set = set()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopping = False
        self.configure(cfg)

    def configure(self, cfg: Config) -> None:
        """Take a (re)loaded config; probes already planned keep their next time."""
        now = time.monotonic()
        with self._lock:
            old = {(d.target.name, d.profile): d for d in getattr(self, "due", [])}
            self.cfg = cfg
            self.due = []
            for t in cfg.targets:
                for p in t.profiles:
                    prev = old.get((t.name, p))
                    # first runs are spread over the first interval (at most a minute) so
                    # a restart does not fire every probe at once
                    first = now + self.rng.uniform(1.0, min(t.interval_seconds, 60.0))
                    self.due.append(Due(t, p, prev.next_at if prev else first))

    def _physical(self, target: Target) -> tuple[str, ...]:
        try:
            st = os.stat(target.path)
        except OSError:
            return ()
        dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
        name = device_name_for(dev, self.roots)
        if name is None:
            return ()
        return blockqueue.physical_devices(name, blockqueue.read(self.roots)) or (name,)

    def step(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [d for d in self.due if d.next_at <= now]
        for d in due:
            disks = self._physical(d.target)
            with self._lock:
                if self._stopping or self._busy_disks & set(disks):
                    continue  # another probe holds one of its disks: try again next tick
            contended = False
            util = max((self.sampler.recent_util_percent(x) or 0.0 for x in disks), default=0.0)
            if util > DEFER_UTIL_PERCENT:
                d.deferred_since = d.deferred_since or now
                if now - d.deferred_since < MAX_DEFERRAL_SECONDS:
                    self.skipped_total["busy"] += 1
                    d.next_at = now + 5.0
                    log.info("probe %s/%s deferred: device busy (%.0f%% util)", d.target.name, d.profile, util,
                             extra={"TARGET": d.target.name, "PROBE": d.profile})
                    continue
                contended = True
            d.deferred_since = None
            d.next_at = now + d.target.interval_seconds * (1 + self.rng.uniform(-JITTER_RATIO, JITTER_RATIO))
            with self._lock:
                self._busy_disks |= set(disks)
            w = threading.Thread(target=self._run, args=(d, disks, contended), name="iowarden-probe", daemon=True)
            self._workers = [t for t in self._workers if t.is_alive()] + [w]
            w.start()

    def _run(self, d: Due, disks, contended: bool) -> None:
        cfg = self.cfg
        try:
            profile = cfg.profiles[d.profile]
            sizes = {min(cfg.profiles[p].effective_size_bytes(), cfg.limits.max_size_bytes)
                     for p in d.target.profiles if p in cfg.profiles}
            result = run_probe(d.target.name, d.target.path, profile, cfg.limits, self.roots,
                               keep_sizes=sizes, on_start=self._track)
            result.contended = contended
            if self._stopping and not result.ok:
                result.error = "interrupted: iowarden is stopping"
            self.on_result(result)
        except Exception:
            log.exception("probe %s/%s crashed", d.target.name, d.profile)
        finally:
            with self._lock:
                self._busy_disks -= set(disks)

    def _track(self, proc) -> None:
        with self._lock:
            self._procs = {p for p in self._procs if p.poll() is None} | {proc}
            stopping = self._stopping
        if stopping:
            kill_group(proc)

    def stop(self, timeout_seconds: float) -> None:
        """Kill running fio process groups and wait for the workers to record their results."""
        with self._lock:
            self._stopping = True
            procs = list(self._procs)
        for p in procs:
            kill_group(p)
        log.debug("stopping: killed %d running probe(s)", len(procs))
        deadline = time.monotonic() + timeout_seconds
        for w in self._workers:
            w.join(max(0.0, deadline - time.monotonic()))


def result_summary(r: ProbeResult) -> str:
    j = r.to_json()
    if not r.ok:
        return f"probe {r.target}/{r.profile} failed: {r.error}"
    p99 = j["clat_p99_seconds"]
    return (f"probe {r.target}/{r.profile} on {r.device}: read {j['read_iops']:.0f} IOPS, write "
            f"{j['write_iops']:.0f} IOPS, clat p99 {p99 * 1000 if p99 else float('nan'):.3f} ms"
            f"{' (contended)' if r.contended else ''}")
