"""/metrics latency of iowarden (64 devices, every family on) beside node_exporter, same machine, same run.

    sudo .venv/bin/python bench/metrics_latency.py [--scrapes 200]
Makes 64 loop devices and a probe target on one of them (so probe, histogram,
baseline and XFS families are all present), waits for the first probes, then
times 200 sequential scrapes of each exporter. Removes everything it made.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from _support import attach_loops, detach_loops, free_port, node_exporter_or_exit


def timed_scrapes(url: str, n: int, gap: float = 0.0) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        size = len(urllib.request.urlopen(url, timeout=10).read())
        times.append(time.perf_counter() - t0)
        time.sleep(gap)
    return sorted(times), size


def clients_at(url: str, clients: int, hz: float, seconds: float) -> list[float]:
    """`clients` scrapers at `hz` each (gzip asked, as Prometheus does), for `seconds`: every scrape's time."""
    times: list[float] = []

    def run():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
            urllib.request.urlopen(req, timeout=10).read()
            times.append(time.perf_counter() - t0)
            time.sleep(max(0.0, 1 / hz - (time.perf_counter() - t0)))
    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(times)


def p99(t: list[float]) -> float:
    return t[max(0, int(len(t) * 0.99) - 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--devices", type=int, default=64)
    args = ap.parse_args()
    exporter = node_exporter_or_exit()
    work = tempfile.mkdtemp(prefix="iowarden-bench-")
    loops, procs, mnt = [], [], os.path.join(work, "mnt")
    try:
        loops = attach_loops(work, args.devices, first_size="512M")
        subprocess.run(["mkfs.xfs", "-q", "-f", loops[0]], check=True)
        os.mkdir(mnt)
        subprocess.run(["mount", loops[0], mnt], check=True)
        port = free_port()
        cfg = os.path.join(work, "config.toml")
        with open(cfg, "w") as f:
            f.write(f"""[daemon]
state_dir = "{work}/state"
[prometheus]
listen_address = "127.0.0.1:{port}"
[xfs]
interval_seconds = 60.0
[limits]
min_free_bytes = "1MiB"
min_free_ratio = 0.0
[budget]
device_time_ratio = 1.0
[profiles.rr]
size = "32MiB"
runtime_seconds = 1.0
ramp_time_seconds = 0.0
[profiles.rw]
rw = "randwrite"
size = "32MiB"
runtime_seconds = 1.0
ramp_time_seconds = 0.0
[[targets]]
name = "bench"
path = "{mnt}"
profiles = ["rr", "rw"]
interval_seconds = 3600.0
""")
        iow = subprocess.Popen([sys.executable, "-m", "iowarden.daemon.cli", "run", "-c", cfg],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        nport = free_port()
        nex = subprocess.Popen([exporter, f"--web.listen-address=127.0.0.1:{nport}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs = [iow, nex]
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # both profiles have run once: every family is on
            try:
                text = urllib.request.urlopen(url, timeout=5).read().decode()
                if text.count("iowarden_probe_latency_seconds_count{") >= 2:
                    break
            except OSError:
                pass
            time.sleep(1)
        else:
            raise SystemExit("iowarden did not report its probes in time")
        print(f"{args.devices} loop devices. back to back: {args.scrapes} sequential scrapes; fresh: 40 scrapes "
              "2.1 s apart (iowarden renders each anew: one render per snapshot); 4 clients at 20 Hz for 20 s")
        print(f"{'exporter':<26} {'back to back ms':>16} {'fresh render ms':>16} {'4 x 20 Hz ms':>14} "
              f"{'size KiB':>9}")
        print(f"{'':<26} {'median   p99':>16} {'median   p99':>16} {'median   p99':>14}")
        for name, u in (("iowarden", url), ("prometheus-node-exporter", f"http://127.0.0.1:{nport}/metrics")):
            timed_scrapes(u, 5)  # warm
            t, size = timed_scrapes(u, args.scrapes)
            # more than one snapshot apart (the core publishes every second): iowarden renders for each, as it
            # does for a Prometheus scraping every 15 s
            f, _ = timed_scrapes(u, 40, gap=2.1)
            c = clients_at(u, 4, 20.0, 20.0)
            print(f"{name:<26} {statistics.median(t) * 1e3:>7.2f} {p99(t) * 1e3:>7.2f} "
                  f"{statistics.median(f) * 1e3:>8.2f} {p99(f) * 1e3:>7.2f} "
                  f"{statistics.median(c) * 1e3:>6.2f} {p99(c) * 1e3:>7.2f} {size / 1024:>9.0f}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        if os.path.ismount(mnt):
            subprocess.run(["umount", mnt], check=False)
        detach_loops(loops)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
