"""The tracer's policy, pure: how much of a disk's requests to time, when its cost is over budget, when the
program must be re-planned. The reader (sources/tracer.py) applies it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from iowarden.probes import blocktrace


def skip_for(iops: float, max_timed_iops: float) -> int:
    """How many of SAMPLE_SCALE hash values to skip so that about max_timed_iops are timed."""
    if iops <= max_timed_iops:
        return 0
    keep = max(1, math.ceil(blocktrace.SAMPLE_SCALE * max_timed_iops / iops))
    return blocktrace.SAMPLE_SCALE - keep


# What each engine costs the machine per request of any disk, timed or not, before sampling saves anything: the
# whole machine's CPU per I/O over fio alone at a fixed rate (bench/tracer_overhead.py, a 2-core VM; docs/
# measurements.md). bpftrace: three classic tracepoints, each building its record, and two start maps.
# compiled: one BTF tracepoint at completion.
ENGINE_COST_PER_IO_NS = {"bpftrace": 400.0, "compiled": 150.0}


# What the compiled engine's BTF tracepoint costs per request beyond its program's run time, which the kernel's
# bpf_stats do not see: the bench's "compiled, no disk traced" row (the tracepoint firing and one map lookup).
ATTACH_COST_NS = {"compiled": 40.0}
# A measurement of fewer requests (under 10,000 I/O per second over its second) is not taken: there the program
# runs from cold caches, 570 ns a request at 2,300/s here against 99 at 300,000/s (bench), and the budget binds
# only at hundreds of thousands a second. A figure from an idle minute would pause the tracer at the next burst.
MIN_MEASURED_RUNS = 10_000
# For the same reason a figure measured at under a half of the rate being judged overstates the cost at that
# rate (a soak's host going from 11,000 to 112,000 I/O a second was judged at 777 ns a request, its program's
# time at 11,000/s, and paused; at 76,000/s it had run 164). The loader measures once a minute, so the tracer
# waits for a measurement at the new rate for at most this long before the older figure decides.
REMEASURE_WAIT_SECONDS = 150.0


@dataclass(frozen=True)
class ProgramCost:
    """One measurement of the compiled program's own run time (blockstage.cost_message)."""
    ns_per_request: float
    requests_per_second: float   # the host's completions a second while it was measured


def measured_cost(run_ns: int, runs: int, seconds: float, previous: ProgramCost | None) -> ProgramCost | None:
    """The program's run time per request from one measurement, or the last one's where this saw too few requests
    (a quiet host: MIN_MEASURED_RUNS)."""
    if runs < MIN_MEASURED_RUNS or not seconds > 0:
        return previous
    return ProgramCost(run_ns / runs, runs / seconds)


def figure_is_stale(cost: ProgramCost | None, host_iops: float) -> bool:
    """The figure at hand was measured at under half the rate now judged, so it overstates the cost at this rate."""
    return cost is not None and 2 * cost.requests_per_second < host_iops


def cost_per_io_ns(section, engine: str = "bpftrace", cost: ProgramCost | None = None) -> float:
    """[tracer] cost_per_io_ns when set; else the compiled engine's program run time as the kernel measured it
    (bpf_stats, whose two clock reads make it err high) plus its tracepoint's firing; else what the engine was
    measured to cost by the bench."""
    if section.cost_per_io_ns:
        return section.cost_per_io_ns
    if cost is not None and engine in ATTACH_COST_NS:
        return cost.ns_per_request + ATTACH_COST_NS[engine]
    return ENGINE_COST_PER_IO_NS[engine]


def over_budget(host_iops: float, paused: bool, section, engine: str = "bpftrace",
                cost: ProgramCost | None = None, stale_for_seconds: float = 0.0) -> bool:
    """Whether the tracer must be off. The tracepoints cost about cost_per_io_ns() on every request of every
    disk before the program decides anything (sampling saves only the program's own time), so the only
    bound on that cost is to detach: above max_cpu_cores it pauses, and it resumes below half of it, so a
    rate near the line does not start and stop it every window. A running compiled program is not paused on a
    figure measured at under half the rate (figure_is_stale) until it has waited REMEASURE_WAIT_SECONDS for one
    taken at this rate: the tracer is most wanted under a flood (who causes it, whom it hurts)."""
    if (not paused and engine in ATTACH_COST_NS and not section.cost_per_io_ns and figure_is_stale(cost, host_iops)
            and stale_for_seconds < REMEASURE_WAIT_SECONDS):
        return False
    cores = host_iops * cost_per_io_ns(section, engine, cost) / 1e9
    return cores > (section.max_cpu_cores / 2 if paused else section.max_cpu_cores)


def sustained_rate(rates: list[tuple[float, float, float]], now: float, span_seconds: float) -> float:
    """The host's I/O rate over the last span_seconds: the mean of readings (at, rate, seconds it covers),
    each weighted by the part of its seconds inside the span. The budget is judged on it, not on one
    window: a burst of seconds (iowarden's own probe, a job's start) costs the tracepoints a fraction of
    a CPU-second and does not stop the tracer; a rate held for a minute does."""
    start = now - span_seconds
    weighted = covered = 0.0
    for at, rate, seconds in rates:
        inside = max(0.0, min(seconds, at - start))
        weighted, covered = weighted + rate * inside, covered + inside
    return weighted / covered if covered > 0 else (rates[-1][1] if rates else 0.0)


def needs_replan(current: dict[str, int], wanted: dict[str, int]) -> bool:
    """A disk came or went, or its kept share moved by a factor of four."""
    if current.keys() != wanted.keys():
        return True
    scale = blocktrace.SAMPLE_SCALE
    for name, skip in wanted.items():
        a, b = scale - current[name], scale - skip
        if max(a, b) >= 4 * min(a, b):
            return True
    return False
