"""Each service against its own normal (daemon/passive/service.py), through the passive detector on synthetic
windows of the device and of the tracer's counts per cgroup: no clock, no root.

A batch job's 4k random writes flood the volume of a database whose reads then wait 20 times their normal: the
page names the database's service and the batch job, with numbers, within two minutes, and clears within two
minutes of the flood's end. The same flood on a volume whose service is idle, or whose service keeps its normal
latency, raises nothing, though the device's own rule for other work (VolumeContended) would have; a service slow
with no one else on the device is not contention.
"""
import inspect
import random
import re

import pytest

from iowarden.daemon.passive.detector import PassiveDetector
from iowarden.daemon.passive.service import ServiceParams, ServiceRule
from iowarden.daemon.passive.values import Flow, Window
from iowarden.probes.blocktrace import CgroupCounts, StageHistogram, bucket_of_ns
from tests import passive_traces as pt

LEARN = 2 * 240          # two hours of 15 s windows
FLOOD = 32               # eight minutes
DB, BATCH = "/system.slice/postgresql.service", "/batch.scope"


def _counts(requests: int, mean_ms: float, nbytes_each: int, rng) -> CgroupCounts:
    """`requests` timed requests around `mean_ms` (a spread of +-30 %), `nbytes_each` bytes each."""
    hist: dict = {}
    total_ns = 0
    for _ in range(requests):
        ns = int(mean_ms * 1e6 * rng.uniform(0.7, 1.3))
        total_ns += ns
        b = bucket_of_ns(ns)
        hist[b] = hist.get(b, 0) + 1
    return CgroupCounts(requests, requests * nbytes_each, total_ns, StageHistogram(tuple(sorted(hist.items()))))


def _step(i, rng, flood=False, db_idle=False, db_slow=1.0, device_slow=1.0):
    """One window: the device's own (diskstats) and the tracer's per cgroup. The database reads 200 a window at
    0.5 ms; a flood adds 20,000 writes of 4 KiB a window from the batch job and makes the database's reads wait
    `db_slow` times as long (a closed loop: it then does proportionally fewer)."""
    db_ms = 0.5 * db_slow * device_slow
    db_requests = 0 if db_idle else max(40, int(200 / (db_slow * device_slow)))
    per = {}
    if db_requests:
        per[(DB, "read")] = _counts(db_requests, db_ms, 8192, rng)
    if flood:
        per[(BATCH, "write")] = _counts(20000, 4.0, 4096, rng)
    flows = {}
    if db_requests:
        flows["read"] = Flow(db_requests / pt.WINDOW_SECONDS, db_requests * 8 / pt.WINDOW_SECONDS, db_ms)
    if flood:
        flows["write"] = Flow(20000 / pt.WINDOW_SECONDS, 80000 / pt.WINDOW_SECONDS, 40.0 if db_slow > 1 else 4.0)
    w = Window("vdb", 1.7e9 + i * pt.WINDOW_SECONDS, pt.WINDOW_SECONDS, flows, None, None)
    return w, {"vdb": per}


def _run(episode, per_cgroup=True, **kw):
    rng, det, out = random.Random(5), PassiveDetector(), []
    for i in range(LEARN + episode + 60):
        during = LEARN <= i < LEARN + episode
        w, per = _step(i, rng, **(kw if during else {}))
        got = det.observe([w], [])
        if per_cgroup:
            got += det.observe_services(per, pt.WINDOW_SECONDS, w.end, lambda path: path.rsplit("/", 1)[-1] or "/")
        out += [(i - LEARN, t.kind, t.state, t) for t in got]
    return out


def test_a_flood_that_hurts_a_service_names_victim_and_culprit_with_numbers_and_clears_after_it():
    got = _run(FLOOD, flood=True, db_slow=20.0)
    service = [(i, state) for i, kind, state, _ in got if kind == "service"]
    assert [s for _, s in service] == ["raised", "cleared"], got
    raised_at, cleared_at = service[0][0], service[1][0]
    assert raised_at <= 8, raised_at                   # two minutes of 15 s windows
    assert cleared_at - FLOOD <= 8, cleared_at         # two minutes after the flood's end
    t = next(t for _, kind, state, t in got if kind == "service" and state == "raised")
    assert t.alert == "ServiceContended" and t.severity == "critical"
    e = t.evidence
    assert e["victim"] == DB and e["culprit"] == BATCH and e["direction"] == "read", e
    assert 15 <= e["victim_ratio"] <= 25 and e["culprit_request_share"] > 0.95, e
    s = t.summary
    assert re.match(r"vdb: postgresql\.service's reads wait (1[5-9]|2[0-5])x their normal \(p99 [\d.]+ ms vs "
                    r"[\d.]+ µs, mean [\d.]+ ms vs [\d.]+ µs\) since \d\d:\d\d; batch\.scope is doing (99|100)% of "
                    r"the device's requests \(4 KiB writes, 5\.2 MiB/s\)$", s), s
    # the device's own rule for other work is the per-service rule's now: no VolumeContended beside it
    assert {kind for _, kind, _, _ in got} == {"service"}, got


