"""A messy but healthy week of work, compressed: what the volumes of a database host carry.

Every ingredient of the week on call, on a schedule in seconds instead of hours:
- a database mix (4k random, 70 % reads) on every volume, its rate following a daily cycle of 240 s;
- a nightly backup: sequential 1 MiB reads at full speed for 60 s, every 270 s, on one volume after another;
- a compaction: sequential 1 MiB writes at full speed for 45 s, every 270 s, on another;
- writes that move from volume to volume every minute;
- fsync-heavy small writes (each 4k write followed by fsync);
- reads the page cache answers (buffered, the file stays cached);
- fstrim of every volume every 240 s.
Each is fio (or fstrim) in a session of its own, killed when the mix stops.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.integration.scenarios import Player

DAY_S = 240
CYCLE = [0.25, 0.4, 0.7, 1.0, 1.0, 0.7, 0.4, 0.25]   # the daily cycle, in eighths of a day
BACKUP_EVERY_S, BACKUP_FOR_S = 270, 60
COMPACTION_AT_S, COMPACTION_FOR_S = 80, 45
EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"
CHUNK_S = 30   # the steady ingredients run as 30 s fio runs, so each can take the cycle's rate


def fio(*args: str) -> list[str]:
    return ["fio", "--output=/dev/null", "--ioengine=libaio", "--group_reporting", *args]


def job(name: str, filename: Path, *args: str) -> list[str]:
    return [f"--name={name}", f"--filename={filename}", *args]


class Mix(Player):
    def __init__(self, mounts: list[Path], base_iops: int):
        super().__init__("soak-mix")
        self.mounts = mounts
        self.base_iops = base_iops

    def lay_out(self) -> None:
        """The files the mix reads, written before it starts (reading unwritten extents costs no I/O)."""
        for m in self.mounts:
            for name, size in (("db.dat", "128M"), ("backup.dat", "192M"), ("cache.dat", "32M")):
                subprocess.run(fio(*job("layout", m / name, "--rw=write", "--bs=1M", "--direct=1", f"--size={size}")),
                               check=True, timeout=300)

    def _spawn(self, what: str, argv: list[str]) -> None:
        self.procs = [p for p in self.procs if p.poll() is None]
        self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True))
        self.log.append(f"{time.monotonic() - self.t0:6.0f} s  {what}")

    def _run(self) -> None:
        next_chunk = next_trim = 0.0
        next_backup, next_compaction = 30.0, float(COMPACTION_AT_S)
        n = len(self.mounts)
        while not self.stopping.wait(0.5):
            t = time.monotonic() - self.t0
            if t >= next_chunk:
                k = int(t // CHUNK_S)
                rate = max(10, int(self.base_iops * CYCLE[int(t // (DAY_S / len(CYCLE))) % len(CYCLE)]))
                db = []
                for m in self.mounts:
                    db += job("db", m / "db.dat", "--rw=randrw", "--rwmixread=70", "--bs=4k", "--direct=1",
                              "--iodepth=4", f"--rate_iops={rate}", "--time_based", f"--runtime={CHUNK_S}")
                self._spawn(f"database mix at {rate} IOPS on every volume", fio(*db))
                moving = self.mounts[int(t // 60) % n]
                self._spawn(f"moving writes on {moving.name}", fio(*job(
                    "moving", moving / "moving.dat", "--rw=randwrite", "--bs=4k", "--direct=1", "--size=32M",
                    "--rate_iops=300", "--time_based", f"--runtime={CHUNK_S}")))
                self._spawn("fsync-heavy writes", fio(*job(
                    "fsync", self.mounts[-1] / "fsync.dat", "--rw=write", "--bs=4k", "--fsync=1", "--size=16M",
                    "--rate_iops=100", "--time_based", f"--runtime={CHUNK_S}")))
                self._spawn("page-cache reads", fio(*job(
                    "cache", self.mounts[0] / "cache.dat", "--rw=randread", "--bs=4k", "--invalidate=0",
                    "--rate_iops=3000", "--time_based", f"--runtime={CHUNK_S}")))
                next_chunk = (k + 1) * CHUNK_S
            if t >= next_backup:
                m = self.mounts[int(t // BACKUP_EVERY_S + 1) % n]
                self._spawn(f"backup of {m.name} at full speed", fio(*job(
                    "backup", m / "backup.dat", "--rw=read", "--bs=1M", "--direct=1", "--iodepth=8",
                    "--time_based", f"--runtime={BACKUP_FOR_S}")))
                next_backup += BACKUP_EVERY_S
            if t >= next_compaction:
                m = self.mounts[int(t // BACKUP_EVERY_S + 2) % n]
                self._spawn(f"compaction on {m.name} at full speed", fio(*job(
                    "compaction", m / "compaction.dat", "--rw=write", "--bs=1M", "--direct=1", "--iodepth=16",
                    "--size=96M", "--time_based", f"--runtime={COMPACTION_FOR_S}")))
                next_compaction += BACKUP_EVERY_S
            if t >= next_trim:
                for m in self.mounts:
                    self._spawn(f"fstrim {m.name}", ["fstrim", str(m)])
                next_trim += DAY_S


COMPRESSED = """
[scheduling]
warmup_interval_seconds = 15.0
max_deferral_seconds = 120.0
[budget]
device_time_ratio = 0.15
[passive]
window_seconds = 5.0
"""


def stacked_volumes(stack, where: Path, count: int = 4, in_ram: bool = False) -> tuple[list, list]:
    """`count` loop XFS volumes of 1 GiB, each on a loop device of its own (so a throttle of the lower device
    slows the volume below its block layer, as a provisioned cap does), mounted at where/vol0...; removed
    by the ExitStack `stack`. Returns (lowers, uppers).

    in_ram: the lower images on a tmpfs of their own (where/backing; helpers.ram_backing), not on the host's
    disk, which is every other test's too: a lab phase beside the lane stalled it for 40 s and more, and every
    volume on it with it, which is that disk's fault, not a volume's."""
    from tests.conftest import LoopXfs
    from tests.integration.helpers import ram_backing
    # each lower image is 1.5 GiB, sparse: room for every one filled, no more
    backing = ram_backing(stack, where / "backing", count * 1536 + 256) if in_ram else None
    lowers, uppers = [], []
    for i in range(count):
        lower = LoopXfs("1536M", direct_io=not in_ram, image_dir=backing)
        stack.callback(lower.close)
        upper = LoopXfs("1G", direct_io=True, image_dir=lower.mountpoint, mountpoint=where / f"vol{i}")
        stack.callback(upper.close)
        lowers.append(lower)
        uppers.append(upper)
    return lowers, uppers


def example_profiles() -> str:
    """The shipped example's [profiles.*] sections, their files made 128 MiB (the volumes are 1 GiB)."""
    text = EXAMPLE.read_text()
    sections = text[text.index("[profiles."):text.index("[[targets]]")]
    assert sections.count('size = "256MiB"') == 4, "config.example.toml's profiles changed"
    return sections.replace('size = "256MiB"', 'size = "128MiB"')


def mix_config(state_dir: Path, port: int, mounts: list[Path], devices: list[str], compressed: bool = True) -> str:
    """One daemon for the mix's volumes, with the shipped example's profiles. Compressed: probes every 60 s
    (warm-up every 15 s), 5 s passive windows and a budget to match; else the example's own schedule."""
    targets = "".join(f"""
[[targets]]
name = "{m.name}"
path = "{m}"
profiles = ["randread-4k", "randwrite-4k", "read-1m", "randread-4k-qd1"]
interval_seconds = {60.0 if compressed else 300.0}
""" for m in mounts)
    return f"""
[daemon]
state_dir = "{state_dir}"
[prometheus]
listen_address = "127.0.0.1:{port}"
[limits]
min_free_bytes = "64MiB"
timeout_margin_seconds = 10.0
{COMPRESSED if compressed else ""}[sampler]
devices = [{", ".join(f'"{d}"' for d in devices)}]
[tracer]
enabled = false
[cgroups]
interval_seconds = 1.0
{example_profiles()}{targets}"""
