"""The core: events in, in order, on one thread; one immutable snapshot out per batch. No root, a fake clock.

The parts around it are the real ones where they are pure (Health, State, the scheduler's budget and
topology over the fixture tree); what parts read of the machine comes in as the events they post
(rates from a captured /proc/diskstats, the device view of the md/LVM fixture tree, an XFS report
from captured xfs_db output). The last test scrapes what the core published and diffs it with a
golden file.

    IOWARDEN_REGENERATE_GOLDEN=1 python -m pytest tests/unit/test_core.py   # after a deliberate change
"""
import dataclasses
import difflib
import logging
import os
import random
import re
import time
from types import MappingProxyType, SimpleNamespace

import pytest

from iowarden.daemon.core.core import Core
from iowarden.daemon.events import (DevicesRead, DisksSampled, InfluxCounted, PartsChecked, PassiveJudged,
                                         ProbeFinished, ProbesCounted, SettingsRead, TargetsChanged, XfsRead,
                                         frozen_map)
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.core.effects import StoredHealth, health_from
from iowarden.daemon.passive.values import Transition
from iowarden.daemon.registry import PartStats, Registry
from iowarden.daemon.core.state import State
from iowarden.probes import blockqueue, cpupower, diskstats, fio, xfs
from iowarden.probes.common import Roots
from iowarden.probes.fio_run import ProbeResult
from tests.conftest import FIXTURES
from tests.unit.test_exporter import scrape
from tests.unit.test_policy import Clock, FakeRun, _cfg, _target

GOLDEN = FIXTURES / "golden" / "scrape-core.prom"
REPORT = fio.parse((FIXTURES / "fio" / "fio-3.33-randrw-json+.json").read_text())


def _result(i: int, read_iops: float, ok: bool = True, target: str = "db", device: str = "dm-0") -> ProbeResult:
    d = REPORT.directions
    rep = dataclasses.replace(REPORT, directions={**d, "read": dataclasses.replace(d["read"], iops=read_iops)})
    return ProbeResult(target, f"/srv/{target}", device, "rr", ok, None if ok else "fio exited with 1",
                       1.7e9 + 60 * i, 2.1, rep if ok else None)


def _with_scheduler(devices: dict, name: str, scheduler: str) -> dict:
    d = devices[name]
    return {**devices, name: dataclasses.replace(d, queue=dataclasses.replace(d.queue, scheduler=scheduler))}


@pytest.fixture
def parts(tree, tmp_path):
    roots = tree("storage-md-dm.tree")
    devices = blockqueue.read_sysfs_and_superblocks(roots)
    ds = diskstats.parse((FIXTURES / "diskstats" / "linux-4.14-14-fields.txt").read_text())
    later = {n: c._replace(reads=c.reads + 500, sectors_read=c.sectors_read + 8000,
                                    read_ms=c.read_ms + 250, io_ms=c.io_ms + 400,
                                    weighted_io_ms=c.weighted_io_ms + 900) for n, c in ds.items()}
    last = diskstats.DiskSample(1.0, later)
    rates = MappingProxyType(diskstats.rates_between(diskstats.DiskSample(0.0, ds), last))
    report = xfs.XfsReport("/srv", "/dev/dm-0", xfs.parse_frag((FIXTURES / "xfs" / "xfs_db-frag-fragmented.txt")
                                                               .read_text()),
                           xfs.parse_freesp((FIXTURES / "xfs" / "xfs_spaceman-freesp.txt").read_text()),
                           "xfs_spaceman", None, ())
    cfg = _cfg(_target("db", 300.0) + _target("logs", 300.0))
    clock = Clock()
    state = State(str(tmp_path / "state.db"))
    scheduler = FakeRun(cfg, Roots(), SimpleNamespace(), post=None, rng=random.Random(0), clock=clock,
                        devices=lambda: devices, device_of={"db": "dm-0", "logs": "md1"})
    for t in cfg.targets:
        scheduler.physical_disks(t)   # what the scheduler found when it last looked
    scheduler.budget.record(("sdb", "sdc"), time.time(), 2.0, 1 << 20)   # dm-0's disks
    power = cpupower.read_power_settings(tree("cpu-bare-metal.tree"), run_tuned_adm_verify=False)
    registry = Registry(clock)
    health = health_from(state, DetectorParams(warmup_probes=6))

    def new_core():
        core = Core(state, health, "0.1.0", clock=clock)
        # what the parts would have posted by the time the first probe ends: the targets, two settings
        # polls (sdb's scheduler changed in between: one drift), a sample, an XFS report
        core.run_batch([TargetsChanged(cfg.targets),
                        SettingsRead(DevicesRead(MappingProxyType(_with_scheduler(devices, "sdb", "none")), 0.0),
                                     power),
                        SettingsRead(DevicesRead(MappingProxyType(devices), 1.0), power),
                        DisksSampled(last, rates, None, 1.7e9), XfsRead(MappingProxyType({"/srv": (report, 1.7e9)})),
                        # the parts' own counters, as the scheduler and the supervisor post them
                        ProbesCounted(frozen_map(scheduler.skipped()), frozen_map(scheduler.budget_view())),
                        PartsChecked(frozen_map(registry.stats()))])
        return core

    yield SimpleNamespace(state=state, health=health, devices=devices, scheduler=scheduler, clock=clock,
                          new_core=new_core, power=power)
    state.close()


