"""The detector's figures on the synthetic trace suite (tests/traces.py), over many seeds.

    .venv/bin/python bench/detector_traces.py [--seeds 200]
Prints detection delay (median, p90, worst) for step changes, drift and burst-credit
exhaustion, probes to clear after a recovery (full or partial), false alarms per
1000 probes on stable traces, and spike shapes that must never alert.
"""
import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests import traces  # noqa: E402

from iowarden.daemon.verdicts.detect import Detector  # noqa: E402


def first_raise(vals, metric):
    d = Detector(metric)
    for i, v in enumerate(vals):
        if d.update(v).changed == "raised":
            return i
    return None


def recovery(level, seed, back_to):
    """IOPS halved for 60 probes after 300, then back at `back_to` of normal: the probes from
    the recovery to the clear (None: still open) and how many times it was raised."""
    d = Detector("read_iops")
    raises, cleared_at = 0, None
    for i, v in enumerate(traces.halve_then_recover(level, seed, back_to)):
        changed = d.update(v).changed
        raises += changed == "raised"
        if changed == "cleared" and i >= 360 and cleared_at is None:
            cleared_at = i - 359
    return cleared_at, raises


def summary(delays, never="never detected"):
    got = sorted(d for d in delays if d is not None)
    missed = len(delays) - len(got)
    if not got:
        return never
    return (f"median {statistics.median(got):g}, p90 {got[int(len(got) * 0.9) - 1]}, worst {got[-1]}"
            + (f", missed {missed}" if missed else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=200)
    n = ap.parse_args().seeds
    print(f"detector on synthetic traces, {n} seeds each (delays in probes after the change)")
    for level in ("low", "high"):
        print(f"\nnoise level {level} (sigma of log value {traces.NOISE_LEVELS[level]}, AR(1) phi {traces.AR_PHI})")
        for name, factor, metric, hi, base in (("IOPS halve", 0.5, "read_iops", False, 1e4),
                                               ("p99 triples", 3.0, "clat_p99_seconds", True, 0.002)):
            delays = []
            for s in range(n):
                i = first_raise(traces.step(300, 60, factor, level, s, base, hi), metric)
                delays.append(None if i is None or i < 300 else i - 299)
            print(f"  {name:<28} {summary(delays)}")
        delays = []
        for s in range(n):
            i = first_raise(traces.drift(300, 288, 300, 2.0, level, s), "clat_p99_seconds")
            delays.append(None if i is None or i < 300 else i - 299)
        print(f"  {'latency 2x over a day (288)':<28} {summary(delays)}")
        delays = []
        for s in range(n):
            vals, empty = traces.burst_credits(1200, level, s)
            i = first_raise(vals, "read_iops")
            delays.append(None if i is None or i < empty else i - empty + 1)
        print(f"  {'burst credits exhausted':<28} {summary(delays)}")
        for after in (1.0, 0.9, 0.75):
            got = [recovery(level, s, after) for s in range(n)]
            flaps = sum(r > 1 for _, r in got)
            print(f"  {f'halved, back to {after:.0%}: clear':<28} {summary([c for c, _ in got], 'never cleared (still degraded)')}"
                  f"{f', raised again in {flaps}' if flaps else ''}")
        for metric, hi in (("read_iops", False), ("clat_p99_seconds", True)):
            probes = alarms = 0
            for s in range(n // 4):
                d = Detector(metric)
                for v in traces.stable(4000, level, 10000 + s, worse_is_higher=hi):
                    alarms += d.update(v).changed == "raised"
                    probes += 1
            print(f"  stable {metric:<21} {alarms} false alarms in {probes} probes "
                  f"({alarms / probes * 1000:.4f} per 1000)")
    rng = random.Random(1)
    # a single spike never alerts, whatever its size; two or more in a row do only as a collapse (10x worse
    # than normal and 2.5x beyond anything seen: minutes of it, confirmed by the next probe)
    for shape, count, factors in (("single spike", 1, (3, 10, 100, 1e6)), ("pair < 10x", 2, (2.5, 3, 5, 8)),
                                  ("4 spikes in 10 < 10x", 4, (2.5, 3, 5, 8)), ("pair >= 10x", 2, (10, 100, 1e6))):
        alarms = 0
        for s in range(n):
            vals = traces.stable(400, "low", s, spike_rate=0)
            pos = [300, 301] if count == 2 else ([300] if count == 1 else rng.sample(range(300, 310), 4))
            factor = rng.choice(factors)
            for p in pos:
                vals[p] /= factor
            alarms += first_raise(vals, "read_iops") is not None
        print(f"{shape:<22} alerts in {alarms} of {n} traces")
    print("\ntime to detect a collapse (probes after it; x the probe interval: 120 s by default)")
    for factor in (10, 3, 1.5):
        delays = []
        for s in range(n):
            vals = traces.step(300, 100, 1 / factor, "high", s)
            i = first_raise(vals, "read_iops")
            delays.append(None if i is None else i - 300 + 1)
        got = sorted(d for d in delays if d is not None)
        print(f"  IOPS / {factor:<4}  probes to raise: median {statistics.median(got) if got else '-'}, worst "
              f"{got[-1] if got else '-'} ({len(got)} of {n} raised; {statistics.median(got) * 120 / 60:.0f} min at "
              f"120 s)" if got else f"  IOPS / {factor}: never raised")


if __name__ == "__main__":
    main()
