"""Policy without root: budgets, deferral, one probe per physical disk, alert state, causes.

A fake clock drives the scheduler and a fake worker stands in for fio; the md/LVM
topology is the fixture tree's (sdb1 + sdc1 -> md0 -> dm-0; sdd + sde -> md1 with
sde faulty). The end-to-end tests prove the same wiring with real devices.
"""
import dataclasses
import random

from iowarden.daemon import config
from iowarden.daemon.verdicts.causes import Evidence, likely_causes
from iowarden.daemon.verdicts.contended import STRIKE_SPAN_PROBES
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.core.effects import StoredHealth
from iowarden.daemon.probing.budget import Budget
from iowarden.daemon.probing.scheduler import Scheduler
from iowarden.daemon.core.state import State
from iowarden.probes import blockqueue
from iowarden.probes.common import Roots
from iowarden.probes.xfs import FragReport, XfsReport


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


class Sampler:
    io_pressure = None

    def __init__(self, util=0.0):
        self.util = util

    def recent_util_percent(self, disk):
        return self.util


def _cfg(targets: str, extra: str = "") -> config.Config:
    return config.parse(f"""
[budget]
device_time_ratio = 1.0
[scheduling]
jitter_ratio = 0.0
max_deferral_seconds = 30.0
defer_util_percent = 50.0
{extra}
[profiles.rr]
rw = "randread"
runtime_seconds = 2.0
ramp_time_seconds = 0.0
{targets}""")


def _target(name, interval=10.0):
    return f'[[targets]]\nname = "{name}"\npath = "/srv/{name}"\nprofiles = ["rr"]\ninterval_seconds = {interval}\n'


class FakeRun(Scheduler):
    """The scheduler's decisions with the probe replaced by a record of what would run, and when."""

    def __init__(self, *a, device_of=None, **kw):
        self.ran, self.ran_profiles, self.running, self._device = [], [], [], device_of or {}
        kw.setdefault("devices", lambda: {})   # no sysfs: the disks are the fixture's, or the names themselves
        if kw.get("post", a[3] if len(a) > 3 else None) is None:   # events not looked at: the scheduler's only
            kw["post"], a = (lambda event: None), a[:3]
        super().__init__(*a, **kw)

    def device_of(self, target):
        return self._device.get(target.name, "sdz")

    def start_worker(self, d, disks, contended, util):
        self.ran.append((self.clock(), d.target.name, contended))
        self.ran_profiles.append(d.profile)
        self.running.append((self.clock() + 2.0, d.target.name, disks))

    def tick(self, seconds=1.0):
        for item in [r for r in self.running if r[0] <= self.clock()]:
            self.running.remove(item)
            self.probe_done(item[2])
        self.step()
        self.clock.now += seconds


# --- budget -------------------------------------------------------------------------------

def test_budget_refuses_past_its_device_time_share_and_write_bytes():
    b = Budget(time_ratio=0.01, window_seconds=3600.0, write_bytes_per_day=1 << 30)
    now = 1e9
    b.record(("sdb",), now - 100, 30.0, 0)
    assert b.refuses(("sdb",), 5.0, now) is None              # 35 of 36 s
    assert b.refuses(("sdb",), 7.0, now) == "budget_time"     # 37 of 36 s
    assert b.refuses(("sdb",), 7.0, now + 3600) is None       # the window moved on
    b.record(("sdc",), now - 10, 1.0, 1 << 30)
    assert b.refuses(("sdc",), 1.0, now) == "budget_bytes"
    assert b.refuses(("sdc",), 1.0, now + 86400) is None      # a day later


def test_budget_replayed_after_a_restart_counts_against_every_member(tree):
    devices = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    now = 1e9
    b = Budget(time_ratio=0.01, window_seconds=3600.0, write_bytes_per_day=1 << 30, clock=lambda: now,
               wall=lambda: now)   # the stored result's age is the same on both clocks
    b.replay([{"device": "dm-0", "started_at": now - 60, "duration_seconds": 20.0, "write_io_bytes": 1 << 20,
               "layout_bytes": 0}], devices)
    # a probe of the LV on md0 spent the time of both disks under it
    for disk in ("sdb", "sdc"):
        st = b.status(disk, now)
        assert st.device_seconds_used == 20.0 and st.written_bytes_24h == 1 << 20
    assert b.status("sdd", now).device_seconds_used == 0


# --- deferral -----------------------------------------------------------------------------

def test_a_busy_disk_defers_the_probe_up_to_the_maximum_then_it_runs_contended():
    clock = Clock()
    sampler = Sampler(util=90.0)
    sch = FakeRun(_cfg(_target("db")), Roots(), sampler, post=None, rng=random.Random(0), clock=clock)
    sch.learned[("db", "rr")] = 12   # armed: a routine probe (a warm-up one waits less: below)
    start = clock.now
    for _ in range(80):
        sch.tick()
        if sch.ran:
            break
    (at, name, contended), = sch.ran
    assert contended and 30.0 <= at - start <= 60.0 + 5.0         # first due within a minute, then 30 s
    assert sch.skipped()[("db", "busy")] >= 5                     # every deferral counted