def test_without_counts_per_cgroup_the_same_flood_is_the_devices_volume_contended():
    got = _run(FLOOD, per_cgroup=False, flood=True, db_slow=20.0)
    assert [k for _, k, s, _ in got if s == "raised"] == ["contention"], got


def test_a_flood_with_no_victim_pages_nothing():
    # the service idle through the flood (a backup alone on the volume at night)
    assert _run(FLOOD, flood=True, db_idle=True) == []
    # the service busy and at its normal latency beside the flood (a device with room for both)
    assert _run(FLOOD, flood=True, db_slow=1.0) == []


def _host_run(host_slow: float, db_slow: float, neighbours=("vdc", "vdd")):
    """The flood's episode on vdb beside two neighbours that carry a steady 0.5 ms read load, all of them
    `host_slow` times their normal latency through the episode (a host whose CPUs are starved, its page cache
    flushing), the database on vdb `db_slow` times its own."""
    rng, det, out = random.Random(5), PassiveDetector(), []
    for i in range(LEARN + FLOOD + 60):
        during = LEARN <= i < LEARN + FLOOD
        w, per = _step(i, rng, **({"flood": True, "db_slow": db_slow} if during else {}))
        windows = [w] + [Window(n, w.end, pt.WINDOW_SECONDS,
                                {"read": Flow(100.0, 400.0, 0.5 * (host_slow if during else 1.0) * rng.uniform(0.9, 1.1))},
                                None, None) for n in neighbours]
        got = det.observe(windows, [])
        got += det.observe_services(per, pt.WINDOW_SECONDS, w.end, lambda path: path.rsplit("/", 1)[-1] or "/")
        out += [(i - LEARN, t.kind, t.state, t) for t in got]
    return out


@pytest.mark.parametrize("host_slow, db_slow, paged", [
    (15.0, 27.0, False),   # every disk of the host 15x its normal, the database 27x its own: the host's
    (1.0, 27.0, True),     # the neighbours at their normal: the batch job's victim, as on a host of one disk
    (3.0, 60.0, True),     # far beyond what the host shares: still a victim, and said so
])
def test_a_service_waiting_as_much_as_the_hosts_other_disks_is_the_hosts_not_a_neighbours_victim(host_slow, db_slow,
                                                                                                 paged):
    got = _host_run(host_slow, db_slow)
    raised = [t for _, kind, state, t in got if kind == "service" and state == "raised"]
    if not paged:
        assert not [t for _, kind, _, t in got if kind == "service"], got
        return
    assert [t.evidence["culprit"] for t in raised] == [BATCH], got
    if host_slow < 1.5:
        assert "host's other disks" not in raised[0].summary, raised[0].summary
    else:
        assert host_slow * 0.8 <= raised[0].evidence["host_slowdown"] <= host_slow * 1.2, raised[0].evidence
        assert "where the host's other disks are at" in raised[0].summary, raised[0].summary


def test_a_slow_service_alone_on_its_device_is_not_contention():
    got = _run(FLOOD, device_slow=20.0)
    assert not [t for _, kind, _, t in got if kind == "service"], got


def test_a_service_learns_its_normal_at_its_own_rate_and_the_learned_are_bounded():
    rule = ServiceRule(ServiceParams(max_services=3, learn_windows=4))
    rng = random.Random(1)
    for i in range(10):
        rule.judge("sda", {(f"/s{i % 5}", "read"): _counts(50, 1.0, 4096, rng)}, 15.0, 1.7e9 + 15 * i)
    assert len(rule.services) == 3
    assert {k[1] for k in rule.services} == {"/s2", "/s3", "/s4"}   # the least recently seen went first


