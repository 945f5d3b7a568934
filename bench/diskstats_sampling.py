"""Cost of one sampler tick (read /proc/diskstats, parse, compute iostat -x rates) by device count.

Runs against generated fixture trees, so 1000 devices need no 1000 disks:
    .venv/bin/python bench/diskstats_sampling.py [--ticks N]
Prints the median and p99 cost per tick and per device, and the tick's share of a
1 s sampling interval on one core.
"""
import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from iowarden.probes import diskstats
from iowarden.probes.common import Roots


def write_diskstats(path: Path, n: int, tick: int) -> None:
    rnd = random.Random(n * 1000 + tick)
    lines = []
    for i in range(n):
        base = tick * 1000 + i
        v = [base * 3, base, base * 24, base * 2, base * 2, base // 2, base * 16, base * 3, rnd.randint(0, 4),
             base, base * 5, 0, 0, 0, 0, base // 10, base // 20]
        lines.append(f"{8 + i // 16:4d} {i % 16 * 16:7d} sd{i} " + " ".join(map(str, v)))
    path.write_text("\n".join(lines) + "\n")


def bench(n: int, ticks: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        roots = Roots.under(d)
        roots.proc.mkdir()
        write_diskstats(roots.proc / "diskstats", n, 0)
        prev = diskstats.read(roots)
        costs = []
        for t in range(1, ticks + 1):
            write_diskstats(roots.proc / "diskstats", n, t)   # not timed: the kernel's side
            t0 = time.perf_counter()
            cur = diskstats.read(roots)
            rates = diskstats.rates_between(prev, cur)
            costs.append(time.perf_counter() - t0)
            assert len(rates) == n
            prev = cur
    costs.sort()
    return statistics.median(costs), costs[int(len(costs) * 0.99) - 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=300)
    args = ap.parse_args()
    print(f"{'devices':>8} {'median ms/tick':>15} {'p99 ms/tick':>12} {'us/device':>10} {'CPU share at 1 Hz':>18}")
    for n in (1, 64, 1000):
        med, p99 = bench(n, args.ticks)
        print(f"{n:>8} {med * 1e3:>15.3f} {p99 * 1e3:>12.3f} {med / n * 1e6:>10.2f} {med * 100:>17.3f}%")


if __name__ == "__main__":
    main()
