"""Where the daemon's CPU goes on a fake host of N disks: py-spy samples it while /metrics is scraped at 1 Hz.

    .venv/bin/python bench/profile_parts.py [--disks 1024] [--seconds 60] [--top 40]

The host is bench/_fake_host.py's (N whole disks of one model, counters moving every second), the daemon
its own process with the tracer off and SMART on, as bench/scale_parts.py runs it. Prints the share of
samples per function, counted once per stack (inclusive), and the functions that were on top (self).
Needs py-spy (in the venv: pip install py-spy) and ptrace rights over a child (root, or ptrace_scope 0).
"""
import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from _fake_host import MovingDiskstats, make_tree  # noqa: E402
from _support import free_port  # noqa: E402

RUNNER = ("import sys\nfrom iowarden.probes.common import Roots\nfrom iowarden.daemon import runtime\n"
          "sys.exit(runtime.Daemon(sys.argv[1], Roots.under(sys.argv[2])).run())\n")


def shares(raw: str) -> tuple[int, collections.Counter, collections.Counter]:
    """py-spy's raw output (one `frame;frame;... count` a line) -> total, inclusive and self counts."""
    total, inclusive, own = 0, collections.Counter(), collections.Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        frames = stack.split(";")
        for f in set(frames):
            inclusive[f] += int(n)
        own[frames[-1]] += int(n)
    return total, inclusive, own


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--disks", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    work = tempfile.mkdtemp(prefix="iowarden-profile-")
    proc = None
    try:
        tree = os.path.join(work, "root")
        names = make_tree(tree, args.disks)
        port = free_port()
        cfg = os.path.join(work, "config.toml")
        with open(cfg, "w") as f:
            f.write(f'[daemon]\nstate_dir = "{work}/state"\nlog_level = "warning"\n[prometheus]\n'
                    f'listen_address = "127.0.0.1:{port}"\n[tracer]\nenabled = false\n[smart]\nenabled = true\n')
        with MovingDiskstats(tree, names):
            proc = subprocess.Popen([sys.executable, "-c", RUNNER, cfg, tree],
                                    stderr=open(os.path.join(work, "daemon.log"), "w"))
            time.sleep(20)   # start-up and the first passes are not steady state
            out = os.path.join(work, "raw.txt")
            recorder = subprocess.Popen([spy, "record", "-p", str(proc.pid), "-d", str(args.seconds), "-r", "50",
                                         "-f", "raw", "-o", out, "--nonblocking"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"})
                urllib.request.urlopen(req, timeout=60).read()
                time.sleep(1)
            recorder.wait(timeout=120)
        total, inclusive, own = shares(open(out).read())
        print(f"{args.disks} disks, {args.seconds} s, {total} samples at 50 Hz "
              f"({total / 50 / args.seconds:.1%} of a core while sampled)")
        print("-- inclusive")
        for frame, n in inclusive.most_common(args.top):
            print(f"{n:7} {n / total:6.1%}  {frame}")
        print("-- self")
        for frame, n in own.most_common(20):
            print(f"{n:7} {n / total:6.1%}  {frame}")
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
