"""Block devices from a fixture /sys: md RAID0 under LVM, RAID1 with a failed member, udev identity."""
import subprocess

from iowarden.probes import blockqueue, fs_uuid
from iowarden.probes.common import ParseError

import pytest


def test_md_dm_stack(tree):
    devs = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    assert devs["md0"].kind == "md" and devs["dm-0"].kind == "dm"
    assert devs["sdb1"].kind == "partition" and devs["sdb1"].parent == "sdb"
    assert devs["md0"].md.level == "raid0" and [m.name for m in devs["md0"].md.members] == ["sdb1", "sdc1"]
    assert devs["dm-0"].dm.name == "vg0-data" and devs["dm-0"].slaves == ("md0",)
    # a filesystem on the LV sits on both physical disks
    assert blockqueue.physical_devices("dm-0", devs) == ("sdb", "sdc")
    assert blockqueue.physical_devices("sdb1", devs) == ("sdb",)


def test_degraded_raid1_names_the_faulty_member(tree):
    md1 = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))["md1"].md
    assert md1.degraded == 1 and md1.level == "raid1"
    faulty = [m for m in md1.members if m.faulty]
    assert [m.name for m in faulty] == ["sde"] and "write_error" in faulty[0].states and faulty[0].slot == "none"


def test_queue_settings(tree):
    q = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))["sdb"].queue
    assert q.scheduler == "mq-deadline" and q.schedulers_available == ("none", "mq-deadline", "kyber", "bfq")
    assert (q.rotational, q.nr_requests, q.read_ahead_kb, q.wbt_lat_usec, q.write_cache) == (1, 256, 128, 75000,
                                                                                             "write back")
    # a partition reports its disk's queue
    assert blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))["sdb1"].queue.scheduler == "mq-deadline"


def test_identity_prefers_stable_names(tree):
    devs = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    assert devs["sdb"].identity == "wwn:0x5000c500a1b2c3d4"                  # from udev
    assert devs["sdc"].identity == "kernel:sdc"                              # nothing better: says so
    assert devs["sdd"].identity == "serial:S3Z9NB0K123456A"                  # sysfs serial, no udev
    assert devs["md0"].identity == "by-id:md-uuid-3f1c2d4e:5a6b7c8d:9e0f1a2b:3c4d5e6f"
    assert devs["dm-0"].identity.startswith("dm-uuid:LVM-")
    assert devs["sdb1"].identity == "wwn:0x5000c500a1b2c3d4-part1"


def test_identity_without_udev_uses_wwid(tree, tmp_path):
    roots = tree("storage-md-dm.tree")
    (roots.run / "udev" / "data" / "b8:16").unlink()
    assert blockqueue.read_sysfs_and_superblocks(roots)["sdb"].identity == "wwn:naa.5000c500a1b2c3d4"


@pytest.mark.parametrize("text,active", [("[none] mq-deadline", "none"), ("mq-deadline [bfq]", "bfq"),
                                         ("none", "none")])
def test_scheduler_line(text, active):
    assert blockqueue.parse_scheduler(text)[0] == active


def test_scheduler_line_garbage():
    with pytest.raises(ParseError):
        blockqueue.parse_scheduler("[none] [bfq]")
    with pytest.raises(ParseError):
        blockqueue.parse_scheduler("mq-deadline bfq")


def _fs_image(tmp_path, mkfs: list[str], size: str) -> tuple[bytes, str]:
    """The first 2 KiB of a freshly made filesystem image, and the UUID blkid reads from it."""
    img = tmp_path / f"{mkfs[0]}.img"
    subprocess.run(["truncate", "-s", size, str(img)], check=True)
    subprocess.run(mkfs + [str(img)], check=True, capture_output=True)
    uuid = subprocess.run(["blkid", "-p", "-s", "UUID", "-o", "value", str(img)], capture_output=True,
                          text=True, check=True).stdout.strip()
    return img.read_bytes()[:fs_uuid.FS_HEAD_BYTES], uuid