def test_the_scheduler_defers_on_the_util_the_core_published_not_on_the_sampler():
    """What a probe defers on is read in the core's snapshot (the sampler's reading as posted): a disk the
    latest published reading shows 90 % busy defers its probe; once a reading shows it quiet, it runs."""
    from types import MappingProxyType

    from iowarden.daemon.probing.published import Published
    from iowarden.daemon.snapshot import Snapshot
    from iowarden.daemon.sources.sampler import SamplerReading
    from iowarden.probes import diskstats

    def published(util):
        reading = SamplerReading(diskstats.DiskSample(0.0, {}), MappingProxyType({}), frozenset({"sdz"}), None,
                                 MappingProxyType({"sdz": util}))
        return Snapshot(0.0, "test", disk_reading=reading)
    clock, snap = Clock(), [None]
    load = Published(lambda: snap[0])
    assert load.recent_util_percent("sdz") is None and load.io_pressure is None   # before the first snapshot
    snap[0] = published(90.0)
    sch = FakeRun(_cfg(_target("db")), Roots(), load, post=None, rng=random.Random(0), clock=clock)
    sch.learned[("db", "rr")] = 12
    for _ in range(70):
        sch.tick()
        if sch.skipped().get(("db", "busy")):
            break
    assert not sch.ran and sch.skipped().get(("db", "busy")) == 1
    snap[0] = published(3.0)
    for _ in range(5):
        sch.tick()
    assert [contended for _, _, contended in sch.ran] == [False]


class BusySpells(Sampler):
    """A disk busy in seeded spells of 1-25 minutes (backups, compactions) between quiet ones of 1-10."""

    def __init__(self, clock, seed):
        rng, at, self.spells = random.Random(seed), clock.now, []
        while at < clock.now + 5 * 3600:
            length = rng.uniform(60, 1500)
            self.spells.append((at, at + length))
            at += length + rng.uniform(60, 600)
        self.clock = clock

    def recent_util_percent(self, disk):
        return 95.0 if any(a <= self.clock.now < b for a, b in self.spells) else 5.0


def test_the_example_configuration_measures_every_volume_once_an_interval_however_busy_its_disk():
    """Its four profiles wait for a busy disk up to max_deferral_seconds (600 s, two intervals), so a volume
    busy for ten minutes went that long unmeasured. Whatever the spells, one profile runs by the interval."""
    from pathlib import Path
    example = (Path(__file__).resolve().parents[2] / "config.example.toml").read_text()
    cfg = config.parse(example)
    (target,) = cfg.targets
    interval = target.interval_seconds
    for seed in range(4):
        clock = Clock()
        sch = FakeRun(cfg, Roots(), BusySpells(clock, seed), post=None, rng=random.Random(seed), clock=clock)
        for p in target.profiles:
            sch.learned[(target.name, p)] = 100    # armed: routine probes, which may wait for the disk
        started = clock.now
        while clock.now < started + 4 * 3600:
            sch.tick(5.0)
        starts = [at for at, _, _ in sch.ran]
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        assert len(starts) > 4 * 3600 / interval and max(gaps) <= interval, (seed, max(gaps))
        assert any(contended for _, _, contended in sch.ran)          # the spells did defer some
        assert sch.skipped()[(target.name, "busy")] > 0


def test_a_volumes_profiles_take_turns_over_its_interval_not_together():
    """Out of the warm-up the example's four profiles fall due together (each ran every minute, then every
    300 s from about the same moment): a fault that began just after them was first probed 214 s later. They
    are moved apart in their first rounds, and then the volume is probed every quarter interval."""
    from pathlib import Path
    from iowarden.daemon.probing.plan import spread_next
    cfg = config.parse((Path(__file__).resolve().parents[2] / "config.example.toml").read_text())
    (target,) = cfg.targets
    clock = Clock()
    sch = FakeRun(cfg, Roots(), Sampler(0.0), post=None, rng=random.Random(3), clock=clock)
    for p in target.profiles:
        sch.learned[(target.name, p)] = 100
    start = clock.now
    while clock.now < start + 3 * 3600:
        sch.tick(5.0)
    late = [at for at, _, _ in sch.ran if at > start + 3600]
    gaps = [b - a for a, b in zip(late, late[1:])]
    slot = target.interval_seconds / len(target.profiles)
    assert all(0.8 * slot <= g <= 1.2 * slot for g in gaps), gaps
    # the rule alone: a run is moved to the clearest time within half a slot, and no sooner than half an interval
    assert spread_next(400.0, 100.0, 300.0, [400.0, 401.0, 402.0]) == 362.5
    assert spread_next(400.0, 100.0, 300.0, []) == 400.0
    assert spread_next(400.0, 100.0, 300.0, [475.0, 550.0, 625.0]) == 400.0   # a whole slot clear: left
    assert spread_next(260.0, 100.0, 300.0, [260.0]) >= 250.0