def test_a_result_is_stored_judged_and_published_in_one_new_snapshot(parts):
    core = parts.new_core()
    core.publish()
    first, (v1, _) = core.snapshot, core.published
    core.run_batch([ProbeFinished(_result(0, 38000.0))])
    snap, (v2, _) = core.snapshot, core.published
    assert v2 == v1 + 1 and snap is not first and first.probes == ()   # the old snapshot is left as it was
    (view,) = snap.probes
    ident = parts.devices["dm-0"].identity
    assert (view.target, view.profile, view.volume, view.last_success_timestamp) == ("db", "rr", ident, 1.7e9 + 2.1)
    assert [r["read_iops"] for r in parts.state.probe_results()] == [38000.0]
    assert core.last_result.iops("read") == 38000.0
    assert snap.drift_total == {("sdb", parts.devices["sdb"].identity, "scheduler"): 1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.probes = ()


def test_results_in_order_raise_an_alert_whose_causes_the_core_gathers(parts):
    core = parts.new_core()
    core.run_batch([ProbeFinished(_result(i, 38000.0 * (1 + 0.01 * (i % 3)))) for i in range(12)])
    assert core.snapshot.alerts == ()
    # sdb's scheduler drifts again after the baseline was learned: a settings poll says so
    core.run_batch([SettingsRead(DevicesRead(MappingProxyType(_with_scheduler(parts.devices, "sdb", "bfq")), 2.0),
                                 parts.power)])
    # one batch, many results: applied in the order posted, one snapshot for the lot
    core.run_batch([ProbeFinished(_result(i, 9000.0)) for i in range(12, 20)])
    (alert,) = core.snapshot.alerts
    assert alert.alert == "VolumeDegraded" and alert.target == "db"
    (stored,) = parts.state.alerts(open_only=True)
    # the core's evidence: drift on a member of the target's stack (dm-0 -> md0 -> sdb1 + sdc1), the XFS report
    assert any("scheduler" in c and "sdb" in c for c in stored["causes"]), stored["causes"]


def test_a_dropped_target_leaves_the_snapshot_and_a_passive_verdict_opens_an_alert(parts):
    core = parts.new_core()
    core.run_batch([ProbeFinished(_result(0, 38000.0)), ProbeFinished(_result(0, 1000.0, target="logs"))])
    assert {v.target for v in core.snapshot.probes} == {"db", "logs"}
    assert {k[0] for k in core.snapshot.probe_latency} == {"db", "logs"}
    dbt = [t for t in _cfg(_target("db", 300.0)).targets]
    core.run_batch([TargetsChanged(tuple(dbt), (("logs", "target dropped: no longer mounted"),))])
    assert {v.target for v in core.snapshot.probes} == {"db"}
    assert {k[0] for k in core.snapshot.probe_latency} == {"db"}   # its histogram goes with it
    t = Transition("self", "serial:Z1", "raised", "warning", "sdb is 3.1x slower than its own normal at this load",
                   {"ratio": 3.1})
    core.run_batch([PassiveJudged(((t, "sdb"),))])
    assert [(a.alert, a.volume) for a in core.snapshot.alerts] == [("DeviceSlow", "serial:Z1")]


def test_a_passive_alert_on_a_device_no_target_uses_says_where_its_xfs_is_mounted(parts):
    """(c) of the page: a peer group's slow member need not be probed, and its page still names the mount point
    (from the XFS reports, which know each mount's kernel device); a device with no mount says none."""
    core = parts.new_core()
    report = xfs.XfsReport("/srv/b", "/dev/loop3", None, None, None, None, (), kernel_name="loop3")
    core.run_batch([XfsRead(MappingProxyType({"/srv/b": (report, 1.7e9)}))])
    slow = Transition("peers", "fs-uuid:b", "raised", "warning", "loop3 is 5.0x slower than its peers loop1",
                      {"ratio": 5.0})
    bare = Transition("self", "serial:Z9", "raised", "warning", "sdz is 3.1x slower than its own normal",
                      {"ratio": 3.1})
    core.run_batch([PassiveJudged(((slow, "loop3"), (bare, "sdz")))])
    where = {a["identity"]: a["evidence"]["where"] for a in parts.state.alerts(open_only=True)}
    assert where["fs-uuid:b"] == {"mountpoint": "/srv/b", "devices": ["loop3"]}
    assert where["serial:Z9"] == {"mountpoint": None, "devices": ["sdz"]}
    assert {a.volume: a.mountpoint for a in core.snapshot.alerts} == {"fs-uuid:b": "/srv/b", "serial:Z9": None}


def test_a_bad_event_is_logged_and_the_next_one_is_handled(parts, caplog):
    core = parts.new_core()
    with caplog.at_level(logging.ERROR, logger="iowarden"):
        core.run_batch([object(), ProbeFinished(_result(0, 38000.0))])
    assert "core: handling object failed" in caplog.text
    assert len(core.snapshot.probes) == 1 and core.events_total == 7 + 2   # after the fixture's seven


def test_a_snapshot_that_cannot_be_built_leaves_the_last_one_and_the_core_running(parts, caplog):
    core = parts.new_core()
    core.run_batch([ProbeFinished(_result(0, 38000.0))])
    last, (version, _) = core.snapshot, core.published
    stats = parts.state.stats
    parts.state.stats = lambda: 1 / 0
    with caplog.at_level(logging.ERROR, logger="iowarden"):
        core.run_batch([_sampled()])
    assert "building the snapshot failed" in caplog.text
    assert core.snapshot is last and core.published[0] == version
    parts.state.stats = stats
    core.run_batch([_sampled()])
    assert core.published[0] == version + 1


def _sampled():
    return DisksSampled(diskstats.DiskSample(2.0, {}), MappingProxyType({}), None, 1.7e9 + 2)


def test_the_supervising_tick_takes_the_operators_requests_with_no_sample(parts):
    """Requests are taken on the runtime's own tick (PartsChecked, every second), not on the sampler's: a
    sampler that stopped must not stop an operator's ack or baseline reset."""
    core = parts.new_core()
    parts.health.pins["db"] = "wwn:old"
    assert parts.health.pin_refusal("db", "wwn:new") is not None
    parts.state.request_baseline("reset", "db", None)
    core.run_batch([_sampled()])
    assert parts.health.pin_refusal("db", "wwn:new") is not None   # a sample is no tick
    core.run_batch([PartsChecked(MappingProxyType({}))])
    assert parts.health.pin_refusal("db", "wwn:new") is None


def test_the_thread_applies_what_was_posted_before_the_stop_and_says_when_it_is_stuck(parts):
    core = parts.new_core()
    core.start()
    for i in range(5):
        core.post(ProbeFinished(_result(i, 38000.0)))
    assert core.stop(5.0)
    assert not core._thread.is_alive()
    # the core wrote them, then closed the database on its own thread: read back from the file
    assert len(State(parts.state.path).probe_results()) == 5 and core.events_total == 7 + 5   # and the fixture's seven
    assert core.stuck_seconds() == 0.0
    parts.clock.now += 40.0   # no batch for 40 s: the watchdog is withheld past CORE_STUCK_SECONDS
    assert core.stuck_seconds() == 40.0



def test_a_handler_that_keeps_failing_is_counted_and_makes_the_core_unhealthy(parts, monkeypatch):
    """One bad event is logged and passed over; a handler that fails every time for a minute is the core failing:
    counted, in its part stats (iowarden_part_success{part="core"} 0) and withheld from the watchdog."""
    from iowarden.daemon.core import core as core_module
    core = parts.new_core()

    def broken(self, e):
        raise KeyError("no such device")
    monkeypatch.setitem(core_module.HANDLERS, DisksSampled, broken)
    for _ in range(core_module.FAILING_IN_A_ROW):
        core.run_batch([_sampled()])
        parts.clock.now += 1.0
    assert core.handler_errors_total == core_module.FAILING_IN_A_ROW
    assert core.failing() == []   # five in five seconds: not yet "keeps failing"
    parts.clock.now += core_module.FAILING_SECONDS
    core.run_batch([_sampled()])
    (failing,) = core.failing()
    assert failing.startswith("DisksSampled (6 in a row for 65 s; handling DisksSampled failed: KeyError")
    stats = core.snapshot.parts["core"]
    assert (stats.success, stats.errors_total) == (False, 6) and "DisksSampled" in stats.last_error
    # another event type handled well does not hide it; the same type handled well again ends it
    core.run_batch([ProbeFinished(_result(0, 38000.0))])
    assert core.failing() and not core.snapshot.parts["core"].success
    monkeypatch.undo()
    core.run_batch([_sampled()])
    assert core.failing() == [] and core.snapshot.parts["core"].success


def _stable(text: str) -> str:
    text = re.sub(r'python="[^"]*"', 'python="X"', text)
    text = re.sub(r"^(iowarden_snapshot_timestamp_seconds) .*$", r"\1 0", text, flags=re.M)
    text = re.sub(r"^(iowarden_settings_drift_last_timestamp_seconds\{.*\}) .*$", r"\1 0", text, flags=re.M)
    text = re.sub(r"^(iowarden_part_last_success_timestamp_seconds\{.*\}) .*$", r"\1 0", text, flags=re.M)
    return re.sub(r"^(iowarden_scrape_collector_duration_seconds\{[^}]*\}) .*$", r"\1 0", text, flags=re.M)


def test_the_scrape_of_what_the_core_published_matches_the_golden_file(parts):
    core = parts.new_core()
    core.run_batch([ProbeFinished(_result(i, 38000.0 * (1 + 0.01 * (i % 3)))) for i in range(12)]
                   + [ProbeFinished(_result(12, 0.0, ok=False, target="logs", device="md1"))])
    got = _stable(scrape(core.snapshot))
    if os.environ.get("IOWARDEN_REGENERATE_GOLDEN"):
        GOLDEN.write_text(got)
    want = GOLDEN.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "scrape"))
    assert got == want, "the exposition changed (IOWARDEN_REGENERATE_GOLDEN=1 to accept):\n" + diff[:6000]
    # absent means absent: no sample of InfluxDB or the passive detector (both off), no baseline for `logs`
    samples = [line for line in got.splitlines() if not line.startswith("#")]
    assert not [line for line in samples if line.startswith(("iowarden_influxdb_", "iowarden_passive_"))]
    assert [line for line in samples if line.startswith("iowarden_baseline_iops{")]
    assert [line for line in samples if line.startswith("iowarden_probe_success{") and 'target="logs"' in line
            and line.endswith(" 0.0")]


