"""The passive detector's policy on synthetic windows: no clock, no root, no devices."""
import dataclasses
import math
import random
import time
import itertools
import json

import pytest

from iowarden.daemon.passive.detector import PassiveDetector
from iowarden.daemon.passive.values import Flow, PassiveParams, Window
from iowarden.daemon.passive.replay import parse_lines, replay_passive, windows_of
from iowarden.probes.common import ParseError
from tests import passive_traces as pt

DAY = pt.DAY_WINDOWS


def run(windows, detector=None, groups=()):
    det = detector or PassiveDetector()
    events = []
    for i, w in enumerate(windows):
        batch = w if isinstance(w, list) else [w]
        events += [(i, t) for t in det.observe(batch, groups)]
    return det, events


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_healthy_device_over_two_days_never_alerts(seed):
    _, events = run(pt.device_trace(seed, 2 * DAY))
    assert events == []


def test_a_load_surge_moves_along_the_curve_and_never_alerts():
    # load triples for two hours on day two: latency rises with it, as the curve says it does
    _, events = run(pt.device_trace(4, 2 * DAY, surge=(DAY + 1000, DAY + 1480)))
    assert events == []


@pytest.mark.parametrize("factor,within", [(2.0, 240), (1.5, 480)])
def test_slower_at_equal_load_is_caught(factor, within):
    start = DAY + 700
    _, events = run(pt.device_trace(5, DAY + 700 + 2 * within, slow_from=start, factor=factor))
    raised = [(i, t) for i, t in events if t.state == "raised"]
    assert raised and raised[0][1].kind == "self", events
    assert start <= raised[0][0] <= start + within, raised[0][0] - start
    assert "slower than its own normal at this load" in raised[0][1].summary


def test_the_same_latency_at_a_lower_load_is_a_fault():
    det, _ = run(pt.device_trace(6, DAY))
    # the latency of the busiest hour, at a fifth of its load
    busy_ms = pt.curve_ms(2000)
    events = []
    for i in range(60):
        events += det.observe([pt.window("sda", DAY + i, 400, busy_ms * 1.6)])
    assert [t.kind for t in events if t.state == "raised"] == ["self"]


def test_an_idle_disk_never_alerts_whatever_its_await():
    det = PassiveDetector()
    events = []
    for i in range(2000):
        # 1 I/O a second: 15 per window, fewer than min_ios; await wild, as idle flash shows
        events += det.observe([pt.window("nvme0n1", i, 1.0, 50.0 if i % 3 else 0.01, queue=0.0, util=0.1)])
    assert events == []
    assert det.views()[0].slowdown_ratio == {}


def test_learning_is_frozen_while_flagged_and_the_alert_clears_on_recovery():
    start = DAY + 500
    det, events = run(pt.device_trace(7, start + 600, slow_from=start, factor=4.0))
    assert any(t.state == "raised" for _, t in events)
    learned = det.views()[0].learned_windows["read"]
    det2, more = run(pt.device_trace(7, 400, slow_from=0, factor=4.0), det)
    assert det.views()[0].learned_windows["read"] == learned
    # back to normal: cleared
    _, back = run(pt.device_trace(8, 600), det)
    assert [t.state for _, t in back] == ["cleared"]


def test_curves_survive_a_restart_and_judge_at_once():
    det, _ = run(pt.device_trace(9, DAY))
    state = json.loads(json.dumps({"|".join(k): v for k, v in det.curves_state().items()}))
    restored = PassiveDetector(curves={tuple(k.split("|")): v for k, v in state.items()})
    _, events = run(pt.device_trace(10, 100, slow_from=0, factor=4.0), restored)
    raised = [i for i, t in events if t.state == "raised"]
    assert raised and raised[0] <= 60   # no warm-up after a restart: the curve was kept


def test_the_slow_member_of_an_array_is_named_and_its_peers_not():
    members = ("sda", "sdb", "sdc", "sdd")
    _, events = run(pt.peer_trace(11, 1200, slow={2: 3.0}, slow_from=600), groups=[members])
    raised = [t for _, t in events if t.state == "raised"]
    assert [(t.kind, t.device) for t in raised if t.kind == "peers"] == [("peers", "sdc")]
    t = next(t for t in raised if t.kind == "peers")
    assert t.evidence["peers"] == ("sda", "sdb", "sdd") and t.evidence["ratio"] >= 2


def test_of_three_alike_disks_with_one_idle_the_slow_one_of_the_two_busy_is_named_as_in_a_pair():
    """Two busy disks and an idle third of the same model: the third gives no median, so the pair's rule
    judges the two (the group's 40-window patience held the slow one back past a test's 150 s in CI)."""
    p = PassiveParams()
    idle = Window("sdc", 0, 15.0, {"read": Flow(0.0, 0.0, 0.0)}, 0.0, 0.0)

    def batches():
        for i, batch in enumerate(pt.peer_trace(13, 200, members=2, slow={1: 6.0}, slow_from=100)):
            yield batch + [dataclasses.replace(idle, end=batch[0].end)]

    _, events = run(batches(), groups=[("sda", "sdb", "sdc")])
    raised = [(i, t) for i, t in events if t.state == "raised" and t.kind == "peers"]
    assert [t.device for _, t in raised] == ["sdb"], raised
    assert raised[0][0] < 100 + p.severe_windows + 3, raised[0][0] - 100
    assert raised[0][1].evidence["peers"] == ("sda", "sdc")


def test_every_member_slowing_together_is_said_to_be_the_array_not_a_member():
    members = ("sda", "sdb", "sdc", "sdd")
    slow = {m: 4.0 for m in range(4)}
    _, events = run(pt.peer_trace(12, DAY + 300, slow=slow, slow_from=DAY), groups=[members])
    kinds = {(t.kind, t.state) for _, t in events}
    assert ("peers", "raised") not in kinds
    # three or more members: one finding for the group, after most of an hour (a change of workload that moves
    # them together for less long raises nothing: test_passive_evidence.py)
    together = [(i, t) for i, t in events if t.state == "raised" and t.kind == "self"]
    assert {t.device for _, t in together} == set(members)
    assert all("slowed together" in t.summary and t.evidence["rule"] == "together" for _, t in together)
    assert all(DAY + 170 <= i <= DAY + 250 for i, _ in together), [i - DAY for i, _ in together]


