"""The host as a layer on the probe side: a probe taken while the host's other disks serve their loads far above
their normals measured the host, not the volume. No root, no fio; the passive detector on synthetic windows and
Health on generated probes, each with a state database of the test's own.

Beside two unrelated fio jobs on the same store, a healthy volume's quiet probe read p99.9 at 12x its normal
for 45 s, and paged VolumeDegraded, while every volume on the host was slow at its own load. The passive side
already judged a disk only beyond what its neighbours share; the probe side now does too.
"""
import math
import random

from iowarden.daemon.core.state import State
from iowarden.daemon.events import PassiveJudged, ProbeFinished
from iowarden.daemon.passive.values import DeviceView
from iowarden.daemon.passive.detector import PassiveDetector
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.verdicts.contended import STARVED_DEVICE_AGREES_SLOWDOWN
from iowarden.daemon.verdicts.health import HOST_SHARED_SLOWDOWN
from iowarden.daemon.core.effects import StoredHealth
from tests import passive_traces as pt
from tests.unit.test_alert_invariants import WARMUP, _probe
from tests.unit.test_core import _result, parts  # noqa: F401 (a fixture)

DAY = pt.DAY_WINDOWS


def _neighbours_ratio(slow: set[int], factor: float = 4.0, quiet: int | None = None) -> dict[str, float | None]:
    """Five disks, a day learned, then an hour with those in `slow` at `factor` times their normal; the disk
    `quiet` carries no traffic in that hour (it is the one being probed). Each view's neighbours' ratio."""
    hour = 240
    traces = [pt.device_trace(10 + k, DAY + hour, slow_from=DAY if k in slow else None, factor=factor,
                              device=f"vd{k}") for k in range(5)]
    det = PassiveDetector()
    for i, batch in enumerate(zip(*traces)):
        det.observe([w for w in batch if not (i >= DAY and w.device == f"vd{quiet}")], [])
    return {v.device: v.neighbours_ratio for v in det.views()}


def test_a_quiet_disk_sees_what_its_busy_neighbours_share():
    ratios = _neighbours_ratio(slow={1, 2, 3, 4}, quiet=0)
    assert ratios["vd0"] is not None and ratios["vd0"] > 3.0, ratios   # no traffic of its own, still its host's
    calm = _neighbours_ratio(slow=set(), quiet=0)
    assert calm["vd0"] is not None and calm["vd0"] < 1.5, calm


def test_one_slow_neighbour_is_not_the_host():
    ratios = _neighbours_ratio(slow={1}, quiet=0)
    assert ratios["vd0"] < HOST_SHARED_SLOWDOWN, ratios   # the median of four neighbours, one of them slow


def _health(tmp_path):
    h = StoredHealth(State(str(tmp_path / "s.db")), DetectorParams(warmup_probes=WARMUP))
    rng, clock = random.Random(7), iter(range(10_000))
    for _ in range(WARMUP + 4):
        h.on_result(_probe(next(clock), 1.0, rng), "vol", lambda since: ["a cause"])
    return h, rng, clock


def test_slow_probes_on_a_slowed_host_page_nothing_and_teach_nothing(tmp_path):
    h, rng, clock = _health(tmp_path)
    before = {k: d.to_state() for k, d in h.detectors.items()}
    for _ in range(12):
        h.on_result(_probe(next(clock), 0.1, rng), "vol", lambda since: ["a cause"], {"host_slowdown": 3.0})
    assert h.open == {}
    assert {k: d.to_state() for k, d in h.detectors.items()} == before   # the host's figures are not its normal
    # the same probes on a host whose other disks are at their normal: the volume's own, and paged
    events = []
    for _ in range(8):
        events += h.on_result(_probe(next(clock), 0.1, rng), "vol", lambda since: ["a cause"], {"host_slowdown": 1.1})
    assert events == ["VolumeDegraded raised"], events


def test_an_open_alert_still_clears_on_a_slowed_host(tmp_path):
    h, rng, clock = _health(tmp_path)
    for _ in range(8):
        h.on_result(_probe(next(clock), 0.1, rng), "vol", lambda since: ["a cause"])
    assert list(h.open) == [("VolumeDegraded", "vol", "rr")]
    events = []
    for _ in range(6):   # the fault ends while the host is busy: the volume back at its normal is still said
        events += h.on_result(_probe(next(clock), 1.0, rng), "vol", lambda since: ["a cause"], {"host_slowdown": 3.0})
    assert "VolumeDegraded cleared" in events and h.open == {}, events


