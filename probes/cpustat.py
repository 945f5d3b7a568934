"""The all-CPU line of /proc/stat (Documentation/filesystems/proc.rst, "1.8 Miscellaneous kernel statistics").

  cpu  user nice system idle iowait irq softirq steal guest guest_nice

in USER_HZ ticks since boot. Kernels before 2.6.11 had no steal, before 2.6.24 no guest: the
missing fields are zero. guest and guest_nice are already counted in user and nice, so the total
leaves them out (as sysstat does), or guest time would count twice.
"""
from __future__ import annotations

from dataclasses import dataclass

from .common import KERNEL_FILE_MAX_BYTES, ParseError, Roots, read_bounded

_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class CpuTicks:
    user: int = 0
    nice: int = 0
    system: int = 0
    idle: int = 0
    iowait: int = 0
    irq: int = 0
    softirq: int = 0
    steal: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, f) for f in _FIELDS)


@dataclass(frozen=True)
class AvgCpuPercent:
    """iostat's avg-cpu block: the share of all CPUs' time over an interval."""
    user: float
    nice: float
    system: float   # irq and softirq included, as sysstat counts them
    iowait: float
    steal: float
    idle: float


def parse(text: str) -> CpuTicks:
    for line in text.split("\n"):
        parts = line.split()
        if parts and parts[0] == "cpu":
            try:
                values = [int(v) for v in parts[1:1 + len(_FIELDS)]]
            except ValueError:
                raise ParseError(f"/proc/stat: the cpu line has a field that is not a number: {line[:80]!r}") from None
            if len(values) < 4:
                raise ParseError(f"/proc/stat: the cpu line has {len(values)} fields, at least 4 expected")
            return CpuTicks(**dict(zip(_FIELDS, values)))
    raise ParseError("/proc/stat has no 'cpu' line")


def read(roots: Roots = Roots()) -> CpuTicks:
    return parse(read_bounded(roots.proc / "stat", KERNEL_FILE_MAX_BYTES).decode("ascii", "replace"))


def avg_cpu(prev: CpuTicks, cur: CpuTicks) -> AvgCpuPercent:
    """sysstat's write_plain_cpu_stat: each share of the interval's total ticks, in percent.

    A counter that went backwards (a CPU taken offline takes its ticks with it) gives 0, not a
    negative share; an interval of no ticks gives zeros.
    """
    ticks = max(cur.total - prev.total, 0)

    def share(a: int, b: int) -> float:
        return 100.0 * (b - a) / ticks if ticks and b >= a else 0.0

    return AvgCpuPercent(
        user=share(prev.user, cur.user),
        nice=share(prev.nice, cur.nice),
        system=share(prev.system + prev.irq + prev.softirq, cur.system + cur.irq + cur.softirq),
        iowait=share(prev.iowait, cur.iowait),
        steal=share(prev.steal, cur.steal),
        idle=share(prev.idle, cur.idle),
    )
