"""A new volume is armed in minutes: probed every warmup_interval_seconds until its normal is learned, within
the warm-up's own budget, then at its target's interval. Fake clock, no root, no fio."""
from tests.unit.test_policy import Clock, FakeRun, Sampler, _cfg, _target

from iowarden.probes.common import Roots


class Learning(FakeRun):
    """FakeRun whose probes succeed: each one counts towards the volume's warm-up, as _run counts it."""

    def tick(self, seconds=1.0):
        for item in [r for r in self.running if r[0] <= self.clock()]:
            self.learned[(item[1], "rr")] += 1
        super().tick(seconds)


def _run(s: FakeRun, seconds: int):
    for _ in range(seconds):
        s.tick()
    return [t for t, _, _ in s.ran]


WARMUP = "[detector]\nwarmup_probes = 6\n"


def _history(contended: bool = False) -> list[dict]:
    """Six stored results of db/rr: a learned volume (or, contended, one that learned nothing)."""
    return [{"target": "db", "profile": "rr", "ok": True, "contended": contended, "device": None,
             "started_at": 0.0, "duration_seconds": 1.0}] * 6


def test_a_new_volume_is_probed_every_minute_until_learned_then_at_its_interval():
    clock = Clock()
    s = Learning(_cfg(_target("db", interval=1800.0), extra="warmup_interval_seconds = 60.0\n" + WARMUP),
                 Roots(), Sampler(), lambda e: None, clock=clock)
    times = _run(s, 3600)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) >= 8
    # the warm-up: a minute apart (the probe that started while the sixth was measured was planned a minute on)
    assert all(59 <= g <= 61 for g in gaps[:6]), gaps
    assert 1799 <= gaps[6] <= 1801, gaps                      # learned: back to the target's interval
    assert times[5] - 1000 <= 6 * 60, times                   # armed within six minutes of the start


def test_a_restart_of_a_learned_volume_does_not_warm_up_again():
    clock = Clock()
    history = _history()
    s = Learning(_cfg(_target("db", interval=1800.0), extra="warmup_interval_seconds = 60.0\n" + WARMUP),
                 Roots(), Sampler(), lambda e: None, clock=clock, history=history)
    times = _run(s, 3600)
    assert len(times) == 2 and 1799 <= times[1] - times[0] <= 1801, times


def test_contended_probes_do_not_count_as_learning():
    clock = Clock()
    history = _history(contended=True)
    s = Learning(_cfg(_target("db", interval=1800.0), extra="warmup_interval_seconds = 60.0\n" + WARMUP),
                 Roots(), Sampler(), lambda e: None, clock=clock, history=history)
    assert s.warming_up("db", "rr")


def test_the_warm_up_has_its_own_budget_and_the_normal_one_applies_after():
    clock = Clock()
    # the normal budget: 0.1 % of an hour (3.6 s) takes one 2 s probe; the warm-up's 10 % takes all six
    budget = "[budget]\ndevice_time_ratio = 0.001\nwarmup_device_time_ratio = 0.1\n"
    from iowarden.daemon import config
    cfg = config.parse(budget + f"""
[scheduling]
jitter_ratio = 0.0
warmup_interval_seconds = 60.0
{WARMUP}
[profiles.rr]
rw = "randread"
runtime_seconds = 2.0
ramp_time_seconds = 0.0
{_target("db", interval=300.0)}""")
    s = Learning(cfg, Roots(), Sampler(), lambda e: None, clock=clock, devices=lambda: {})
    real_start = s.start_worker

    def start(d, disks, contended, util):
        warming = s.warming_up(d.target.name, d.profile)   # as _run records it, before the probe is learned
        real_start(d, disks, contended, util)
        s.budget.record(disks, clock(), 2.0, 0, warmup=warming)
    s.start_worker = start
    times = _run(s, 1800)
    assert [b - a for a, b in zip(times, times[1:6])] == [60.0] * 5, times   # the warm-up ran whole, a minute apart
    # then the armed volume's first probe, planned by the last warm-up one: the warm-up just spent does not hold
    # it back (it did, for the rest of the hour); after it the routine budget's 3.6 s an hour holds the 300 s
    # interval back: fitted to it (fit.py: 2.4 s a probe, 28.8 s an hour asked of 3.6), the next one is planned
    # 8.9 intervals later instead of being refused at its time
    assert len(times) == 7 and times[6] - times[5] <= 301, times
    (planned,) = [d.next_at for d in s.due]
    assert planned - times[6] >= 300 * 28.8 / (0.9 * 3.6) - 1, planned - times[6]
    assert s.skipped_total[("db", "budget_time")] == 0


def test_a_probe_far_off_its_normal_is_confirmed_a_minute_later_not_an_interval():
    clock = Clock()
    history = _history()      # learned: its interval is 1800 s
    suspicion = {"on": False}
    s = Learning(_cfg(_target("db", interval=1800.0), extra="warmup_interval_seconds = 60.0\n" + WARMUP),
                 Roots(), Sampler(), lambda e: None, clock=clock, history=history,
                 suspected=lambda target, profile: "probe" if suspicion["on"] else None)
    while not s.ran:
        s.tick()
    s.tick()
    s.tick()
    suspicion["on"] = True    # its result (two seconds on) was 1000x off: the core's snapshot says so
    times = _run(s, 200)
    assert len(times) >= 2 and 59 <= times[1] - times[0] <= 65, times   # a minute on (or at once, if later)
    off_at = clock()
    suspicion["on"] = False   # back to normal: the interval again (the one already planned a minute on runs)
    times = _run(s, 1000)
    assert [t for t in times if t > off_at + 61] == [], times


def test_the_warm_up_counts_every_probe_and_the_routine_budget_only_its_own():
    from iowarden.daemon.probing.budget import Budget
    clock = Clock()
    b = Budget(0.01, 3600.0, 1 << 40, clock=clock)   # routine: 36 s an hour
    b.warmup_time_ratio = 0.05                        # warm-up: 180 s an hour, every probe counted
    for _ in range(10):
        b.record(("sdb",), clock(), 17.0, 0, warmup=True)
    st = b.status("sdb")
    assert (st.routine_seconds_used, st.device_seconds_used, st.warmup_seconds_allowed) == (0.0, 170.0, 180.0)
    assert b.refuses(("sdb",), 17.0, warming_up=True) == "budget_time"   # the warm-up's share is spent
    assert b.refuses(("sdb",), 17.0) is None                              # the routine one is whole
    b.record(("sdb",), clock(), 30.0, 0)
    assert b.refuses(("sdb",), 17.0) == "budget_time"
    # a restart: the stored results before a profile had learned warmup_probes were its warm-up's
    again = Budget(0.01, 3600.0, 1 << 40, clock=clock, wall=lambda: 10_000.0)
    rec = {"target": "db", "profile": "rr", "ok": True, "contended": False, "device": "sdb",
           "started_at": 9_000.0, "duration_seconds": 17.0}
    again.replay([rec] * 3, {}, warmup_probes=2)
    st = again.status("sdb")
    assert (st.routine_seconds_used, st.device_seconds_used) == (17.0, 51.0)