def test_a_volume_busy_from_its_first_minute_learns_under_load_and_arms():
    """Every warm-up probe of a volume whose device is never idle once waited out its deferral, ran
    contended and was not learned: not armed after 53 minutes. A warm-up probe waits one warm-up interval
    at most; after three contended in a row, the warm-up learns beside the load (and says so in the result)."""
    from iowarden.daemon.probing.scheduler import WARMUP_UNDER_LOAD_AFTER, Due
    from iowarden.probes.fio_run import ProbeResult
    clock = Clock()
    sch = FakeRun(_cfg(_target("db", interval=300.0), "warmup_interval_seconds = 20.0\n"), Roots(),
                  Sampler(util=90.0), post=None, rng=random.Random(0), clock=clock)
    first_deferred = None
    for _ in range(120):
        sch.tick()
        if first_deferred is None and sch.skipped().get(("db", "busy")):
            first_deferred = clock.now - 1.0
        if sch.ran:
            break
    (at, _, contended), = sch.ran
    assert contended and 19.0 <= at - first_deferred <= 21.0   # its warm-up interval, not max_deferral_seconds (30)
    due = Due(sch.cfg.targets[0], "rr", clock.now)
    results = []
    for i in range(WARMUP_UNDER_LOAD_AFTER + 1):
        r = ProbeResult("db", "/srv/db", "sdz", "rr", True, None, 1e9 + i, 2.0, contended=True)
        results.append(sch._learn_under_load(due, r))
    assert results == [False] * (WARMUP_UNDER_LOAD_AFTER - 1) + [True, True]
    # an uncontended probe breaks the streak; a failed one does not count either way
    sch._learn_under_load(due, ProbeResult("db", "/srv/db", "sdz", "rr", True, None, 1e9, 2.0))
    r = ProbeResult("db", "/srv/db", "sdz", "rr", True, None, 1e9, 2.0, contended=True)
    assert not sch._learn_under_load(due, r)
    # once armed, a contended probe is what it always was: not learned
    sch.learned[("db", "rr")] = 12
    for _ in range(WARMUP_UNDER_LOAD_AFTER + 1):
        r = ProbeResult("db", "/srv/db", "sdz", "rr", True, None, 1e9, 2.0, contended=True)
        assert not sch._learn_under_load(due, r)


def test_a_probe_learned_under_load_is_learned_by_the_detectors_and_a_contended_one_is_not(tmp_path):
    from iowarden.daemon.core.state import State
    from iowarden.daemon.verdicts.detect import DetectorParams
    from iowarden.daemon.core.effects import StoredHealth, health_from
    st = State(str(tmp_path / "s.db"))
    h = StoredHealth(st, DetectorParams())
    base = {"target": "db", "profile": "rr", "device": "sdz", "ok": True, "error": None, "started_at": 1e9,
            "duration_seconds": 2.0, "read_iops": 1000.0, "write_iops": 0.0, "read_bw_bytes": 4096000.0,
            "write_bw_bytes": 0.0, "clat_p50_seconds": 0.001, "clat_p99_seconds": 0.002, "clat_p999_seconds": 0.003,
            "layout_bytes": 0, "write_io_bytes": 0}
    h.on_result({**base, "contended": True, "learned_under_load": False}, "kernel:sdz", lambda since: [])
    assert h.detectors == {}
    h.on_result({**base, "contended": True, "learned_under_load": True}, "kernel:sdz", lambda since: [])
    assert {m for (_, _, m) in h.detectors} >= {"read_iops", "clat_p99_seconds"}
    st.close()


