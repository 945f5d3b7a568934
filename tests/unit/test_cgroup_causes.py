"""The diagnosis in layers and who does the I/O: cgroup v1 and v2 fixture trees, no root, no clock."""
import dataclasses
import shutil

import pytest

from iowarden.daemon.sources import cgroups
from iowarden.daemon.verdicts.causes import Evidence, ProbeWindow, layer_of, likely_causes
from iowarden.probes import cgroupio
from iowarden.probes.common import ParseError, Roots
from tests.conftest import FIXTURES

V1, V2 = FIXTURES / "cgroup" / "v1", FIXTURES / "cgroup" / "v2"


def test_v2_io_stat_and_io_max_parse():
    stat = cgroupio.parse_v2_stat("8:16 rbytes=1459200 wbytes=314773504 rios=192 wios=353 dbytes=0 dios=0\n")
    assert stat == {"8:16": cgroupio.IoCounts(1459200, 314773504, 192, 353)}
    limits = cgroupio.parse_v2_max("8:16 rbps=2097152 wbps=max riops=max wiops=120\n8:0 rbps=max wbps=max "
                                   "riops=max wiops=max\n")
    assert limits == {"8:16": cgroupio.IoLimit(wiops=120, rbps=2097152)}   # 8:0: all max, no limit


@pytest.mark.parametrize("text", ["8:16 rbytes=1e9\n", "sdb rios=1\n", "8:16 rios\n", "8:16 rios=-1\n",
                                  "8:16 rios=" + "9" * 30 + "\n"])
def test_v2_values_no_kernel_writes_are_refused(text):
    with pytest.raises(ParseError):
        cgroupio.parse_v2_stat(text)


def test_v1_throttle_files_parse():
    io = cgroupio.parse_v1_stat("7:7 Read 4096\n7:7 Write 8192\n7:7 Sync 0\n7:7 Total 12288\nTotal 12288\n",
                                "7:7 Read 1\n7:7 Write 2\n7:7 Total 3\nTotal 3\n")
    assert io == {"7:7": cgroupio.IoCounts(4096, 8192, 1, 2)}
    assert cgroupio.parse_v1_limit("7:7 200\n8:0 0\n") == {"7:7": 200}   # 0: the limit removed
    with pytest.raises(ParseError):
        cgroupio.parse_v1_limit("7:7 200 300\n")


def test_v2_tree_own_io_is_each_cgroup_less_its_children():
    io = cgroupio.read(Roots.under(V2))
    assert io.version == 2 and not io.cut_short
    by = {g.path: g for g in io.groups}
    assert set(by) >= {"/", "/system.slice", "/system.slice/backup.service", "/system.slice/iowarden.service"}
    # system.slice counts 1,000,000 reads with its children's 900,000 + 100,000: none of its own
    assert by["/system.slice"].io["8:16"].rios == 0
    assert by["/system.slice/backup.service"].io["8:16"].rios == 900000
    assert by["/system.slice/iowarden.service"].limits["8:16"] == cgroupio.IoLimit(riops=200)
    assert cgroupio.own_cgroup(Roots.under(V2), 2) == "/system.slice/iowarden.service"


def test_the_walk_is_bounded():
    io = cgroupio.read(Roots.under(V2), max_cgroups=2)
    assert len(io.groups) == 2 and io.cut_short


def _view(root):
    read = cgroups.start(type("S", (), {"max_cgroups": 100})(), Roots.under(root))
    return read


def test_a_limit_on_iowardens_own_cgroup_is_named_with_its_value_and_file():
    view = _view(V2)()
    found = cgroups.limits_holding(view, {"sdb"})
    assert found == ["a cgroup I/O limit holds sdb (8:16) at 200 read IOPS (io.max rios= of "
                     "/system.slice/iowarden.service)"]
    # postgresql's write limit holds postgresql, not iowarden's probe: named only for a passive verdict
    anyone = cgroups.limits_holding(view, {"sdb"}, anyone=True)
    assert any("100.0 MiB/s write bytes/s (io.max wbps= of /system.slice/postgresql.service)" in c for c in anyone)
    assert cgroups.limits_holding(view, {"nvme0n1"}) == []


