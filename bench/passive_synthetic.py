"""The passive detector's figures on synthetic days (tests/passive_traces.py), over many seeds.

    .venv/bin/python bench/passive_synthetic.py [--seeds 20]

A day of 15 s windows whose load swings tenfold (200 to 2,000 IOPS), latency on a device curve with
log-normal noise (sigma 0.15) and one window in 200 spiking up to 8x. Prints: windows from the
start of a slowdown at equal load (+50 %, 2x, 4x) to the alert (p50, p90, missed); false alarms per
1000 windows on healthy days; load surges along the curve that alerted; a slow member among four
named (windows to alert) and its peers named by mistake; the cost of a window.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests import passive_traces as pt  # noqa: E402

from iowarden.daemon.passive.detector import PassiveDetector  # noqa: E402

DAY = pt.DAY_WINDOWS


def first_raise(windows, groups=(), kind=None, device=None):
    det = PassiveDetector()
    for i, w in enumerate(windows):
        for t in det.observe(w if isinstance(w, list) else [w], groups):
            if t.state == "raised" and (kind is None or t.kind == kind) and (device is None or t.device == device):
                return i, t
    return None, None


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    seeds = range(1, args.seeds + 1)
    print(f"{args.seeds} seeds; a day is {DAY} windows of 15 s\n")
    start = DAY + 700     # mid-morning of day two, the curve learned over day one
    for factor in (1.5, 2.0, 4.0):
        delays, missed = [], 0
        for s in seeds:
            i, _ = first_raise(pt.device_trace(s, start + 1500, slow_from=start, factor=factor))
            if i is None or i < start:
                missed += 1
            else:
                delays.append(i - start)
        print(f"latency x{factor} at equal load: windows to alert p50 {pct(delays, 0.5)}, p90 {pct(delays, 0.9)} "
              f"(minutes at 15 s: {pct(delays, 0.5) / 4 if delays else '-'} / "
              f"{pct(delays, 0.9) / 4 if delays else '-'}); missed or early {missed}/{len(seeds)}")
    alarms, windows = 0, 0
    t0 = time.perf_counter()
    for s in seeds:
        det = PassiveDetector()
        for w in pt.device_trace(1000 + s, 3 * DAY):
            alarms += sum(1 for t in det.observe([w]) if t.state == "raised")
            windows += 1
    cost = (time.perf_counter() - t0) / windows
    print(f"healthy: {alarms} alarms in {windows} windows = {1000 * alarms / windows:.4f} per 1000 windows per device")
    surges = sum(1 for s in seeds if first_raise(pt.device_trace(2000 + s, 2 * DAY,
                                                                  surge=(DAY + 600, DAY + 1080)))[0] is not None)
    print(f"load tripled for 2 h, along the curve: alerted in {surges}/{len(seeds)}")
    members = ("sda", "sdb", "sdc", "sdd")
    for factor in (2.0, 3.0):
        delays, wrong = [], 0
        for s in seeds:
            det = PassiveDetector()
            first = None
            for i, batch in enumerate(pt.peer_trace(3000 + s, 1500, slow={2: factor}, slow_from=500)):
                for t in det.observe(batch, [members]):
                    if t.state == "raised" and t.kind == "peers":
                        if t.device == "sdc" and first is None:
                            first = i - 500
                        elif t.device != "sdc":
                            wrong += 1
            if first is not None:
                delays.append(first)
        print(f"one member of four at {factor:g}x its peers (evidence over time): named in {len(delays)}/"
              f"{len(seeds)} within 1000 windows, windows to alert p50 {pct(delays, 0.5)}, p90 {pct(delays, 0.9)};"
              f" a healthy member named {wrong} times")
    print(f"cost: {cost * 1e6:.0f} us per device-window (one device: {cost * 1e6 / 15:.1f} us of CPU per second)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
