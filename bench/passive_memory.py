"""What the passive detector holds per busy device once its windows are full, beside the same detector with
its rolling medians kept as lists of floats (how they were before they became arrays), in one run.

    .venv/bin/python bench/passive_memory.py [--members 12] [--windows 700]

Twelve drives of one group carry traffic every window (tests/passive_traces.py, a 15 s window each), so every
per-device structure fills: the 480-window peer rings, the self ring, the evidence block. tracemalloc counts
what the detector holds after the last window, less what was held before it was made. No root.
"""
import argparse
import bisect
import gc
import sys
import tracemalloc
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests import passive_traces as pt  # noqa: E402

from iowarden.daemon.passive import detector as detector_module  # noqa: E402
from iowarden.daemon.passive.detector import PassiveDetector  # noqa: E402


class ListRollingMedian:
    """The reference: the rolling median as it was, a deque and a sorted list of float objects."""

    def __init__(self, size: int):
        self.ring: deque = deque()
        self.size = size
        self.sorted: list[float] = []

    def add(self, x: float) -> None:
        if len(self.ring) == self.size:
            old = self.ring.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]
        self.ring.append(x)
        bisect.insort(self.sorted, x)

    def median(self) -> float:
        s, n = self.sorted, len(self.sorted)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

    def __len__(self) -> int:
        return len(self.ring)

    def clear(self) -> None:
        self.ring.clear()
        self.sorted.clear()


def held_per_device(batches, group, rolling) -> tuple[float, list]:
    detector_module.RollingMedian = rolling
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    det = PassiveDetector()
    for batch in batches:
        det.observe(batch, [group])
    gc.collect()
    stats = tracemalloc.take_snapshot().compare_to(before, "lineno")
    tracemalloc.stop()
    del det
    return sum(s.size_diff for s in stats) / len(group), stats[:6]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=12)
    ap.add_argument("--windows", type=int, default=700)
    args = ap.parse_args()
    batches = list(pt.peer_trace(3, args.windows, members=args.members))
    names = tuple(sorted({w.device for batch in batches for w in batch}))
    shipped = detector_module.RollingMedian
    rows = [("iowarden (arrays of single floats)", *held_per_device(batches, names, shipped)),
            ("reference: lists of floats", *held_per_device(batches, names, ListRollingMedian))]
    detector_module.RollingMedian = shipped
    print(f"{len(names)} busy devices, {args.windows} windows of 15 s: KiB the detector holds per device")
    for title, per_device, _ in rows:
        print(f"  {title:<32} {per_device / 1024:8.1f}")
    print(f"  ratio {rows[0][1] / rows[1][1]:.2f}; at 1,024 busy devices "
          f"{rows[0][1] * 1024 / 2**20:.0f} MiB against {rows[1][1] * 1024 / 2**20:.0f} MiB")
    for title, _, top in rows:
        print(f"where it is, {title}:")
        for s in top:
            print(f"  {s.size_diff / 1024:8.1f} KiB  {s.traceback[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