def test_a_group_slow_together_clears_within_minutes_of_recovering_not_when_its_hour_has_drained():
    """The group's finding is over when its members are back: the last clear_run_windows (3 min) all off the
    slow mark clear it, where waiting for the hour's ring to fall under a quarter slow took 45 minutes."""
    p = PassiveParams()
    members = ("sda", "sdb", "sdc", "sdd")
    end = DAY + 300
    _, events = run(pt.peer_trace(12, DAY + 600, shift=(DAY, end, 4.0)), groups=[members])
    raised = [i for i, t in events if t.kind == "self" and t.state == "raised"]
    cleared = [(i, t) for i, t in events if t.kind == "self" and t.state == "cleared"]
    assert len(raised) == len(members) and len(cleared) == len(members), [(i, t.state) for i, t in events]
    assert all(end <= i <= end + p.clear_run_windows + 2 for i, _ in cleared), [i - end for i, _ in cleared]
    assert all("back on its normal" in t.summary for _, t in cleared)
    # and a relapse needs a whole hour of windows again: none raised in the 300 windows after
    assert not [i for i in raised if i > end]


def test_a_volume_held_flat_at_a_ceiling_with_a_queue_is_at_its_limit():
    det = PassiveDetector()
    events = []
    # first it shows what it can do: 8,000 IOPS in a window (a backup at full speed)
    events += det.observe([pt.window("nvme1n1", -1, 8000, 1.0, queue=8.0, util=100.0)])
    for i in range(10):
        iops = 2000 * (1 + 0.01 * (-1) ** i)
        events += det.observe([pt.window("nvme1n1", i, iops, 12.0, queue=24.0, util=100.0)])
    raised = [t for t in events if t.state == "raised"]
    assert [t.kind for t in raised] == ["saturation"]
    assert "at its limit: 2,000 IOPS (25% of the 8,000 IOPS it has delivered), queue 24, await 12 ms" \
        in raised[0].summary
    assert det.views()[0].ceiling == "2,000 IOPS"


def test_iowardens_own_probe_held_flat_by_its_queue_depth_is_not_a_ceiling_but_shows_the_best():
    """The week lane's warm-up: profiles back to back on one device, fio at a fixed depth, flat
    for 30 s: VolumeAtLimit raised on the daemon's own probes. Such windows neither start nor end a ceiling,
    and still show what the device delivers."""
    det = PassiveDetector()
    events = []
    for i in range(12):
        w = pt.window("sdb", i, 2000 * (1 + 0.01 * (-1) ** i), 12.0, queue=24.0, util=100.0)
        events += det.observe([dataclasses.replace(w, own_probe=True)])
    assert [t for t in events if t.state == "raised"] == []
    # a real workload held at 2,000 IOPS is a ceiling, a probe window in the middle neither ends nor delays it
    det = PassiveDetector()
    events = det.observe([dataclasses.replace(pt.window("sdb", -1, 8000, 1.0, queue=8.0, util=100.0), own_probe=True)])
    for i in range(7):
        w = pt.window("sdb", i, 2000 * (1 + 0.01 * (-1) ** i), 12.0, queue=24.0, util=100.0)
        events += det.observe([dataclasses.replace(w, own_probe=(i == 3))])
    (raised,) = [t for t in events if t.state == "raised"]
    assert "IOPS (25% of the 8,000 IOPS it has delivered)" in raised.summary, raised.summary
    assert len(events) == 1 and det.devices["sdb"].flagged


def test_what_a_volume_has_shown_is_its_rate_at_full_util_and_at_one_request_size():
    """A probe busy for a second of a five-second window showed its full speed, not the window's average;
    a backup of 1 MiB requests is compared with what 1 MiB requests got, not with 4 KiB IOPS."""
    det = PassiveDetector()
    events = det.observe([pt.window("sdb", -1, 10000, 0.5, queue=6.0, util=20.0)])   # the probe's window
    for i in range(10):
        events += det.observe([pt.window("sdb", i, 2000 * (1 + 0.01 * (-1) ** i), 12.0, queue=24.0, util=100.0)])
    (raised,) = [t for t in events if t.state == "raised"]
    assert "2,000 IOPS (4% of the 50,000 IOPS it has delivered)" in raised.summary, raised.summary
    det = PassiveDetector()
    events = det.observe([pt.window("sdb", -1, 10000, 0.5, queue=6.0, util=20.0)])
    for i in range(20):   # the backup: 500 requests of 1 MiB a second, flat, queued, at full util
        w = pt.window("sdb", i, 500 * (1 + 0.01 * (-1) ** i), 30.0, queue=16.0, util=100.0)
        w = dataclasses.replace(w, flows={"read": dataclasses.replace(w.flows["read"],
                                                                      kib_per_second=w.flows["read"].iops * 1024)})
        events += det.observe([w])
    assert [t for t in events if t.state == "raised"] == []


def test_a_healthy_volume_at_full_speed_is_busy_not_at_a_limit():
    """A backup or a compaction at the device's own best: flat, queued, and not a page."""
    det = PassiveDetector()
    events = []
    for i in range(30):
        iops = 8000 * (1 + 0.01 * (-1) ** i)
        events += det.observe([pt.window("nvme1n1", i, iops, 3.0, queue=24.0, util=100.0)])
    assert [t for t in events if t.state == "raised"] == []
    # its characterized saturation is its best too: 8,000 against 8,400 measured is full speed
    det = PassiveDetector()
    det.capability = {"nvme1n1": (8400.0, None)}
    events = []
    for i in range(30):
        events += det.observe([pt.window("nvme1n1", i, 8000 * (1 + 0.01 * (-1) ** i), 3.0, queue=24.0, util=100.0)])
    assert [t for t in events if t.state == "raised"] == []


