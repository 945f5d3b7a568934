"""A fake host's /proc and /sys for the daemon's readers (Roots.under): N whole disks of one model and size
(one peer group, the passive detector's costliest case), a /proc/diskstats whose counters move every
second as a steady workload would move them, and optionally M mounted XFS filesystems for [[discover]].
Nothing of the real machine is touched: the tree lives in a directory of the caller's."""
from __future__ import annotations

import os
import random
import shutil
import threading
from pathlib import Path


def disk_name(i: int) -> str:
    """sda .. sdz, sdaa .. : as the kernel names SCSI disks."""
    letters, n = "", i
    while True:
        letters = chr(ord("a") + n % 26) + letters
        n = n // 26 - 1
        if n < 0:
            return "sd" + letters


def dev_numbers(i: int) -> tuple[int, int]:
    """A fake disk's major:minor, the same in sysfs and diskstats (majors from 1000: no real driver's)."""
    return 1000 + i // 256, i % 256


def make_tree(base: str | Path, disks: int, mounts: int = 0) -> list[str]:
    """Lay the tree out under base (proc/, sys/, dev/, run/, etc/); returns the disks' names."""
    base = Path(base)
    names = [disk_name(i) for i in range(disks)]
    for sub in ("proc/pressure", "sys/block", "dev", "run", "etc"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy("/proc/stat", base / "proc" / "stat")
    if os.path.exists("/proc/pressure/io"):
        shutil.copy("/proc/pressure/io", base / "proc" / "pressure" / "io")
    for i, name in enumerate(names):
        d = base / "sys" / "block" / name
        (d / "queue").mkdir(parents=True)
        (d / "device").mkdir()
        (d / "dev").write_text(f"{dev_numbers(i)[0]}:{dev_numbers(i)[1]}\n")
        (d / "size").write_text("7814037168\n")
        (d / "device" / "model").write_text("ST4000NM0035-1V4\n")
        (d / "device" / "wwid").write_text(f"naa.5000c500{i:08x}\n")
        for attr, value in (("scheduler", "none [mq-deadline] kyber bfq"), ("rotational", "1"),
                            ("nr_requests", "256"), ("read_ahead_kb", "128"), ("max_sectors_kb", "1280"),
                            ("write_cache", "write back"), ("wbt_lat_usec", "75000"), ("nomerges", "0"),
                            ("rq_affinity", "1"), ("logical_block_size", "512"), ("physical_block_size", "4096")):
            (d / "queue" / attr).write_text(value + "\n")
    lines = ["/dev/root / ext4 rw,relatime 0 0"]
    for m in range(mounts):   # real directories (discovery stats them), listed as XFS mounts of the fake disks
        mnt = base / "srv" / f"vol{m}"
        mnt.mkdir(parents=True)
        lines.append(f"/dev/{names[m % len(names)]} {mnt} xfs rw,noatime 0 0")
    (base / "proc" / "mounts").write_text("\n".join(lines) + "\n")
    (base / "proc" / "self").mkdir(exist_ok=True)
    (base / "proc" / "self" / "mounts").write_text("\n".join(lines) + "\n")
    return names


class MovingDiskstats:
    """Rewrites base/proc/diskstats every second: each disk doing ~100 reads and ~50 writes a second with
    a few milliseconds of await, as a busy JBOD does (the daemon's rates and passive detector see traffic)."""

    def __init__(self, base: str | Path, names: list[str], seed: int = 1):
        self.path = Path(base) / "proc" / "diskstats"
        self.names = names
        self.rng = random.Random(seed)
        self.counts = {n: [0] * 17 for n in names}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._write()

    def _write(self) -> None:
        out = []
        for i, n in enumerate(self.names):
            c = self.counts[n]
            major, minor = dev_numbers(i)
            out.append(f"{major:4d} {minor:7d} {n} " + " ".join(str(v) for v in c))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("\n".join(out) + "\n")
        os.replace(tmp, self.path)

    def _tick(self) -> None:
        for c in self.counts.values():
            reads, writes = self.rng.randint(80, 120), self.rng.randint(40, 60)
            c[0] += reads
            c[2] += reads * 8
            c[3] += reads * self.rng.randint(3, 6)
            c[4] += writes
            c[6] += writes * 16
            c[7] += writes * self.rng.randint(2, 4)
            c[9] += self.rng.randint(300, 500)
            c[10] += reads * 5 + writes * 3

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            self._tick()
            self._write()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)

