"""How long `iowarden replay --prometheus` takes over a fleet's month of disk history, and its peak memory.

    .venv/bin/python bench/replay_prometheus.py [--days 30] [--hosts 10] [--disks 10] [--scrape 15]

Writes node_exporter's disk counters for `hosts` x `disks` drives of one model over `days` (scraped every
`scrape` seconds; one drive of the first host three times slower from the middle of the window on) into a
real VictoriaMetrics of its own (its /api/v1/import/prometheus, host by host and day by day, so the bench
itself holds a day of one host at a time), then replays the whole window with the command as a user runs it,
timing it and taking its peak RSS (getrusage of the child). The reference, in the same run: the same
detector over the first host's history made into lines in memory (`replay --passive`'s path with no server),
so the figure shows what reading from the server adds. No root.
"""
import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._support import free_port  # noqa: E402

from iowarden.daemon.passive.replay import Line, PassiveReplay, WindowPooler  # noqa: E402
from iowarden.daemon.passive.values import PassiveParams  # noqa: E402

NAMES = ("node_disk_reads_completed_total", "node_disk_writes_completed_total", "node_disk_read_bytes_total",
         "node_disk_written_bytes_total", "node_disk_read_time_seconds_total", "node_disk_write_time_seconds_total",
         "node_disk_io_time_seconds_total", "node_disk_io_time_weighted_seconds_total")


def host_days(host: int, disks: int, start: float, days: int, scrape: float, seed: int):
    """(day, exposition text of that day, lines of the first host or None): counters kept across days."""
    rng = random.Random(seed * 1000 + host)
    totals = [[0.0] * 8 for _ in range(disks)]
    per_day = int(86400 / scrape)
    middle = start + days * 86400 / 2
    for day in range(days):
        out, lines = [], [] if host == 0 else None
        for i in range(per_day):
            t = start + (day * per_day + i) * scrape
            for d in range(disks):
                c = totals[d]
                slow = 3.0 if host == 0 and d == 1 and t >= middle else 1.0
                reads, writes = round(300 * scrape * (1 + 0.1 * (rng.random() - 0.5))), round(50 * scrape)
                read_s = reads * 0.0005 * slow * (1 + 0.1 * (rng.random() - 0.5))
                write_s = writes * 0.001 * slow
                inc = (reads, writes, reads * 4096, writes * 16384, read_s, write_s,
                       min(scrape, 0.9 * (read_s + write_s)), read_s + write_s)
                for k in range(8):
                    c[k] += inc[k]
                if lines is not None and i + day:
                    # the same increments as iostat's line of this scrape (the reference's input)
                    lines.append(Line(t, f"sd{chr(97 + d)}", "SYNTH", {
                        "r/s": reads / scrape, "w/s": writes / scrape, "rkB/s": reads * 4 / scrape,
                        "wkB/s": writes * 16 / scrape, "r_await": 1000 * read_s / reads,
                        "w_await": 1000 * write_s / writes, "aqu-sz": (read_s + write_s) / scrape,
                        "util": 100 * inc[6] / scrape}))
                ms = round(t * 1000)
                labels = f'device="sd{chr(97 + d)}",instance="host-{host}:9100",job="node"'
                out += [f"{n}{{{labels}}} {v!r} {ms}" for n, v in zip(NAMES, c)]
                if i == 0:
                    out.append(f'node_disk_info{{{labels},model="SYNTH"}} 1 {ms}')
        yield day, "\n".join(out) + "\n", lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--hosts", type=int, default=10)
    ap.add_argument("--disks", type=int, default=10, help="drives per host")
    ap.add_argument("--scrape", type=float, default=15.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="iowarden-bench-replay-")
    port = free_port()
    vm = subprocess.Popen(["victoria-metrics", f"-storageDataPath={work}/vm", f"-httpListenAddr=127.0.0.1:{port}",
                           "-retentionPeriod=100y", "-search.maxPointsPerTimeseries=100000"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.2)
        start = (int(time.time()) // 86400 - args.days - 1) * 86400
        began, samples = time.monotonic(), 0
        # the reference: the first host's lines through the same detector as they are made, timed alone
        reference = PassiveReplay(PassiveParams(), [tuple(f"sd{chr(97 + d)}" for d in range(args.disks))])
        pooler, reference_s, reference_windows = WindowPooler(PassiveParams().window_seconds, args.scrape), 0.0, 0
        for host in range(args.hosts):
            for day, text, lines in host_days(host, args.disks, start, args.days, args.scrape, args.seed):
                req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/import/prometheus", data=text.encode(),
                                             method="POST")
                urllib.request.urlopen(req, timeout=600).read()
                samples += text.count("\n")
                t0 = time.monotonic()
                reference.feed(pooler, lines or [])
                reference_s += time.monotonic() - t0
                reference_windows += len(lines or ())
        urllib.request.urlopen(f"http://127.0.0.1:{port}/internal/force_flush", timeout=60).read()
        time.sleep(2)
        print(f"history: {args.hosts} hosts x {args.disks} drives x {args.days} days at {args.scrape:g} s scrapes, "
              f"{samples:,} samples, written in {time.monotonic() - began:.0f} s")

        print(f"reference (the first host's lines through the detector in memory, no server): {reference_s:.1f} s "
              f"for {reference_windows:,} drive-windows ({reference_windows / max(reference_s, 1e-9):,.0f} a "
              f"second); named {sorted({(i['device'], i['kind']) for i in reference.intervals})}")

        t0 = time.monotonic()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        r = subprocess.run([sys.executable, "-m", "iowarden.daemon.cli", "replay", "--prometheus",
                            f"http://127.0.0.1:{port}", "--from", str(start), "--to",
                            str(start + args.days * 86400), "--scrape-interval", f"{args.scrape:g}s", "--json"],
                           capture_output=True, text=True)
        wall = time.monotonic() - t0
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if r.returncode != 0:
            raise SystemExit(f"replay failed ({r.returncode}): {r.stderr[-2000:]}")
        out = json.loads(r.stdout)
        windows = args.hosts * args.disks * args.days * 86400 / args.scrape
        named = {(h["instance"], a["device"], a["kind"]) for h in out["hosts"] for a in h["alerts"]}
        print(f"replay --prometheus: {wall:.0f} s for {args.hosts * args.disks} drives x {args.days} days "
              f"({windows / wall:,.0f} drive-windows a second, {wall / (args.hosts * args.disks):.1f} s a drive), "
              f"peak RSS {max(peak_kib, before) / 1024:.0f} MiB; named {sorted(named)}")
        print(f"node-mixin firings: {sum(len(h['node_mixin']['firings']) for h in out['hosts'])}")
    finally:
        os.killpg(vm.pid, 15)
        vm.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