def test_the_rules_minutes_are_the_same_in_windows_of_any_length():
    for seconds in (5.0, 15.0, 60.0):
        p = ServiceParams.for_windows_of(seconds)
        assert abs(p.windows * seconds - 120) <= max(seconds, 4 * seconds - 120)
        assert abs(p.learn_windows * seconds - 300) <= max(seconds, 4 * seconds - 300)


def test_a_raised_service_alert_clears_when_the_counts_per_cgroup_stop_and_the_device_rule_takes_over_again():
    rng, det = random.Random(9), PassiveDetector()
    raised = cleared = None
    for i in range(LEARN + 20 + 20):
        w, per = _step(i, rng, **({"flood": True, "db_slow": 20.0} if i >= LEARN else {}))
        det.observe([w], [])
        counted = i < LEARN + 20   # then the tracer stops counting per cgroup
        for t in det.observe_services(per if counted else {}, pt.WINDOW_SECONDS, w.end, lambda p: p):
            if t.state == "raised":
                raised = i - LEARN
            else:
                cleared = i - LEARN
    assert raised is not None and raised <= 8
    assert cleared is not None and 20 <= cleared <= 20 + 8 + 1, cleared   # a ring of windows without its requests
    assert det.by_service == frozenset()


def _blocked_run(flood_requests: int, flood_mean_ms: float, learn: int = 24, flood: int = 12):
    """A service reading one at a time, 200 reads a 15 s window at 0.5 ms; then a flood from the batch job while
    the service does `flood_requests` a window at `flood_mean_ms` each. Returns (window, state) of its transitions."""
    rule, rng, out = ServiceRule(ServiceParams(learn_windows=20)), random.Random(3), []
    for i in range(learn + flood + 12):
        during = learn <= i < learn + flood
        per = {(DB, "read"): _counts(flood_requests, flood_mean_ms, 4096, rng) if during
               else _counts(200, 0.5, 4096, rng)}
        if during:
            per[(BATCH, "read")] = _counts(3000, 20.0, 1 << 20, rng)
        out += [(i - learn, t.state) for t in rule.judge("vdb", per, 15.0, 1.7e9 + 15 * i)]
    return out


def test_a_service_a_flood_holds_to_a_few_reads_a_window_is_paged_not_left_out_as_too_few():
    # 5 reads a window at 2.5 s each: under min_requests, but they took the whole window: the worst hurt
    got = _blocked_run(5, 2500.0)
    assert [s for _, s in got] == ["raised", "cleared"], got
    assert got[0][0] <= 8, got
    # 5 reads a window at 5 ms (25 ms of a 15 s window): a service that reads little, not one blocked on its disk
    assert _blocked_run(5, 5.0) == []


def test_a_services_normal_is_shown_once_learned_at_its_recent_rate():
    rule, rng = ServiceRule(ServiceParams(learn_windows=4)), random.Random(2)
    for i in range(4):
        assert rule.views("vdb") == ()   # not learned yet: no normal to show
        rule.judge("vdb", {(DB, "read"): _counts(200, 0.5, 4096, rng)}, 15.0, 1.7e9 + 15 * i)
    (v,) = rule.views("vdb")
    assert (v.cgroup, v.direction, v.learned_windows) == (DB, "read", 4)
    assert 0.4 < v.usual_mean_ms < 0.6 and v.usual_p99_ms >= v.usual_mean_ms, v
    assert rule.views("vdc") == ()


def _restarted_mid_flood(saved_state: bool):
    """The database learns its normal for two hours; the daemon stops and starts again two windows into a flood,
    with its services saved (to_state through JSON, as the state database keeps them) or not. Returns the new
    detector's service transitions (window since the restart, state)."""
    import json
    rng, before = random.Random(7), PassiveDetector()
    for i in range(LEARN + 2):
        w, per = _step(i, rng, **({"flood": True, "db_slow": 20.0} if i >= LEARN else {}))
        before.observe([w], [])
        before.observe_services(per, pt.WINDOW_SECONDS, w.end, lambda p: p)
    after = PassiveDetector()
    if saved_state:
        st = json.loads(json.dumps(before.services.to_state("vdb")))
        assert after.services.load_state("vdb", st) == 2   # the database and the flood two windows in
    out = []
    for i in range(LEARN + 2, LEARN + FLOOD):
        w, per = _step(i, rng, flood=True, db_slow=20.0)
        after.observe([w], [])
        out += [(i - LEARN - 2, t.state) for t in after.observe_services(per, pt.WINDOW_SECONDS, w.end,
                                                                         lambda p: p)]
    return out


