"""Steady-state CPU share and RSS of `iowarden run` sampling 64 devices at 1 Hz, beside node_exporter.

Both watch the same 64 real loop devices (made here, removed at the end) in the
same run; node_exporter is scraped once a second, as Prometheus would at 1 Hz.
Needs root and prometheus-node-exporter (apt-get install prometheus-node-exporter):
    sudo .venv/bin/python bench/daemon_footprint.py [--seconds 60]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from _support import attach_loops, detach_loops, free_port, node_exporter_or_exit

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK   # utime + stime


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--devices", type=int, default=64)
    args = ap.parse_args()
    exporter = node_exporter_or_exit()
    work = tempfile.mkdtemp(prefix="iowarden-bench-")
    loops, procs = [], []
    try:
        existing = len([ln for ln in open("/proc/diskstats") if " loop" in ln])
        loops = attach_loops(work, args.devices)
        cfg = os.path.join(work, "config.toml")
        with open(cfg, "w") as f:
            f.write(f'[daemon]\nstate_dir = "{work}/state"\n[sampler]\ninterval_seconds = 1.0\n')
        iow = subprocess.Popen([sys.executable, "-m", "iowarden.daemon.cli", "run", "-c", cfg],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = free_port()
        nex = subprocess.Popen([exporter, f"--web.listen-address=127.0.0.1:{port}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs = [iow, nex]
        time.sleep(10)  # start-up and imports are not steady state
        start = {p.pid: cpu_seconds(p.pid) for p in procs}
        t0 = time.monotonic()
        scrapes, peak = 0, {p.pid: 0.0 for p in procs}
        while time.monotonic() - t0 < args.seconds:
            tick = time.monotonic()
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            scrapes += 1
            for p in procs:
                peak[p.pid] = max(peak[p.pid], rss_mib(p.pid))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        elapsed = time.monotonic() - t0
        print(f"{args.devices} loop devices added ({existing + args.devices} loop devices in /proc/diskstats), "
              f"{elapsed:.0f} s measured, node_exporter scraped {scrapes} times ({len(body) >> 10} KiB each)")
        print(f"{'process':<34} {'CPU % of one core':>18} {'RSS MiB (peak)':>15}")
        for name, p in (("iowarden run (1 Hz sampling)", iow), ("prometheus-node-exporter @ 1 Hz", nex)):
            used = cpu_seconds(p.pid) - start[p.pid]
            print(f"{name:<34} {used / elapsed * 100:>17.2f}% {peak[p.pid]:>15.1f}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        detach_loops(loops)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
