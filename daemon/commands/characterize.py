"""`iowarden characterize`: the sweeps users ran by hand (queue depth, block size, jobs, mix), as one
budgeted series of ordinary probes, and what they show (the knee, the saturation IOPS, where a
volume turns from IOPS-bound to bandwidth-bound).

Pure: the plan, its cost and the findings are functions of numbers; cli.cmd_characterize runs
the probes (probes/fio_run.run_probe, with every probe's safety rules and limits) and prints.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from iowarden.probes.common import parse_size_bytes
from iowarden.probes.fio_job import ProbeProfile

SWEEPS = ("qd", "bs", "jobs", "mix", "working-set")
QD_STEPS = (1, 2, 4, 8, 16, 32, 64)
BS_STEPS = (4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576)
JOB_STEPS = (1, 2, 4, 8, 16)
MIX_READ_PERCENT = (100, 50, 0)      # randread, randrw (fio's default 50/50), randwrite
MIB = 2 ** 20
WORKING_SET_FIRST = 64 * MIB
KNEE_NARROW = 1.25            # a cache knee is narrowed by midpoints until its bracket is this close
CACHE_DROP = 0.5              # a cache knee: IOPS below half of what the smaller working sets got
KNEE_SHARE = 0.9              # the knee: the shallowest depth within 10 % of the saturation IOPS
BANDWIDTH_BOUND_SHARE = 0.9   # bandwidth-bound from the block size reaching 90 % of the sweep's best MB/s
CHECKED_SWEEPS = ("qd", "qd-write", "jobs", "bs")   # sweeps with a shape a step can break (mix and working set fall by design)
OUT_OF_LINE_SHARE = 0.7       # a step below 70 % of what a smaller one reached breaks a rising sweep
FOREIGN_SHARE = 0.1           # a step whose device moved over 10 % more bytes than the step's own was disturbed


@dataclass(frozen=True)
class Step:
    sweep: str
    value: int                 # the swept parameter: depth, block size in bytes, jobs, read %
    profile: ProbeProfile

    @property
    def label(self) -> str:
        if self.sweep in ("bs", "working-set"):
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
    suspect: str | None = None         # out of line twice: measured, shown, left out of the findings
    first_iops: float | None = None    # a step measured again: the first run's IOPS (the spread of the two)


def working_sets(largest_bytes: int) -> list[int]:
    """64 MiB, doubling, up to the largest allowed (the cap, or the free-space floor)."""
    out, size = [], WORKING_SET_FIRST
    while size <= largest_bytes:
        out.append(size)
        size *= 2
    return out


def plan(sweeps: list[str], size_bytes: int, runtime_seconds: float, ramp_seconds: float,
         writes: bool, largest_working_set: int = 0, buffered: bool = False) -> list[Step]:
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
        elif sweep == "working-set":
            for ws in working_sets(largest_working_set):
                steps += working_set_steps(ws, runtime_seconds, ramp_seconds, buffered)
        else:
            raise ValueError(f"unknown sweep {sweep!r}: one of {', '.join(SWEEPS)}")
    return steps


def working_set_steps(ws: int, runtime_seconds: float, ramp_seconds: float, buffered: bool) -> list[Step]:
    """One working-set point: a probe file of ws bytes (the one before is removed), read once in order
    first, as a database warms its cache, then randomly: IOPS against how far the reads spread."""
    direct = "0" if buffered else "1"
    warm = (("warm", (("rw", "read"), ("bs", "1048576"), ("iodepth", "4"), ("direct", direct), ("size", str(ws)),
                      ("runtime", "120"), ("time_based", "0"), ("invalidate", "0"))),)
    # invalidate=0: fio drops the file's cached pages before a job by default, which would measure a
    # cold cache every time
    job = (("rw", "randread"), ("bs", "4096"), ("iodepth", "16"), ("direct", direct), ("size", str(ws)),
           ("runtime", f"{runtime_seconds:g}"), ("ramp_time", f"{ramp_seconds:g}"), ("time_based", "1"),
           ("invalidate", "0"))
    return [Step("warm", ws, ProbeProfile(name=f"warm-{_size(ws)}", jobs=warm)),
            Step("working-set", ws, ProbeProfile(name=f"randread-4k-qd16-ws{_size(ws)}", jobs=((f"ws{_size(ws)}", job),)))]


def next_knee_point(points: list[Point]) -> int | None:
    """The working set to measure next to narrow a cache knee found by doubling: the middle (on a MiB grid)
    between the last size served at the cache's speed and the first that was not. Doubling alone puts the
    cache anywhere in a factor of two; each point halves that. None once the two are within KNEE_NARROW
    of each other, when there is no knee, or when the middle was tried and failed."""
    k = cache_knee(points)
    if k is None:
        return None
    above = min(p.value for p in points if p.ok and p.value > k)
    if above <= k * KNEE_NARROW:
        return None
    mid = (k + above) // 2 // MIB * MIB
    tried = {p.value for p in points}   # a failed point is not tried again
    return mid if k < mid < above and mid not in tried else None


WARM_BYTES_PER_SECOND = 256 * 2 ** 20   # a guess for the estimate: a warm pass reads its file once, in order


def step_seconds(step: Step, fio_start_seconds: float = 0.5) -> float:
    if step.sweep == "warm":
        return step.value / WARM_BYTES_PER_SECOND + fio_start_seconds
    return step.profile.effective_runtime_seconds() + fio_start_seconds


def estimate(steps: list[Step], size_bytes: int) -> tuple[float, int, int]:
    """(seconds, bytes the layouts write, write steps). What a write step writes is what the volume
    takes in its runtime, known only once measured: the run stops the write steps before one could
    pass the byte budget (write_step_allowed). Laying a file out takes time too (at the volume's
    sequential speed), not counted here."""
    seconds = sum(step_seconds(s) for s in steps)
    layouts = {s.profile.size_bytes for s in steps if s.sweep not in ("working-set", "warm")}
    layout_bytes = (size_bytes if layouts else 0) + sum(s.value for s in steps if s.sweep == "working-set")
    return seconds, layout_bytes, sum(1 for s in steps if s.profile.writes)


def write_step_cap(budget_bytes: int, charged_bytes: int, largest_write_step: int, block_bytes: int) -> int | None:
    """The most the next write step may write: what is left of the budget, in whole blocks. None (the step
    is left out) when not even one as large as the largest so far would fit. The cap is what keeps the run
    within its budget; the prediction only spares a step that would be cut short."""
    left = budget_bytes - charged_bytes
    if left < max(largest_write_step, block_bytes):
        return None
    return left - left % block_bytes


def capped_at(profile: ProbeProfile, cap_bytes: int) -> ProbeProfile:
    """The profile as fio jobs that stop at cap_bytes issued or at their runtime, whichever comes first.

    fio's io_size counts every byte a job issues, the ramp included (a write during ramp_time is on the
    disk all the same); a time-based job ignores it, so the step is not time-based. A size below the
    cap makes fio wrap around the file, as a time-based job would. io_size is per job."""
    jobs = []
    for name, opts in profile.job_dicts():
        per_job = cap_bytes // max(1, int(opts.get("numjobs", "1")))
        bs = parse_size_bytes(opts.get("bs", "4096"))
        jobs.append((name, tuple({**opts, "io_size": str(max(bs, per_job - per_job % bs)),
                                  "time_based": "0"}.items())))
    return ProbeProfile(name=profile.name, jobs=tuple(jobs))


def step_fits(elapsed_seconds: float, step: Step, budget_seconds: float) -> bool:
    """Does the step, as estimated, end within the time budget? The plan is cut by estimates (within_budget);
    the run checks the clock too, since what the estimate leaves out (laying files out, a slow fio start)
    is real time."""
    return elapsed_seconds + step_seconds(step) <= budget_seconds


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

    The saturation IOPS is the best measured; the knee the shallowest depth within KNEE_SHARE of
    it. Past the knee a doubling buys at most about a tenth more IOPS while, by Little's law,
    the latency nearly doubles: IOPS grow less than latency."""
    pts = [p for p in sorted(points, key=lambda p: p.value) if p.ok and p.iops > 0]
    if not pts:
        return None, None
    best = max(p.iops for p in pts)
    return next(p.value for p in pts if p.iops >= KNEE_SHARE * best), best