def test_v1_root_limit_is_every_process():
    view = _view(V1)()
    assert view.version == 1 and view.own_cgroup == "/"
    assert cgroups.limits_holding(view, {"loop7"}) == [
        "a cgroup I/O limit holds loop7 (7:7) at 200 read IOPS (blkio.throttle.read_iops_device of the root "
        "cgroup: every process not in a cgroup of its own)"]


def _bump(path, old, new):
    path.write_text(path.read_text().replace(old, new))


def test_who_names_the_cgroups_doing_the_io_with_rates_and_shares(tmp_path, monkeypatch):
    root = tmp_path / "v2"
    shutil.copytree(V2, root, symlinks=True)
    clock = iter([100.0, 110.0])
    monkeypatch.setattr(cgroups.time, "monotonic", lambda: next(clock))
    read = _view(root)
    first = read()
    assert first.seconds is None and cgroups.who(first, {"sdb"}) is None   # no interval yet
    cg = root / "sys" / "fs" / "cgroup" / "system.slice"
    # in 10 s: the backup read 9,000 I/Os (36.9 MB), iowarden's probes 1,000
    _bump(cg / "backup.service" / "io.stat", "rbytes=3686400000 wbytes=0 rios=900000", "rbytes=3723264000 wbytes=0 rios=909000")
    _bump(cg / "iowarden.service" / "io.stat", "rios=100000", "rios=101000")
    _bump(cg / "io.stat", "rios=1000000", "rios=1010000")
    view = read()
    assert view.seconds == 10.0
    said = cgroups.who(view, {"sdb"})
    assert said == ("I/O on sdb in the last 10 s by cgroup: /system.slice/backup.service 900 IOPS 3.5 MiB/s (90%), "
                    "/system.slice/iowarden.service (iowarden's own probes) 100 IOPS 0.0 MiB/s (10%)")
    assert cgroups.foreign_share(view, {"sdb"}) == pytest.approx(0.9)


def _evidence(**kw):
    base = dict(physical_disks=("loop7",), device="loop7", devices={}, drift=[], contended=False,
                foreign_util_percent=None)
    base.update(kw)
    return Evidence(**base)


def test_slow_probe_over_a_fast_device_is_above_the_block_layer_and_names_the_limit():
    view = _view(V1)()
    ev = _evidence(window=ProbeWindow("loop7", 0.200, 0.26, 0.8), cgroup_limits=cgroups.limits_holding(view, {"loop7"}))
    assert layer_of(ev) == "above"
    causes = likely_causes(ev)
    assert causes[0] == ("above the block layer: a cgroup I/O limit holds loop7 (7:7) at 200 read IOPS "
                         "(blkio.throttle.read_iops_device of the root cgroup: every process not in a cgroup of its "
                         "own); the probe's I/Os took 200 ms at the median while loop7 answered in 0.26 ms at 1% util")


def test_above_the_block_layer_without_a_limit_says_so_and_where_to_look():
    causes = likely_causes(_evidence(window=ProbeWindow("loop7", 0.050, 0.3, 5.0)))
    assert causes[0].startswith("above the block layer: the probe's I/Os took 50 ms at the median while loop7 answered in 0.30 ms")
    assert "no cgroup I/O limit on it applies" in causes[0]


def test_a_busy_device_is_contention_and_says_who():
    who = "I/O on loop7 in the last 5 s by cgroup: /load 2,900 IOPS 11.3 MiB/s (91%)"
    ev = _evidence(window=ProbeWindow("loop7", 0.012, 9.5, 99.0), contended=True, foreign_util_percent=93.0,
                   who=who, foreign_share=0.91)
    assert layer_of(ev) == "contention"
    assert likely_causes(ev)[0] == ("contention: the device was busy with other work during the probe (93% util "
                                    "from other I/O); " + who)


def test_a_slow_device_with_no_other_work_is_the_device_itself():
    ev = _evidence(window=ProbeWindow("loop7", 0.030, 25.0, 97.0), foreign_share=0.0)
    assert layer_of(ev) == "device"
    assert likely_causes(ev)[0] == "the device itself: loop7 took 25 ms per I/O at 97% util, 0% of its I/O from other work"


