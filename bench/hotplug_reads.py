"""The device view read for a burst of hot-added disks: only the disks the burst named, beside a read of
every device (what each burst cost before the handler diffed), on a fake host's /sys (bench/_fake_host.py). No root.

    .venv/bin/python bench/hotplug_reads.py [--disks 1024] [--added 960] [--burst 240]

`--added` disks arrive in bursts of `--burst` uevents (960 loop devices attached in 3.8 s came as four
bursts of a second); each burst's read is timed both ways, from the view before it.
"""
import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fake_host import disk_name, make_tree  # noqa: E402

from iowarden.probes import blockqueue  # noqa: E402
from iowarden.probes.common import Roots  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--disks", type=int, default=1024)
    ap.add_argument("--added", type=int, default=960)
    ap.add_argument("--burst", type=int, default=240)
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="iowarden-hotplug-")
    try:
        return run(base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(base: str, args) -> int:
    make_tree(base, args.disks + args.added)
    roots = Roots.under(base)
    new = [disk_name(i) for i in range(args.disks, args.disks + args.added)]
    held = Path(base) / "not-yet"
    held.mkdir()
    for name in new:      # not attached yet: each burst brings its disks into /sys
        (Path(base) / "sys" / "block" / name).rename(held / name)
    view = blockqueue.read_sysfs_and_superblocks(roots)
    named_s = full_s = 0.0
    for start in range(0, len(new), args.burst):
        burst = frozenset(new[start:start + args.burst])
        for name in burst:
            (held / name).rename(Path(base) / "sys" / "block" / name)
        t0 = time.process_time()
        after = blockqueue.read_sysfs_and_superblocks(roots, view, burst)
        named_s += time.process_time() - t0
        t0 = time.process_time()
        whole = blockqueue.read_sysfs_and_superblocks(roots)
        full_s += time.process_time() - t0
        assert after == whole, "the burst's read differs from a read of every device"
        view = after
    print(f"{args.added} disks added to {args.disks} in bursts of {args.burst}: CPU seconds of the device reads")
    print(f"  {'only the disks each burst named (iowarden)':<48} {named_s:8.3f}")
    print(f"  {'every device, each burst (the reference: before)':<48} {full_s:8.3f}")
    print(f"  ratio {named_s / full_s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