def test_a_daemon_restarted_during_a_flood_judges_it_against_the_services_saved_normal():
    got = _restarted_mid_flood(saved_state=True)
    assert [s for _, s in got] == ["raised"] and got[0][0] <= 8, got
    # without the saved normal the flood's first five minutes become the service's normal: no page at all
    assert _restarted_mid_flood(saved_state=False) == []


def test_a_damaged_or_out_of_range_saved_service_is_refused_whole_and_learned_again():
    rule, rng = ServiceRule(ServiceParams(learn_windows=4)), random.Random(4)
    for i in range(6):
        rule.judge("vdb", {(DB, "read"): _counts(200, 0.5, 4096, rng),
                           (BATCH, "write"): _counts(100, 1.0, 4096, rng)}, 15.0, 1.7e9 + 15 * i)
    good = rule.to_state("vdb")
    assert [e["cgroup"] for e in good["services"]] == [BATCH, DB]
    assert rule.to_state("vdc") is None
    bad_cases = [
        {"services": "x"},
        {"services": [{"cgroup": DB, "direction": "read", "bins": [[0, float("nan"), 0.0, 3]]}]},
        {"services": [{"cgroup": DB, "direction": "read", "bins": [[0, 0.0, 0.0, 0]]}]},        # never learned
        {"services": [{"cgroup": DB, "direction": "read", "bins": [[99, 0.0, 0.0, 3]]}]},       # no such rate
        {"services": [{"cgroup": DB, "direction": "read", "bins": [[0, 1e6, 0.0, 3]]}]},        # e^1e6 ms
        {"services": [{"cgroup": "x" * 5000, "direction": "read", "bins": [[0, 0.0, 0.0, 3]]}]},
        {"services": [good["services"][0], {"cgroup": DB, "direction": "read", "bins": []}]},    # one bad: none
    ]
    for bad in bad_cases:
        fresh = ServiceRule(ServiceParams(learn_windows=4))
        try:
            fresh.load_state("vdb", bad)
        except (ValueError, TypeError, KeyError):
            pass
        else:
            raise AssertionError(f"loaded {bad}")
        assert fresh.services == {} and fresh.to_state("vdb") is None, bad
    fresh = ServiceRule(ServiceParams(learn_windows=4))
    assert fresh.load_state("vdb", good) == 2 and fresh.to_state("vdb") == good
    assert [v.cgroup for v in fresh.views("vdb")] == [BATCH, DB]


def test_the_services_normals_go_through_the_state_database_to_the_next_start(tmp_path):
    from iowarden.daemon.core.core import Core
    from iowarden.daemon.core.effects import health_from
    from iowarden.daemon.core.state import State
    from iowarden.daemon.passive.part import PassiveWatch
    from iowarden.daemon.passive.values import PassiveParams
    from iowarden.daemon.verdicts.detect import DetectorParams
    from tests.unit.test_passive import FakeSampler, published

    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st, DetectorParams()), "test")
    sampler = FakeSampler()
    part = PassiveWatch(PassiveParams(window_seconds=15), published(lambda: sampler.reading), st,
                        lambda e: core.run_batch([e]))
    rng = random.Random(6)
    for i in range(30):
        part.detector.services.judge("kernel:sdz", {(DB, "read"): _counts(200, 0.5, 4096, rng)}, 15.0,
                                     1.7e9 + 15 * i)
    learned = part.detector.services.to_state("kernel:sdz")
    core.run_batch([part.final_event()])
    again = PassiveWatch(PassiveParams(window_seconds=15), published(lambda: sampler.reading), st,
                         lambda e: core.run_batch([e]))
    assert again.detector.services.to_state("kernel:sdz") == learned
    (v,) = again.detector.services.views("kernel:sdz")
    assert v.cgroup == DB and v.learned_windows == 30
    st.close()


def test_a_service_page_names_the_other_work_as_its_cause_before_where_the_wait_is_spent(tmp_path):
    """The flood's queue is in the device, and the tracer's line says so ("the time goes to the device"): as the
    page's first cause it read as if the device were at fault. The other work is the cause, said first."""
    from types import SimpleNamespace

    from iowarden.daemon.core.core import Core
    from iowarden.daemon.core.effects import health_from
    from iowarden.daemon.core.state import State
    from iowarden.daemon.verdicts.detect import DetectorParams
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st, DetectorParams()), "test", clock=lambda: 100.0)
    flood = SimpleNamespace(kind="service", evidence={"victim": "/db", "victim_words": "db.service",
                                                      "culprit": "/batch", "culprit_words": "batch.service",
                                                      "culprit_share": 0.93})
    causes = core.passive_causes(flood, "sdb")
    assert causes[0] == "other work on sdb: batch.service is doing 93% of its requests or bytes, and db.service " \
                        "waits behind it", causes
    assert not any(c.startswith("the device itself") for c in causes)
    assert not any(c.startswith("other work") for c in core.passive_causes(SimpleNamespace(kind="self"), "sdb"))
    st.close()