def bandwidth_bound_from(points: list[Point]) -> int | None:
    """The smallest block size reaching BANDWIDTH_BOUND_SHARE of the sweep's ceiling: below it the
    volume is IOPS-bound (MB/s grows with the block), from it bandwidth-bound (IOPS fall instead). The
    ceiling is the second-best MB/s: a limit that lets a burst through (blk-throttle's slices, a cloud
    volume's burst) puts one step above the plateau, and the plateau is what bounds the volume. Whether
    MB/s still rose beyond the step found is still_rising_after's to say."""
    pts = [p for p in sorted(points, key=lambda p: p.value) if p.ok and p.bw_bytes > 0]
    if not pts:
        return None
    ceiling = sorted((p.bw_bytes for p in pts), reverse=True)[min(1, len(pts) - 1)]
    return next(p.value for p in pts if p.bw_bytes >= BANDWIDTH_BOUND_SHARE * ceiling)


def still_rising_after(points: list[Point], bound: int) -> bool:
    """The largest block measured moved more than BANDWIDTH_BOUND_SHARE's margin more MB/s than the block
    found: no plateau was reached within the sizes measured (the turn, if any, is beyond the range). The
    largest, not any: one step in between may be a burst through the limit."""
    pts = sorted((p for p in points if p.ok and p.bw_bytes > 0), key=lambda p: p.value)
    at = next((p.bw_bytes for p in pts if p.value == bound), None)
    return at is not None and pts[-1].value > bound and pts[-1].bw_bytes * BANDWIDTH_BOUND_SHARE > at