def test_a_compaction_writing_at_full_speed_is_not_held_below_a_backups_reads():
    """The soak: 1 MiB reads of a backup at 8,000 IOPS, then a compaction's 1 MiB writes flat at
    2,100, the most the device writes: "at its limit: 26% of the 8,038 IOPS it has delivered" compared
    writes with reads. Each direction is compared with itself."""
    def one_mib(w, direction):
        f = w.flows["read"]
        return dataclasses.replace(w, flows={direction: dataclasses.replace(f, kib_per_second=f.iops * 1024)})
    det = PassiveDetector()
    events = []
    for i in range(10):   # the backup
        events += det.observe([one_mib(pt.window("sdb", i, 8000 * (1 + 0.01 * (-1) ** i), 2.0, queue=8.0,
                                                 util=100.0), "read")])
    for i in range(10, 40):   # the compaction
        events += det.observe([one_mib(pt.window("sdb", i, 2100 * (1 + 0.01 * (-1) ** i), 7.5, queue=16.0,
                                                 util=100.0), "write")])
    assert [t for t in events if t.state == "raised"] == []


def test_an_array_held_back_by_one_member_names_the_member_not_the_array():
    """RAID0 of four with one member throttled (what the lab measured): the member is slow against its
    peers and at its limit; the array is flat at a quarter of its pace with a queue. Only the member
    is a finding; an array limit raised before the member's verdict clears, naming the member."""
    members = ("vdb", "vdc", "vdd", "vde")
    det = PassiveDetector()
    events = []
    for i in range(40):
        throttled = i >= 4
        batch = [pt.window("md0", i, 120 * (1 + 0.01 * (-1) ** i) if throttled else 400,
                           35.0 if throttled else 1.2, queue=3.9 if throttled else 0.5,
                           util=100.0 if throttled else 40.0)]
        for m in members:
            slow = throttled and m == "vdd"
            batch.append(pt.window(m, i, 30 * (1 + 0.01 * (-1) ** i) if slow else 100, 125.0 if slow else 0.7,
                                   queue=3.8 if slow else 0.1, util=100.0 if slow else 8.0 if throttled else 40.0))
        events += det.observe(batch, [members], {"md0": members})
    raised = {(t.kind, t.device) for t in events if t.state == "raised"}
    assert ("peers", "vdd") in raised
    assert not [r for r in raised if r[1] != "vdd"], raised
    view = {v.device: v for v in det.views()}
    assert view["md0"].flagged == () and view["md0"].ceiling is None
    assert view["vdd"].peer_ratio > 4 and view["vdb"].peer_ratio < 1.5

    # the array's limit seen first (its members not yet judged), then the member's verdict
    det = PassiveDetector()
    # what they delivered before the throttle: the array 400 IOPS, each member 100
    events = det.observe([pt.window("md0", -1, 400, 1.2, queue=0.5, util=40.0)]
                         + [pt.window(m, -1, 100, 0.7, queue=0.1, util=40.0) for m in members], [members],
                         {"md0": members})
    for i in range(30):
        batch = [pt.window("md0", i, 120 * (1 + 0.01 * (-1) ** i), 35.0, queue=3.9, util=100.0)]
        if i >= 10:
            batch += [pt.window(m, i, 30 if m == "vdd" else 100, 125.0 if m == "vdd" else 0.7,
                                queue=3.8 if m == "vdd" else 0.1, util=100.0 if m == "vdd" else 8.0) for m in members]
        events += det.observe(batch, [members], {"md0": members})
    md0 = [t for t in events if t.device == "md0"]
    assert [(t.kind, t.state) for t in md0] == [("saturation", "raised"), ("saturation", "cleared")]
    assert "held back by its member vdd" in md0[1].summary


def test_a_steady_rate_without_a_queue_is_not_a_limit():
    det = PassiveDetector()
    events = []
    for i in range(20):   # an application's own steady rate: flat, but the device keeps up
        events += det.observe([pt.window("sdb", i, 2000, 0.4, queue=0.8, util=60.0)])
    assert events == []


def test_bursty_demand_under_a_busy_device_is_not_a_ceiling():
    det = PassiveDetector()
    events = []
    for i in range(30):
        iops = 2000 if i % 3 else 500
        events += det.observe([pt.window("sdb", i, iops, 3.0, queue=6.0, util=95.0)])
    assert [t for t in events if t.kind == "saturation"] == []


# -- replay ---------------------------------------------------------------------------------------

def _lines(objs):
    return "\n".join(json.dumps(o) for o in objs)


def test_replay_errors_name_the_line_and_the_key():
    with pytest.raises(ParseError, match=r"f.jsonl:2: 'r_await' must be a finite number"):
        parse_lines("f.jsonl", _lines([{"timestamp": 1, "disk_device": "sda", "r/s": 5},
                                       {"timestamp": 2, "disk_device": "sda", "r_await": "NaN"}]))
    with pytest.raises(ParseError, match=r"f.jsonl:2: timestamp 1 of sda is not after"):
        parse_lines("f.jsonl", _lines([{"timestamp": 1, "disk_device": "sda"}, {"timestamp": 1, "disk_device": "sda"}]))
    with pytest.raises(ParseError, match=r"f.jsonl:1: 'disk_device'"):
        parse_lines("f.jsonl", '{"timestamp": 1}')
    with pytest.raises(ParseError, match=r"f.jsonl:1: not a JSON object"):
        parse_lines("f.jsonl", "{oops")


def test_replay_a_missing_key_is_unknown_not_zero():
    # bytes only (no r/s), and no write figures at all: the read direction is judged on KiB/s
    lines = parse_lines("f", _lines([{"timestamp": 15 * i, "disk_device": "sda", "rkB/s": 4000, "r_await": 0.5}
                                     for i in range(1, 4)]))
    (_, batch), *_ = windows_of(lines, 15)
    w = batch[0]
    assert set(w.flows) == {"read"} and w.flows["read"].iops is None and w.flows["read"].kib_per_second == 4000
    assert w.queue_size is None and w.util_percent is None


