"""`iowarden characterize`: the sweeps users ran by hand (queue depth, block size, jobs, mix), as one
budgeted series of ordinary probes, and what they show (the knee, the saturation IOPS, where a
volume turns from IOPS-bound to bandwidth-bound).

Pure: the plan, its cost and the findings are functions of numbers; cli.cmd_characterize runs
the probes (probes/fio_run.run_probe, with every probe's safety rules and limits) and prints.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from iowarden.probes.fio_job import ProbeProfile

SWEEPS = ("qd", "bs", "jobs", "mix")
QD_STEPS = (1, 2, 4, 8, 16, 32, 64)
BS_STEPS = (4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576)
JOB_STEPS = (1, 2, 4, 8, 16)
MIX_READ_PERCENT = (100, 50, 0)      # randread, randrw (fio's default 50/50), randwrite
KNEE_LATENCY_GROWTH = 1.0     # past the knee latency grows faster than IOPS (per doubling of depth)
BANDWIDTH_BOUND_SHARE = 0.9   # bandwidth-bound from the block size reaching 90 % of the sweep's best MB/s


@dataclass(frozen=True)
class Step:
    sweep: str
    value: int                 # the swept parameter: depth, block size in bytes, jobs, read %
    profile: ProbeProfile

    @property
    def label(self) -> str:
        if self.sweep == "bs":
            return _size(self.value)
        if self.sweep == "mix":
            return f"{self.value}% read"
        return str(self.value)


@dataclass(frozen=True)
class Point:
    """One step's measurement (the JSON carries every one)."""
    sweep: str
    value: int
    iops: float
    bw_bytes: float
    mean_latency_seconds: float | None
    p99_seconds: float | None
    p999_seconds: float | None
    ok: bool = True
    error: str | None = None


def plan(sweeps: list[str], size_bytes: int, runtime_seconds: float, ramp_seconds: float,
         writes: bool) -> list[Step]:
    base = ProbeProfile(name="characterize", rw="randread", bs_bytes=4096, iodepth=32, size_bytes=size_bytes,
                        runtime_seconds=runtime_seconds, ramp_time_seconds=ramp_seconds)
    steps: list[Step] = []
    for sweep in sweeps:
        if sweep == "qd":
            rws = ("randread", "randwrite") if writes else ("randread",)
            for rw in rws:
                steps += [Step("qd" if rw == "randread" else "qd-write", q,
                               replace(base, name=f"{rw}-4k-qd{q}", rw=rw, iodepth=q)) for q in QD_STEPS]
        elif sweep == "bs":
            steps += [Step("bs", b, replace(base, name=f"randread-{_size(b)}-qd16", bs_bytes=b, iodepth=16,
                                            size_bytes=max(size_bytes - size_bytes % b, b)))
                      for b in BS_STEPS]
        elif sweep == "jobs":
            steps += [Step("jobs", j, replace(base, name=f"randread-4k-qd8-jobs{j}", iodepth=8, numjobs=j))
                      for j in JOB_STEPS]
        elif sweep == "mix":
            for pct in MIX_READ_PERCENT if writes else (100,):
                rw = "randread" if pct == 100 else ("randwrite" if pct == 0 else "randrw")
                steps.append(Step("mix", pct, replace(base, name=f"mix-{pct}-read", rw=rw, iodepth=16)))
        else:
            raise ValueError(f"unknown sweep {sweep!r}: one of {', '.join(SWEEPS)}")
    return steps


def step_seconds(step: Step, fio_start_seconds: float = 0.5) -> float:
    return step.profile.runtime_seconds + step.profile.ramp_time_seconds + fio_start_seconds


def estimate(steps: list[Step], size_bytes: int) -> tuple[float, int, int]:
    """(seconds, bytes the layout writes, write steps). What a write step writes is what the volume
    takes in its runtime, known only once measured: the run stops the write steps before one could
    pass the byte budget (write_step_allowed)."""
    seconds = sum(step_seconds(s) for s in steps)
    return seconds, size_bytes, sum(1 for s in steps if s.profile.writes)


def write_step_allowed(written_so_far: int, largest_write_step: int, budget_bytes: int) -> bool:
    """Another write step, if even one as large as the largest so far stays within the budget."""
    return written_so_far + largest_write_step <= budget_bytes


def within_budget(steps: list[Step], budget_seconds: float) -> tuple[list[Step], list[Step]]:
    """The steps that fit the time budget in plan order, and the ones left out."""
    kept, used = [], 0.0
    for i, s in enumerate(steps):
        if used + step_seconds(s) > budget_seconds:
            return kept, steps[i:]
        kept.append(s)
        used += step_seconds(s)
    return kept, []


def knee(points: list[Point]) -> tuple[int | None, float | None]:
    """(the knee's queue depth, the saturation IOPS) of a depth sweep.

    The knee is the last depth before the first doubling that buys less IOPS than it costs in
    latency (IOPS x g, mean latency x more than g); the saturation IOPS the best measured."""
    pts = [p for p in sorted(points, key=lambda p: p.value) if p.ok and p.iops > 0]
    if not pts:
        return None, None
    best = max(p.iops for p in pts)
    for a, b in zip(pts, pts[1:]):
        if a.mean_latency_seconds and b.mean_latency_seconds:
            iops_gain = b.iops / a.iops
            latency_gain = b.mean_latency_seconds / a.mean_latency_seconds
            if latency_gain > iops_gain * KNEE_LATENCY_GROWTH and iops_gain < 1.5:
                return a.value, best
    return pts[-1].value, best


def bandwidth_bound_from(points: list[Point]) -> int | None:
    """The smallest block size reaching BANDWIDTH_BOUND_SHARE of the sweep's best MB/s: below it the
    volume is IOPS-bound (MB/s grows with the block), from it bandwidth-bound (IOPS fall instead)."""
    pts = [p for p in sorted(points, key=lambda p: p.value) if p.ok and p.bw_bytes > 0]
    if not pts:
        return None
    best = max(p.bw_bytes for p in pts)
    return next(p.value for p in pts if p.bw_bytes >= BANDWIDTH_BOUND_SHARE * best)


def _size(b: int) -> str:
    return f"{b // 1048576}M" if b >= 1048576 and b % 1048576 == 0 else f"{b // 1024}k"