def test_the_core_keeps_counters_only_of_the_disk_a_probe_runs_on_from_the_sample_before_it(tmp_path):
    """The 130 whole samples once kept (260 MiB at 4,000 disks) are now only the probed device's, from the sample
    just before ProbeStarted: a 1 s probe between two 1 Hz samples is still bracketed (the integration test
    test_passive.py::test_busy_volume_... judges contended probes by what the disk delivered)."""
    from iowarden.daemon.events import ProbeStarted
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st), "t")
    base = diskstats.parse("   7       5 loop5 100 0 800 50 0 0 0 0 0 100 50 0 0 0 0\n"
                           "   7       6 loop6 100 0 800 50 0 0 0 0 0 100 50 0 0 0 0\n")

    def sample(t, n):
        counters = {k: v._replace(reads=v.reads + n) for k, v in base.items()}
        return DisksSampled(diskstats.DiskSample(t, counters), MappingProxyType({}), None, t)
    core.run_batch([sample(999.0, 0)])
    assert len(core.known.samples) == 0                      # no probe: nothing kept
    core.run_batch([ProbeStarted("loop", "rr", "loop5"), sample(1000.0, 1000)])
    assert [set(s.counters) for _, s in core.known.samples] == [{"loop5"}, {"loop5"}]
    assert core.known.delivered("loop5", 999.2, 1000.3).reads_per_second == 1000.0
    st.close()