def test_a_collapse_in_the_warm_up_is_not_learned_as_the_volumes_normal_and_a_busy_healthy_disk_is(tmp_path, caplog):
    """A volume collapsed to 5 % of its load in its first minutes: its warm-up, busy probe after probe, learned the
    collapse's 49 IOPS as its normal beside quiet warm-up probes of 60,000, and never paged. A busy warm-up probe
    is read against the quiet ones so far as an armed volume's is against its normal: short in total, with the
    device's latency or a cgroup limit agreeing, it is not learned (and said); a busy healthy disk's is."""
    import logging
    from iowarden.daemon.core.state import State
    from iowarden.daemon.verdicts.detect import DetectorParams
    from iowarden.daemon.core.effects import StoredHealth
    st = State(str(tmp_path / "s.db"))
    h = StoredHealth(st, DetectorParams(warmup_probes=12))
    quiet = {"target": "db", "profile": "rr", "device": "sdz", "ok": True, "error": None, "started_at": 1e9,
             "duration_seconds": 2.0, "read_iops": 60_000.0, "write_iops": 0.0, "read_bw_bytes": 60_000 * 4096.0,
             "write_bw_bytes": 0.0, "clat_p50_seconds": 0.0004, "clat_p99_seconds": 0.001,
             "clat_p999_seconds": 0.002, "layout_bytes": 0, "write_io_bytes": 0, "contended": False}
    for _ in range(3):
        h.on_result(quiet, "kernel:sdz", lambda since: [])
    learned = lambda: len(h.detectors[("kernel:sdz", "rr", "read_iops")].values)
    assert learned() == 3
    busy = {**quiet, "contended": True, "learned_under_load": True, "read_iops": 49.0, "read_bw_bytes": 49 * 4096.0}

    def context(total_iops, own=None, limited=False):
        c = {"delivered_iops": total_iops, "delivered_bytes_per_second": total_iops * 4096.0,
             "probe_queue_depth": 32, "delivered_on": None}
        if own is not None:
            c["own_slowdown_now"] = own
        if limited:
            c["cgroup_limited"] = True
        return c
    with caplog.at_level(logging.WARNING, logger="iowarden"):
        h.on_result(busy, "kernel:sdz", lambda since: [], context(94, limited=True))
    assert learned() == 3
    said = [r.getMessage() for r in caplog.records if "not learned" in r.getMessage()]
    assert said and "delivered 94 IOPS in total where the probes its warm-up learned got 60000" in said[0], said
    # a device at its normal latency, no limit: the total is the other work's asking, not the volume's fault
    h.on_result(busy, "kernel:sdz", lambda since: [], context(94, own=1.0))
    assert learned() == 4
    # a busy healthy disk delivering a third of the quiet figure in total, its device slowed: busy, learned
    h.on_result({**busy, "read_iops": 9000.0}, "kernel:sdz", lambda since: [], context(20_000, own=4.0))
    assert learned() == 5
    st.close()


def test_a_throttle_met_in_the_warm_up_pages_on_its_second_short_probe_and_clears_only_once_the_total_is_back():
    """A quarter throttle met 25 minutes after the start, a quarter of the profiles still learning: four busy
    warm-up probes in six minutes delivered 319-354 IOPS in total against 1,959-5,978 (a cgroup limit on the
    stack), each set aside as not learned, and nothing paged. Each is a strike as an armed volume's busy probe is:
    the second pages, once for the volume (another profile's strike is counted, not raised again), saying the
    normal is the warm-up's so far. A busy probe between short and its normal neither holds nor clears it; two
    probes back at three quarters of that normal clear it. A healthy busy disk (the device at its normal latency, no
    limit) and a short probe on a slowed host are not strikes."""
    from iowarden.daemon.verdicts.changes import AlertClosed, AlertRaised
    from iowarden.daemon.verdicts.contended import Strikes
    from iowarden.daemon.verdicts.detect import DetectorParams
    from iowarden.daemon.verdicts.health import Health
    h = Health(DetectorParams(warmup_probes=12))
    quiet = {"target": "db", "profile": "rr", "device": "sdz", "ok": True, "error": None, "started_at": 1e9,
             "duration_seconds": 2.0, "read_iops": 5978.0, "write_iops": 0.0, "read_bw_bytes": 5978 * 4096.0,
             "write_bw_bytes": 0.0, "clat_p50_seconds": 0.0004, "clat_p99_seconds": 0.001,
             "clat_p999_seconds": 0.002, "layout_bytes": 0, "write_io_bytes": 0, "contended": False}
    for profile in ("rr", "rw"):
        for _ in range(3):
            h.on_result({**quiet, "profile": profile}, "kernel:sdz", lambda since: [])
    busy = {**quiet, "contended": True, "learned_under_load": True, "read_iops": 263.0, "read_bw_bytes": 263 * 4096.0}

    def context(total_iops, own=None, limited=False, host=None):
        c = {"delivered_iops": total_iops, "delivered_bytes_per_second": total_iops * 4096.0,
             "probe_queue_depth": 32, "delivered_on": None, "cpu_pressure_some_percent": 98.0}
        if own is not None:
            c["own_slowdown_now"] = own
        if limited:
            c["cgroup_limited"] = True
        if host is not None:
            c["host_slowdown"] = host
        return c

    def raised(changes):
        return [c for c in changes if isinstance(c, AlertRaised)]
    causes = lambda since: ["a cgroup I/O limit holds sdz"]
    # a healthy busy disk: the device at its normal latency, no limit (the other work's asking) is no strike, and
    # ends the volume's run of strikes
    assert not raised(h.on_result(busy, "kernel:sdz", causes, context(323, limited=True)))
    assert not raised(h.on_result({**busy, "profile": "rw"}, "kernel:sdz", causes, context(323, own=1.0)))
    assert not raised(h.on_result({**busy, "profile": "rw"}, "kernel:sdz", causes, context(323, own=1.0)))
    # a device whose window was not read (a new daemon's curves learn too) is set aside, not counted
    free = {**context(323), "cpu_pressure_some_percent": 10.0}
    assert not raised(h.on_result(busy, "kernel:sdz", causes, free))
    assert not raised(h.on_result(busy, "kernel:sdz", causes, free))
    assert h.contended_strikes.get("kernel:sdz", None) in (None, Strikes())
    # on a slowed host a short probe is not counted, as an armed volume's is not
    assert not raised(h.on_result(busy, "kernel:sdz", causes, context(323, limited=True, host=3.0)))
    assert not raised(h.on_result(busy, "kernel:sdz", causes, context(323, limited=True, host=3.0)))
    # the throttle: the first strike does not page, the second does, and names the normal as the warm-up's
    assert not raised(h.on_result(busy, "kernel:sdz", causes, context(323, limited=True)))
    assert ("kernel:sdz", "rr") in h.short_on_busy()   # its next probe soon
    got = raised(h.on_result(busy, "kernel:sdz", causes, context(319, limited=True)))
    assert len(got) == 1 and got[0].metric == "delivered_iops" and got[0].profile == "rr"
    said = " ".join(got[0].causes)
    assert "delivered 319 IOPS in total" in said and "its first quiet probes got 5,978 (the volume is still " \
        "learning its normal)" in said and "a cgroup limit holds its stack" in said, said
    assert "a cgroup I/O limit holds sdz" in said
    # another profile's strikes are counted, not paged again: one fault, one alert for the volume
    assert not raised(h.on_result({**busy, "profile": "rw"}, "kernel:sdz", causes, context(354, limited=True)))
    assert not raised(h.on_result({**busy, "profile": "rw"}, "kernel:sdz", causes, context(354, limited=True)))
    assert [k for k in h.open if k[0] == "VolumeDegraded"] == [("VolumeDegraded", "kernel:sdz", "rr")]
    # between short and its normal (a quarter cap's 4k writes gave 0.28): neither holds nor clears, though learned
    for _ in range(4):
        out = h.on_result(busy, "kernel:sdz", causes, context(5978 * 0.28))
        assert not [c for c in out if isinstance(c, AlertClosed)]
    # back: two probes at three quarters of the warm-up's normal or more clear it, one does not
    assert not [c for c in h.on_result(busy, "kernel:sdz", causes, context(5978 * 0.8))
                if isinstance(c, AlertClosed)]
    closed = [c for c in h.on_result({**quiet, "read_iops": 5500.0}, "kernel:sdz", causes) if isinstance(c, AlertClosed)]
    assert len(closed) == 1 and ("VolumeDegraded", "kernel:sdz", "rr") not in h.open


