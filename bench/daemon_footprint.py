"""CPU share and RSS of `iowarden run` beside node_exporter, on the same real loop devices, in one run.

    sudo .venv/bin/python bench/daemon_footprint.py [--devices 64,1024] [--seconds 60] [--hotplug 960 [--hotplug-seconds 240]]

For each size: N loop devices over sparse files are attached (made here, detached at the end), then both
daemons start fresh and are scraped once a second with gzip, as Prometheus at 1 Hz would. Both do the
per-device work: node_exporter's diskstats collector is told to include loop devices (its default drops
them, and then its side does none), iowarden samples them at 1 Hz. iowarden's tracer is off (node_exporter
has none; bench/tracer_overhead.py measures it), SMART on. With --hotplug K, K more devices are attached
while both run, and each one's CPU over the next --hotplug-seconds is printed: in all, its settled share (the
last minute), the burst's own CPU above that share, and when its 15 s average last exceeded 1.5x the settled
share: a burst of uevents, an HBA reset in small.
Needs root and prometheus-node-exporter (apt-get install prometheus-node-exporter).
"""
import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from _support import attach_loops, detach_loops, free_port, node_exporter_or_exit, unit_environment

CLK_TCK = os.sysconf("SC_CLK_TCK")
# node_exporter's default less `loop`: RAM disks, floppies and partitions (iowarden samples whole devices)
NODE_EXCLUDE = r"^(ram|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$"


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK   # utime + stime


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scrape(port: int) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
        return len(gzip.decompress(raw) if r.headers.get("Content-Encoding") == "gzip" else raw)


