"""The probe scheduler: each target's profiles at their interval with jitter, one probe per physical device.

Every second it looks for due probes. A probe waits while another probe runs on
any of the same physical disks (a filesystem on md0 shares md0's members), and
is deferred while the disk is busy with other work, up to a maximum deferral;
then it runs and is marked contended. Every deferral and skip is counted by
reason. Those rules are plan()'s (daemon/probing/plan.py, a pure function); this module
carries its decisions out. Probes run in worker threads, so the scheduler and the
sampler keep their cadence while fio runs.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import random
import stat
import threading
import time
from dataclasses import dataclass
from types import MappingProxyType

from iowarden.probes import blockqueue, pathstat, tasklimit
from iowarden.probes.common import TASK_LIMIT_TEXT, Roots
from iowarden.probes.fio_job import SATURATING_QUEUE_DEPTH
from iowarden.probes.fio_run import ProbeResult
from iowarden.probes.probe_dir import device_name_for
from iowarden.probes.probe_child import run_isolated

from iowarden.daemon.config import Config, Target
from iowarden.daemon.events import IntervalsFitted, ProbeFinished, ProbesCounted, ProbeStarted, frozen_map
from iowarden.daemon.probing import fit
from iowarden.daemon.probing.budget import Budget
from iowarden.daemon.probing.plan import (DEFER_RETRY_SECONDS, Candidate, Load, Rules, plan, spread_next,
                                          within_cover)
from iowarden.daemon.probing.published import Published
from iowarden.daemon.probing.processes import CHILD_REAP_SECONDS, ProbeProcesses, probe_deadline_seconds
from iowarden.daemon.probing.suspicion import BY_PROBE
from iowarden.daemon.registry import fault_switch

log = logging.getLogger("iowarden")

PROBE_PART = "probe"   # the supervised part whose tasks the probe workers are

WARMUP_UNDER_LOAD_AFTER = 3   # warm-up probes in a row run contended before the warm-up learns under load
# Probes running at once, whatever their disks: one per physical disk already, and this bounds the threads
# (and fio processes) when disks cannot be told apart (a target whose device is not found): 1,000
# discovered targets started 1,000 workers in one step.
MAX_PROBE_WORKERS = 8
# A due probe's path is asked (pathstat: a stat by a child, with a deadline) at most this often while it waits, and
# once more by its worker just before it runs; a target that does not answer is a failed probe on record
PATH_ASK_EVERY_SECONDS = 10.0


@dataclass
class Due:
    target: Target
    profile: str
    next_at: float
    deferred_since: float | None = None
    waiting: bool = False        # held back by another probe on its disks since it fell due (counted once)
    started_at: float | None = None   # when its last probe was started (the scheduler's clock)


def profile_directions(rw: str) -> frozenset:
    """The directions a profile's I/O goes in, as the passive view names them."""
    both = rw in ("rw", "randrw")   # fio's names for mixed I/O; "readwrite" carries both words
    reads, writes = both or "read" in rw, both or "write" in rw
    return frozenset(({"read"} if reads else set()) | ({"write"} if writes else set()))