def test_a_warm_up_probe_counted_but_not_learned_keeps_the_profile_warming_up():
    """The scheduler counts a warm-up probe learned when it ends; the core may set it aside (a collapse in the
    warm-up). Counted to its warmup_probes, the profile stays in its warm-up while the core's normal still learns."""
    from iowarden.daemon.probing.published import Published
    from iowarden.daemon.snapshot import BaselineView, ProbeView, Snapshot

    def snapshot(values: int) -> Snapshot:
        return Snapshot(0.0, "test", probes=(ProbeView("db", "rr", "kernel:sdz", None, None),),
                        baselines=(BaselineView("kernel:sdz", "rr", "read_iops", 1.0, 0.1, None, values, values < 12),))
    snap = [snapshot(11)]
    sch = FakeRun(_cfg(_target("db")), Roots(), Published(lambda: snap[0]), post=None, rng=random.Random(0),
                  clock=Clock())
    sch.learned[("db", "rr")] = 12
    assert sch.warming_up("db", "rr")
    snap[0] = snapshot(12)
    assert not sch.warming_up("db", "rr")


def test_an_idle_disk_runs_on_time_and_uncontended():
    clock = Clock()
    sch = FakeRun(_cfg(_target("db", interval=10.0)), Roots(), Sampler(0.0), post=None,
                  rng=random.Random(0), clock=clock)
    for _ in range(60):
        sch.tick()
    times = [at for at, _, _ in sch.ran]
    assert len(times) >= 5 and all(not c for _, _, c in sch.ran)
    assert all(abs((b - a) - 10.0) <= 1.0 for a, b in zip(times, times[1:]))   # no jitter configured


def test_two_profiles_on_one_disk_take_turns():
    """Two profiles, 2 s interval and 2 s runtime, on one target: before they took turns, 12 randread
    in 40 s, 0 randwrite, and no skip counted."""
    cfg = _cfg(_target("data", 2.0).replace('profiles = ["rr"]', 'profiles = ["rr", "rw"]'),
               '[profiles.rw]\nrw = "randwrite"\nruntime_seconds = 2.0\nramp_time_seconds = 0.0\n')
    clock = Clock()
    sch = FakeRun(cfg, Roots(), Sampler(0.0), post=None, rng=random.Random(1), clock=clock)
    for _ in range(40):
        sch.tick()
        assert len(sch.running) <= 1          # never two probes at once on the disk
    ran = [name for _, name, _ in sch.ran]
    profiles = sch.ran_profiles
    assert profiles.count("rr") >= 8 and profiles.count("rw") >= 8, profiles
    assert abs(profiles.count("rr") - profiles.count("rw")) <= 1 and set(ran) == {"data"}
    assert sch.skipped()[("data", "waiting_for_disk")] >= 8    # each waited for the other, counted