def _own_queue_run(batch_mean_ms: float, learn: int = 24, episode: int = 12):
    """The root cgroup's writes (a WAL appender and the page-cache writeback of a buffered backup, 64 KiB each): 200
    a window at 1.5 ms; then its own load fills the device's queue, 40 a window at 30 ms (20x), while a batch job
    does 400 writes of 4 KiB a window at `batch_mean_ms` each: 91 % of the device's requests, 39 % of its bytes.
    Returns (window, state, evidence) of its transitions."""
    rule, rng, out = ServiceRule(ServiceParams(learn_windows=20)), random.Random(4), []
    for i in range(learn + episode + 12):
        during = learn <= i < learn + episode
        per = {("/", "write"): _counts(40, 30.0, 1 << 16, rng) if during else _counts(200, 1.5, 1 << 16, rng)}
        if during:
            per[(BATCH, "write")] = _counts(400, batch_mean_ms, 4096, rng)
        out += [(i - learn, t.state, t.evidence) for t in rule.judge("vdb", per, 15.0, 1.7e9 + 15 * i)]
    return out


def test_a_service_whose_own_requests_fill_the_queue_is_not_the_victim_of_whoever_does_more_requests():
    # the batch job's 400 requests at 0.7 ms are 0.02 in the device on average, the root's 40 at 30 ms 0.08: the
    # root waits on its own load, though the batch job does 91 % of the requests
    assert _own_queue_run(0.7) == []
    # the same counts with the batch job's requests holding the device (400 at 30 ms: 0.8 in it against the
    # root's 0.08): the batch job is the culprit, named with its share of the requests
    got = _own_queue_run(30.0)
    assert [s for _, s, _ in got] == ["raised", "cleared"], got
    assert got[0][0] <= 8 and got[0][2]["culprit"] == BATCH and got[0][2]["culprit_request_share"] >= 0.9, got


def _background_run(limited: frozenset, victim: str = BATCH, culprit: str = "/", learn: int = 24,
                    episode: int = 16):
    """A soak's healthy mix, as the tracer counted it on the disk under a loop device: a batch job's 4 KiB direct
    writes, held by its cgroup to 200 IOPS, 0.78 ms each while it ran alone; then the root's 496 KiB writes at
    416 MiB/s (a compaction, a writeback storm) took 89 % of the disk's requests, and the batch job's writes
    waited 15 ms (19x). `victim`, `culprit`:
    the two cgroups' paths. Returns (window, state, evidence) of the device's transitions."""
    rule, rng, out = ServiceRule(ServiceParams(learn_windows=20)), random.Random(8), []
    for i in range(learn + episode + 12):   # a tenth of the soak's requests a window, in the same shares
        during = learn <= i < learn + episode
        per = {(victim, "write"): _counts(600 if not during else 90, 15.1 if during else 0.78, 4096, rng)}
        if during:
            per[(culprit, "write")] = _counts(1290, 40.0, 496 << 10, rng)
        out += [(i - learn, t.state, t.evidence)
                for t in rule.judge("vdb", per, 15.0, 1.7e9 + 15 * i, limited=limited)]
    return out


@pytest.mark.parametrize("victim,limited", [
    (BATCH, frozenset({BATCH})),                                    # its own limit
    ("/batch.slice/nightly-1.scope", frozenset({"/batch.slice"})),  # the limit of the slice it runs in
])
def test_work_its_owner_held_to_an_io_limit_is_not_paged_as_a_victim(victim, limited):
    """Seen in soaks of healthy mixes, twice in the first twenty minutes of five: a batch job held to a few hundred
    IOPS waited 14-19x the normal it had learned alone while a compaction's writes flushed, and ServiceContended
    paged it. Its owner limited it: background work, whose waits no one is woken for. The same waits of a cgroup
    nothing limits are paged, and a limit on the root (a throttle of the whole host) declares nothing."""
    assert _background_run(limited, victim) == []
    for unlimited in (frozenset(), frozenset({"/"}), frozenset({"/other.slice"})):
        got = _background_run(unlimited, victim)
        assert [s for _, s, _ in got] == ["raised", "cleared"], (unlimited, got)
        assert got[0][2]["victim"] == victim and got[0][2]["culprit"] == "/", got