def test_filesystem_uuid_read_like_blkid_names_a_device_without_udev(tree, tmp_path):
    xfs_head, xfs_uuid = _fs_image(tmp_path, ["mkfs.xfs", "-q", "-f"], "320M")
    ext4_head, ext4_uuid = _fs_image(tmp_path, ["mkfs.ext4", "-q", "-F"], "16M")
    assert fs_uuid.parse_fs_uuid(xfs_head) == xfs_uuid
    assert fs_uuid.parse_fs_uuid(ext4_head) == ext4_uuid
    assert fs_uuid.parse_fs_uuid(bytes(2048)) is None and fs_uuid.parse_fs_uuid(b"XFSB") is None
    # sdc (no udev record, no serial): its partition sdc1 holds ext4, then sdc itself holds XFS
    roots = tree("storage-md-dm.tree")
    roots.dev.mkdir(parents=True, exist_ok=True)
    (roots.dev / "sdc1").write_bytes(ext4_head)
    devs = blockqueue.read_sysfs_and_superblocks(roots)
    assert (devs["sdc"].identity, devs["sdc1"].identity) == ("kernel:sdc", f"fs-uuid:{ext4_uuid}")
    (roots.dev / "sdc").write_bytes(xfs_head)
    devs = blockqueue.read_sysfs_and_superblocks(roots)
    # a whole-disk filesystem names the disk; the partition is then "its disk, partition 1"
    assert (devs["sdc"].identity, devs["sdc1"].identity) == (f"fs-uuid:{xfs_uuid}", f"fs-uuid:{xfs_uuid}-part1")
    assert devs["sdb"].identity == "wwn:0x5000c500a1b2c3d4"   # a hardware name still comes first


def test_devices_below_follow_partitions_members_and_a_loop_devices_backing_file(tree):
    devs = dict(blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree")))
    assert blockqueue.devices_below("dm-0", devs)[:1] == ("md0",)
    assert set(blockqueue.devices_below("dm-0", devs)) >= {"md0", "sdb1", "sdc1", "sdb", "sdc"}
    assert blockqueue.devices_below("sdb", devs) == ()
    # a loop device over a file on loop7's file system: loop7 is below it (the limit there holds it)
    lower = blockqueue.BlockDevice("loop7", 7, 7, "loop", 1 << 30, None, (), (), None)
    upper = blockqueue.BlockDevice("loop8", 7, 8, "loop", 1 << 29, None, (), (), None,
                                   loop_backing_file="/mnt/lower/vol.img", loop_backing_devno="7:7")
    assert blockqueue.devices_below("loop8", {"loop7": lower, "loop8": upper}) == ("loop7",)
    assert blockqueue.devices_below("loop7", {"loop7": lower, "loop8": upper}) == ()


def test_a_burst_of_uevents_reads_again_only_the_devices_it_names(tree, monkeypatch):
    """A hot-added disk re-read every device (N disks added: N x M reads). Now the names a burst
    carried, their partitions and the members under them; the rest as last read, until the next poll."""
    read = blockqueue.read_sysfs_and_superblocks
    roots = tree("storage-md-dm.tree")
    full = read(roots)
    calls = []
    real = blockqueue._device
    monkeypatch.setattr(blockqueue, "_device", lambda d, *a: calls.append(d.name) or real(d, *a))
    assert read(roots, full, {"sdb1"}) == full                       # a partition's event: its disk read again
    assert set(calls) == {"sdb"} | {n for n, d in full.items() if d.parent == "sdb"}
    # a change no event named stays as last read; the event that names it brings it
    (roots.sys / "block" / "sdc" / "queue" / "scheduler").write_text("[none] mq-deadline\n")
    assert read(roots, full, {"sdb"})["sdc"].queue.scheduler == "mq-deadline"
    assert read(roots, full, {"sdc"})["sdc"].queue.scheduler == "none"
    assert read(roots, full, {"sdc"}) == read(roots)
    # an array is read with the disks under it (their holders change with it)
    calls.clear()
    read(roots, full, {"md0"})
    assert {"md0", "sdb", "sdc"} <= set(calls) and "sde" not in calls
    # a name the last view cannot place (a new partition) is a full read; a disk gone is gone
    assert read(roots, full, {"sdz9"}) == read(roots)
    gone = dict(full)
    gone["sdq"] = full["sdc"]
    assert "sdq" not in read(roots, gone, {"sdq"})


def test_a_loop_backing_file_is_placed_by_the_mount_table_not_by_a_stat():
    """A stat of a backing file on a filesystem that stops answering (an image on NFS or FUSE) held the
    settings poller in the kernel; the mount table says the same without touching the file."""
    from iowarden.probes.mountinfo import devno_of as mount_devno_of, parse as parse_mountinfo_devnos
    text = ("22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
            "30 22 7:3 / /srv/my\\040images rw - xfs /dev/loop3 rw\n"
            "31 22 0:50 / /srv/nfs rw - nfs4 host:/x rw\n"
            "32 31 0:51 / /srv/nfs rw - fuse.hang hang rw\n")
    mounts = parse_mountinfo_devnos(text)
    assert mounts[1] == ("/srv/my images", "7:3")
    assert mount_devno_of("/srv/my images/a.img", mounts) == "7:3"
    assert mount_devno_of("/srv/nfs/b.img", mounts) == "0:51"         # the mount on top
    assert mount_devno_of("/srv/nfsx/c.img", mounts) == "254:0"       # a name that only starts alike
    assert mount_devno_of("/var/d.img", mounts) == "254:0"