def test_replay_pools_short_intervals_into_windows_weighted_by_ios():
    objs = [{"timestamp": t, "disk_device": "sda", "r/s": rate, "r_await": ms}
            for t, rate, ms in [(1, 10, 1.0), (2, 100, 1.0), (3, 100, 1.0), (4, 10, 10.0), (5, 100, 1.0),
                                (6, 100, 1.0)]]
    batches = windows_of(parse_lines("f", _lines(objs)), 3)
    w = batches[0][1][0]
    assert w.seconds == pytest.approx(3) and w.flows["read"].iops == pytest.approx(70)
    # 1 s at 10 IOPS waiting 10 ms among 200 I/Os waiting 1 ms
    assert batches[1][1][0].flows["read"].await_ms == pytest.approx((10 * 10 + 200 * 1) / 210)


def test_replay_finds_the_slow_device_of_a_file_whatever_its_gaps():
    objs = []
    for day in range(2):
        base = 1.7e9 + day * 86400
        for i in range(800):   # evening hours only: gaps of a day between blocks
            for m in range(4):
                ms = 0.5 * (3.0 if m == 1 and day == 1 else 1.0) * (1 + 0.1 * ((i * 7 + m) % 5 - 2) / 2)
                objs.append({"timestamp": base + 15 * i, "disk_device": f"d{m}", "r/s": 300, "r_await": ms,
                             "model": "X"})
    intervals = replay_passive(parse_lines("f", _lines(objs)))
    # three times its peers, and three times its own normal of the first evening: both say so
    assert {(i["device"], i["kind"]) for i in intervals} == {("d1", "peers"), ("d1", "self")}
    assert all(i["start"] >= 1.7e9 + 86400 and i["end"] is None for i in intervals)


def test_flows_without_enough_ios_are_no_evidence():
    p = PassiveParams()
    assert not Flow(1.0, 4.0, 3.0).is_evidence(15, p)
    assert Flow(3.0, 12.0, 3.0).is_evidence(15, p)
    assert not Flow(None, 10.0, 3.0).is_evidence(15, p) and Flow(None, 100.0, 3.0).is_evidence(15, p)
    assert Window("x", 0, 15, {}).flows == {}


# -- the daemon's part: peers from the device view, windows from counters, verdicts to Health ------

def test_peer_groups_are_array_members_else_disks_of_one_model_and_size(tree):
    from iowarden.daemon.passive.part import peer_groups
    from iowarden.probes import blockqueue
    devices = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    groups = peer_groups(devices)
    md = {name: d for name, d in devices.items() if d.md is not None}
    for name, d in md.items():
        members = tuple(sorted({devices[m.name].parent or m.name for m in d.md.members}))
        assert members in groups, (name, members, groups)   # partitions resolved to their disks
    assert all(len(g) >= 2 for g in groups)


def published(reading_fn, devices_fn=dict, own_probes_fn=dict):
    """What the part reads each window, the core's snapshot, built here from a sampler's reading, a device
    view and when probes last ran."""
    from types import MappingProxyType

    from iowarden.daemon.snapshot import Snapshot
    return lambda: Snapshot(0.0, "test", disk_reading=reading_fn(), devices=MappingProxyType(dict(devices_fn())),
                            own_probes=MappingProxyType(dict(own_probes_fn())))


class FakeSampler:
    """What the sampler publishes: one frozen reading, replaced whole (set here through last_sample)."""
    reading = None

    @property
    def last_sample(self):
        return self.reading.sample

    @last_sample.setter
    def last_sample(self, s):
        from types import MappingProxyType

        from iowarden.daemon.sources.sampler import SamplerReading
        self.reading = SamplerReading(s, MappingProxyType({}), frozenset(s.counters), None)


def sdz_sample(t: float, reads: int, read_ms: int):
    """sdz's counters at t: a queue of 24 kept all the while (what a volume held at a limit shows)."""
    from iowarden.probes import diskstats
    c = diskstats.DiskCounters(8, 0, "sdz", reads=reads, sectors_read=reads * 8, read_ms=read_ms,
                               io_ms=int(t * 1000 * 0.99), weighted_io_ms=int(t * 24000))
    return diskstats.DiskSample(t, {"sdz": c})


def held_at_a_limit(windows: int = 14):
    """sdz window by window, as a 15 s part steps: 8,000 IOPS in its first window, then held at 2,000 with a
    queue of 24 waiting 12 ms. Yields (window index, its sample)."""
    reads = read_ms = 0
    for i in range(windows):
        yield i, sdz_sample(15.0 * i, reads, read_ms)
        n = 120000 if i == 0 else 30000
        reads += n
        read_ms += n * (1 if i == 0 else 12)


def test_the_part_turns_counters_into_windows_and_verdicts_into_alerts(tmp_path):
    from iowarden.daemon.verdicts.detect import DetectorParams
    from iowarden.daemon.core.effects import StoredHealth, health_from
    from iowarden.daemon.core.core import Core
    from iowarden.daemon.core.state import State
    from iowarden.daemon.passive.part import PassiveWatch

    st = State(str(tmp_path / "s.db"))
    health = health_from(st, DetectorParams())
    core = Core(st, health, "test")   # the part posts, the core applies (here at once, on this thread)
    sampler = FakeSampler()
    part = PassiveWatch(PassiveParams(window_seconds=15), published(lambda: sampler.reading), st,
                        lambda e: core.run_batch([e]))
    for _, sampler.last_sample in held_at_a_limit():
        part.step()
    (alert,) = st.alerts(open_only=True)
    assert alert["alert"] == "VolumeAtLimit" and alert["identity"] == "kernel:sdz" and alert["target"] == "sdz"
    assert "sdz is at its limit: 2,000 IOPS" in alert["causes"][0]
    ((name, ident, view),) = part.views
    assert (name, ident, view.ceiling, view.flagged) == ("sdz", "kernel:sdz", "2,000 IOPS", ("saturation",))
    # the curve and the view are in the database for `status` and the next start
    saved = {(m.split(":")[0]) for i, p, m, _, _ in st.load_baselines() if p == "passive"}
    assert saved == {"curve", "view"}
    st.close()


