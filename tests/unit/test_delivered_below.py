"""A contended probe's total, read where its contention is: the physical disk under its device. Two LVs (or
partitions) on one disk: a backup on one fills the disk, and the other's probe is deferred, then run contended.
Its own device carries the probe alone, short of the volume's quiet normal, though the disk delivers plenty:
judged there, a healthy volume paged (issue 33: "a backup raised it on three volumes at once when they shared
a backend"). Fake counters, no root."""

from iowarden.daemon.core.knowledge import Knowledge, delivered_in_total
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
