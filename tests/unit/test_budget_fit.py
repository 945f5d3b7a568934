"""The budget fits what it pays for (fake clock, no root, no fio).

Landed code: the example's four profiles were planned at 1.5 s each and measured 1.8-2.0 s, 89 s an hour of a
72 s budget; every volume's budget ran dry 45 minutes after arming and nothing was probed for a quarter of an
hour. A detected fault re-probed every minute spent the budget, so its alert could not clear. Now routine
intervals are fitted to what the probes cost, and a reserve only confirming probes spend stays for them.
"""
import logging
import sys

import pytest

from tests.unit.test_policy import Clock, FakeRun, Sampler

from iowarden.daemon import config
from iowarden.daemon.probing import fit
from iowarden.daemon.probing.budget import Budget
from iowarden.probes.common import Roots

COST = 1.9   # what each of the example's probes took, measured


def _example_like(ratio=0.02, reserve=0.02, interval=300.0):
    profiles = "".join(f'[profiles.p{i}]\nrw = "randread"\nruntime_seconds = 1.0\nramp_time_seconds = 0.5\n'
                       for i in range(4))
    return config.parse(f"""
[budget]
device_time_ratio = {ratio}
reserve_device_time_ratio = {reserve}
[scheduling]
jitter_ratio = 0.0
[detector]
warmup_probes = 3
{profiles}
[[targets]]
name = "db"
path = "/srv/db"
profiles = ["p0", "p1", "p2", "p3"]
interval_seconds = {interval}
""")


class Paying(FakeRun):
    """Each probe costs COST seconds of device time, charged as _run charges it."""

    def start_worker(self, d, disks, contended, util):
        warming = self.warming_up(d.target.name, d.profile)   # as _run records it, before the probe is learned
        super().start_worker(d, disks, contended, util)
        self.budget.record(disks, self.clock(), COST, 0, warmup=warming,
                           confirm=bool(self.suspected(d.target.name, d.profile)))
        self.fit.observe(d.target.name, d.profile, COST)
        self.learned[(d.target.name, d.profile)] += 1


def _four_hours_of_the_example(caplog) -> Paying:
    """The example-like volume probed for four hours on the fake clock, the fit's warnings caught."""
    s = Paying(_example_like(), Roots(), Sampler(), lambda e: None, clock=Clock(0.0), devices=lambda: {},
               device_of={"db": "sdb"})
    with caplog.at_level(logging.WARNING, logger="iowarden"):
        for _ in range(4 * 3600):
            s.tick()
    return s


def test_the_reserve_is_for_confirming_probes_only():
    now = [10_000.0]
    b = Budget(0.02, 3600.0, 10 << 30, clock=lambda: now[0])
    b.reserve_time_ratio = 0.02
    b.record(("sdb",), now[0] - 100, 72.0, 0)                        # the routine share, spent
    assert b.refuses(("sdb",), 2.0) == "budget_time"
    assert b.refuses(("sdb",), 2.0, confirming=True) is None        # the reserve is whole
    b.record(("sdb",), now[0] - 50, 71.0, 0, confirm=True)
    assert b.refuses(("sdb",), 2.0, confirming=True) == "budget_time"   # the reserve has its own bound
    st = b.status("sdb")
    assert (st.routine_seconds_used, st.confirm_seconds_used, st.reserve_seconds_allowed) == (72.0, 71.0, 72.0)
    now[0] += 3600                                                  # an hour on: both whole again
    assert b.refuses(("sdb",), 2.0) is None and b.refuses(("sdb",), 2.0, confirming=True) is None


def test_confirming_probes_never_take_the_routine_share():
    now = [10_000.0]
    b = Budget(0.02, 3600.0, 10 << 30, clock=lambda: now[0])
    b.reserve_time_ratio = 0.02
    for i in range(30):                                             # a fault confirmed every minute: 57 s
        b.record(("sdb",), now[0] - 1800 + 60 * i, COST, 0, confirm=True)
    assert b.refuses(("sdb",), COST) is None                        # the armed volumes' routine probes still run