# --- one probe per physical disk across md and LVM -------------------------------------------

def test_targets_sharing_md_members_never_probe_at_once_and_others_run_beside_them(tree):
    devices = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    clock = Clock()
    cfg = _cfg(_target("lv", 2.0) + _target("raw-sdc", 2.0) + _target("mirror", 2.0))
    sch = FakeRun(cfg, Roots(), Sampler(0.0), post=None, rng=random.Random(0), clock=clock,
                  devices=lambda: devices, device_of={"lv": "dm-0", "raw-sdc": "sdc1", "mirror": "md1"})
    together = set()
    for _ in range(120):
        sch.tick()
        names = {name for _, name, _ in sch.running}
        assert not {"lv", "raw-sdc"} <= names         # dm-0 -> md0 -> sdb1 + sdc1: shares sdc with sdc1
        together.add(frozenset(names))
    assert any({"lv", "mirror"} <= s or {"raw-sdc", "mirror"} <= s for s in together)   # disjoint disks: in parallel
    counts = {n: sum(1 for _, name, _ in sch.ran if name == n) for n in ("lv", "raw-sdc", "mirror")}
    assert min(counts["lv"], counts["raw-sdc"]) >= 20 and abs(counts["lv"] - counts["raw-sdc"]) <= 2, counts


# --- alert state ---------------------------------------------------------------------------

def _result(i, iops):
    return {"target": "db", "profile": "rr", "ok": True, "error": None, "contended": False, "started_at": i,
            "read_iops": iops, "write_iops": 0.0, "read_bw_bytes": iops * 4096, "write_bw_bytes": 0.0}


def test_volume_degraded_raises_clears_and_an_accepted_normal_closes_it(tmp_path):
    st = State(str(tmp_path / "s.db"))
    h = StoredHealth(st, DetectorParams(warmup_probes=6))
    causes = lambda since: ["a cause"]   # noqa: E731
    for i in range(12):
        assert h.on_result(_result(i, 1000.0 * (1 + 0.01 * (i % 3))), "vol", causes) == []
    events = []
    for i in range(12, 20):
        events += h.on_result(_result(i, 500.0), "vol", causes)
    assert events == ["VolumeDegraded raised"]
    (alert,) = st.alerts(open_only=True)
    assert alert["causes"] == ["a cause"] and alert["severity"] == "critical"   # half: 2x worse
    cleared = []
    for i in range(20, 30):
        cleared += h.on_result(_result(i, 1000.0), "vol", causes)
    assert cleared == ["VolumeDegraded cleared"] and st.alerts(open_only=True) == []
    # degraded again, and the operator says it is the new normal
    for i in range(30, 40):
        h.on_result(_result(i, 400.0), "vol", causes)
    assert st.alerts(open_only=True)
    st.request_baseline("accept", None, "rr")
    h.apply_requests(lambda target: "vol")
    assert st.alerts(open_only=True) == []
    assert h.on_result(_result(41, 400.0), "vol", causes) == []   # 400 is normal now
    st.close()


def test_probe_failing_after_two_failures_in_a_row_and_cleared_by_a_success(tmp_path):
    st = State(str(tmp_path / "s.db"))
    h = StoredHealth(st)
    fail = {**_result(0, 0.0), "ok": False, "error": "fio exited with 1"}
    assert h.on_result(fail, "vol", None) == []
    assert h.on_result(fail, "vol", None) == ["ProbeFailing raised"]
    assert h.on_result(_result(2, 1000.0), "vol", None) == ["ProbeFailing cleared"]
    st.close()


# --- causes ----------------------------------------------------------------------------------

def _frag(per_file):
    return XfsReport("/srv", "dm-0", FragReport(int(per_file * 100), 100, 1 - 1 / per_file, per_file),
                     None, None, None, ())


def test_causes_name_drift_contention_md_members_fragmentation_and_budget(tree):
    devices = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    ev = Evidence(physical_disks=("sdb", "sdc"), device="dm-0", devices=devices,
                  drift=[(1.0, "sdb", "scheduler", "mq-deadline", "bfq"), (2.0, "sdd", "scheduler", "none", "bfq"),
                         (3.0, "host", "tuned_profile", "latency-performance", "balanced")],
                  contended=True, foreign_util_percent=85.0,
                  disk_await_ms={"sdb1": 40.0, "sdc1": 2.0},
                  xfs_now=_frag(6.0), xfs_then=_frag(1.5), budget_exhausted=True)
    causes = likely_causes(ev)
    text = "\n".join(causes)
    assert "sdb scheduler mq-deadline -> bfq" in text
    assert "sdd" not in text                                   # not under this volume
    assert "host tuned_profile latency-performance -> balanced" in text
    assert "contention" in text and "85% util" in text
    assert "md member sdb1 of md0 is slow: await 40.0 ms" in text
    assert "XFS fragmentation grew on /srv: 1.5 -> 6.0" in text
    assert "probe budget is spent" in text


