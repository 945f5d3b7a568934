"""Two volumes on one disk (partitions here; LVs on one PV are the same to the daemon): a full-speed backup on
one fills the disk, and the other's probes, deferred and then run contended, are judged on what the disk
delivered in total, not on their own partition, which carried the probe alone. Judged there, the healthy
volume was paged twice in a row ("a backup raised it on three volumes at once when they shared a
backend"). Real partitions on a real loop device, real fio, the daemon confined to that disk."""
import os
import struct
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import fresh_loop_queue, require_root, run_prefix
from tests.integration.helpers import (baselines_armed, blkio_cap, config_text, end_processes, read_iops_cap, rows,
                                       wait_for)

pytestmark = [pytest.mark.root, pytest.mark.slow]

SECTOR = 512
PART_SECTORS = 560 << 11   # 560 MiB each: XFS wants 300


def _mbr(path: Path, parts: int) -> None:
    """A DOS partition table of `parts` Linux partitions, written as fdisk would (no fdisk needed)."""
    table = bytearray(SECTOR)
    for i in range(parts):
        start = 2048 + i * PART_SECTORS
        table[446 + 16 * i:462 + 16 * i] = struct.pack("<B3sB3sII", 0, bytes(3), 0x83, bytes(3), start, PART_SECTORS)
    table[510:512] = b"\x55\xaa"
    with open(path, "r+b") as f:
        f.write(table)


@contextmanager
def partitioned_disk(parts: int = 2):
    """A loop device (direct I/O: paced by the disk under its image) with `parts` XFS partitions, mounted;
    yields (disk name, [mountpoints]). Only what it made is removed, by its own names."""
    require_root()
    work = Path(tempfile.mkdtemp(prefix=run_prefix("shared")))
    image, device, mounted = work / "disk.img", None, []
    try:
        subprocess.run(["truncate", "-s", str((2048 + parts * PART_SECTORS + 2048) * SECTOR), str(image)], check=True)
        _mbr(image, parts)
        device = subprocess.run(["losetup", "--find", "--show", "--partscan", "--direct-io=on", str(image)],
                                check=True, capture_output=True, text=True).stdout.strip()
        name = os.path.basename(device)
        fresh_loop_queue(name)
        subprocess.run(["partx", "--add", device], check=False, capture_output=True)   # without udev: the nodes
        nodes = [f"{device}p{i + 1}" for i in range(parts)]
        wait_for(lambda: all(os.path.exists(n) for n in nodes), timeout=10, what="the partitions' nodes")
        for i, node in enumerate(nodes):
            subprocess.run(["mkfs.xfs", "-q", "-f", node], check=True)
            mnt = work / f"vol{i}"
            mnt.mkdir()
            subprocess.run(["mount", node, str(mnt)], check=True)
            mounted.append(mnt)
        yield name, mounted
    finally:
        still = [m for m in reversed(mounted) if not _unmount(m)]
        if device:
            subprocess.run(["losetup", "-d", device], check=False, capture_output=True)
        if not still:   # never a recursive remove into a filesystem still mounted
            subprocess.run(["rm", "-rf", str(work)], check=False)


def _unmount(mnt: Path) -> bool:
    """umount, waited for a few seconds (a process of the test's that just ended may still hold it)."""
    for _ in range(20):
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
            return True
        time.sleep(0.5)
    return False


@contextmanager
def backup(directory: Path, seconds: int):
    """A nightly backup at full speed: sequential 1 MiB reads of a file laid out first, for `seconds`."""
    lay = ["fio", "--name=backup", f"--directory={directory}", "--size=400M", "--rw=write", "--bs=1M",
           "--direct=1", "--output=/dev/null"]
    subprocess.run(lay, check=True)
    proc = subprocess.Popen(["fio", "--name=backup", f"--directory={directory}", "--size=400M", "--rw=read",
                             "--bs=1M", "--direct=1", "--ioengine=libaio", "--iodepth=8", "--time_based",
                             f"--runtime={seconds}", "--output=/dev/null"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        end_processes(proc)


def test_a_backup_filling_the_shared_disk_does_not_page_the_healthy_volume_beside_it(tmp_path, daemon_factory):
    with partitioned_disk() as (disk, (vol, neighbour)):
        state = tmp_path / "state"
        db = str(state / "state.db")
        # a probe deferred 3 s at most, then run contended: the backup's minute holds a dozen of them
        extra = ("[budget]\ndevice_time_ratio = 1.0\n[detector]\nwarmup_probes = 6\n"
                 "[scheduling]\nmax_deferral_seconds = 3.0\n")
        d = daemon_factory(config_text(vol, state, runtime=1.0, interval=2.0, extra=extra))
        try:
            _backup_beside(d, db, disk, neighbour)
        finally:
            d.close()   # before the disk's volumes are unmounted: its probes use them


def _backup_beside(d, db: str, disk: str, neighbour: Path) -> None:
    assert f'devices = ["{disk}"]' in d.cfg.read_text()   # confined to the shared disk, found from the mount
    d.wait_message("READY=1")
    wait_for(lambda: baselines_armed(db, "rr", 6), timeout=120, what="the volume's normal learned")
    with backup(neighbour, 240):
        wait_for(lambda: len(rows(db, "SELECT id FROM probe_results WHERE ok = 1 AND contended = 1")) >= 6,
                 timeout=120, what="six contended probes during the backup")
        contended = rows(db, "SELECT device, read_iops FROM probe_results WHERE ok = 1 AND contended = 1")
        alerts = rows(db, "SELECT alert, causes FROM alerts")
        assert alerts == [], f"paged for a neighbour's backup: {alerts}"
        # judged, not passed over: each contended probe's total was read on the disk the backup filled
        # (in the probe's one line of the log: "probe ... (contended): the busy disk delivered N IOPS ... on DISK, ...")
        # the log line of the probe whose row was just read can still be on its way from the daemon's output
        def said():
            lines = [line for line in d.output().splitlines() if "(contended): the busy disk delivered" in line]
            return lines if len(lines) >= len(contended) else None
        totals = wait_for(said, timeout=30, what="each contended probe's line in the log")
        assert len(totals) >= 6 and all(f" in total on {disk}, " in line for line in totals), totals[-3:]
        assert {dev for dev, _ in contended} == {f"{disk}p1"}, contended
        # the disk itself held at a limit, the backup still running: short on the disk too, and paged. The limit
        # holds its bytes as well as its requests: at 100 IOPS alone the backup's large reads still moved 23-34
        # MiB/s, which a quiet normal learned on a loaded host (the probe's 4 KiB reads) can fall under
        with read_iops_cap(_major_minor(disk), 100), blkio_cap("read_bps_device", _major_minor(disk), 2 << 20):
            causes = wait_for(lambda: rows(db, "SELECT causes FROM alerts WHERE alert = 'VolumeDegraded'"),
                              timeout=90, what="VolumeDegraded with the disk at a limit")[0][0]
    # (held above the block layer, the disk looks idle: the probe runs uncontended and its own figures page)
    assert f"a cgroup I/O limit holds {disk}" in causes and "at 100 read IOPS" in causes, causes


def _major_minor(name: str) -> str:
    return Path(f"/sys/block/{name}/dev").read_text().strip()