def test_the_part_takes_the_cores_word_for_which_devices_its_own_probes_ran_on(tmp_path):
    """ProbeStarted to the core, the snapshot's own_probes to the part: the same flat, queued windows as
    above while a probe of ours runs on sdz raise nothing; six after its end (ProbeFinished) do."""
    from iowarden.daemon.events import ProbeFinished, ProbeStarted
    from iowarden.daemon.verdicts.detect import DetectorParams
    from iowarden.daemon.core.effects import StoredHealth, health_from
    from iowarden.daemon.core.core import Core
    from iowarden.daemon.core.state import State
    from iowarden.daemon.passive.part import PassiveWatch
    from iowarden.probes.fio_run import ProbeResult
    sample = sdz_sample

    st = State(str(tmp_path / "s.db"))
    now = [0.0]   # the sampler's clock and the core's: one monotonic clock in the daemon
    core = Core(st, health_from(st, DetectorParams()), "test", clock=lambda: now[0])
    sampler = FakeSampler()
    part = PassiveWatch(PassiveParams(window_seconds=15), published(
        lambda: sampler.reading, own_probes_fn=lambda: core.snapshot.own_probes), st, lambda e: core.run_batch([e]))
    core.run_batch([ProbeStarted("vol", "randread-4k", "sdz")])
    reads = read_ms = 0
    for i in range(15):
        now[0] = 15.0 * i
        if i == 7:
            r = ProbeResult("vol", str(tmp_path), "sdz", "randread-4k", True, None, time.time(), 1.0)
            core.run_batch([ProbeFinished(r, ("sdz",), False)])
        sampler.last_sample = sample(15.0 * i, reads, read_ms)
        part.step()
        if i == 7:
            assert st.alerts(open_only=True) == []   # six windows held flat while the probe ran: nothing
        n = 120000 if i == 0 else 30000
        reads += n
        read_ms += n * (1 if i == 0 else 12)
    (alert,) = st.alerts(open_only=True)
    assert alert["alert"] == "VolumeAtLimit" and "sdz is at its limit: 2,000 IOPS" in alert["causes"][0]
    st.close()


def test_the_devices_a_probe_ran_on_include_every_device_under_its_volume(tmp_path):
    """A probe of a volume on loop4, whose file sits on loop5's file system (the soak's stacked volumes),
    and of an LV over two disks: the devices under them carried the probe too (the week lane raised
    VolumeAtLimit on lower loop devices during the warm-up's probes)."""
    from iowarden.daemon.passive.part import own_probed
    from iowarden.probes import blockqueue

    def dev(name, major, minor, kind="disk", slaves=(), backing=None):
        return blockqueue.BlockDevice(name, major, minor, kind, 1 << 30, None, slaves, (), None,
                                      loop_backing_devno=backing)

    devices = {"loop4": dev("loop4", 7, 4, "loop", backing="7:5"), "loop5": dev("loop5", 7, 5, "loop"),
               "dm-0": dev("dm-0", 253, 0, "dm", slaves=("sdb", "sdc")), "sdb": dev("sdb", 8, 16),
               "sdc": dev("sdc", 8, 32), "sdd": dev("sdd", 8, 48)}
    probed = {"loop4": 100.0, "dm-0": float("inf"), "sdd": 50.0}
    assert own_probed(90.0, devices, probed) == {"loop4", "loop5", "dm-0", "sdb", "sdc"}   # sdd's ended before


def test_a_disk_newer_than_the_device_view_waits_for_its_identity(tmp_path):
    """Hot-added, a disk is in /proc/diskstats before udev has named it: it is not judged (nor its curve
    saved) under `kernel:sdd` meanwhile, and once the view has it, it is judged under its WWN."""
    import dataclasses

    from iowarden.daemon.core.core import Core
    from iowarden.daemon.core.state import State
    from iowarden.daemon.passive.part import PassiveWatch
    from iowarden.daemon.verdicts.detect import DetectorParams
    from iowarden.daemon.core.effects import StoredHealth, health_from
    from iowarden.probes import blockqueue, diskstats


    def disk(name, identity):
        return blockqueue.BlockDevice(name, 8, 0, "disk", 1 << 30, None, (), (), None, identity=identity)

    def sample(t, n):
        return diskstats.DiskSample(t, {name: diskstats.DiskCounters(8, i, name, reads=n, sectors_read=n * 8,
                                                                     read_ms=n // 2, io_ms=int(t * 100))
                                        for i, name in enumerate(("sdc", "sdd"))})

    view = {"sdc": disk("sdc", "wwn:0xc")}
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st, DetectorParams()), "test")
    sampler = FakeSampler()
    part = PassiveWatch(PassiveParams(window_seconds=15), published(lambda: sampler.reading, lambda: view), st,
                        lambda e: core.run_batch([e]))
    for i in range(4):
        sampler.last_sample = sample(15.0 * i, 3000 * i)
        part.step()
    assert {ident for _, ident, _ in part.views} == {"wwn:0xc"}
    view = {**view, "sdd": dataclasses.replace(disk("sdd", "wwn:0xd"))}   # udev has named it
    for i in range(4, 8):
        sampler.last_sample = sample(15.0 * i, 3000 * i)
        part.step()
    core.run_batch([part.final_event()])
    assert {ident for _, ident, _ in part.views} == {"wwn:0xc", "wwn:0xd"}
    assert not [i for i, *_ in st.load_baselines() if i.startswith("kernel:")]
    st.close()


def test_status_shows_every_disk_as_the_passive_detector_judged_it():
    from iowarden.daemon.commands.status import render_passive
    from iowarden.daemon.commands.tables import table
    text = render_passive([
        {"device": "sdb", "identity": "wwn:1", "at": 1.7e9, "slowdown_ratio": {"read": 1.1},
         "expected_await_ms": {"read": 0.25}, "learned_windows": {"read": 900}, "peer_ratio": 1.02,
         "ceiling": None, "flagged": []},
        {"device": "nvme1n1", "identity": "serial:v", "at": 1.7e9, "slowdown_ratio": {},
         "expected_await_ms": {}, "learned_windows": {"read": 4}, "peer_ratio": None,
         "ceiling": "2,000 IOPS", "flagged": ["saturation"]}], table)
    assert "1.10x of 250 µs" in text or "1.10x of 250 us" in text, text
    assert "at its limit (2,000 IOPS)" in text and "learning (4 windows)" in text