def test_causes_name_a_degraded_array_and_its_faulty_member(tree):
    devices = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    ev = Evidence(physical_disks=("sdd", "sde"), device="md1", devices=devices, drift=[], contended=False,
                  foreign_util_percent=None)
    assert likely_causes(ev) == ["md array md1 (raid1) is degraded: faulty member sde"]
    quiet = Evidence(physical_disks=("sdb", "sdc"), device="dm-0", devices=devices, drift=[], contended=False,
                     foreign_util_percent=10.0)
    assert likely_causes(quiet) == []


# --- parts and the watchdog ----------------------------------------------------------------

def test_a_failing_step_is_counted_and_a_part_is_stuck_by_its_own_deadline_not_by_two_cadences():
    from iowarden.daemon.registry import Registry
    clock = Clock(0.0)
    reg = Registry(clock=clock)
    calls = []

    def flaky():
        calls.append(clock())
        if len(calls) == 1:
            raise OSError("EIO from sysfs")
    part = reg.add("settings", cadence_seconds=30.0, deadline_seconds=5.0, step=flaky)
    reg.add("xfs", cadence_seconds=3600.0, deadline_seconds=120.0, step=lambda: None)
    reg.run_once(part)
    st = reg.stats()["settings"]
    assert st.errors_total == 1 and not st.success and "EIO" in st.last_error
    clock.now = 10.0
    reg.run_once(part)
    assert reg.stats()["settings"].success and reg.stats()["settings"].errors_total == 1
    clock.now = 10.0 + 30.0 + 5.0               # the next step is due by its cadence plus its deadline: not yet
    assert reg.stuck() == []
    clock.now += 0.1
    assert reg.stuck() == ["settings"]           # xfs, hourly, is nowhere near its own

    # a step under way is stuck past its deadline, however long its cadence (it once took 2 x 1e10 s)
    long = reg.add("sampler", cadence_seconds=1e10, deadline_seconds=5.0, step=lambda: None)
    long.stats = dataclasses.replace(long.stats, step_started_monotonic=clock.now)   # as run_once marks a step
    clock.now += 5.0
    assert "sampler" not in reg.stuck()
    clock.now += 0.1
    assert "sampler" in reg.stuck()


def _contended(i, iops):
    return {**_result(i, iops), "contended": True}


def test_a_contended_probe_is_judged_by_what_the_busy_device_delivered_in_total(tmp_path):
    st = State(str(tmp_path / "s.db"))
    h = StoredHealth(st, DetectorParams(warmup_probes=6))
    causes = lambda since: []   # noqa: E731
    for i in range(8):
        h.on_result(_result(i, 1000.0 * (1 + 0.01 * (i % 3))), "vol", causes)
    # busy with other work: the probe gets 300, but the device moved 1,400 I/Os a second in all: healthy
    busy = {"delivered_iops": 1400.0, "delivered_bytes_per_second": 1400.0 * 4096}
    for i in range(8, 12):
        assert h.on_result(_contended(i, 300.0), "vol", causes, busy) == []
    # held at a ceiling: 150 in all, twice in a row
    capped = {"delivered_iops": 150.0, "delivered_bytes_per_second": 150.0 * 4096}
    assert h.short_on_busy() == frozenset()
    assert h.on_result(_contended(12, 100.0), "vol", causes, capped) == []
    # one short: not a page, but the next probe of the profile is the evidence, soon (probing/suspicion.py)
    assert h.short_on_busy() == {("vol", "rr")}
    assert h.on_result(_contended(13, 100.0), "vol", causes, capped) == ["VolumeDegraded raised"]
    (alert,) = st.alerts(open_only=True)
    # VolumeDegraded's one severity (daemon/alert_kinds.py), however far the figures moved
    assert "delivered 150 IOPS in total" in alert["causes"][0] and alert["severity"] == "critical"
    # the baseline learned nothing from the contended probes
    assert h.detectors[("vol", "rr", "read_iops")].baseline()[0] > 6.8   # log(1000) = 6.9
    assert h.on_result(_contended(14, 300.0), "vol", causes, busy) == ["VolumeDegraded cleared"]
    assert h.short_on_busy() == frozenset()   # a busy probe that delivered its normal in total ends it
    assert h.on_result(_contended(14, 100.0), "vol", causes, capped) == [] and h.short_on_busy()
    h.on_result(_result(14, 1000.0), "vol", causes)
    assert h.short_on_busy() == frozenset()   # and so does a quiet probe
    # without the sampler's figures a contended probe is not judged at all
    assert h.on_result(_contended(15, 10.0), "vol", causes, {}) == []
    st.close()


