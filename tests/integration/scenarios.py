"""Mixes nobody tuned to: a seeded generator of messy but healthy work on a host's volumes, and of faults.

`healthy(seed, volumes, seconds)` draws a database mix per volume (its peak rate, read share, queue depth and the
period of its daily cycle) and, over the given seconds, the other work a database host carries, each at times,
on volumes and with sizes drawn from the seed: backups (buffered and direct) and compactions at full speed,
writeback storms, a WAL appender (4k writes, each followed by fdatasync), defragmentation, trims, a batch job
in a cgroup held to a limit, host-wide CPU pressure and I/O pressure elsewhere on the host. `faults(seed, ...)`
draws faults: a throttle from a quarter to 1.3x of the volume's load, a noisy neighbour in a cgroup of its own,
host-wide contention, scheduler drift, a volume filling up, and a collapse that recovers.

Pure: the same seed gives the same scenario, printed with the report so a run can be repeated. `Runner`
(below) plays a scenario on real mounts with fio, fstrim and xfs_fsr; the soak bench (bench/soak.py) and the
CI lane use both.
"""
from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HEALTHY_KINDS = ("backup-direct", "backup-buffered", "compaction", "writeback-storm", "wal-appender", "defrag",
                 "trim", "batch-limited", "cpu-pressure", "io-pressure-elsewhere")
FAULT_KINDS = ("throttle", "noisy-neighbour", "host-contention", "scheduler-drift", "filling", "collapse")
# how often each healthy ingredient comes, on average (seconds between starts), and how long it runs
EVERY_S = {"backup-direct": 1800, "backup-buffered": 1800, "compaction": 900, "writeback-storm": 600,
           "wal-appender": 1200, "defrag": 2400, "trim": 900, "batch-limited": 1200, "cpu-pressure": 1200,
           "io-pressure-elsewhere": 1500}
LASTS_S = {"backup-direct": (60, 600), "backup-buffered": (60, 600), "compaction": (30, 240),
           "writeback-storm": (10, 60), "wal-appender": (300, 1800), "defrag": (30, 180), "trim": (1, 1),
           "batch-limited": (120, 900), "cpu-pressure": (30, 300), "io-pressure-elsewhere": (60, 600)}


@dataclass(frozen=True)
class Event:
    at_s: float
    seconds: float
    kind: str
    volume: int | None          # None: the host, not one volume
    params: dict = field(default_factory=dict)

    def said(self, when: bool = True) -> str:
        where = "the host" if self.volume is None else f"vol{self.volume}"
        extra = ", ".join(f"{k} {v}" for k, v in sorted(self.params.items()))
        return (f"{self.at_s:7.0f} s  " if when else "") + f"{self.kind} on {where} for {self.seconds:.0f} s" + (
            f" ({extra})" if extra else "")


@dataclass(frozen=True)
class DatabaseMix:
    peak_iops: int
    read_percent: int
    iodepth: int
    day_s: float                # the period of its daily cycle: from a quarter of its peak to its peak and back


@dataclass(frozen=True)
class Scenario:
    seed: int
    databases: tuple[DatabaseMix, ...]
    events: tuple[Event, ...]

    def said(self) -> list[str]:
        out = [f"scenario seed {self.seed}"]
        out += [f"  vol{i}: database mix at up to {d.peak_iops} IOPS, {d.read_percent} % reads, QD {d.iodepth}, "
                f"a day of {d.day_s:.0f} s" for i, d in enumerate(self.databases)]
        return out + ["  " + e.said() for e in self.events]


def healthy(seed: int, volumes: int, seconds: float) -> Scenario:
    rng = random.Random(seed)
    dbs = tuple(DatabaseMix(rng.choice((300, 500, 800, 1200, 1500)), rng.choice((50, 70, 80, 90)),
                            rng.choice((1, 2, 4, 8)), rng.choice((600.0, 1800.0, 3600.0, 7200.0)))
                for _ in range(volumes))
    events = []
    for kind in HEALTHY_KINDS:
        t = rng.uniform(0, EVERY_S[kind])
        while t < seconds:
            low, high = LASTS_S[kind]
            lasts = min(rng.uniform(low, high), seconds - t)
            host_wide = kind in ("cpu-pressure", "io-pressure-elsewhere")
            params = {}
            if kind == "batch-limited":
                params["limit_iops"] = rng.choice((100, 200, 400))
            if kind == "writeback-storm":
                params["mib"] = rng.choice((64, 96, 128))
            if kind == "wal-appender":
                params["fsyncs_per_second"] = rng.choice((50, 100, 300))
            if kind == "cpu-pressure":
                params["busy_cpus"] = rng.choice((1, 2))
            events.append(Event(round(t, 1), round(lasts, 1), kind, None if host_wide else rng.randrange(volumes),
                                params))
            t += rng.expovariate(1 / EVERY_S[kind])
    return Scenario(seed, dbs, tuple(sorted(events, key=lambda e: e.at_s)))