def test_the_core_hands_a_probe_its_hosts_slowdown_from_the_passive_view(parts):
    """The wiring: the passive detector's view of the probed device (its neighbours' ratio) reaches the
    judgement of the probe, and the journal's line for the probe says it was measured on a slowed host."""
    core = parts.new_core()
    core.run_batch([ProbeFinished(_result(i, 38000.0 * (1 + 0.01 * (i % 3)))) for i in range(12)])

    def host_at(ratio):
        view = DeviceView("dm-0", {}, {}, {}, None, None, (), neighbours_ratio=ratio)
        return PassiveJudged(views=(("dm-0", parts.devices["dm-0"].identity, view),))
    core.run_batch([host_at(3.0)] + [ProbeFinished(_result(i, 3000.0)) for i in range(12, 20)])
    assert core.snapshot.alerts == ()
    core.run_batch([host_at(1.0)] + [ProbeFinished(_result(i, 3000.0)) for i in range(20, 28)])
    assert [a.alert for a in core.snapshot.alerts] == ["VolumeDegraded"]


def test_a_volume_twice_as_slow_as_its_slowed_host_is_still_its_own(tmp_path):
    """An array dragged by a slow member in a guest whose every disk ran slow: its device at 10x its normal
    beside neighbours at 3x is its own slowdown, and its probes page; at 4x beside 3x it is the host's."""
    h, rng, clock = _health(tmp_path)
    for _ in range(8):
        h.on_result(_probe(next(clock), 0.1, rng), "vol", lambda since: ["a cause"],
                    {"host_slowdown": 3.0, "own_slowdown": 4.0})
    assert h.open == {}
    events = []
    for _ in range(8):
        events += h.on_result(_probe(next(clock), 0.1, rng), "vol", lambda since: ["a cause"],
                              {"host_slowdown": 3.0, "own_slowdown": 10.0})
    assert events == ["VolumeDegraded raised"], events


def _busy(i, rng, delivered_iops, **passive):
    """A probe of 32 in flight run contended on a busy disk, and what the disk delivered in total meanwhile."""
    probe = {**_probe(i, 0.3, rng), "contended": True}
    return probe, {"probe_queue_depth": 32, "delivered_iops": delivered_iops,
                   "delivered_bytes_per_second": delivered_iops * 4096, **passive}


def test_contended_probes_short_on_a_slowed_host_neither_page_nor_count_towards_a_page(tmp_path):
    """A busy disk delivering a tenth of the probe's normal in total, twice: a page where the device is slower
    than its neighbours, nothing where its neighbours are as slow (the host is the layer); and the short
    probes on the slowed host leave no strike behind for the next one to complete."""
    h, rng, clock = _health(tmp_path)
    slowed = {"host_slowdown": 2.7, "own_slowdown": 2.8, "passive_slowdown": 2.8}
    for _ in range(6):
        probe, ctx = _busy(next(clock), rng, 100.0, **slowed)
        assert h.on_result(probe, "vol", lambda since: ["a cause"], ctx) == []
    assert h.open == {} and h.short_on_busy() == frozenset()
    own = {"host_slowdown": 2.7, "own_slowdown": 60.0, "passive_slowdown": 60.0}
    probe, ctx = _busy(next(clock), rng, 100.0, **own)
    assert h.on_result(probe, "vol", lambda since: ["a cause"], ctx) == []   # one short: suspected, not paged
    probe, ctx = _busy(next(clock), rng, 100.0, **own)
    assert h.on_result(probe, "vol", lambda since: ["a cause"], ctx) == ["VolumeDegraded raised"]


