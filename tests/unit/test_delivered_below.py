"""A contended probe's total, read where its contention is: the physical disk under its device. Two LVs (or
partitions) on one disk: a backup on one fills the disk, and the other's probe is deferred, then run contended.
Its own device carries the probe alone, short of the volume's quiet normal, though the disk delivers plenty:
judged there, a healthy volume paged ("a backup raised it on three volumes at once when they shared
a backend"). A backup that begins during a probe on a quiet disk makes it a contended one too. Fake counters,
no root."""
from types import MappingProxyType, SimpleNamespace

from iowarden.daemon.core.knowledge import Knowledge, delivered_in_total, other_work
from iowarden.daemon.sources import cgroups
from iowarden.probes.blockqueue import BlockDevice
from iowarden.probes.cgroupio import IoLimit
from iowarden.probes.diskstats import DiskCounters, DiskSample


def _sample(t: float, ios: dict[str, tuple[int, int]]) -> DiskSample:
    """Counters at monotonic t: device -> (reads, sectors read)."""
    return DiskSample(t, {n: DiskCounters(8, i, n, reads=r, sectors_read=s)
                          for i, (n, (r, s)) in enumerate(ios.items())})


def _probe(k: Knowledge, device: str, disks: tuple, per_second: dict[str, tuple[int, int]], seconds: int = 5):
    """The core's view of one probe: started, sampled each second, ended; counters grow by per_second."""
    k.sample, k.sample_at = _sample(0.0, {n: (0, 0) for n in per_second}), 1000.0
    k.probe_started("vol", "rr", device, disks)
    for s in range(1, seconds + 1):
        k.keep_sample(1000.0 + s, _sample(float(s), {n: (r * s, b * s) for n, (r, b) in per_second.items()}))
    return delivered_in_total(k, device, disks, 1000.0, 1000.0 + seconds)


def test_a_probe_on_one_lv_of_a_disk_a_backup_fills_is_judged_on_the_disks_total():
    k = Knowledge()
    # the probe alone on dm-1: 300 reads/s of 4 KiB; the backup on dm-2 takes the disk's other 2,000/s of 1 MiB
    iops, bw, where = _probe(k, "dm-1", ("sda",), {"dm-1": (300, 300 * 8), "dm-2": (2000, 2000 * 2048),
                                                  "sda": (2300, 300 * 8 + 2000 * 2048)})
    assert where == "sda" and iops == 2300 and bw == (300 * 8 + 2000 * 2048) * 512
    assert "dm-2" not in k.samples[-1][1].counters   # only the probe's device and its disks are kept


def test_a_disk_held_at_a_limit_is_short_on_the_disk_too():
    k = Knowledge()
    iops, bw, where = _probe(k, "sda1", ("sda",), {"sda1": (90, 720), "sda": (100, 800)})
    assert (iops, where) == (100, "sda")   # the disk's total, short of any normal above it


def test_a_whole_disk_or_a_disk_not_sampled_is_its_own_total():
    k = Knowledge()
    assert _probe(k, "loop3", ("loop3",), {"loop3": (500, 4000)})[::2] == (500, "loop3")
    k = Knowledge()
    assert _probe(k, "sda1", ("sda",), {"sda1": (500, 4000)})[::2] == (500, "sda1")


def test_an_arrays_members_are_summed():
    k = Knowledge()
    iops, _, where = _probe(k, "md0", ("vdb", "vdc"), {"md0": (400, 3200), "vdb": (700, 5600), "vdc": (700, 5600)})
    assert (iops, where) == (1400, "vdb,vdc")


def test_the_core_keeps_the_disks_from_the_probes_start_to_its_end():
    k = Knowledge()
    _probe(k, "dm-1", ("sda",), {"dm-1": (1, 8), "sda": (1, 8)})
    k.probing.pop(("vol", "rr")), k.probing_disks.pop(("vol", "rr"))
    n = len(k.samples)
    k.keep_sample(2000.0, _sample(9.0, {"dm-1": (1, 8), "sda": (1, 8)}))
    assert len(k.samples) == n   # nothing is kept while no probe runs