def test_without_the_devices_view_no_layer_is_claimed():
    assert layer_of(_evidence()) is None
    assert likely_causes(_evidence()) == []


def test_a_limit_on_the_device_under_a_stacked_loop_device_is_named_for_the_upper_one():
    """The v1 fixture limits loop7; loop8's image lives on loop7's file system: the limit holds loop8 too."""
    from types import SimpleNamespace
    from iowarden.daemon.core import knowledge
    from iowarden.probes.blockqueue import BlockDevice
    view = _view(V1)()
    lower = BlockDevice("loop7", 7, 7, "loop", 1 << 30, None, (), (), None)
    upper = BlockDevice("loop8", 7, 8, "loop", 1 << 29, None, (), (), None, loop_backing_devno="7:7")
    k = SimpleNamespace(sources={cgroups.SPEC.name: view}, devices={"loop7": lower, "loop8": upper})
    found = knowledge.cgroup_evidence(k, {"loop8"})["cgroup_limits"]
    assert found == ["below loop8: a cgroup I/O limit holds loop7 (7:7) at 200 read IOPS (blkio.throttle."
                     "read_iops_device of the root cgroup: every process not in a cgroup of its own)"]
    assert knowledge.cgroup_evidence(k, {"loop7"})["cgroup_limits"][0].startswith("a cgroup I/O limit holds loop7")


def test_a_contended_probe_says_who_first_and_a_devices_limits_are_one_sentence():
    """A page's text is bounded: the read and write limits of a device in one sentence, and for a probe run
    on a busy device the contention and who did it come first (the first question on call: who)."""
    from types import SimpleNamespace
    from iowarden.probes.cgroupio import IoLimit
    view = SimpleNamespace(version=1, own_cgroup="/", names={"7:3": "loop3"}, seconds=None, rates=(),
                           limits=[("/", "7:3", IoLimit(riops=2000, wiops=2000))])
    limits = cgroups.limits_holding(view, {"loop3"})
    assert limits == ["a cgroup I/O limit holds loop3 (7:3) at 2,000 read IOPS and 2,000 write IOPS "
                      "(blkio.throttle.read_iops_device, blkio.throttle.write_iops_device of the root cgroup: "
                      "every process not in a cgroup of its own)"]
    ev = _evidence(window=ProbeWindow("loop4", 0.200, 0.26, 0.8), cgroup_limits=limits, contended=True,
                   who="I/O on loop4 in the last 1 s by cgroup: /app 1,800 IOPS 7.0 MiB/s (90%)")
    causes = likely_causes(ev)
    assert causes[0].startswith("contention: the device was busy") and "by cgroup: /app" in causes[0]
    assert any("2,000 read IOPS and 2,000 write IOPS" in c for c in causes[1:])


def _stacked_v1(rates, names):
    """loop8's image lives on loop7's file system (the lab's and test_passive's stacked volume), on cgroup v1."""
    from types import MappingProxyType, SimpleNamespace
    from iowarden.daemon.core import knowledge
    from iowarden.probes.blockqueue import BlockDevice
    view = cgroups.CgroupIoView(0.0, 1.0, 1, "/", tuple(rates), (), MappingProxyType(names))
    lower = BlockDevice("loop7", 7, 7, "loop", 1 << 30, None, (), (), None)
    upper = BlockDevice("loop8", 7, 8, "loop", 1 << 29, None, (), (), None, loop_backing_devno="7:7")
    return knowledge, SimpleNamespace(sources={cgroups.SPEC.name: view}, devices={"loop7": lower, "loop8": upper})