def start_both(work: str) -> tuple[dict, dict]:
    port_i, port_n = free_port(), free_port()
    cfg = os.path.join(work, "config.toml")
    with open(cfg, "w") as f:
        f.write(f'[daemon]\nstate_dir = "{work}/state"\nlog_level = "warning"\n[sampler]\ninterval_seconds = 1.0\n'
                f'[prometheus]\nlisten_address = "127.0.0.1:{port_i}"\n[tracer]\nenabled = false\n')
    iow = subprocess.Popen([sys.executable, "-m", "iowarden.daemon.cli", "run", "-c", cfg], env=unit_environment(),
                           stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "iowarden.log"), "w"))
    nex = subprocess.Popen([shutil.which("prometheus-node-exporter") or "node_exporter",
                            f"--web.listen-address=127.0.0.1:{port_n}",
                            f"--collector.diskstats.device-exclude={NODE_EXCLUDE}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"iowarden": iow, "node_exporter": nex}, {"iowarden": port_i, "node_exporter": port_n}


def scrape_all(ports: dict, sizes: dict) -> None:
    for name, port in ports.items():
        try:
            sizes[name] = scrape(port)
        except OSError:
            pass


def steady(procs: dict, ports: dict, seconds: float) -> dict:
    """Each one's CPU share and peak RSS over `seconds`, scraped every second."""
    t_end = time.monotonic() + 15
    while time.monotonic() < t_end:   # start-up and imports are not steady state; both answering first
        sizes: dict = {}
        scrape_all(ports, sizes)
        if len(sizes) == len(ports):
            break
        time.sleep(1)
    time.sleep(5)
    start = {n: cpu_seconds(p.pid) for n, p in procs.items()}
    peak = {n: 0.0 for n in procs}
    sizes = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        tick = time.monotonic()
        scrape_all(ports, sizes)
        for n, p in procs.items():
            peak[n] = max(peak[n], rss_mib(p.pid))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    elapsed = time.monotonic() - t0
    return {n: {"cpu": (cpu_seconds(p.pid) - start[n]) / elapsed, "rss": peak[n], "bytes": sizes.get(n, 0)}
            for n, p in procs.items()}


def hotplug(work: str, procs: dict, ports: dict, count: int, seconds: float,
            profile_top: int = 0) -> tuple[dict, list, float]:
    """Each one's CPU over `seconds` from the first of `count` attaches: (CPU s in all, its settled share over
    the last minute, the CPU s above that share: the burst's own cost, seconds until quiet); with profile_top,
    py-spy samples iowarden meanwhile (30 s) and its top frames are printed."""
    recorder, raw = None, os.path.join(work, "hotplug-profile.txt")
    if profile_top:
        spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        recorder = subprocess.Popen([spy, "record", "-p", str(procs["iowarden"].pid), "-d", "30", "-r", "50",
                                     "-f", "raw", "-o", raw, "--nonblocking", "--threads"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
    start = {n: cpu_seconds(p.pid) for n, p in procs.items()}
    t0 = time.monotonic()
    os.makedirs(os.path.join(work, "hot"))
    extra = attach_loops(os.path.join(work, "hot"), count)
    attached_s = time.monotonic() - t0
    # each second's CPU, for a fixed time: "quiet" is judged against where each settles with the new devices
    # (its share over the last minute), not its share before them, which a process at 16x the devices never
    # falls back to (neither was ever "quiet", and both were charged ten minutes)
    last, per_second = dict(start), {n: [] for n in procs}
    while time.monotonic() - t0 < seconds:
        tick = time.monotonic()
        scrape_all(ports, {})
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        for n, p in procs.items():
            now = cpu_seconds(p.pid)
            per_second[n].append(now - last[n])
            last[n] = now
    used = {}
    for n, cpu in per_second.items():
        settled = sum(cpu[-60:]) / len(cpu[-60:])
        # over 15 s: the passive detector's step every window is its routine, not the burst
        smooth = [sum(cpu[i:i + 15]) / 15 for i in range(len(cpu) - 14)]
        busy = [i + 15 for i, x in enumerate(smooth) if x > max(1.5 * settled, settled + 0.02)]
        total = last[n] - start[n]
        used[n] = (total, settled, max(0.0, total - settled * len(cpu)), busy[-1] if busy else 0)
    if recorder is not None:
        recorder.wait(timeout=120)
        from profile_parts import shares
        total, inclusive, own = shares(open(raw).read())
        print(f"\niowarden during the hotplug: {total} samples at 50 Hz over 30 s")
        for title, counts in (("inclusive", inclusive), ("self", own)):
            print(f"-- {title}")
            for frame, n in counts.most_common(profile_top):
                print(f"{n:7} {n / max(total, 1):6.1%}  {frame}")
    return used, extra, attached_s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--devices", default="64,1024")
    ap.add_argument("--hotplug", type=int, default=0, help="devices attached while both run, at the last size")
    ap.add_argument("--hotplug-seconds", type=float, default=240.0,
                    help="how long both are watched after the attaches (the last minute is where they settle)")
    ap.add_argument("--profile-hotplug", type=int, default=0, metavar="N",
                    help="py-spy over iowarden during the hotplug: print its N top frames")
    args = ap.parse_args()
    node_exporter_or_exit()
    sizes = [int(n) for n in args.devices.split(",")]
    rows = []
    for i, n in enumerate(sizes):
        work = tempfile.mkdtemp(prefix="iowarden-bench-")
        loops, procs, extra = [], {}, []
        try:
            loops = attach_loops(work, n)
            in_diskstats = len([ln for ln in open("/proc/diskstats") if ln.split()[2].startswith("loop")])
            procs, ports = start_both(work)
            got = steady(procs, ports, args.seconds)
            rows.append((n, in_diskstats, got))
            if args.hotplug and i == len(sizes) - 1:
                used, extra, attached_s = hotplug(work, procs, ports, args.hotplug, args.hotplug_seconds,
                                                  args.profile_hotplug)
                print(f"\nhotplug: {args.hotplug} loop devices attached in {attached_s:.1f} s beside {n}, both running;"
                      f" {args.hotplug_seconds:.0f} s watched")
                print(f"{'':16}{'CPU s in all':>14}{'settled %':>11}{'burst CPU s':>13}{'quiet after s':>15}")
                for name, (cpu, settled, burst, quiet) in used.items():
                    print(f"{name:16}{cpu:>14.1f}{settled * 100:>11.2f}{burst:>13.1f}{quiet:>15.0f}")
                print(f"{'ratio':16}{used['iowarden'][0] / max(used['node_exporter'][0], 0.01):>13.1f}x"
                      f"{'':11}{used['iowarden'][2] / max(used['node_exporter'][2], 0.01):>12.1f}x")
        finally:
            for p in procs.values():
                p.terminate()
                p.wait(timeout=30)
            detach_loops(extra + loops)
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nsteady state, both scraped at 1 Hz with gzip, {args.seconds:.0f} s a size, iowarden's tracer off")
    print(f"{'loop devices added (in diskstats)':36}{'':4}{'iowarden':>12}{'node_exporter':>15}{'ratio':>8}")
    for n, in_ds, got in rows:
        i, x = got["iowarden"], got["node_exporter"]
        print(f"{f'{n} ({in_ds})':36}{'CPU %':>4}{i['cpu'] * 100:>12.2f}{x['cpu'] * 100:>15.2f}"
              f"{i['cpu'] / max(x['cpu'], 1e-9):>7.2f}x")
        print(f"{'':36}{'RSS':>4}{i['rss']:>9.1f} MiB{x['rss']:>11.1f} MiB{i['rss'] / max(x['rss'], 1e-9):>7.2f}x")
        print(f"{'':36}{'body':>4}{i['bytes'] / 1e6:>10.2f} MB{x['bytes'] / 1e6:>12.2f} MB"
              f"{i['bytes'] / max(x['bytes'], 1):>7.2f}x")


if __name__ == "__main__":
    main()