def _result(device: str, started_at: float, seconds: float, bytes_per_second: float):
    """A probe that read evenly at bytes_per_second for `seconds` (what other_work reads of a ProbeResult)."""
    read = SimpleNamespace(io_bytes=bytes_per_second * seconds, bw_bytes=bytes_per_second)
    return SimpleNamespace(device=device, started_at=started_at, duration_seconds=seconds, layout_bytes=0,
                           ramp_seconds=0.0, report=SimpleNamespace(directions={"read": read}))


def _seen(k: Knowledge, result, disks: tuple):
    k.moved(result, disks)
    return other_work(k, result, disks)


def test_a_backup_that_begins_during_a_probe_on_a_quiet_disk_makes_it_a_measurement_beside_other_work():
    # the disk was quiet when the probe began (not deferred, not contended); 2,000 MiB/s of backup joined it
    k = Knowledge()
    _probe(k, "loop1p1", ("loop1",), {"loop1p1": (300, 300 * 8), "loop1": (2300, 300 * 8 + 2000 * 2048)})
    beside = _seen(k, _result("loop1p1", 1000.0, 5.0, 300 * 4096), ("loop1",))
    assert beside is not None and abs(beside - 2000 * 2048 * 512) < 1


def test_a_probe_alone_or_a_mirror_writing_twice_is_not_beside_other_work():
    k = Knowledge()
    _probe(k, "loop3", ("loop3",), {"loop3": (300, 300 * 8)})
    assert _seen(k, _result("loop3", 1000.0, 5.0, 300 * 4096), ("loop3",)) is None
    k = Knowledge()   # an md mirror: each member carries the probe's bytes once, 2x in all
    _probe(k, "md0", ("vdb", "vdc"), {"md0": (300, 2400), "vdb": (300, 2400), "vdc": (300, 2400)})
    assert _seen(k, _result("md0", 1000.0, 5.0, 300 * 4096), ("vdb", "vdc")) is None
    k = Knowledge()   # a trickle of other work far under the probe's own is not a neighbour's job
    _probe(k, "sda1", ("sda",), {"sda1": (300, 2400), "sda": (310, 2480)})
    assert _seen(k, _result("sda1", 1000.0, 5.0, 300 * 4096), ("sda",)) is None


def test_iowardens_own_probe_before_it_in_the_same_seconds_is_not_other_work():
    # a 1 MiB probe at 1 GiB/s ended 0.4 s into the sampler's seconds that bracket the 4k probe after it
    k = Knowledge()
    k.own_io.append(({"loop2"}, 990.0, 1001.4, 11.4 * (1 << 30)))
    gib_sectors = int(0.4 * (1 << 30)) // 512
    k.samples.append((1001.0, _sample(1.0, {"loop2": (0, 0)})))
    k.samples.append((1002.5, _sample(2.5, {"loop2": (1000, gib_sectors + 300 * 8)})))
    probe = _result("loop2", 1001.4, 1.0, 300 * 4096)
    assert _seen(k, probe, ("loop2",)) is None
    k.own_io.clear()   # not counted, the probe before it would be other work
    assert _seen(k, probe, ("loop2",)) is not None


def _loop_over(k: Knowledge, loop: str, host_disk: str = "vda", siblings: tuple = ()) -> None:
    """Loop devices whose backing files are on a host disk (254:0): the device view the core holds."""
    def dev(name, major, minor, kind, backing=None):
        return BlockDevice(name, major, minor, kind, 1 << 30, None, (), (), None, loop_backing_devno=backing)
    view = {host_disk: dev(host_disk, 254, 0, "disk")}
    for i, name in enumerate((loop, *siblings)):
        view[name] = dev(name, 7, i, "loop", "254:0")
    k.devices = MappingProxyType(view)