def test_short_busy_probes_of_different_profiles_in_a_row_page_the_volume_once(tmp_path):
    """A volume collapsed to 5 % of its load meets its profiles in turn, each short once (a qd1 read, then a deep
    one): the volume's strikes, not each profile's, raise; one page for the volume, not one per profile. A starved
    host's short totals, its device at its normal latency for its load and no limit on its stack, page nothing."""
    h, rng, clock = _health(tmp_path)
    for _ in range(WARMUP + 4):
        h.on_result({**_probe(next(clock), 1.0, rng), "profile": "qd1"}, "vol", lambda since: ["a cause"])

    def busy(profile, depth, iops, **passive):
        probe, ctx = _busy(next(clock), rng, iops, **passive)
        return h.on_result({**probe, "profile": profile}, "vol", lambda since: ["a cause"],
                           {**ctx, "probe_queue_depth": depth})
    starved = {**STARVED, "own_slowdown": 1.0, "own_slowdown_now": 1.0, "passive_slowdown": 1.0}
    for _ in range(4):   # 0.005 and 0.1 of their normals, both past their shortfalls: the device says otherwise
        assert busy("qd1", 1, 5.0, **starved) == [] and busy("rr", 32, 100.0, **starved) == []
    assert h.open == {}
    # the device's last judged window (0.71x) is from before the collapse; its last window was not judged (a load
    # its curve has not learned): unknown, not a disagreement
    collapsed = {"own_slowdown": 0.71}
    assert busy("qd1", 1, 5.0, **collapsed) == []            # one strike: suspected
    assert busy("rr", 32, 50.0, **collapsed) == ["VolumeDegraded raised"]
    assert busy("qd1", 1, 5.0, **collapsed) == []            # the volume is paged: not again for another profile
    assert [k[2] for k in h.open] == ["rr"]
    # a qd1 probe at a tenth of its normal is what its users ask of a busy disk, not a strike
    (tmp_path / "h2").mkdir()
    h2, rng, clock = _health(tmp_path / "h2")
    probe, ctx = _busy(next(clock), rng, 100.0, own_slowdown_now=40.0)
    for _ in range(4):
        assert h2.on_result(probe, "vol", lambda since: ["a cause"], {**ctx, "probe_queue_depth": 1}) == []


def test_a_contended_alert_still_clears_on_a_slowed_host(tmp_path):
    h, rng, clock = _health(tmp_path)
    calm = {"host_slowdown": 1.0, "own_slowdown": 40.0, "passive_slowdown": 40.0}
    events = []
    for _ in range(2):
        probe, ctx = _busy(next(clock), rng, 100.0, **calm)
        events += h.on_result(probe, "vol", lambda since: ["a cause"], ctx)
    assert events == ["VolumeDegraded raised"], events
    # the fault ends while the whole host slows: the busy device delivering its normal in total still clears it
    probe, ctx = _busy(next(clock), rng, 1000.0, host_slowdown=3.0, own_slowdown=3.0, passive_slowdown=3.0)
    assert h.on_result(probe, "vol", lambda since: ["a cause"], ctx) == ["VolumeDegraded cleared"]


STARVED = {"cpu_pressure_some_percent": 90.0}