def test_the_ceiling_is_set_beside_the_characterized_capability_and_load_is_measured_against_it():
    det = PassiveDetector()
    det.capability = {"nvme1n1": (8100.0, None)}
    events = []
    for i in range(8):
        events += det.observe([pt.window("nvme1n1", i, 2000 * (1 + 0.01 * (-1) ** i), 12.0, queue=24.0,
                                         util=100.0)])
    (raised,) = [t for t in events if t.state == "raised"]
    assert "at its limit: 2,000 IOPS (its characterized saturation: 8,100 IOPS)" in raised.summary
    (view,) = det.views()
    assert view.capability == (8100.0, None) and view.load_ratio["iops"] == pytest.approx(2000 / 8100, rel=0.02)


def test_an_acute_alert_clears_when_the_fault_ends_on_a_host_busier_than_it_learned():
    """The device learned its normal, then ran 1.3x it in health (a busier host: below
    a shift, nothing raised), then was throttled (acute: raised). Once the throttle is gone the hour's median
    is 1.3x; the acute alert clears on the last ten minutes and what would raise a shift, not on 1.2x."""
    busy = DAY + 240
    det, events = run(itertools.chain(pt.device_trace(21, DAY), _scaled(pt.device_trace(22, 240), 1.3, DAY)))
    assert events == [], [(i, t.state, t.summary) for i, t in events]
    _, fault = run(_scaled(pt.device_trace(23, 60), 4.0, busy), det)
    assert [t.state for _, t in fault] == ["raised"] and fault[0][1].evidence["rule"] == "acute"
    _, after = run(_scaled(pt.device_trace(24, 300), 1.3, busy + 60), det)
    assert [t.state for _, t in after] == ["cleared"], [(i, t.state, t.summary) for i, t in after]
    assert after[0][0] <= 60, f"cleared {after[0][0]} windows after the fault"


def _scaled(windows, factor: float, first: int):
    """The windows with their latency `factor` times and their numbers from `first` on."""
    for i, w in enumerate(windows):
        flows = {d: dataclasses.replace(f, await_ms=f.await_ms * factor) for d, f in w.flows.items()}
        yield dataclasses.replace(w, end=1.7e9 + (first + i) * pt.WINDOW_SECONDS, flows=flows)


@pytest.mark.parametrize("seed", [13, 14, 15])
def test_a_pair_member_named_on_its_last_windows_is_not_cleared_while_they_stay_slow(seed):
    """The lab's flap: SlowMember raised on the last windows (severe) cleared two seconds later on
    the whole run's median, still below the clear ratio because the slowdown was new, then raised again. A
    verdict raised on the recent windows clears on them: one episode while the member stays slow."""
    p = PassiveParams()
    trace = list(pt.peer_trace(seed, 400, members=2, slow={1: 5.0}, slow_from=100))
    trace += list(pt.peer_trace(seed + 100, 200, members=2))        # the fault mended
    _, events = run(trace, groups=[("sda", "sdb")])
    peers = [(i, t.state) for i, t in events if t.kind == "peers"]
    assert peers and peers[0][1] == "raised" and peers[0][0] < 100 + p.severe_windows + 5, peers
    assert [s for _, s in peers] == ["raised", "cleared"], peers   # one episode
    # cleared once the member is mended, within its last windows (before: held for the two hours' median)
    assert 400 <= peers[1][0] <= 400 + p.severe_windows, peers


def test_the_views_status_shows_are_saved_every_minute_the_curves_every_five(tmp_path):
    """`status`'s passive "as of" lagged the verdict by 3-5 minutes: the views were saved with the curves."""
    from iowarden.daemon.core.state import State
    from iowarden.daemon.passive.part import SAVE_EVERY_WINDOWS, VIEWS_SAVE_EVERY_WINDOWS, PassiveWatch
    from iowarden.probes import diskstats

    st, posted, sampler = State(str(tmp_path / "s.db")), [], FakeSampler()
    part = PassiveWatch(PassiveParams(window_seconds=15), published(lambda: sampler.reading), st, posted.append)
    reads = 0
    for i in range(SAVE_EVERY_WINDOWS + 1):   # a quiet disk at 200 IOPS and 1 ms: no verdict to save at once
        sampler.last_sample = diskstats.DiskSample(15.0 * i, {"sdz": diskstats.DiskCounters(
            8, 0, "sdz", reads=reads, sectors_read=reads * 8, read_ms=reads, io_ms=int(15.0 * i * 200),
            weighted_io_ms=reads)})
        part.step()
        reads += 3000
    kinds = [sorted({m.split(":")[0] for _, m, _ in e.saves}) for e in posted]
    assert all(not e.transitions for e in posted)
    views_at = [n for n, k in enumerate(kinds, 1) if k == ["view"]]
    full_at = [n for n, k in enumerate(kinds, 1) if "curve" in k]
    assert views_at and all(b - a == VIEWS_SAVE_EVERY_WINDOWS for a, b in zip(views_at, views_at[1:])), kinds
    assert full_at == [SAVE_EVERY_WINDOWS], kinds
    st.close()