def faults(seed: int, volumes: int, kinds=FAULT_KINDS) -> tuple[Event, ...]:
    """One fault of each kind, in a seeded order, each on a seeded volume, each lasting 6-12 minutes; `at_s`
    counts from the start of the fault phase, a fault's end followed by 10 minutes to clear."""
    rng = random.Random(seed * 7919 + 1)
    out, t = [], 0.0
    for kind in rng.sample(list(kinds), len(kinds)):
        lasts = rng.uniform(360, 720)
        params = {}
        if kind == "throttle":
            params["of_load"] = rng.choice((0.25, 0.5, 0.75, 1.0, 1.3))
        if kind == "collapse":
            params["of_load"] = 0.05
            lasts = rng.uniform(180, 360)
        if kind == "scheduler-drift":
            params["scheduler"] = "bfq"
        out.append(Event(round(t, 1), round(lasts, 1), kind, None if kind == "host-contention"
                         else rng.randrange(volumes), params))
        t += lasts + 600
    return tuple(out)


def end_sessions(procs: list[subprocess.Popen]) -> None:
    """End processes started in sessions of their own, with everything in their groups (fio's job processes):
    SIGTERM, 15 s, then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()


def fio(*args: str) -> list[str]:
    return ["fio", "--output=/dev/null", "--ioengine=libaio", "--group_reporting", *args]


class Player:
    """Work played on a thread of its own, each process in a session of its own; `stop` ends the thread and
    every session. Subclasses give `_run`."""

    def __init__(self, name: str):
        self.stopping = threading.Event()
        self.procs: list[subprocess.Popen] = []
        self.log: list[str] = []   # what ran when: the report's timeline
        self.t0 = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join(10)
        end_sessions(self.procs)

    def _run(self) -> None:
        raise NotImplementedError


class Runner(Player):
    """Plays a scenario on mounts: the database mixes throughout (30 s fio runs at the cycle's rate), each event
    at its time. Every process is in a session of its own, ended with the runner; a cgroup it makes is its own
    (iowarden-soak-<pid>-N) and removed. `elsewhere` is a directory on another device of the host, for I/O
    pressure off the judged volumes."""

    CHUNK_S = 30

    def __init__(self, scenario: Scenario, mounts: list[Path], elsewhere: Path | None = None):
        super().__init__("scenario")
        self.scenario, self.mounts, self.elsewhere = scenario, mounts, elsewhere
        self.cgroups: list[Path] = []
        self.scratch: list[tuple[subprocess.Popen, Path]] = []

    def stop(self) -> None:
        super().stop()
        for _, path in self.scratch:
            path.unlink(missing_ok=True)
        self.scratch = []
        for cg in self.cgroups:
            try:
                cg.rmdir()
            except OSError:
                pass

    def _spawn(self, what: str, argv: list[str], cgroup: Path | None = None, scratch: Path | None = None) -> None:
        """`scratch`: the file the job writes, removed when it ends (a storm's spill, a compaction's output): a
        healthy mix does not fill its volume. On 960 MiB volumes, with the database's and the backup's files and
        the probes' 256 MiB, the scratch left behind filled two volumes within 50 minutes and every probe there
        was refused."""
        self._reap()
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(p.pid))
        self.procs.append(p)
        if scratch is not None:
            self.scratch.append((p, scratch))
        self.log.append(f"{time.monotonic() - self.t0:7.0f} s  {what}")

    def _reap(self) -> None:
        self.procs = [p for p in self.procs if p.poll() is None]
        for p, path in [x for x in self.scratch if x[0].poll() is not None]:
            self.scratch.remove((p, path))
            if not any(q.poll() is None and other == path for q, other in self.scratch):
                path.unlink(missing_ok=True)

    def cgroup(self, name: str, device: str | None = None, limit_iops: int | None = None) -> Path:
        cg = Path("/sys/fs/cgroup/blkio") / f"iowarden-soak-{os.getpid()}-{name}"
        cg.mkdir(exist_ok=True)
        self.cgroups.append(cg)
        if device and limit_iops:
            for kind in ("read_iops_device", "write_iops_device"):
                (cg / f"blkio.throttle.{kind}").write_text(f"{device} {limit_iops}")
        return cg

    def _db_chunk(self, t: float) -> None:
        import math
        for i, (m, d) in enumerate(zip(self.mounts, self.scenario.databases)):
            phase = 2 * math.pi * (t % d.day_s) / d.day_s
            rate = max(10, int(d.peak_iops * (0.25 + 0.75 * (1 - math.cos(phase)) / 2)))
            self._spawn(f"database mix at {rate} IOPS on vol{i}", fio(
                "--name=db", f"--filename={m / 'db.dat'}", "--size=128M", "--rw=randrw",
                f"--rwmixread={d.read_percent}", "--bs=4k", "--direct=1", f"--iodepth={d.iodepth}",
                f"--rate_iops={rate}", "--time_based", f"--runtime={self.CHUNK_S}"))

    def play(self, e: Event) -> None:
        """One event, started now (its processes end by their own runtime)."""
        m = self.mounts[e.volume] if e.volume is not None else None
        secs = f"--runtime={max(1, int(e.seconds))}"
        if e.kind in ("backup-direct", "backup-buffered"):
            self._spawn(e.said(False), fio("--name=backup", f"--filename={m / 'backup.dat'}", "--size=192M", "--rw=read",
                                      "--bs=1M", f"--direct={int(e.kind == 'backup-direct')}", "--iodepth=8",
                                      "--time_based", secs))
        elif e.kind == "compaction":
            self._spawn(e.said(False), fio("--name=compaction", f"--filename={m / 'compaction.dat'}", "--size=96M",
                                      "--rw=write", "--bs=1M", "--direct=1", "--iodepth=16", "--time_based", secs),
                        scratch=m / "compaction.dat")
        elif e.kind == "writeback-storm":
            self._spawn(e.said(False), fio("--name=storm", f"--filename={m / 'storm.dat'}", f"--size={e.params['mib']}M",
                                      "--rw=write", "--bs=1M", "--direct=0", "--end_fsync=1"), scratch=m / "storm.dat")
        elif e.kind == "wal-appender":
            self._spawn(e.said(False), fio("--name=wal", f"--filename={m / 'wal.dat'}", "--size=32M", "--rw=write",
                                      "--bs=4k", "--fdatasync=1", f"--rate_iops={e.params['fsyncs_per_second']}",
                                      "--time_based", secs), scratch=m / "wal.dat")
        elif e.kind == "defrag":
            self._spawn(e.said(False), ["timeout", str(max(1, int(e.seconds))), "xfs_fsr", "-v", str(m)])
        elif e.kind == "trim":
            self._spawn(e.said(False), ["fstrim", str(m)])
        elif e.kind == "batch-limited":
            device = _major_minor(m)
            cg = self.cgroup(f"batch-{int(e.at_s)}", device, e.params["limit_iops"])
            self._spawn(e.said(False), fio("--name=batch", f"--filename={m / 'batch.dat'}", "--size=64M",
                                      "--rw=randwrite", "--bs=4k", "--direct=1", "--iodepth=16", "--startdelay=1",
                                      "--time_based", secs), cgroup=cg, scratch=m / "batch.dat")
        elif e.kind == "cpu-pressure":
            for _ in range(e.params["busy_cpus"]):
                self._spawn(e.said(False), ["timeout", str(max(1, int(e.seconds))), "sh", "-c", "while :; do :; done"])
        elif e.kind == "io-pressure-elsewhere" and self.elsewhere is not None:
            self._spawn(e.said(False), fio("--name=elsewhere", f"--filename={self.elsewhere / 'pressure.dat'}",
                                      "--size=256M", "--rw=randrw", "--bs=4k", "--direct=1", "--iodepth=32",
                                      "--time_based", secs))

    def _run(self) -> None:
        pending = list(self.scenario.events)
        next_chunk = 0.0
        while not self.stopping.wait(0.5):
            t = time.monotonic() - self.t0
            if t >= next_chunk:
                self._db_chunk(t)
                next_chunk += self.CHUNK_S
            while pending and pending[0].at_s <= t:
                self.play(pending.pop(0))


def _major_minor(mount: Path) -> str:
    """The block device under a mount point, as cgroup v1 names it ("7:3")."""
    st = os.stat(mount)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