def test_slow_probes_on_a_starved_cpu_the_device_does_not_share_page_nothing_and_teach_nothing(tmp_path):
    """fio's clock on a starved CPU: a qd1 read at many times its normal while the passive view of the same
    device serves its load at its normal latency measured the CPU. Neither learned nor paged; a probe within its
    band there is learned; the same slow probes page where the device agrees, where a cgroup limit explains
    them, or where the CPU is not starved."""
    h, rng, clock = _health(tmp_path)
    before = {k: d.to_state() for k, d in h.detectors.items()}
    for _ in range(12):
        assert h.on_result(_probe(next(clock), 0.1, rng), "vol", lambda since: ["a cause"],
                           {**STARVED, "host_slowdown": 1.3, "own_slowdown": 1.0}) == []
    assert {k: d.to_state() for k, d in h.detectors.items()} == before
    # within its band, on the same starved CPU: the CPU made nothing of it, and it is learned as ever
    h.on_result(_probe(next(clock), 1.0, rng), "vol", lambda since: ["a cause"],
                {**STARVED, "host_slowdown": 1.3, "own_slowdown": 1.0})
    assert {k: d.to_state() for k, d in h.detectors.items()} != before

    def pages(name, context, probe=lambda i, rng: _probe(i, 0.1, rng)):
        (tmp_path / name).mkdir()
        h, rng, clock = _health(tmp_path / name)
        events = []
        for _ in range(8):
            events += h.on_result(probe(next(clock), rng), "vol", lambda since: ["a cause"], context)
        return events
    assert pages("agrees", {**STARVED, "own_slowdown": STARVED_DEVICE_AGREES_SLOWDOWN}) == ["VolumeDegraded raised"]
    # a loop device's own latency on a starved CPU is partly the CPU's (its requests complete on a kernel thread
    # that waits for a CPU too): a soak's healthy loop volumes' quiet write probes read 12x and 54x their normal
    # p50 there and paged where 1.5x of the device's normal agreed
    assert pages("partly the CPU's", {**STARVED, "own_slowdown": 3.0}) == []
    # an array's own 3x diluted by its healthy members: its slow member agrees for it, as on a busy disk
    assert pages("member", {**STARVED, "own_slowdown": 3.0, "slowest_member_now": ("vdd", 27.2)}) == \
        ["VolumeDegraded raised"]
    assert pages("member the CPU's", {**STARVED, "own_slowdown": 3.0, "slowest_member_now": ("vdd", 3.0)}) == []
    assert pages("limited", {**STARVED, "own_slowdown": 1.0, "cgroup_limited": True}) == ["VolumeDegraded raised"]
    assert pages("free", {"cpu_pressure_some_percent": 20.0, "own_slowdown": 1.0}) == ["VolumeDegraded raised"]
    # a device with no reading against its normal (idle, or its curve not learned yet) cannot agree or not: a
    # throughput fallen to a collapse's 5 % is the volume's and pages; the shapes a starved CPU gave healthy loop
    # volumes in a soak (seed 607) do not: the p99 alone at 54x with its IOPS whole, and IOPS 2.6x under normal
    assert pages("idle", STARVED, lambda i, rng: _probe(i, 0.05, rng)) == ["VolumeDegraded raised"]

    def latency_only(i, rng):
        return {**_probe(i, 1.0, rng), "clat_p99_seconds": 54e-3}
    assert pages("no reading, latency", STARVED, latency_only) == []
    assert pages("no reading, 2.6x", STARVED, lambda i, rng: _probe(i, 1 / 2.6, rng)) == []
    assert pages("no reading, free CPU", {"cpu_pressure_some_percent": 20.0}, latency_only) == ["VolumeDegraded raised"]


def test_on_a_starved_cpu_a_probe_the_detector_would_count_at_all_is_set_aside_not_only_one_past_two_spreads(tmp_path):
    """A volume whose p99 scatters widely (a loop device's write p99 on a busy host) has a wide band: a 12x probe
    there was under 2 spreads, yet the detector's ratio rules count it, and a soak's healthy volume paged so, its
    device at 1.33x with the CPU starved. What any rule counts (past k spreads, or outside_ratio times its normal)
    is set aside on a starved CPU; what none counts is learned as ever."""
    params = DetectorParams(warmup_probes=WARMUP, min_spread_log=1.3)   # the wide band, made so
    h = StoredHealth(State(str(tmp_path / "s.db")), params)
    rng, clock = random.Random(11), iter(range(10_000))

    def probe(factor):
        return {**_probe(next(clock), 1.0, rng), "clat_p99_seconds": 1e-3 * factor}
    for _ in range(WARMUP + 4):
        h.on_result(probe(1.0), "vol", lambda since: ["a cause"])
    det = h.detectors[("vol", "rr", "clat_p99_seconds")]
    assert 1.5 < det.spreads_from_normal(12e-3) < 2.0 and det.spreads_from_normal(3e-3) < params.k
    before = {k: d.to_state() for k, d in h.detectors.items()}
    starved = {**STARVED, "own_slowdown": 1.33, "own_slowdown_now": 1.33}
    for factor in (12.0, 3.0):   # past k spreads; under k but 3x its normal (the outside rule's ratio)
        events = []
        for _ in range(6):
            events += h.on_result(probe(factor), "vol", lambda since: ["a cause"], starved)
        assert events == [] and {k: d.to_state() for k, d in h.detectors.items()} == before, factor
    h.on_result(probe(1.2), "vol", lambda since: ["a cause"], starved)
    assert {k: d.to_state() for k, d in h.detectors.items()} != before   # near its normal: learned as ever
    # on a free CPU the same 3x is the outside rule's: it pages
    events = []
    for _ in range(8):
        events += h.on_result(probe(3.0), "vol", lambda since: ["a cause"], {"cpu_pressure_some_percent": 20.0})
    assert events == ["VolumeDegraded raised"]