def test_routine_probes_over_their_budget_are_spread_not_starved(caplog):
    s = _four_hours_of_the_example(caplog)
    routine = [t for t, _, _ in s.ran if t > 600]       # past the warm-up
    assert s.skipped_total[("db", "budget_time")] == 0, s.skipped_total
    # spread over the hours, each profile about every 300 x 1.41 s: never a gap of a quarter hour. Out of the
    # warm-up the four profiles are moved apart in their first rounds, each by half its slot at most (a
    # quarter of the stretched interval, spread_next), then keep the stretched cadence
    by_profile = {}
    for (t, _, _), p in zip(s.ran, s.ran_profiles):
        if t > 600:
            by_profile.setdefault(p, []).append(t)
    stretched = 300 * 1.408
    for p, times in by_profile.items():
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(abs(g - stretched) <= stretched / 8 + 1 for g in gaps), (p, gaps)
        assert max(gaps[3:]) < 470 and min(gaps[3:]) > 400, (p, gaps)
    assert len(routine) >= 4 * 3 * 3600 / 470
    said = [r.getMessage() for r in caplog.records if "routine probes on sdb" in r.getMessage()]
    assert said and "1.41x less often" in said[-1] and "device_time_ratio = 0.0281" in said[-1], said


def test_a_schedule_that_fits_is_left_as_it_is():
    clock = Clock(0.0)
    s = Paying(_example_like(ratio=0.04), Roots(), Sampler(), lambda e: None, clock=clock, devices=lambda: {},
               device_of={"db": "sdb"})
    for _ in range(3600):
        s.tick()
    times = [t for (t, _, _), p in zip(s.ran, s.ran_profiles) if p == "p0" and t > 600]
    gaps = [b - a for a, b in zip(times, times[1:])]
    # moved apart from its volume's other profiles in its first rounds (half a slot at most), then on time
    assert all(abs(g - 300) <= 300 / 8 + 1 for g in gaps) and all(299 <= g <= 301 for g in gaps[3:]), gaps


def test_check_config_says_what_would_fit():
    from iowarden.daemon.cli import budget_problems
    (line,) = budget_problems(_example_like())
    assert "targets[0] (db)" in line and "ask 91 s of device time per 3600 s" in line
    assert "device_time_ratio = 0.0281" in line
    assert budget_problems(_example_like(ratio=0.04)) == []
    assert fit.stretch(91.2, 144.0) == 1.0


def test_the_interval_each_probe_runs_at_is_published_stretched(tmp_path):
    """/metrics says the interval a probe runs at, not the configured one: IowardenProbeStale allows three of them,
    and a stretched schedule would otherwise read as probes gone stale."""
    from iowarden.daemon.core.core import Core
    from iowarden.daemon.core.state import State
    from iowarden.daemon.events import IntervalsFitted, TargetsChanged
    from iowarden.daemon.core.effects import health_from
    clock, posted = Clock(0.0), []
    cfg = _example_like()
    s = Paying(cfg, Roots(), Sampler(), posted.append, clock=clock, devices=lambda: {}, device_of={"db": "sdb"})
    for _ in range(2 * 3600):
        s.tick()
    fitted = [e for e in posted if isinstance(e, IntervalsFitted)]
    assert fitted and len(fitted) < 40, len(fitted)   # said when it changes, not every second
    assert all(v < 300 for v in fitted[0].intervals.values()), fitted[0].intervals   # the warm-up's first
    assert all(415 < v < 430 for v in fitted[-1].intervals.values()), fitted[-1].intervals   # 300 s x 1.41
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st), "t")
    core.run_batch([TargetsChanged(cfg.targets), fitted[-1]])
    assert set(core.snapshot.probe_intervals.items()) == set(fitted[-1].intervals.items())
    st.close()


