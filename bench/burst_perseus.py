"""The burst bucket's thresholds held out: how sensitive the fall can be made before real traffic, with no bucket
in it, is learned as one; chosen on two clusters of the real fail-slow traces, reported on the third.

    .venv/bin/python bench/burst_perseus.py [--data ../shared/data/perseus-dev]

DATA is the data set's own layout (`cluster_X/host_N/DAY.csv` with `slow_drive_info.csv` beside the clusters) or
a directory holding it as `*.tar.xz` (the development sample). None of its 276 drives sits behind a burst
bucket: every bucket learned on them is a false one, and every BurstCreditsLow a false warning. Each drive's rows
(one each 15 s, the daemon's window) go through the daemon's own bucket learner (daemon/passive/burst.py) as
windows of its throughput over 4 KiB (the traces give bytes, not requests: the shape is one for all), and every
window is taken as busy, a queue at full utilisation: the traces do not say, so the learner's guard on it is
given away and what is measured is its levels, ratios and lengths alone: the worst case.

The thresholds: the fall ratio (the burst rate over the baseline), the shortest burst (MIN_BURST_SECONDS), the
flat windows at the baseline ([passive] saturation_windows) and how flat they must be (their highest and lowest
within a spread of their mean: a volume held at a limit delivers it to a few per cent, a demand wanders). For each cluster held out: on the other two, the
most sensitive grid point (lowest ratio, then shortest burst, then fewest flat windows, then widest spread) that learns no bucket on
any of their drives; then on the held-out cluster, with that point, the drives where a bucket is learned (a fall
and a recovery), where one is a candidate only (a fall, no recovery), and where BurstCreditsLow is raised. The
shipped values are printed beside, on every cluster.

Beside it, the same learner on seeded synthetic bucket volumes (a demand above the baseline with 10 % noise
drains a bucket, held at its baseline within 2 % once empty; a quiet spell; a second drain): at each chosen point,
how many learn their bucket and warn before the second fall, and how close the time left said is to the truth:
what a point costs in buckets missed, beside what it saves in false ones.
"""
import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.fleet_perseus import read_data  # noqa: E402

from iowarden.daemon.passive import burst  # noqa: E402
from iowarden.daemon.passive.values import PassiveParams  # noqa: E402

ROW_SECONDS = 15.0
REQUEST_BYTES = 4096
RATIOS = (1.5, 2.0)
MIN_BURSTS = (60.0, 120.0)
FLATS = (6, 8)
SPREADS = (0.10, 0.05, 0.03)
SHAPE = ("r", 4096)


def params(point: tuple) -> burst.BurstParams:
    """The shipped bucket parameters but for the grid's: the fall's ratio (and the recovery's, the same test the
    other way), its flat windows and how flat they are (MIN_BURST_SECONDS, a module constant, is set apart)."""
    ratio, _, flat, spread = point
    shipped = PassiveParams().burst()
    return burst.BurstParams(horizon_seconds=shipped.horizon_seconds, fall_ratio=ratio, flat_windows=flat,
                             recover_ratio=ratio, flat_spread=spread)


def run_drive(rows, p: burst.BurstParams) -> tuple[bool, bool, int]:
    """(a bucket learned, a candidate left, warnings raised) on one drive's rows."""
    t, warned = burst.learning(), 0
    for ts, tput, _ in rows:
        if tput is None:
            continue
        for state, _, _ in burst.step(t, p, "d", float(ts), ROW_SECONDS, tput / REQUEST_BYTES, True, SHAPE):
            warned += state == "raised"
    return t.bucket is not None, t.candidate is not None, warned


def synthetic_volume(seed: int):
    """([(end, seconds, iops, busy)], when the second fall came) of a bucket volume: drain, quiet, drain again."""
    rng = random.Random(seed)
    baseline = rng.choice((100, 300, 1000, 3000))
    burst_iops = baseline * rng.choice((2, 3, 5, 10))
    capacity = (burst_iops - baseline) * rng.choice((120, 600, 1800, 3600))
    demand = baseline + (burst_iops - baseline) * rng.uniform(0.6, 1.0)
    out, balance, now, fall2 = [], capacity, 1_700_000_000.0, None
    phases = [("drain", 1), ("quiet", rng.randint(40, 120)), ("drain", 2), ("after", 40)]
    for phase, n in phases:
        windows = 10_000 if phase == "drain" else n
        for _ in range(windows):
            now += ROW_SECONDS
            want = demand * (1 + 0.1 * (rng.random() - 0.5) * 2) if phase in ("drain", "after") else baseline * 0.3
            rate = want if balance > 0 else min(want, baseline * (1 + 0.04 * (rng.random() - 0.5)))
            balance = min(capacity, max(0.0, balance + (baseline - rate) * ROW_SECONDS))
            out.append((now, ROW_SECONDS, rate, balance <= 0))
            if phase == "drain" and balance <= 0:
                # six windows and more at the baseline, then the phase ends
                for _ in range(12):
                    now += ROW_SECONDS
                    out.append((now, ROW_SECONDS, baseline * (1 + 0.04 * (rng.random() - 0.5)), True))
                if n == 2:
                    fall2 = now - 12 * ROW_SECONDS
                break
    return out, fall2