class Scheduler:
    def __init__(self, cfg: Config, roots: Roots, published, post, rng: random.Random | None = None,
                 history: list[dict] | None = None, pin_check=None, devices=None, clock=time.monotonic,
                 suspected=None, spawn=None, paths: pathstat.PathWatch | None = None, slow=None, struck=None):
        """`published`: what the scheduler reads of the rest of the daemon (a `Published` over the core's
        snapshot): the load it defers on, the device view, the suspected faults, the pins. `pin_check`, `devices`,
        `suspected`, `slow` and `struck` stand in for its parts where a test gives only a load."""
        self.roots = roots
        # every touch of a target's path: by a child with a deadline, never on this thread (pathstat)
        self.paths = paths or pathstat.WATCH
        # spawn(part, deadline_seconds, fn, *args) -> Thread: a probe worker as a supervised part's task (Registry.run_task:
        # counted, a crash said, a hung one stuck for the watchdog); a bare thread in tests
        self.spawn = spawn or _bare_thread
        self.clock = clock
        # marks this daemon's fio processes (its state directory): see fio_run.end_leftover_probes
        self.owner = os.path.realpath(cfg.section("daemon").state_dir)
        # the disks' recent %util and the host's I/O pressure, as published: what a probe defers on
        self.load = published
        whole = isinstance(published, Published)
        self.post = post                  # its events (ProbeStarted, ProbeFinished, IntervalsFitted, ProbesCounted)
        self._counted_posted: tuple | None = None   # (skips, budgets) as last posted
        self._counters_lock = threading.Lock()
        # (target, device) -> why the target may not be probed there (not the volume it was first probed on)
        self.pin_check = pin_check or (published.pin_refusal if whole else (lambda target, device: None))
        # (target, profile) -> why a fault is suspected there, or None (read from the core's published snapshot)
        self.suspected = suspected or (published.suspected if whole else (lambda target, profile: None))
        # target -> whether its volume has one strike on a busy device (its next probe is the second)
        self.struck_on_busy = struck or (published.struck_on_busy if whole else (lambda target: False))
        # target -> the directions ("read", "write") its device is far slower than its normal in, per the passive view
        self.slow_directions = slow or (published.slow_directions if whole else (lambda target: frozenset()))
        # (target, profile) -> whether the core's normal for it still learns, past the probes counted here
        self.still_learning = published.still_learning if whole else (lambda target, profile: False)
        # the block devices as last read (the settings poller's view, kept current by hotplug): a probe waiting
        # for a busy disk must not re-read all of sysfs every second
        self.devices = devices or (published.devices if whole
                                   else (lambda: blockqueue.read_sysfs_and_superblocks(roots)))
        self.rng = rng or random.Random()
        self.skipped_total: collections.Counter = collections.Counter()
        self._busy_disks: set[str] = set()
        self.processes = ProbeProcesses()
        self._last_probe_end = -1e9
        # target -> its physical disks when last looked at; replaced whole, never in place (budget_view copies it)
        self._disks_of: MappingProxyType = MappingProxyType({})
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        # held by step() and configure() for their whole run: a reload or a discovery (other threads) replaces
        # cfg and due while step reads them, and step's changes to the Due it holds would be lost
        self._plan_lock = threading.RLock()
        b = cfg.section("budget")
        self.budget = Budget(b.device_time_ratio, b.window_seconds, b.write_bytes_per_day, clock=clock)
        if history:  # what was spent before a restart still counts
            self.budget.replay(history, self.devices(), cfg.section("detector").warmup_probes)
        # (target, profile) -> measured probes so far (ok, uncontended: what a baseline learns from), this run's and
        # the stored ones: fewer than [detector] warmup_probes is a volume still learning its normal
        self.learned: collections.Counter = collections.Counter(
            (r["target"], r["profile"]) for r in history or ()
            if r.get("ok") and (not r.get("contended") or r.get("learned_under_load")))
        self.fit = fit.Fit(history or ())        # what each profile costs, and routine intervals fitted to it
        self._contended_warmups: collections.Counter = collections.Counter()   # key -> contended warm-ups in a row
        self.configure(cfg)

    def configure(self, cfg: Config, targets: tuple[Target, ...] | None = None) -> None:
        """Take a (re)loaded config and the targets to probe (the config's, unless discovery adds some);
        probes already planned keep their next time, a target no longer given is dropped."""
        with self._plan_lock:
            self._configure(cfg, cfg.targets if targets is None else targets)

    def _configure(self, cfg: Config, targets: tuple[Target, ...]) -> None:
        now = self.clock()
        self.budget.configure(cfg.section("budget"))
        with self._lock:
            old = {(d.target.name, d.profile): d for d in getattr(self, "due", [])}
            self.cfg = cfg
            self.due = []
            names = {t.name for t in targets}
            self._disks_of = MappingProxyType({n: d for n, d in self._disks_of.items() if n in names})
            for key in [k for k in list(self.skipped_total) if k[0] not in names]:
                del self.skipped_total[key]  # a dropped target's series go with it
            for t in targets:
                for p in t.profiles:
                    prev = old.get((t.name, p))
                    # first runs are spread over the first interval (at most a minute): a restart fires not all at once
                    first = now + self.rng.uniform(1.0, min(t.interval_seconds, 60.0))
                    self.due.append(Due(t, p, prev.next_at, started_at=prev.started_at) if prev else Due(t, p, first))

    def device_of(self, target: Target) -> str | None:
        """Kernel name of the block device a target lives on (itself, for a device target), from its path's
        last answer: None while it has none, or does not answer."""
        answer = self.paths.latest(target.path)
        if answer is None or not answer.ok:
            return None
        return device_name_for(answer.st_rdev if stat.S_ISBLK(answer.st_mode) else answer.st_dev, self.roots)

    def still_mounted(self, target: Target, now: bool = False) -> bool:
        """False when a discovered target's filesystem is no longer the one at its path, by its last answer or
        (now: a worker, which may wait) one asked now; a path that does not answer is hung, not gone, and one that
        could not be asked (no process to be had) is unknown, not gone."""
        if target.found_on_dev is None:
            return True
        answer = self.paths.check([target.path])[target.path] if now else self.paths.latest(target.path)
        return answer is None or answer.hung or not answer.asked or answer.st_dev == target.found_on_dev

    def physical_disks(self, target: Target) -> tuple[str, ...]:
        name = self.device_of(target)
        disks = () if name is None else (blockqueue.physical_devices(name, self.devices()) or (name,))
        with self._lock:
            self._disks_of = MappingProxyType({**self._disks_of, target.name: disks})
        return disks

    def physical_disks_cached(self, target: Target) -> tuple[str, ...]:
        """The disks found when the target was last looked at: no sysfs reads (for scrapes)."""
        return self._disks_of.get(target.name, ())

    def budget_view(self) -> dict:
        """Each probed disk's budget as it stands (a copy, for a snapshot)."""
        disks = {d for ds in self._disks_of.values() for d in ds}
        return {d: self.budget.status(d) for d in sorted(disks)}

    def budget_exhausted(self, disks) -> bool:
        return self.budget.refuses(disks, 0.0) is not None

    def _confirm_soon(self, now: float) -> None:
        """A probe far off its volume's normal (or on a volume with an open alert) is confirmed, or not, by the
        next one: that one runs warmup_interval_seconds after it, not a whole interval later. A collapse is
        then paged one interval after it began at most, plus a minute."""
        soon = self.cfg.section("scheduling").warmup_interval_seconds
        for d in self.due:
            if d.started_at is not None and d.next_at > d.started_at + soon and d.next_at > now \
                    and self.suspected(d.target.name, d.profile) == BY_PROBE:
                d.next_at = max(now, d.started_at + soon)
        self._meet_the_slow_direction(now, soon)

    def _meet_the_slow_direction(self, now: float, soon: float) -> None:
        """A device the passive view finds far slower than its normal in a direction is met by a probe of that
        direction within a minute, whichever profile was next due (a volume's four profiles take turns over its
        interval: a collapse of a few minutes may end before a profile of its direction comes due): one profile
        a minute per volume at most (of that direction, deep enough to fill the device alone where the volume has
        one, the one probed longest ago), from the reserve, while the view says so."""
        by_target: dict[str, list[Due]] = {}
        for d in self.due:
            by_target.setdefault(d.target.name, []).append(d)
        for target, dues in by_target.items():
            slow = self.slow_directions(target)
            if not slow:
                continue
            if any(d.started_at is not None and now - d.started_at < soon for d in dues):
                continue   # probed within the minute: that probe, or the next, is the evidence
            meeting = [d for d in dues if d.profile in self.cfg.profiles
                       and profile_directions(self.cfg.profiles[d.profile].rw) & slow]
            # a probe deep enough to fill the device alone, where the volume has one of that direction: beside the
            # volume's own users (a slow device is a busy one) only its total can show the volume held short; a qd1
            # probe waits behind them, and a quarter cap met first by its qd1 read was paged a probe later
            deep = [d for d in meeting if self.cfg.profiles[d.profile].iodepth
                    * self.cfg.profiles[d.profile].numjobs >= SATURATING_QUEUE_DEPTH]
            meeting = deep or meeting
            if not meeting or any(d.next_at <= now + soon for d in meeting):
                continue   # one of that direction runs within the minute anyway
            oldest = min(meeting, key=lambda d: d.started_at if d.started_at is not None else -math.inf)
            oldest.next_at = now

    def warming_up(self, target: str, profile: str) -> bool:
        """A volume new to iowarden is probed every [scheduling] warmup_interval_seconds until its baseline
        has [detector] warmup_probes measurements, within [budget] warmup_device_time_ratio: armed in minutes,
        not after the hours that warmup_probes x interval_seconds would take."""
        return self.learned[(target, profile)] < self.cfg.section("detector").warmup_probes \
            or self.still_learning(target, profile)

    def skip(self, target: str, reason: str) -> None:
        """Count a deferral or skip (workers and the scheduler both count); not for a target dropped meanwhile
        (a worker that finds its volume gone ends after discovery dropped it): its series went with it."""
        with self._lock:
            if any(d.target.name == target for d in self.due):
                self.skipped_total[(target, reason)] += 1

    def skipped(self) -> dict:
        """The skip counters as they are now."""
        with self._lock:
            return dict(self.skipped_total)

    def step(self) -> None:
        """Ask plan() what to do with the due probes, and do it: start workers, count, log; then tell the core
        its counters if they moved."""
        with self._plan_lock:
            self._step()
        self.post_counters()

    def post_counters(self) -> None:
        """The skip counters and each probed disk's budget to the core, when they moved since the last time
        (a budget refills as its window slides, so while one is spent this is every step)."""
        with self._counters_lock:   # a worker and the step both post: the newer view is posted last
            counted = (self.skipped(), self.budget_view())
            if counted != self._counted_posted and self.post is not None:
                self._counted_posted = counted
                self.post(ProbesCounted(frozen_map(counted[0]), frozen_map(counted[1])))

    def _step(self) -> None:
        now = self.clock()
        self._confirm_soon(now)
        with self._lock:
            if self.processes.stopping:
                return
            due = [d for d in self.due if d.next_at <= now]
            busy = set(self._busy_disks)
            since_own_probe = now - self._last_probe_end
        if not due:
            return
        sch = self.cfg.section("scheduling")
        answers = self.paths.poll([d.target.path for d in due], PATH_ASK_EVERY_SECONDS)
        fresh_since = self.paths.clock() - 3 * PATH_ASK_EVERY_SECONDS
        by_key, candidates, fitted, needed_of = {}, [], dict(self.fit.intervals), {}
        stretch = self._fit()
        last_start: dict[str, float] = {}   # target -> when a probe of any of its profiles last started
        for d in self.due:
            if d.started_at is not None:
                last_start[d.target.name] = max(last_start.get(d.target.name, d.started_at), d.started_at)
        for d in due:
            if (answer := answers.get(d.target.path)) is None or answer.at < fresh_since:
                continue   # asked: it runs at a later step, on a fresh answer
            if answer.hung:
                d.next_at = now + self._interval(d)   # once an interval: nothing is started on it
                self._hung(d, answer, ())
                continue
            disks = self.physical_disks(d.target)
            by_key[(d.target.name, d.profile)] = (d, disks)
            needed = needed_of[(d.target.name, d.profile)] = self.cfg.profiles[d.profile].effective_runtime_seconds(
                self.cfg.limits.max_runtime_seconds)
            warming = self.warming_up(d.target.name, d.profile)
            interval = fitted[(d.target.name, d.profile)] = self._interval(d, max((stretch.get(x, 1.0) for x in disks),
                                                                                   default=1.0))
            candidates.append(Candidate(d.target.name, d.profile, d.next_at, disks, self.still_mounted(d.target),
                                        needed, interval, d.deferred_since, d.waiting, warming,
                                        bool(self.suspected(d.target.name, d.profile)),
                                        # a volume of one profile has no other to measure it while that one
                                        # waits: its deferral is max_deferral_seconds, as configured
                                        now - last_start[d.target.name]
                                        if d.target.name in last_start and len(d.target.profiles) > 1 else None,
                                        self.struck_on_busy(d.target.name), self._interval(d)))
        if fitted != self.fit.intervals:   # what /metrics says each runs at, and the ProbeStale rule allows for
            self.fit.intervals = fitted
            self.post(IntervalsFitted(frozen_map(fitted)))
        psi = getattr(self.load, "io_pressure", None)
        load = Load({x: self.load.recent_util_percent(x) or 0.0 for c in candidates for x in c.disks},
                    psi.full_avg10_percent if psi is not None else None, since_own_probe)
        rules = Rules(sch.defer_util_percent, sch.max_deferral_seconds, sch.jitter_ratio, sch.warmup_interval_seconds)
        decisions = plan(now, candidates, busy, lambda disks, needed, warming, suspected: self.budget.refuses(
                         disks, needed, warming_up=warming, confirming=suspected), load, rules,
                         lambda ratio: self.rng.uniform(-ratio, ratio))
        with self._lock:
            running = sum(1 for t in self._workers if t.is_alive())
        for dec in decisions:
            d, disks = by_key[(dec.target, dec.profile)]
            if dec.action == "run" and running >= MAX_PROBE_WORKERS:
                continue   # due still: it runs at a later step, when a worker ends
            if dec.next_at is not None:
                d.next_at = dec.next_at
                if dec.action == "run":   # the target's profiles in turn over its interval, not together
                    siblings = [o for o in self.due if o.target.name == d.target.name]
                    d.next_at = spread_next(dec.next_at, now, fitted[(d.target.name, d.profile)],
                                            [o.next_at for o in siblings if o is not d])
                    if len(siblings) > 1 and fitted[(d.target.name, d.profile)] > d.target.interval_seconds:
                        # stretched by the budget's fit, each profile's run is spaced past the volume's interval:
                        # the volume itself is still measured within it
                        drawn = within_cover({o.profile: o.next_at for o in siblings}, now,
                                             d.target.interval_seconds,
                                             needed_of[(d.target.name, d.profile)] + DEFER_RETRY_SECONDS)
                        for o in siblings:
                            o.next_at = drawn[o.profile]
            d.deferred_since, d.waiting = dec.deferred_since, dec.waiting
            if dec.action == "run":
                d.started_at = now
                with self._lock:
                    self._busy_disks |= set(disks)
                self.start_worker(d, disks, dec.contended, dec.util_percent)
                running += 1
                continue
            if dec.counted:
                self.skip(dec.target, dec.reason)
                fit.log_hold(dec, disks, load)

    def _hung(self, d: Due, answer, disks) -> None:
        """A target whose path does not answer: a failed probe on record that says so (ProbeFailing after two)."""
        self.skip(d.target.name, "hung")
        self._not_run(d, disks, answer.hung_text(pathstat.HUNG_AFTER_SECONDS))

    def _not_checked(self, d: Due, answer, disks) -> None:
        """A target whose path could not be asked (no process could be started): a failed probe that says why,
        not a verdict on the volume (a device that seems gone would read as another volume mounted there)."""
        self._not_run(d, disks, f"{d.target.path} could not be checked: {answer.error}")

    def _not_run(self, d: Due, disks, error: str) -> None:
        """A due probe that was not run: a failed probe on record that says why (ProbeFailing after two)."""
        log.error("probe %s/%s not run: %s", d.target.name, d.profile, error,
                  extra={"TARGET": d.target.name, "PROBE": d.profile, "REPEATS": True})
        self.post(ProbeFinished(ProbeResult(d.target.name, d.target.path, None, d.profile, False, error,
                                            time.time(), 0.0), tuple(disks), False))

    def _interval(self, d: Due, stretch: float = 1.0) -> float:
        """Its next probe's interval: the warm-up's while it learns, else its own, stretched to fit the budget."""
        if self.warming_up(d.target.name, d.profile):
            return min(d.target.interval_seconds, self.cfg.section("scheduling").warmup_interval_seconds)
        return d.target.interval_seconds * stretch

    def _fit(self) -> dict[str, float]:   # each disk's stretch of its routine intervals (fit.py)
        per_disk: dict[str, list] = {}
        for d in self.due:
            if d.profile in self.cfg.profiles and not self.warming_up(d.target.name, d.profile):
                cost = self.fit.cost(d.target.name, self.cfg.profiles[d.profile], self.cfg.limits.max_runtime_seconds)
                for disk in self._disks_of.get(d.target.name, ()):
                    per_disk.setdefault(disk, []).append((cost, d.target.interval_seconds))
        return self.fit.stretches(per_disk, self.budget.time_ratio, self.budget.window_seconds)

    def start_worker(self, d: Due, disks, contended: bool, util: float) -> None:
        """Run the probe in a thread of its own; the scheduler keeps its cadence while fio runs."""
        profile = self.cfg.profiles[d.profile]
        try:
            w = self.spawn(PROBE_PART, probe_deadline_seconds(self.cfg, profile) + CHILD_REAP_SECONDS, self._run, d,
                           disks, contended, util)
        except RuntimeError:   # no thread could be started: a failed probe that says why, the disks free again
            with self._lock:
                self._busy_disks -= set(disks)
            self._not_run(d, disks, f"iowarden cannot start a thread for it: {TASK_LIMIT_TEXT}")
            return
        with self._lock:
            self._workers = [t for t in self._workers if t.is_alive()] + [w]

    def probe_done(self, disks) -> None:
        with self._lock:
            self._busy_disks -= set(disks)
            self._last_probe_end = self.clock()

    def _run(self, d: Due, disks, contended: bool, foreign_util: float) -> None:
        cfg = self.cfg
        try:
            fault_switch(PROBE_PART)
            profile = cfg.profiles[d.profile]
            sizes = {min(cfg.profiles[p].effective_size_bytes(), cfg.limits.max_size_bytes)
                     for p in d.target.profiles if p in cfg.profiles}
            answer = self.paths.check([d.target.path])[d.target.path]   # afresh: the scheduler's may be 10 s old
            if answer.hung:
                self._hung(d, answer, disks)
                return
            if not answer.asked:   # the daemon's own limit: nothing is known of the target, so nothing said of it
                self._not_checked(d, answer, disks)
                return
            device = self.device_of(d.target)
            refusal = self.pin_check(d.target, device)
            if not self.still_mounted(d.target):   # by that answer
                self.skip(d.target.name, "unmounted")
                return
            if refusal:
                result = ProbeResult(d.target.name, d.target.path, device, d.profile, False,
                                     f"refused: {refusal}", time.time(), 0.0)
            else:
                self.post(ProbeStarted(d.target.name, d.profile, device, tuple(disks)))
                refused_before = tasklimit.refusals(self.roots)
                expect_dev = d.target.found_on_dev
                if expect_dev is None and answer.st_mode is not None and stat.S_ISDIR(answer.st_mode):
                    # the filesystem the pin check approved: another one mounted over the target after it is
                    # refused by the probe's child before it makes a directory there, not written to
                    expect_dev = answer.st_dev
                result = run_isolated(d.target.name, d.target.path, profile, cfg.limits, self.roots,
                                      fio_binary=cfg.section("daemon").fio_path, keep_sizes=sizes,
                                      on_start=lambda proc: self.processes.track(proc, disks),
                                      expect_dev=expect_dev, owner=self.owner,
                                      timeout_seconds=probe_deadline_seconds(cfg, profile))
                refused = (tasklimit.refusals(self.roots) or 0) - (refused_before or 0)
                if not result.ok and refused_before is not None and refused > 0:
                    # fio that cannot start its job threads waits out its deadline: the limit is why, not the disk
                    result = dataclasses.replace(result, error=f"{result.error}; meanwhile iowarden's cgroup was "
                                                               f"refused {refused} tasks: {TASK_LIMIT_TEXT}")
            if not result.ok and not self.still_mounted(d.target, now=True):
                # unmounted between the check above and the probe's open (CI): a volume gone, not a failing probe
                self.skip(d.target.name, "unmounted")
                self.post(ProbeFinished(result, tuple(disks), False, unmounted=True))
                return
            result = dataclasses.replace(result, contended=contended, foreign_util_percent=round(foreign_util, 1))
            result = dataclasses.replace(result, learned_under_load=self._learn_under_load(d, result))
            if result.ok:
                self.fit.observe(d.target.name, d.profile, result.duration_seconds)
            self.budget.record(disks, self.clock() - result.duration_seconds, result.duration_seconds,
                               result.write_io_bytes + result.layout_bytes,
                               warmup=self.warming_up(d.target.name, d.profile),
                               confirm=bool(self.suspected(d.target.name, d.profile)))
            if self.processes.stopping and not result.ok:
                result = dataclasses.replace(result, error="interrupted: iowarden is stopping")
            gone = self.processes.aborted(disks)
            if gone and not result.ok:
                result = dataclasses.replace(result, error=f"aborted: {', '.join(sorted(gone))} was removed during "
                                                           "the probe")
            if result.ok and (not result.contended or result.learned_under_load):
                with self._lock:
                    self.learned[(d.target.name, d.profile)] += 1
            # its budget before its result: a snapshot that holds the result holds the device time it cost
            self.post_counters()
            self.post(ProbeFinished(result, tuple(disks), self.budget_exhausted(disks)))
        except Exception as exc:
            # a crashed worker is a failed probe on record (ProbeFailing can say so), then its part's crash
            self.post(ProbeFinished(ProbeResult(d.target.name, d.target.path, None, d.profile, False,
                                                f"crashed: {type(exc).__name__}: {exc}", time.time(), 0.0),
                                    tuple(disks), False))
            raise
        finally:
            self.probe_done(disks)

    def _learn_under_load(self, d: Due, result) -> bool:
        """A volume busy from its first minute would never arm (every warm-up probe runs contended and is not
        learned): after WARMUP_UNDER_LOAD_AFTER such probes in a row, its warm-up learns what it does beside that
        load, a normal slower and wider than an idle volume's, which probes on a quiet device only make faster.
        Whether this result is learned so."""
        key = (d.target.name, d.profile)
        if not result.ok:
            return False
        if not (result.contended and self.warming_up(*key)):
            with self._lock:
                self._contended_warmups.pop(key, None)
            return False
        with self._lock:
            self._contended_warmups[key] += 1
            streak = self._contended_warmups[key]
        if streak < WARMUP_UNDER_LOAD_AFTER:
            return False
        if streak == WARMUP_UNDER_LOAD_AFTER:
            log.info("%s/%s: its device was busy for %d warm-up probes in a row; learning its normal under "
                     "that load", d.target.name, d.profile, streak, extra={"TARGET": d.target.name, "PROBE": d.profile})
        return True

    def abort_on(self, disk: str) -> int:
        """Kill probes running on a disk that was removed; their results record the failure."""
        return self.processes.abort_on(disk)

    def stop(self, timeout_seconds: float) -> None:
        """Kill running probes and wait for the workers to record their results."""
        log.debug("stopping: killed %d running probe(s)", self.processes.stop())
        deadline = time.monotonic() + timeout_seconds
        with self._lock:
            workers = list(self._workers)
        for w in workers:
            w.join(max(0.0, deadline - time.monotonic()))


def _bare_thread(part: str, deadline_seconds: float, fn, *args) -> threading.Thread:
    def run():
        try:
            fn(*args)
        except Exception:   # noqa: BLE001 - no supervisor here (tests): say it
            log.exception("%s: a task crashed", part)
    t = threading.Thread(target=run, name=f"iowarden-{part}", daemon=True)
    t.start()
    return t