def test_a_drift_says_where_it_is_felt_the_xfs_over_the_device(parts):
    """The drift page lacked the mount: sdb is a member of md0 under dm-0, where /srv's XFS is."""
    core = parts.new_core()
    report = xfs.XfsReport("/srv", "/dev/dm-0", None, None, None, None, (), kernel_name="dm-0")
    core.run_batch([XfsRead(MappingProxyType({"/srv": (report, 1.7e9)})),
                    SettingsRead(DevicesRead(MappingProxyType(_with_scheduler(parts.devices, "sdb", "bfq")), 3.0),
                                 parts.power)])
    ((key, change),) = [(k, v) for k, v in core.snapshot.drift_last_change.items() if k[0] == "sdb"]
    assert change[1:] == ("bfq", "/srv"), change
    text = scrape(core.snapshot)
    assert 'mountpoint="/srv"' in text and 'setting="scheduler"' in text


def test_the_parts_counters_reach_the_snapshot_as_events_posted_when_they_moved(parts):
    """The core calls no part: the scheduler posts its skips and budgets after a step that moved them, the
    supervisor the parts' stats, the InfluxDB output its counts; the snapshot shows what was posted last."""
    core = parts.new_core()
    assert core.snapshot.budget["sdb"].device_seconds_used > 0     # the fixture's probe, as the scheduler posted it
    posted = []
    parts.scheduler.post = posted.append
    parts.scheduler.post_counters()
    parts.scheduler.post_counters()
    assert [type(e) for e in posted] == [ProbesCounted]          # the second found nothing moved
    parts.scheduler.skip("db", "busy")
    parts.scheduler.post_counters()
    assert len(posted) == 2
    core.run_batch(posted)
    assert core.snapshot.skipped_total[("db", "busy")] == 1
    core.run_batch([PartsChecked(frozen_map({"sampler": PartStats(runs_total=3)})),
                    InfluxCounted(frozen_map({"written": 5, "spooled": 0, "dropped": 0, "errors": 0,
                                              "spool_bytes": 0, "rejected": 0}))])
    snap = core.snapshot
    assert snap.parts["sampler"].runs_total == 3 and snap.parts["core"].runs_total == core.events_total
    assert snap.influx["written"] == 5


