"""Run-to-run spread of probes on an idle loop-mounted XFS image: 10 runs, coefficient of variation.

Needs root (creates a loop device and mounts it; both are removed at the end):
    sudo .venv/bin/python bench/probe_spread.py [--runs 10] [--runtime 3] [--direct-io]

--direct-io: the loop device reads its image with O_DIRECT, so the probes measure the disk
under the image instead of the loop worker over the page cache (what the agreement tests use).
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import LoopXfs  # noqa: E402  (the same real-device helper the tests use)

from iowarden.probes.fio_job import ProbeProfile  # noqa: E402
from iowarden.probes.fio_run import ProbeLimits, run_probe  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--runtime", type=float, default=3.0)
    ap.add_argument("--direct-io", action="store_true")
    args = ap.parse_args()
    profiles = [
        ProbeProfile("randread-4k-qd32", rw="randread", iodepth=32, size_bytes=256 << 20,
                     runtime_seconds=args.runtime, ramp_time_seconds=1),
        ProbeProfile("randwrite-4k-qd32", rw="randwrite", iodepth=32, size_bytes=256 << 20,
                     runtime_seconds=args.runtime, ramp_time_seconds=1),
        ProbeProfile("randread-4k-qd8", rw="randread", iodepth=8, size_bytes=256 << 20,
                     runtime_seconds=args.runtime, ramp_time_seconds=1),
        ProbeProfile("randread-4k-qd1", rw="randread", iodepth=1, ioengine="psync", size_bytes=256 << 20,
                     runtime_seconds=args.runtime, ramp_time_seconds=1),
    ]
    limits = ProbeLimits(min_free_bytes=1 << 20, min_free_ratio=0)
    fs = LoopXfs("2G", direct_io=args.direct_io)
    try:
        print(f"{args.runs} runs of {args.runtime:g} s each on {fs.device} (XFS on a loop device "
              f"{'with direct I/O to its image' if args.direct_io else 'over the page cache'}, idle)")
        print(f"{'profile':<20} {'mean IOPS':>10} {'CV IOPS':>8} {'mean p50 us':>12} {'CV p50':>7} {'CV p99':>7}")
        for prof in profiles:
            run_probe("bench", str(fs.mountpoint), prof, limits)  # lay out and warm once
            iops, p50, p99 = [], [], []
            for _ in range(args.runs):
                r = run_probe("bench", str(fs.mountpoint), prof, limits)
                if not r.ok:
                    raise SystemExit(f"probe failed: {r.error}")
                d = "write" if "write" in prof.rw else "read"
                iops.append(r.iops(d))
                p50.append(r.clat_percentile_seconds(50.0))
                p99.append(r.clat_percentile_seconds(99.0))

            def cv(xs):
                return statistics.pstdev(xs) / statistics.mean(xs) * 100

            print(f"{prof.name:<20} {statistics.mean(iops):>10.0f} {cv(iops):>7.1f}% "
                  f"{statistics.mean(p50) * 1e6:>12.1f} {cv(p50):>6.1f}% {cv(p99):>6.1f}%")
    finally:
        fs.close()


if __name__ == "__main__":
    main()