def test_an_array_stays_held_while_its_members_verdict_blinks_and_is_judged_again_after_the_hold():
    """The lab (RAID0 of four, one member throttled, the array's deep probe loading every member at once): the
    member's verdict cleared for a window and the array's own DeviceSlow was raised in that gap. The array is
    held for MEMBER_HOLD_SECONDS after its member was last flagged; an array still slow after that is its own."""
    from iowarden.daemon.passive.groups import MEMBER_HOLD_SECONDS
    members = ("vdb", "vdc", "vdd", "vde")
    det = PassiveDetector()
    events = []
    learn, slow_for, after = 200, 60, 100
    for i in range(learn + slow_for + after):
        throttled, member_slow = i >= learn, learn <= i < learn + slow_for
        j = 1 + 0.02 * ((i * 7) % 5 - 2)
        batch = [pt.window("md0", i, (120 if throttled else 400) * j, 35.0 if throttled else 1.2,
                           queue=3.9 if throttled else 0.5, util=100.0 if throttled else 40.0)]
        for m in members:
            slow = member_slow and m == "vdd"
            batch.append(pt.window(m, i, (30 if slow else 100) * j, 125.0 if slow else 0.7 * j,
                                   queue=3.8 if slow else 0.1, util=100.0 if slow else 8.0 if throttled else 40.0))
        events += [(batch[0].end, t) for t in det.observe(batch, [members], {"md0": members})]
    cleared = next(at for at, t in events if (t.kind, t.device, t.state) == ("peers", "vdd", "cleared"))
    on_array = [(at, t.kind) for at, t in events if t.device == "md0" and t.state == "raised"]
    # held from the member's last flagged window (the one before its clear), for the hold; then judged
    assert on_array and all(at >= cleared - pt.WINDOW_SECONDS + MEMBER_HOLD_SECONDS for at, _ in on_array), \
        (cleared, on_array)


def test_a_busy_volume_whose_throughput_looked_flat_for_a_few_windows_is_not_held_at_a_limit_for_long():
    """A database at its daily peak: the device at 100 % util with a queue of 4, its throughput +-10 % window to
    window. Six windows in a row can fall within 5 % by chance; the raise that followed stayed open while the
    volume stayed busy, long past the shipped rule's 10 minutes. It now ends at the first window well past the
    ceiling; a volume truly held at one stays raised."""
    rng = random.Random(7)
    det = PassiveDetector()
    det.observe([pt.window("sdx", -1, 6000, 1.0, queue=6.0, util=100.0)])   # what it has shown it can do
    for i in range(60):   # the night: its unqueued normal, 0.5 ms
        det.observe([pt.window("sdx", i - 100, 400 * math.exp(rng.gauss(0, 0.1)), 0.5, util=20.0)])
    opened, longest = None, 0
    for i in range(4 * 240):   # four hours of 15 s windows
        iops = 3000 * math.exp(rng.gauss(0, 0.1))
        for t in det.observe([pt.window("sdx", i, iops, 1.3, queue=4.0, util=100.0)]):
            if t.kind == "saturation" and t.state == "raised":
                opened = i
            elif t.kind == "saturation" and t.state == "cleared":
                longest, opened = max(longest, i - opened), None
    longest = max(longest, 0 if opened is None else 4 * 240 - opened)
    assert longest < 40, f"held at a limit for {longest} windows in a row"   # the rule's `for: 10m`
    held = PassiveDetector()
    held.observe([pt.window("sdy", -1, 6000, 1.0, queue=6.0, util=100.0)])
    for i in range(60):   # its unqueued normal: what a queue costs is judged against it
        held.observe([pt.window("sdy", i - 100, 400 * math.exp(rng.gauss(0, 0.1)), 0.5, util=20.0)])
    states = [t.state for i in range(240) for t in held.observe(
        [pt.window("sdy", i, 2000 * (1 + 0.01 * rng.uniform(-1, 1)), 12.0, queue=24.0, util=100.0)])]
    assert states == ["raised"]   # a cgroup throttle's 2,000 IOPS: raised once, held for the hour
    # its demand dipping below the cap now and then (a quiet minute of the database): still held, not flapping
    states = [t.state for i in range(240, 480) for t in held.observe(
        [pt.window("sdy", i, 2000 * (rng.uniform(0.6, 0.9) if i % 10 == 0 else 1 + 0.01 * rng.uniform(-1, 1)),
                   12.0, queue=24.0, util=100.0)])]
    assert states == [], states


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_an_acute_alert_clears_within_minutes_of_the_faults_end_and_a_relapse_is_raised_afresh(seed):
    """Throttled to a quarter for 20 minutes: DeviceSlow. Once the throttle is lifted the alert clears when the
    last clear_run_windows windows (3 min at 15 s) are all off the slow mark, not when the ring of 40 has
    emptied (7.5 min): the fault's end is paged resolved within minutes. The fault's windows then count for
    nothing: the same fault again is raised on a ring of its own windows, never at once."""
    p = PassiveParams()
    det, events = run(pt.device_trace(seed, DAY))
    assert events == []
    _, fault = run(_scaled(pt.device_trace(seed + 100, 80), 4.0, DAY), det)
    assert [t.state for _, t in fault] == ["raised"]
    _, after = run(_scaled(pt.device_trace(seed + 200, 60), 1.0, DAY + 80), det)
    assert [t.state for _, t in after] == ["cleared"], [(i, t.state) for i, t in after]
    assert p.clear_run_windows - 1 <= after[0][0] <= p.clear_run_windows + 2, after[0][0]
    _, again = run(_scaled(pt.device_trace(seed + 300, 60), 4.0, DAY + 140), det)
    assert [t.state for _, t in again] == ["raised"]
    assert again[0][0] >= p.raise_fraction * p.self_windows - 1, again[0][0]


def test_a_fault_that_comes_and_goes_is_not_cleared_by_its_quiet_spells():
    """Slow in two windows of every four: never three quiet minutes in a row, and half the ring slow, so the
    alert stays open."""
    det, _ = run(pt.device_trace(41, DAY))
    _, fault = run(_scaled(pt.device_trace(141, 60), 4.0, DAY), det)
    assert [t.state for _, t in fault] == ["raised"]
    blinking = itertools.chain.from_iterable(
        itertools.chain(_scaled(pt.device_trace(200 + i, 2), 1.0, DAY + 60 + 4 * i),
                        _scaled(pt.device_trace(300 + i, 2), 4.0, DAY + 62 + 4 * i)) for i in range(15))
    _, during = run(blinking, det)
    assert during == [], [(i, t.state) for i, t in during]