def run_synthetic(p: burst.BurstParams, seeds: range) -> tuple[int, int, list[float]]:
    """(learned, warned before the second fall, relative errors of the time left said at the warning)."""
    learned = warned = 0
    errors = []
    for seed in seeds:
        windows, fall2 = synthetic_volume(seed)
        t = burst.learning()
        said = None
        for end, seconds, iops, busy in windows:
            for state, _, ev in burst.step(t, p, "d", end, seconds, iops, busy, SHAPE):
                if state == "raised" and said is None and fall2 is not None and end < fall2:
                    said = (end, ev["seconds_left"])
        learned += t.bucket is not None
        if said is not None:
            warned += 1
            true_left = fall2 - said[0]
            errors.append(abs(said[1] - true_left) / true_left)
    return learned, warned, errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "perseus-dev"))
    ap.add_argument("--synthetic", type=int, default=200, help="synthetic bucket volumes per grid point")
    args = ap.parse_args()
    t0 = time.monotonic()
    drives, _ = read_data(Path(args.data))
    clusters = sorted({c for c, _, _ in drives})
    # the most sensitive first: the lowest ratio, the shortest burst, the fewest flat windows, the widest spread
    grid = sorted(((r, m, f, s) for r in RATIOS for m in MIN_BURSTS for f in FLATS for s in SPREADS),
                  key=lambda x: (x[0], x[1], x[2], -x[3]))
    shipped = (burst.BurstParams().fall_ratio, burst.MIN_BURST_SECONDS, PassiveParams().saturation_windows,
               burst.BurstParams().flat_spread)
    if shipped not in grid:
        grid.append(shipped)
    print(f"{len(drives)} drives in {len(clusters)} clusters, none behind a bucket; {len(grid)} grid points "
          f"(fall ratio, shortest burst s, flat windows, their spread); every window taken as busy")
    # per grid point, per drive: (learned, candidate, warnings)
    found: dict = {}
    keep = burst.MIN_BURST_SECONDS
    try:
        for point in grid:
            burst.MIN_BURST_SECONDS = point[1]
            p = params(point)
            found[point] = {k: run_drive(rows, p) for k, rows in drives.items()}
    finally:
        burst.MIN_BURST_SECONDS = keep

    def falsely(point, cluster) -> tuple[int, int, int, int]:
        mine = [v for k, v in found[point].items() if k[0] == cluster]
        return (sum(1 for v in mine if v[0]), sum(1 for v in mine if v[1]), sum(v[2] for v in mine), len(mine))

    print("\nheld out: each cluster judged with the most sensitive point that learned no bucket on the other two")
    chosen = {}
    for held in clusters:
        train = [c for c in clusters if c != held]
        ok = [pt for pt in grid if all(falsely(pt, c)[0] == 0 and falsely(pt, c)[2] == 0 for c in train)]
        if not ok:
            print(f"  {held}: no grid point learns nothing on {', '.join(train)}")
            continue
        pt = ok[0]
        chosen[held] = pt
        b, c, w, n = falsely(pt, held)
        print(f"  {held}: chosen on {'+'.join(train)}: ratio {pt[0]}, burst {pt[1]:.0f} s, flat {pt[2]} within {pt[3]:.0%}; on its "
              f"{n} drives: buckets learned {b}, candidates left {c}, BurstCreditsLow raised {w}")
    print(f"\nshipped (ratio {shipped[0]}, burst {shipped[1]:.0f} s, flat {shipped[2]} within {shipped[3]:.0%}), per cluster")
    for cl in clusters:
        b, c, w, n = falsely(shipped, cl)
        print(f"  {cl}: {n} drives: buckets learned {b}, candidates left {c}, BurstCreditsLow raised {w}")
    print(f"\nsynthetic bucket volumes ({args.synthetic} seeded: baseline 100-3,000 IOPS, burst 2-10x, a bucket of "
          f"2-60 min at the burst rate, demand 60-100 % of the way to it, 10 % noise; held at its baseline within 2 %)")
    keep = burst.MIN_BURST_SECONDS
    try:
        for label, pt in [("shipped", shipped)] + [(f"chosen holding out {h}", pt) for h, pt in chosen.items()]:
            burst.MIN_BURST_SECONDS = pt[1]
            learned, warned, errors = run_synthetic(params(pt), range(args.synthetic))
            err = (f"time left off by median {100 * statistics.median(errors):.0f} %, worst "
                   f"{100 * max(errors):.0f} %") if errors else "no warning"
            print(f"  {label:28s} ratio {pt[0]}, burst {pt[1]:.0f} s, flat {pt[2]} within {pt[3]:.0%}: learned {learned}, warned before "
                  f"the second fall {warned} of {args.synthetic}; {err}")
    finally:
        burst.MIN_BURST_SECONDS = keep
    print(f"\n{time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