def test_a_limited_cgroup_flooding_a_service_is_still_named_as_its_culprit():
    """The limit exempts the work held by it from being a victim, not from being the cause: a database in a
    cgroup of its own waits behind a limited job's writes, and the job is named."""
    got = _background_run(frozenset({BATCH}), victim=DB, culprit=BATCH)
    assert [s for _, s, _ in got] == ["raised", "cleared"], got
    assert got[0][2]["victim"] == DB and got[0][2]["culprit"] == BATCH, got


def test_the_cgroups_a_limit_of_their_own_holds_are_read_from_the_cgroup_view():
    from types import MappingProxyType

    from iowarden.daemon.sources.cgroups import CgroupIoView, limited_below_root
    from iowarden.probes.cgroupio import IoLimit
    view = CgroupIoView(1.7e9, 5.0, 1, "/", (), (("/", "7:2", IoLimit(riops=50)),
                                                  ("/batch-4", "7:0", IoLimit(wiops=400)),
                                                  ("/batch.slice", "7:0", IoLimit(wbps=1 << 20)),
                                                  ("/gone", "7:9", IoLimit(riops=10))),
                        MappingProxyType({"7:0": "loop0", "7:2": "loop2"}))
    # the root's throttle holds everyone and declares no one; a limit counts on whatever device it is set
    assert limited_below_root(view) == frozenset({"/batch-4", "/batch.slice", "/gone"})
    assert limited_below_root(None) == frozenset()


def test_the_part_hands_the_rule_the_cgroups_held_by_a_limit_on_the_device_above_the_one_they_wait_on(tmp_path):
    """From the snapshot's cgroup view to the rule. In the soak the batch job was limited on its volume's loop
    device (loop1), and the loop driver charged the writes it did to its backing file, on the disk under it
    (loop0), to the batch job's cgroup: there the job was judged, and paged, with no limit of its own."""
    from types import MappingProxyType

    from iowarden.daemon.core.state import State
    from iowarden.daemon.passive.part import PassiveWatch
    from iowarden.daemon.passive.values import PassiveParams
    from iowarden.daemon.snapshot import Snapshot
    from iowarden.daemon.sources import cgroups
    from iowarden.daemon.sources.registry import TAILS_SOURCE
    from iowarden.daemon.sources.cgroups import CgroupIoView
    from iowarden.probes.cgroupio import IoLimit
    from tests.unit.test_passive import FakeSampler, sdz_sample
    from tests.unit.test_passive_tail import _Reading

    sampler, seen = FakeSampler(), []
    view = CgroupIoView(1.7e9, 5.0, 1, "/", (), (("/batch-4", "7:1", IoLimit(wiops=400)),),
                        MappingProxyType({"7:1": "loop1"}))

    def trace(n):
        return _Reading(up=True, total=MappingProxyType({}), unix_time=1.7e9 + n, window_seconds=15.0,
                        cgroups_at=15.0 * n, cgroup_version=1, cgroups=MappingProxyType({
                            ("sdz", "/batch-4", "write"): (CgroupCounts(20 * n, 81920 * n, 10 ** 6 * n,
                                                                        StageHistogram(((100, 20 * n),))), None)}))
    step = [0]
    part = PassiveWatch(PassiveParams(window_seconds=15), lambda: Snapshot(
        0.0, "test", disk_reading=sampler.reading, devices=MappingProxyType({}), own_probes=MappingProxyType({}),
        sources=MappingProxyType({TAILS_SOURCE: trace(step[0]), cgroups.SPEC.name: view})),
        State(str(tmp_path / "s.db")), lambda e: None)
    judge = part.detector.services.judge

    def spy(*a, **k):
        args = inspect.signature(judge).bind(*a, **k).arguments
        seen.append((args["device"], tuple(sorted(args["counts"])), args.get("limited")))
        return judge(*a, **k)
    part.detector.services.judge = spy
    for i in range(4):
        step[0] = i
        sampler.last_sample = sdz_sample(15.0 * i, 1000 * i, 500 * i)
        part.step()
    assert seen and all(s == ("kernel:sdz", (("/batch-4", "write"),), frozenset({"/batch-4"})) for s in seen), seen