def test_a_loop_volume_whose_backing_disk_is_full_of_other_work_is_measured_beside_it():
    # loop4 carries the probe alone; the disk under its file carries a backup of other volumes at 50 MiB/s
    k = Knowledge()
    _loop_over(k, "loop4")
    _probe(k, "loop4", ("loop4",), {"loop4": (300, 300 * 8), "vda": (400, 300 * 8 + 100 * 1024)})
    assert "vda" in k.samples[-1][1].counters   # the disk under the file is watched during the probe
    beside = _seen(k, _result("loop4", 1000.0, 5.0, 300 * 4096), ("loop4",))
    assert beside is not None and abs(beside - 100 * 1024 * 512) < 1
    # the same disk carrying only the probe's own bytes (its file's pages on their way down) is not
    k = Knowledge()
    _loop_over(k, "loop4")
    _probe(k, "loop4", ("loop4",), {"loop4": (300, 300 * 8), "vda": (300, 300 * 8)})
    assert _seen(k, _result("loop4", 1000.0, 5.0, 300 * 4096), ("loop4",)) is None


def test_iowardens_own_probe_on_a_sibling_loop_is_not_other_work_on_the_disk_under_both():
    k = Knowledge()
    _loop_over(k, "loop4", siblings=("loop5",))
    # a 1 MiB probe on loop5 at 50 MiB/s in the same seconds: its bytes reach vda too
    k.own_io.append(({"loop5", "vda"}, 1000.0, 1005.0, 5 * 50 * (1 << 20)))
    _probe(k, "loop4", ("loop4",), {"loop4": (300, 300 * 8), "vda": (350, 300 * 8 + 100 * 1024)})
    assert _seen(k, _result("loop4", 1000.0, 5.0, 300 * 4096), ("loop4",)) is None


def test_a_loop_volume_held_by_a_cgroup_limit_is_not_excused_by_its_backing_disks_work():
    # the week lane's fault: the loop throttled to 400 IOPS while the mix fills the disk under every file
    k = Knowledge()
    _loop_over(k, "loop4")
    k.sources[cgroups.SPEC.name] = cgroups.CgroupIoView(
        0.0, 1.0, 1, "/", (), (("/", "7:0", IoLimit(riops=400)),), MappingProxyType({"7:0": "loop4"}))
    _probe(k, "loop4", ("loop4",), {"loop4": (300, 300 * 8), "vda": (400, 300 * 8 + 100 * 1024)})
    assert _seen(k, _result("loop4", 1000.0, 5.0, 300 * 4096), ("loop4",)) is None


def test_a_short_probe_is_judged_before_the_sample_after_it_arrives():
    # the sample before it came 0.8 s ahead of its start; one more in its 1.5 s; the one after not yet in when it
    # ends. A sample kept for another device's probe just before it is not its first.
    k = Knowledge()
    k.samples.append((999.5, _sample(0.0, {"loop9": (0, 0)})))
    k.sample, k.sample_at = _sample(0.2, {"loop1": (0, 0)}), 999.2
    k.probe_started("vol", "rr", "loop1", ("loop1",))
    k.keep_sample(1000.2, _sample(1.2, {"loop1": (170, 170 * 8)}))
    iops, _, where = delivered_in_total(k, "loop1", ("loop1",), 1000.0, 1001.5)
    assert (round(iops), where) == (170, "loop1")


def test_the_total_is_never_less_than_what_the_probe_itself_did():
    """On a starved CPU the sampler's window can miss a probe of two seconds: the device read 0 I/Os in the
    probe's seconds while the probe itself got its normal 12,000 IOPS. The probe's own I/O is part of the total."""
    k = Knowledge()
    iops, bw, where = _probe(k, "loop1", ("loop1",), {"loop1": (0, 0)})
    assert (iops, bw, where) == (0, 0, "loop1")
    k = Knowledge()
    k.sample, k.sample_at = _sample(0.0, {"loop1": (0, 0)}), 1000.0
    k.probe_started("vol", "rr", "loop1", ("loop1",))
    for s in range(1, 6):
        k.keep_sample(1000.0 + s, _sample(float(s), {"loop1": (0, 0)}))
    assert delivered_in_total(k, "loop1", ("loop1",), 1000.0, 1005.0, (12_000.0, 12_000 * 4096.0)) == \
        (12_000.0, 12_000 * 4096.0, "loop1")
    # and a total above the probe's own (the other work counted) is kept as it is
    k = Knowledge()
    _probe(k, "loop1", ("loop1",), {"loop1": (3000, 3000 * 8)})
    assert delivered_in_total(k, "loop1", ("loop1",), 1000.0, 1005.0, (300.0, 300 * 4096.0))[0] == 3000