def test_a_starved_cpu_held_for_minutes_is_said_once_a_minute_per_probe_with_a_count(tmp_path):
    """A starved CPU lasts minutes and every probe meets it: its line says the numbers of the moment but is one
    message per probe, folded by the journal's repeat filter like a deferral (a week's lane saw it 59 s apart)."""
    import logging
    from iowarden.daemon.logs import RepeatFilter
    from iowarden.daemon.verdicts.changes import Said
    from tests.unit.test_logs import Clock
    h, rng, clock = _health(tmp_path)
    fake = Clock()
    journal = RepeatFilter(60.0, fake)
    lines = []
    for i in range(10):   # a probe of one profile every 20 s, the CPU's pressure moving 88-97 %
        changes = h.verdicts.on_result(_probe(next(clock), 0.1, rng), "vol", lambda since: ["a cause"],
                                       {"cpu_pressure_some_percent": 88.0 + i, "own_slowdown": 1.0 + 0.02 * i},
                                       (None, ()))
        for c in changes:
            if isinstance(c, Said):   # as core/effects.py logs it
                r = logging.LogRecord("iowarden", c.level, __file__, 1, c.message, c.args, None)
                r.__dict__.update(c.fields)
                if journal.filter(r):
                    lines.append(r.getMessage())
        fake.now += 20.0
    held = [x for x in lines if "out of its band not judged" in x]
    assert len(held) == 4, held          # at 0, 60, 120 and 180 s
    assert held[0].startswith("probe ") and "tasks waited for a CPU 88 % of the time" in held[0]
    assert held[1].endswith("(2 more like this in the last 60 s)"), held[1]


def test_the_core_hands_a_probe_the_hosts_cpu_pressure(parts):
    """The wiring: the sampler's /proc/pressure/cpu reaches the judgement of a probe of a device whose passive
    view is at its normal: held on a starved CPU, paged when the CPU is free again."""
    from types import MappingProxyType
    from iowarden.daemon.events import DisksSampled
    from iowarden.probes import diskstats
    from iowarden.probes.pressure import parse
    core = parts.new_core()
    core.run_batch([ProbeFinished(_result(i, 38000.0 * (1 + 0.01 * (i % 3)))) for i in range(12)])

    def cpu_at(percent, t):
        psi = parse(f"some avg10={percent:.2f} avg60={percent:.2f} avg300=0.00 total=0\n")
        view = DeviceView("dm-0", {"read": 1.0}, {}, {}, None, None, (), neighbours_ratio=1.0)
        return [DisksSampled(diskstats.DiskSample(t, {}), MappingProxyType({}), None, 1.7e9 + t, cpu_pressure=psi),
                PassiveJudged(views=(("dm-0", parts.devices["dm-0"].identity, view),))]
    core.run_batch(cpu_at(95.0, 1.0) + [ProbeFinished(_result(i, 3000.0)) for i in range(12, 20)])
    assert core.snapshot.alerts == ()
    core.run_batch(cpu_at(5.0, 2.0) + [ProbeFinished(_result(i, 3000.0)) for i in range(20, 28)])
    assert [a.alert for a in core.snapshot.alerts] == ["VolumeDegraded"]


def test_a_volume_still_learning_on_a_starved_cpu_is_armed_as_ever(tmp_path):
    """A warm-up has no band to be out of: a host starved of CPU all day still arms its volumes."""
    h = StoredHealth(State(str(tmp_path / "s.db")), DetectorParams(warmup_probes=WARMUP))
    rng, clock = random.Random(7), iter(range(10_000))
    for _ in range(WARMUP):
        h.on_result(_probe(next(clock), 1.0, rng), "vol", lambda since: ["a cause"],
                    {**STARVED, "own_slowdown": 1.0})
    assert h.detectors and all(d.baseline() is not None for d in h.detectors.values())


