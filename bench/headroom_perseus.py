"""The knee and the headroom the passive detector learns, day by day, on real drives' traces: is the figure
stable from one day to the next on a healthy drive?

    .venv/bin/python bench/headroom_perseus.py [--data ../shared/data/perseus-dev]

Each host of the Perseus development sample is replayed through the daemon's passive detector (as
bench/passive_perseus.py does: throughput as rkB/s, latency as r_await; the sample has no request counts, so
the curves, knees and peaks are in KiB/s). At the end of each trace day the bench reads every drive's view:
its knee (the load at which its learned median await reaches [passive] knee_multiple x its unloaded await)
or why there is none, and its headroom (the knee over the last half hour to hour's peak). Printed: per
drive, the knee of each day from the second on (the first is the curve still learning), its spread across
days (the largest over the smallest), the headroom's median, and the share of drive-days with no figure and
why; then the spread's distribution over the healthy drives beside the slow ones (labels.csv). The reference
in the same run: the same figures with the knee read at 3x instead of 2x, which should be as stable or more.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from passive_perseus import convert  # noqa: E402

from iowarden.daemon.passive.detector import PassiveDetector  # noqa: E402
from iowarden.daemon.passive.replay import parse_lines, trace_peer_groups, windows_of  # noqa: E402
from iowarden.daemon.passive.values import PassiveParams  # noqa: E402

DAY_SECONDS = 86400


def daily_knees(parsed, params: PassiveParams) -> dict[str, list[tuple]]:
    """drive -> [(day, knee load or None, headroom or None, why none)] at the end of each trace day."""
    detector = PassiveDetector(params)
    groups = trace_peer_groups(parsed)
    out: dict[str, list[tuple]] = defaultdict(list)
    day_end, day = None, 0
    for end, batch in windows_of(parsed, params.window_seconds):
        if day_end is None:
            day_end = end + DAY_SECONDS
        if end >= day_end:
            for v in detector.views():
                k = v.knee.get("read")
                if k is not None:
                    out[v.device].append((day, k.load, v.headroom_ratio.get("read"), k.why_none))
            day, day_end = day + 1, day_end + DAY_SECONDS
        detector.observe(batch, groups)
    return out


def spread(knees: list[float]) -> float | None:
    return max(knees) / min(knees) if len(knees) >= 2 and min(knees) > 0 else None


def report(hosts: dict, labels: set, params: PassiveParams, title: str) -> dict:
    print(f"\n== {title} (knee_multiple {params.knee_multiple:g})")
    print(f"{'drive':<34} {'knee KiB/s by day (day 2 on)':<60} spread  headroom p50  no figure")
    spreads = {"healthy": [], "slow": []}
    why = Counter()
    drive_days = figured = 0
    t0 = time.perf_counter()
    for host, parsed in sorted(hosts.items()):
        for drive, days in sorted(daily_knees(parsed, params).items()):
            later = days[1:]
            drive_days += len(later)
            knees = [k for _, k, _, _ in later if k is not None]
            figured += len(knees)
            why.update(w for _, k, _, w in later if k is None)
            rooms = [h for _, _, h, _ in later if h is not None]
            s = spread(knees)
            kind = "slow" if (host, drive) in labels else "healthy"
            if s is not None:
                spreads[kind].append(s)
            shown = " ".join(f"{k / 1024:.1f}M" if k is not None else "-" for _, k, _, _ in later)[:58]
            print(f"{host + ' ' + drive:<34} {shown:<60} {f'{s:.2f}' if s else '-':>6}  "
                  f"{f'{statistics.median(rooms):.1f}x' if rooms else '-':>12}  {len(later) - len(knees)}/{len(later)}"
                  + ("  (slow)" if kind == "slow" else ""))
    print(f"drive-days with a knee: {figured} of {drive_days}; without, why: "
          + ", ".join(f"{w} {n}" for w, n in why.most_common()))
    for kind, xs in spreads.items():
        if xs:
            xs = sorted(xs)
            p90 = xs[min(len(xs) - 1, math.ceil(0.9 * len(xs)) - 1)]   # nearest rank
            print(f"{kind} drives' knee spread across days (largest / smallest): n {len(xs)}, median "
                  f"{statistics.median(xs):.2f}, p90 {p90:.2f}, max {xs[-1]:.2f}")
    print(f"replayed in {time.perf_counter() - t0:.0f} s")
    return spreads


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "perseus-dev"))
    ap.add_argument("--hosts", help="only these hosts (e.g. cluster_A/host_20,cluster_J/host_9)")
    args = ap.parse_args()
    labels = set()
    with open(os.path.join(args.data, "labels.csv")) as f:
        for r in csv.DictReader(f):
            labels.add((f"{r['cluster']}/{r['host']}", r["disk"]))
    lines = convert(os.path.join(args.data, "perseus-dev.tar.xz"))
    wanted = set(args.hosts.split(",")) if args.hosts else set(lines)
    hosts = {h: parse_lines(h, "\n".join(ls)) for h, ls in lines.items() if h in wanted}
    params = PassiveParams()
    report(hosts, labels, params, "the shipped knee")
    report(hosts, labels, replace(params, knee_multiple=3.0), "reference: the knee at 3x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