def test_v1_who_on_a_device_it_did_not_count_is_read_below_it_once():
    """Cgroup v1 counts a device's I/O per cgroup only once a throttle rule was set on it (seen on 6.18): the
    busy upper loop device shows nobody, the limited one below it shows the workload; named there, not twice."""
    knowledge, k = _stacked_v1([cgroups.Rate("/app", "7:7", 700, 300, 700 * 4096, 300 * 4096),
                                cgroups.Rate("/", "7:7", 100, 0, 100 * 4096, 0)], {"7:7": "loop7"})
    found = knowledge.cgroup_evidence(k, {"loop8"})
    assert found["who"] == ("I/O on loop7 in the last 1 s by cgroup: /app 1,000 IOPS 3.9 MiB/s (91%), "
                            "/ (iowarden's probes and every process not in a cgroup of its own) 100 IOPS 0.4 MiB/s (9%)")
    assert found["foreign_share"] == pytest.approx(1000 / 1100) and found["who_unseen"] is None
    # counted on the device itself: that level is the one named, the one below not added to it
    knowledge, k = _stacked_v1([cgroups.Rate("/app", "7:8", 500, 0, 500 * 4096, 0),
                                cgroups.Rate("/app", "7:7", 700, 300, 700 * 4096, 300 * 4096)],
                               {"7:7": "loop7", "7:8": "loop8"})
    assert knowledge.cgroup_evidence(k, {"loop8"})["who"].startswith("I/O on loop8 in the last 1 s by cgroup: /app 500 IOPS")


def test_v1_contention_nobody_counted_says_why_no_cgroup_is_named():
    knowledge, k = _stacked_v1([], {})
    found = knowledge.cgroup_evidence(k, {"loop8"})
    assert found["who"] is None
    assert found["who_unseen"] == ("who did it is not known: cgroup v1 counts I/O per cgroup on loop8 only once a "
                                   "blkio throttle rule has been set on it (none has been)")
    ev = _evidence(device="loop8", window=ProbeWindow("loop8", 0.012, 9.5, 99.0), contended=True,
                   foreign_util_percent=95.0, **found)
    assert likely_causes(ev)[0] == ("contention: the device was busy with other work during the probe (95% util "
                                    "from other I/O); " + found["who_unseen"])


def test_a_device_that_took_no_measurable_time_is_not_said_to_take_0_us():
    """The kernel counts I/O time in whole milliseconds: 200 fast I/Os in a second can add up to none."""
    causes = likely_causes(_evidence(window=ProbeWindow("loop7", 0.200, 0.0, 0.0)))
    assert "while loop7 answered in no measurable time at 0% util" in causes[0], causes


def test_a_passive_verdict_names_only_a_limit_that_can_explain_the_devices_rate():
    """A soak's VolumeAtLimit at 4,866 IOPS read "a cgroup I/O limit holds loop1 at 100 read IOPS" of a batch job's
    cgroup: that limit holds the batch job, not the device. A limit of another cgroup is named for a passive
    verdict where it is at least half of what the device does of its kind; where the interval's rates say nothing
    of the device (the first reading; v1 before any rule), as before."""
    from types import MappingProxyType
    limits = (("/batch-938", "7:1", cgroupio.IoLimit(riops=100, wiops=100)),
              ("/db", "7:1", cgroupio.IoLimit(riops=3000)))
    rates = (cgroups.Rate("/", "7:1", 3400.0, 1466.0, 3400.0 * 4096, 1466.0 * 4096),
             cgroups.Rate("/batch-938", "7:1", 0.0, 100.0, 0.0, 409600.0))
    view = cgroups.CgroupIoView(0.0, 5.0, 1, "/iowarden", rates, limits, MappingProxyType({"7:1": "loop1"}))
    said = cgroups.limits_holding(view, {"loop1"}, anyone=True)
    assert said == ["a cgroup I/O limit holds loop1 (7:1) at 3,000 read IOPS (blkio.throttle.read_iops_device of "
                    "/db)"], said
    first = dataclasses.replace(view, seconds=None)   # no rates yet: every limit on the device, as before
    assert len(cgroups.limits_holding(first, {"loop1"}, anyone=True)) == 2
    # iowarden's own chain is named whatever the rates (its probe is held by it)
    own = dataclasses.replace(view, own_cgroup="/batch-938")
    assert any("/batch-938" in c for c in cgroups.limits_holding(own, {"loop1"}))