def test_short_busy_probes_of_one_profile_raise_across_another_profiles_probe_that_is_neither(tmp_path):
    """A cap short for the 4k reads only: the 4k write probe between two short 4k reads, at 0.28 of its normal in
    total, neither ends nor adds to the count (verdicts/contended.counted); a quiet probe ages it, and past
    STRIKE_SPAN_PROBES probes since the last strike the count is gone."""
    st = State(str(tmp_path / "s.db"))
    h = StoredHealth(st, DetectorParams(warmup_probes=6))
    causes = lambda since: []   # noqa: E731

    def of(profile, record):
        return {**record, "profile": profile}
    for i in range(8):
        h.on_result(of("rr", _result(i, 1000.0 * (1 + 0.01 * (i % 3)))), "vol", causes)
        h.on_result(of("rw", _result(i, 2000.0 * (1 + 0.01 * (i % 3)))), "vol", causes)
    capped = {"delivered_iops": 40.0, "delivered_bytes_per_second": 40.0 * 4096, "cgroup_limited": True}
    between = {"delivered_iops": 560.0, "delivered_bytes_per_second": 560.0 * 4096, "cgroup_limited": True}
    assert h.on_result(of("rr", _contended(8, 30.0)), "vol", causes, capped) == []
    assert h.on_result(of("rw", _contended(9, 300.0)), "vol", causes, between) == []
    assert h.on_result(of("rr", _contended(10, 30.0)), "vol", causes, capped) == ["VolumeDegraded raised"]
    st.close()
    # the same two strikes with more than the span of other probes between them do not raise
    st = State(str(tmp_path / "t.db"))
    h = StoredHealth(st, DetectorParams(warmup_probes=6))
    for i in range(8):
        h.on_result(of("rr", _result(i, 1000.0 * (1 + 0.01 * (i % 3)))), "vol", causes)
        h.on_result(of("rw", _result(i, 2000.0 * (1 + 0.01 * (i % 3)))), "vol", causes)
    assert h.on_result(of("rr", _contended(8, 30.0)), "vol", causes, capped) == []
    for i in range(9, 9 + STRIKE_SPAN_PROBES + 1):
        assert h.on_result(of("rw", _result(i, 2000.0)), "vol", causes) == []
    assert h.on_result(of("rr", _contended(20, 30.0)), "vol", causes, capped) == []
    st.close()


def test_an_alert_raised_by_a_collapse_clears_on_contended_probes_once_the_busy_device_delivers_its_normal(tmp_path):
    """The fault is gone but a backup keeps every probe contended: the device's total is the evidence."""
    st = State(str(tmp_path / "s.db"))
    h = StoredHealth(st, DetectorParams(warmup_probes=6))
    causes = lambda since: []   # noqa: E731
    for i in range(8):
        h.on_result(_result(i, 1000.0 * (1 + 0.01 * (i % 3))), "vol", causes)
    assert h.on_result(_result(8, 1.0), "vol", causes) == []              # one collapsed probe: a spike, maybe
    assert h.on_result(_result(9, 1.0), "vol", causes) == ["VolumeDegraded raised"]   # confirmed: at once
    # still throttled under a backup: the device moves 200 in all, far below the probe's normal 1,000
    held = {"delivered_iops": 200.0, "delivered_bytes_per_second": 200.0 * 4096}
    assert h.on_result(_contended(10, 50.0), "vol", causes, held) == []
    assert st.alerts(open_only=True)
    # the throttle is gone, the backup goes on: 1,400 in all
    busy = {"delivered_iops": 1400.0, "delivered_bytes_per_second": 1400.0 * 4096}
    assert h.on_result(_contended(11, 300.0), "vol", causes, busy) == ["VolumeDegraded cleared"]
    assert st.alerts(open_only=True) == []
    st.close()


def test_a_contended_probe_clears_the_alert_when_the_device_serves_its_load_at_its_normal_latency(tmp_path):
    """The soak: the throttle gone, a database mix keeps every probe contended, and a probe of 32 in
    flight beside it gets 60 % of its quiet figure in total: the passive view says the device serves its load
    at its normal latency, which is the evidence the fault is over. Not below half the probe's normal: a limit
    above the block layer (invisible to the passive view) holds it far below that."""
    st = State(str(tmp_path / "s.db"))
    h = StoredHealth(st, DetectorParams(warmup_probes=6))
    causes = lambda since: []   # noqa: E731
    for i in range(8):
        h.on_result(_result(i, 1000.0 * (1 + 0.01 * (i % 3))), "vol", causes)
    h.on_result(_result(8, 1.0), "vol", causes)
    assert h.on_result(_result(9, 1.0), "vol", causes) == ["VolumeDegraded raised"]
    above = {"delivered_iops": 300.0, "delivered_bytes_per_second": 300.0 * 4096, "passive_slowdown": 1.0}
    assert h.on_result(_contended(10, 100.0), "vol", causes, above) == []          # held above the block layer
    slow = {"delivered_iops": 600.0, "delivered_bytes_per_second": 600.0 * 4096, "passive_slowdown": 3.0}
    assert h.on_result(_contended(11, 200.0), "vol", causes, slow) == []           # still slow at its load
    back = {"delivered_iops": 600.0, "delivered_bytes_per_second": 600.0 * 4096, "passive_slowdown": 1.1}
    assert h.on_result(_contended(12, 200.0), "vol", causes, back) == ["VolumeDegraded cleared"]
    st.close()