def test_the_devices_latency_now_is_unknown_at_a_load_its_curve_never_learned():
    """A collapse moves a device's load into a bin its curve has not learned: its last judged ratio (0.71x in a
    soak's collapse, for three minutes) is from before, so the view's window_ratio, what a busy disk's short total
    is checked against, is None then, and the last window's ratio while its load is one the curve knows."""
    from iowarden.daemon.passive.detector import PassiveDetector
    det = PassiveDetector()
    day = pt.DAY_WINDOWS // 4
    trace = list(pt.device_trace(7, day))
    for w in trace:
        det.observe([w], [])
    v = det.views()[0]
    assert v.window_ratio is not None and 0.5 <= v.window_ratio <= 2.0, v.window_ratio
    before = dict(v.slowdown_ratio)
    lowest = min(w.flows["read"].iops for w in trace)
    det.observe([pt.window(trace[0].device, day, lowest / 64, 400.0)], [])   # 1/64 of its lightest load, 400 ms
    v = det.views()[0]
    assert v.window_ratio is None and dict(v.slowdown_ratio) == before


def test_a_device_busy_all_window_far_below_its_lightest_learned_load_is_judged_slow():
    """A volume collapsed to 5 % of its load kept its device 99 % busy at 4.3 octaves below its lightest learned
    bin: past the four octaves an unlearned load may borrow a bound from, it went unjudged, nothing suspected it,
    and its probes waited the collapse out as "device busy". A device busy all the window is never idle long
    enough for a power state to slow it: the bound reaches eight octaves then. The same load on a device idle
    most of the window (a lightly loaded disk whose power states may make it slower) is still not judged."""
    det = PassiveDetector()
    day = pt.DAY_WINDOWS // 4
    trace = list(pt.device_trace(7, day))
    for w in trace:
        det.observe([w], [])
    lowest = min(w.flows["read"].iops for w in trace)
    det.observe([pt.window(trace[0].device, day, lowest / 24, 400.0, util=40.0)], [])
    assert det.views()[0].window_ratio is None
    det.observe([pt.window(trace[0].device, day + 1, lowest / 24, 400.0, util=99.0)], [])
    v = det.views()[0]
    assert v.window_ratio is not None and v.window_ratio >= 8, v.window_ratio
    assert max(v.slowdown_ratio.values()) >= 8   # what the scheduler's suspicion reads (suspicion.SUSPECT_SLOWDOWN)
    det.observe([pt.window(trace[0].device, day + 2, lowest / 1024, 400.0, util=99.0)], [])   # ten octaves: no bound
    assert det.views()[0].window_ratio is None


def test_a_probe_collapsed_on_a_starved_cpu_is_set_aside_and_its_next_probe_is_brought_forward(tmp_path):
    """A cgroup limit set seconds before a probe is not yet in the host's view: a soak's quarter throttle met its
    first probe 51x under its normal, set aside on a starved CPU, and the next ran four minutes later behind
    deferrals for the throttled device. Set aside, neither learned nor paged, but a suspicion: the next probe of
    the profile comes a minute later and is not deferred long (probing/suspicion.py). A fall a starved CPU gives
    healthy volumes (2.6x) is no suspicion, and a probe back in band ends it."""
    from types import SimpleNamespace

    from iowarden.daemon.probing.suspicion import BY_PROBE, suspected_fault
    h, rng, clock = _health(tmp_path)
    before = {k: d.to_state() for k, d in h.detectors.items()}
    starved = {**STARVED, "own_slowdown": 1.0}
    assert h.on_result(_probe(next(clock), 1 / 51, rng), "vol", lambda since: ["a cause"], starved) == []
    assert {k: d.to_state() for k, d in h.detectors.items()} == before
    assert h.short_on_busy() == frozenset({("vol", "rr")})
    snapshot = SimpleNamespace(baselines=(), alerts=(), short_on_busy=h.short_on_busy(), passive=(),
                               probes=(SimpleNamespace(target="db", volume="vol", profile="rr",
                                                       result=SimpleNamespace()),))
    assert suspected_fault(snapshot, "db", "rr") == BY_PROBE
    h.on_result(_probe(next(clock), 1 / 2.6, rng), "vol", lambda since: ["a cause"], starved)
    assert h.short_on_busy() == frozenset()
    h.on_result(_probe(next(clock), 1 / 51, rng), "vol", lambda since: ["a cause"], starved)
    h.on_result(_probe(next(clock), 1.0, rng), "vol", lambda since: ["a cause"], starved)
    assert h.short_on_busy() == frozenset()