def _db_and_backup(i: int, backup_iops: float | None, write_ms: float) -> Window:
    """A database's 4k reads and writes, and (backup_iops) a backup's 1 MiB reads filling the device."""
    rng = random.Random(i)
    reads = Flow(300 * rng.uniform(0.9, 1.1), 1200.0, 0.1 * rng.uniform(0.85, 1.15))
    if backup_iops:
        reads = Flow(reads.iops + backup_iops, reads.kib_per_second + backup_iops * 1024, 5.0 * rng.uniform(0.9, 1.1))
    writes = Flow(120 * rng.uniform(0.9, 1.1), 480.0, write_ms * rng.uniform(0.85, 1.15))
    return Window("loop6", 1.7e9 + i * pt.WINDOW_SECONDS, pt.WINDOW_SECONDS, {"read": reads, "write": writes},
                  queue_size=8.0 if backup_iops else 0.05, util_percent=100.0 if backup_iops else 6.0)


@pytest.mark.parametrize("backup_iops", [1500.0, 300.0])
def test_writes_behind_a_backup_are_the_backups_and_the_same_writes_without_one_are_the_devices(backup_iops):
    """A soak's false page: a backup's large reads beside a database's writes on one volume, in one cgroup, the
    writes at 3.8 ms for 0.05 (73x), and DeviceSlow saying "the device itself". A direction at many times its usual
    bytes floods the device, at full speed or not: nothing is judged behind it. Once the backup has ended, the same
    slow writes at the database's usual load are the device's own: that pages, within the acute rule's span."""
    det = PassiveDetector()
    events = []
    i = 0

    def observe(w):
        # the tracer counts per cgroup on the device, and everything runs in one cgroup (a v1 host's root): the
        # service rule names no culprit, and the device's rule for other work is set aside for it
        return det.observe_services({"loop6": {}}, w.seconds, w.end, None) + det.observe([w])
    for _ in range(480):         # two hours of the database
        events += observe(_db_and_backup(i, None, 0.05))
        i += 1
    for _ in range(60):          # the backup under way, a quarter of an hour
        events += observe(_db_and_backup(i, backup_iops, 3.8))
        i += 1
    assert [t for t in events if t.state == "raised"] == [], [t.summary for t in events]
    assert det.views()[0].expected_await_ms.get("write", 0.0) < 0.1   # the flood was not learned as the normal
    for _ in range(60):          # the backup is over; the writes stay slow: the device
        events += observe(_db_and_backup(i, None, 3.8))
        i += 1
    raised = [(j, t) for j, t in enumerate(events) if t.state == "raised"]
    assert [t.kind for _, t in raised] == ["self"] and "writes" in raised[0][1].summary, raised


@pytest.mark.parametrize("window_seconds", [5.0, 15.0, 60.0])
def test_a_directions_usual_bytes_are_known_after_the_same_minutes_at_any_window_length(window_seconds):
    """[passive] window_seconds changes how many windows make five minutes, not the five minutes: a direction's
    usual bytes are known (and a backup beside it is a flood) after five minutes of windows, whatever their length,
    and not before."""
    from iowarden.daemon.passive.detector import FLOOD_LEARN_SECONDS, _flood_of
    from iowarden.daemon.passive.values import DeviceTrack
    d = DeviceTrack()
    quiet = {"read": Flow(300.0, 1200.0, 0.1), "write": Flow(120.0, 480.0, 0.05)}
    backup = {"read": Flow(1800.0, 1200.0 + 1500 * 1024, 5.0), "write": quiet["write"]}

    def window(i, flows):
        return Window("loop6", 1.7e9 + i * window_seconds, window_seconds, flows)
    learned = round(FLOOD_LEARN_SECONDS / window_seconds)
    for i in range(learned - 1):
        _flood_of(d, window(i, quiet), 8.0, window_seconds)
    assert _flood_of(d, window(learned, backup), 8.0, window_seconds) is None    # not yet known: no flood
    _flood_of(d, window(learned + 1, quiet), 8.0, window_seconds)
    assert _flood_of(d, window(learned + 2, backup), 8.0, window_seconds) == "read"


def _writes_of(i: int, rng: random.Random, iops: float, kib_each: float, ms: float) -> Window:
    """A database's 4 KiB reads on their curve, and writes at `iops` of `kib_each` KiB taking `ms`."""
    load = pt.load_at(i, rng)
    reads = Flow(load, load * 4, pt.noisy(pt.curve_ms(load), rng))
    writes = Flow(iops, iops * kib_each, ms * math.exp(rng.gauss(0, 0.1)))
    return Window("loop8", 1.7e9 + i * pt.WINDOW_SECONDS, pt.WINDOW_SECONDS, {"read": reads, "write": writes})


@pytest.mark.parametrize("kib_each, pages", [(512.0, False), (4.0, True)])
def test_a_few_big_writes_are_judged_on_nobodys_curve_and_as_few_small_ones_as_slow_are_the_devices(kib_each, pages):
    """A soak's false page on a healthy lower device: "writes 81.7x slower … 48.561 ms where 0.595 ms normal at 13
    IOPS". Played here: a curve that knew 13-40 writes a second of 4 KiB, then 13 a second of half a MiB each, at
    6.5 MiB/s, under the flood mark (8x the usual bytes). Latency at a load in IOPS compares only at one request
    size: the big writes are not judged (nor learned). The same 13 writes a second at 4 KiB, as slow, are the
    device's own and page within the acute rule's span."""
    rng, det, events = random.Random(11), PassiveDetector(), []
    for i in range(960):                         # four hours of the database, writes at 13-40 a second of 4 KiB
        events += det.observe([_writes_of(i, rng, rng.uniform(13, 40), 4.0, 0.6)])
    assert events == [], [t.summary for t in events]
    for i in range(960, 1040):                   # twenty minutes of 13 writes a second taking 48 ms
        events += det.observe([_writes_of(i, rng, 13.0, kib_each, 48.0)])
    raised = [t for t in events if t.state == "raised"]
    if pages:
        assert [t.kind for t in raised] == ["self"] and "writes" in raised[0].summary, [t.summary for t in raised]
    else:
        assert raised == [], [t.summary for t in raised]
        assert det.views()[0].expected_await_ms.get("write", 0.0) < 1.0   # not learned as the normal