def test_a_disks_fit_said_again_with_new_figures_within_a_minute_is_held_as_a_repeat():
    """Probe costs move with the load, and with them the stretch: said each time it moved 5 %, one busy host said
    it twice in 31 s. The journal's repeat filter takes each disk's sentence as one message, whatever its figures."""
    from iowarden.daemon.logs import RepeatFilter
    now = [0.0]
    held = RepeatFilter(clock=lambda: now[0])
    f, said = fit.Fit(), []

    class Keep(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())
    handler = Keep()
    handler.addFilter(held)
    logger = logging.getLogger("iowarden")
    logger.addHandler(handler)
    try:
        for cost in (2.4, 2.9, 3.5):                   # each a stretch more than 5 % off the last said
            f.stretches({"loop10": [(cost, 60.0)] * 4}, 0.15, 3600.0)
            now[0] += 31
    finally:
        logger.removeHandler(handler)
    assert len(said) == 2 and "1 more like this" in said[1], said
    assert said[0].startswith("routine probes on loop10 ask 576 s") and "device_time_ratio = " in said[0]


def _volume_gaps(s, after):
    """The gaps between two probes of the volume (any profile) from `after` on."""
    times = sorted(t for t, _, _ in s.ran if t >= after)
    return [b - a for a, b in zip(times, times[1:])]


@pytest.mark.parametrize("cost_seconds, stretch", [(1.9, 1.41), (2.5, 1.85)])
def test_a_volume_is_measured_once_its_interval_when_the_fit_stretches_its_profiles(monkeypatch, caplog,
                                                                                    cost_seconds, stretch):
    """The example's budget and probes of 1.9 s (quiet) and 2.5 s (a loaded host's: the soak measured 3.07 s on a
    starved CPU) stretch each profile to 1.41x and 1.85x its interval. After the warm-up its four profiles had run
    a minute apart and each fell due that far on; the volume went unmeasured for most of a stretched interval
    (324 and 442 s here at 300 s; 346-357 s in the soak). Now the earliest is drawn back within the volume's
    interval, and no routine probe is refused for the budget."""
    monkeypatch.setattr(sys.modules[__name__], "COST", cost_seconds)
    s = _four_hours_of_the_example(caplog)
    said = [r.getMessage() for r in caplog.records if "routine probes on sdb" in r.getMessage()]
    assert said and f"{stretch:.2f}x less often" in said[-1], said
    armed_at = sorted(t for t, _, _ in s.ran)[11]         # the warm-up: three probes of each of four profiles
    gaps = _volume_gaps(s, armed_at)
    assert gaps and max(gaps) <= 300.0, sorted(gaps)[-5:]
    assert s.skipped_total[("db", "budget_time")] == 0, s.skipped_total
    per_profile = {}
    for (t, _, _), p in zip(s.ran, s.ran_profiles):
        if t > armed_at:
            per_profile.setdefault(p, []).append(t)
    # each profile still about at its stretched cadence, not at the volume's: the budget's spacing is kept
    for p, ts in per_profile.items():
        assert len(ts) <= (4 * 3600 - armed_at) / (300 * stretch) + 2, (p, len(ts))


def test_the_earliest_of_a_volumes_next_runs_is_drawn_back_within_its_interval_and_only_it():
    from iowarden.daemon.probing.plan import within_cover
    bunched = {"p0": 1427.0, "p1": 1437.0, "p2": 1448.0, "p3": 1460.0}
    assert within_cover(bunched, 1000.0, 300.0, 6.5) == {**bunched, "p0": 1293.5}
    spread = {"p0": 1100.0, "p1": 1205.0, "p2": 1310.0, "p3": 1415.0}
    assert within_cover(spread, 1000.0, 300.0, 6.5) == spread     # already within: nothing moves
    due = {"p0": 990.0, "p1": 1500.0}
    assert within_cover(due, 1000.0, 300.0, 6.5) == due           # one already due: the volume is covered
    assert within_cover({}, 1000.0, 300.0, 6.5) == {}
    for now in (0.0, 17.5, 1e6):                                  # never later, never more than one moved
        for ats in (bunched, spread, due):
            shifted = {p: t + now - 1000.0 for p, t in ats.items()}
            out = within_cover(shifted, now, 300.0, 6.5)
            assert all(out[p] <= shifted[p] for p in shifted)
            assert sum(out[p] != shifted[p] for p in shifted) <= 1
            assert min(out.values()) <= now + 300.0 - 6.5