def test_a_setting_put_back_ends_its_drift_and_is_no_drift_of_its_own(parts):
    """A scheduler put back paged again for ten minutes ("bfq -> none, changed in the last ten minutes") after the
    volume had recovered. Put back to what it was before its drift, the drift is over: its series leaves /metrics
    (the rule clears) and a probe's causes no longer name it; the change is still counted and kept."""
    core = parts.new_core()    # sdb: none -> the fixture's scheduler, one drift
    key = ("sdb", parts.devices["sdb"].identity, "scheduler")
    was = parts.devices["sdb"].queue.scheduler
    core.run_batch([SettingsRead(DevicesRead(MappingProxyType(_with_scheduler(parts.devices, "sdb", "bfq")), 2.0),
                                 parts.power)])
    assert core.snapshot.drift_last_change[key][:2] == ("none", "bfq")   # one drift, from where it started
    core.run_batch([SettingsRead(DevicesRead(MappingProxyType(_with_scheduler(parts.devices, "sdb", "none")), 3.0),
                                 parts.power)])
    snap = core.snapshot
    assert key not in snap.drift_last_at and key not in snap.drift_last_change
    assert snap.drift_total[key] == 3
    assert 'iowarden_settings_drift_last_timestamp_seconds{device="sdb"' not in scrape(snap)
    core.run_batch([ProbeFinished(_result(i, 38000.0 * (1 + 0.01 * (i % 3)))) for i in range(12)])
    core.run_batch([ProbeFinished(_result(i, 9000.0)) for i in range(12, 20)])
    (stored,) = parts.state.alerts(open_only=True)
    assert not any("scheduler" in c for c in stored["causes"]), stored["causes"]
    # and a change from there is a drift again
    core.run_batch([SettingsRead(DevicesRead(MappingProxyType(_with_scheduler(parts.devices, "sdb", was)), 4.0),
                                 parts.power)])
    assert core.snapshot.drift_last_change[key][:2] == ("none", was)


def test_a_passive_verdict_names_a_setting_changed_below_its_device_instead_of_the_device(parts):
    """A scheduler changed on a member of the array under dm-0: dm-0 slower than its own curve is the setting's
    doing, not the device's; with the setting put back, the device is itself slow."""
    core = parts.new_core()    # sdb: none -> the fixture's scheduler, a moment ago
    slow = SimpleNamespace(kind="self")
    was = parts.devices["sdb"].queue.scheduler
    causes = core.passive_causes(slow, "dm-0")
    assert any(f"sdb scheduler none -> {was}" in c and "still holds" in c for c in causes), causes
    assert not any("the device itself" in c for c in causes), causes
    core.run_batch([SettingsRead(DevicesRead(MappingProxyType(_with_scheduler(parts.devices, "sdb", "none")), 2.0),
                                 parts.power)])
    causes = core.passive_causes(slow, "dm-0")
    assert any("the device itself" in c for c in causes) and not any("scheduler" in c for c in causes), causes
    assert not any("scheduler" in c for c in core.passive_causes(slow, "md1"))   # on no device under md1