def _size(b: int) -> str:
    if b >= 2 ** 30 and b % 2 ** 30 == 0:
        return f"{b // 2 ** 30}G"
    return f"{b // 1048576}M" if b >= 1048576 and b % 1048576 == 0 else f"{b // 1024}k"


def cache_knee(points: list[Point]) -> int | None:
    """The largest working set still served at the cache's speed: the size before the first one whose
    IOPS fall below CACHE_DROP of the best smaller one. None: no fall in the sizes measured."""
    pts = [p for p in sorted(points, key=lambda p: p.value) if p.ok and p.iops > 0]
    for prev, (i, p) in zip(pts, enumerate(pts[1:], 1)):
        if p.iops < CACHE_DROP * max(q.iops for q in pts[:i]):
            return prev.value
    return None


def compare(a: list[dict], b: list[dict]) -> list[tuple[str, int, float | None, float | None, float | None]]:
    """(sweep, value, IOPS in A, IOPS in B, change B/A - 1) for every point either run measured."""
    ia = {(p["sweep"], p["value"]): p for p in a}
    ib = {(p["sweep"], p["value"]): p for p in b}
    out = []
    for key in sorted(ia.keys() | ib.keys()):
        # a point another version wrote, or a person edited, without `ok` or `iops`: not measured, not a traceback
        x = ia[key].get("iops") if key in ia and ia[key].get("ok", True) else None
        y = ib[key].get("iops") if key in ib and ib[key].get("ok", True) else None
        out.append((key[0], key[1], x, y, (y / x - 1) if x and y is not None else None))
    return out


def step_problem(point: Point, earlier: list[Point], own_bytes: int | None = None,
                 device_bytes: int | None = None) -> str | None:
    """Why a step's figure cannot be trusted as it is, or None: the device did other work in its seconds,
    or the figure breaks its sweep's shape (depth and jobs: IOPS do not fall as they grow, a device past its
    knee holds its IOPS; block size: MB/s do not fall as blocks grow)."""
    if not point.ok or point.sweep not in CHECKED_SWEEPS:
        return None
    # bytes, not I/Os: the device splits and merges requests, and moves the same bytes
    if own_bytes and device_bytes is not None and device_bytes - own_bytes > FOREIGN_SHARE * own_bytes:
        return (f"the device moved {(device_bytes - own_bytes) / 1048576:,.1f} MiB for other work beside the step's "
                f"{own_bytes / 1048576:,.1f} MiB: it was busy with something else")
    field, unit = ("bw_bytes", "MiB/s") if point.sweep == "bs" else ("iops", "IOPS")
    scale = 1048576 if point.sweep == "bs" else 1
    smaller = [p for p in earlier if p.sweep == point.sweep and p.ok and not p.suspect and p.value < point.value]
    if not smaller:
        return None
    best = max(smaller, key=lambda p: getattr(p, field))
    if getattr(point, field) < OUT_OF_LINE_SHARE * getattr(best, field):
        label = Step(point.sweep, point.value, None).label
        return (f"{getattr(point, field) / scale:,.0f} {unit} at {label}, below the {getattr(best, field) / scale:,.0f} "
                f"at {Step(best.sweep, best.value, None).label}: out of line with the sweep")
    return None


def settle(first: Point, again: Point, still: str | None) -> Point:
    """A step measured twice: the second run, carrying the first's IOPS; marked suspect (left out of the
    findings) when it is out of line again."""
    return replace(again, first_iops=first.iops, suspect=still)


def trusted(points: list[Point]) -> list[Point]:
    return [p for p in points if not p.suspect]


def confidence(points: list[Point]) -> dict:
    """How far a sweep's findings can be trusted: the steps measured again and the spread of their two
    runs, and the steps left out."""
    again = [p for p in points if p.first_iops is not None and p.ok]
    spread = max((abs(p.iops - p.first_iops) / max(p.iops, p.first_iops) for p in again
                  if max(p.iops, p.first_iops) > 0), default=None)
    return {"measured_again": [p.value for p in again], "repeat_spread": spread,
            "left_out": [p.value for p in points if p.suspect], "trusted": not any(p.suspect for p in points)}
