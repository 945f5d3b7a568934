"""Each part's step against its deadline, RSS and /metrics size at 64, 1,024 and 4,000 disks (a fake host's
/proc and /sys, bench/_fake_host.py), so the cost per device shows. Optionally with M discovered targets.

    .venv/bin/python bench/scale_parts.py [--disks 64,1024,4000] [--seconds 90] [--targets 10000] [--node-exporter]

The daemon runs as its own process over the fake tree, its tracer off (bpftrace on fake disks measures
nothing), SMART on (smartctl is asked about each fake disk and answers that it cannot open it: the cost of
asking is real). The reference printed beside each figure is the bound it must stay within: the part's
deadline, the unit's MemoryHigh (512 MiB). No root needed. With --node-exporter, node_exporter runs beside it over
the same tree (--path.procfs, --path.sysfs, --path.udev.data), only its diskstats collector on (the other
collectors would read this machine's, or nothing), scraped as often with gzip: the reference for the per-disk
work, at sizes no machine here can attach as loop devices.
"""
import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from _fake_host import MovingDiskstats, make_tree  # noqa: E402
from _support import free_port, node_exporter_path, unit_environment  # noqa: E402

NODE_EXCLUDE = r"^(ram|loop|fd|nvme\d+n\d+p)\d+$"   # node_exporter's default, less the sd/vd/hd partitions' rule

MEMORY_HIGH_MIB = 512
RUNNER = ("import sys\nfrom iowarden.probes.common import Roots\nfrom iowarden.daemon import runtime\n"
          "try:\n    d = runtime.Daemon(sys.argv[1], Roots.under(sys.argv[2]))\n"
          "except runtime.StartRefused as exc:\n    print(exc, file=sys.stderr); sys.exit(exc.code)\n"
          "sys.exit(d.run())\n")
# --allocations: the same, with tracemalloc on from the start; at the stop the lines that hold the most memory
RUNNER_TRACED = ("import sys, tracemalloc\ntracemalloc.start(1)\n" + RUNNER.replace(
    "sys.exit(d.run())\n", "code = d.run()\nsnap = tracemalloc.take_snapshot()\n"
    "print('ALLOCATIONS total %.1f MiB' % (sum(s.size for s in snap.statistics('filename')) / 2**20), file=sys.stderr)\n"
    "for st in snap.statistics('lineno')[:int(sys.argv[3])]:\n"
    "    print('ALLOCATIONS %8.1f KiB %8d blocks  %s' % (st.size / 1024, st.count, st.traceback[0]), file=sys.stderr)\n"
    "sys.exit(code)\n"))


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> tuple[bytes, int]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
        return (gzip.decompress(raw) if r.headers.get("Content-Encoding") == "gzip" else raw), len(raw)


def gauges(body: str, name: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf'^{name}{{part="([^"]+)"}} (\S+)$', body, re.M)}


def start_node_exporter(tree: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    exporter = node_exporter_path()
    if not exporter:
        raise SystemExit("--node-exporter needs prometheus-node-exporter (apt-get install prometheus-node-exporter)")
    return subprocess.Popen([exporter, f"--web.listen-address=127.0.0.1:{port}", f"--path.procfs={tree}/proc",
                             f"--path.sysfs={tree}/sys", f"--path.udev.data={tree}/run/udev/data",
                             "--collector.disable-defaults", "--collector.diskstats",
                             f"--collector.diskstats.device-exclude={NODE_EXCLUDE}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port


def run(disks: int, seconds: float, targets: int, allocations: int = 0, node_exporter: bool = False) -> dict:
    work = tempfile.mkdtemp(prefix=f"iowarden-scale-{os.getpid()}-")
    proc = nex = None
    try:
        tree = os.path.join(work, "root")
        names = make_tree(tree, disks, mounts=targets)
        port = free_port()
        cfg = os.path.join(work, "config.toml")
        # probes of 1 MiB for 0.2 s: the tree's directories share the bench machine's disk, and run one at a time
        discover = (f'[[discover]]\nname = "vol"\nmountpoints = ["{tree}/srv/*"]\nfstypes = ["xfs"]\n'
                    f'profiles = ["rr"]\ninterval_seconds = 86400.0\n[profiles.rr]\nrw = "randread"\nsize = "1MiB"\n'
                    f'runtime_seconds = 0.2\nramp_time_seconds = 0.0\n[limits]\nmin_free_ratio = 0.0\n'
                    if targets else "")
        with open(cfg, "w") as f:
            f.write(f'[daemon]\nstate_dir = "{work}/state"\nlog_level = "warning"\n'
                    f'[prometheus]\nlisten_address = "127.0.0.1:{port}"\n[tracer]\nenabled = false\n'
                    f'[smart]\nenabled = true\n{discover}')
        with MovingDiskstats(tree, names):
            started = time.monotonic()
            argv = [sys.executable, "-c", RUNNER_TRACED, cfg, tree, str(allocations)] if allocations else \
                [sys.executable, "-c", RUNNER, cfg, tree]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, env=unit_environment(),
                                    stderr=open(os.path.join(work, "daemon.log"), "w"))
            if node_exporter:
                nex, nex_port = start_node_exporter(tree)
            first = None
            peak_rss, sizes, longest, deadline = 0.0, [], {}, {}
            cpu0 = nex_cpu0 = None
            nex_rss, nex_bytes = 0.0, 0
            while time.monotonic() - started < seconds:
                if proc.poll() is not None:
                    raise SystemExit(f"the daemon exited: {open(os.path.join(work, 'daemon.log')).read()[-2000:]}")
                peak_rss = max(peak_rss, rss_mib(proc.pid))
                if nex is not None:
                    try:
                        nex_bytes = len(scrape(nex_port)[0])
                        nex_cpu0 = nex_cpu0 or (cpu_seconds(nex.pid), time.monotonic())
                    except OSError:
                        pass
                    nex_rss = max(nex_rss, rss_mib(nex.pid))
                try:
                    body, zipped = scrape(port)
                except OSError:
                    time.sleep(0.5)
                    continue
                if first is None:
                    first = time.monotonic() - started
                    cpu0 = (cpu_seconds(proc.pid), time.monotonic())
                text = body.decode()
                sizes.append((len(body), zipped))
                longest.update(gauges(text, "iowarden_part_longest_duration_seconds"))
                deadline.update(gauges(text, "iowarden_part_deadline_seconds"))
                time.sleep(2.0)
            cpu = (cpu_seconds(proc.pid) - cpu0[0]) / (time.monotonic() - cpu0[1]) if cpu0 else float("nan")
            nex_cpu = (cpu_seconds(nex.pid) - nex_cpu0[0]) / (time.monotonic() - nex_cpu0[1]) if nex_cpu0 else None
            t0 = time.monotonic()
            proc.terminate()
            code = proc.wait(timeout=60)
            stop_seconds = time.monotonic() - t0
        log_text = open(os.path.join(work, "daemon.log")).read()
        return {"disks": disks, "targets": targets, "first_scrape_s": first, "rss_mib": peak_rss, "cpu": cpu,
                "nex": (nex_cpu, nex_rss, nex_bytes) if nex_cpu is not None else None,
                "metrics_bytes": max(s for s, _ in sizes) if sizes else 0,
                "metrics_gzip_bytes": max(z for _, z in sizes) if sizes else 0,
                "longest": longest, "deadline": deadline, "stop_s": stop_seconds, "exit": code,
                "allocations": [line for line in log_text.splitlines() if line.startswith("ALLOCATIONS")],
                "stuck_lines": log_text.count("parts not completing"), "tracebacks": log_text.count("Traceback"),
                "first_traceback": log_text[log_text.find("Traceback") - 300:][:3000] if "Traceback" in log_text else ""}
    finally:
        for p in (proc, nex):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--disks", default="64,1024,4000")
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--targets", type=int, default=0, help="mounted XFS filesystems a [[discover]] rule matches")
    ap.add_argument("--node-exporter", action="store_true", help="node_exporter beside it over the same tree")
    ap.add_argument("--allocations", type=int, default=0,
                    help="run under tracemalloc (slower, larger) and print the N lines holding the most memory")
    args = ap.parse_args()
    results = [run(int(n), args.seconds, args.targets, args.allocations, args.node_exporter)
               for n in args.disks.split(",")]
    parts = sorted({p for r in results for p in r["deadline"]})
    print(f"fake host, {args.seconds:.0f} s a size, tracer off, {args.targets} discovered targets")
    print(f"{'':32}" + "".join(f"{r['disks']:>14} disks" for r in results))
    print(f"{'RSS peak MiB (MemoryHigh 512)':32}" + "".join(f"{r['rss_mib']:>20.1f}" for r in results))
    print(f"{'  per disk KiB':32}" + "".join(f"{r['rss_mib'] * 1024 / r['disks']:>20.1f}" for r in results))
    print(f"{'CPU % of a core':32}" + "".join(f"{r['cpu'] * 100:>20.1f}" for r in results))
    print(f"{'  per disk us/s':32}" + "".join(f"{r['cpu'] * 1e6 / r['disks']:>20.1f}" for r in results))
    if all(r["nex"] for r in results):
        print(f"{'node_exporter RSS peak MiB':32}" + "".join(f"{r['nex'][1]:>20.1f}" for r in results))
        print(f"{'node_exporter CPU % of a core':32}" + "".join(f"{r['nex'][0] * 100:>20.1f}" for r in results))
        print(f"{'ratio RSS / CPU':32}" + "".join(f"{r['rss_mib'] / max(r['nex'][1], 0.1):>12.2f}x / "
                                                  f"{r['cpu'] / max(r['nex'][0], 1e-4):.2f}x" for r in results))
        print(f"{'node_exporter /metrics bytes':32}" + "".join(f"{r['nex'][2]:>20}" for r in results))
    print(f"{'/metrics bytes (gzip)':32}" + "".join(f"{r['metrics_bytes']:>11} ({r['metrics_gzip_bytes']:>6})"
                                                    for r in results))
    print(f"{'first /metrics after start s':32}" + "".join(f"{r['first_scrape_s']:>20.2f}" for r in results))
    print(f"{'SIGTERM to exit s (exit code)':32}" + "".join(f"{r['stop_s']:>15.2f} ({r['exit']})" for r in results))
    print(f"{'watchdog withheld (lines)':32}" + "".join(f"{r['stuck_lines']:>20}" for r in results))
    print(f"{'tracebacks':32}" + "".join(f"{r['tracebacks']:>20}" for r in results))
    for r in results:
        if r["first_traceback"]:
            print(f"first traceback at {r['disks']} disks:\n{r['first_traceback']}")
    print("longest step s / deadline s, per part:")
    for p in parts:
        cells = []
        for r in results:
            lo, dl = r["longest"].get(p), r["deadline"].get(p)
            mark = " OVER" if lo is not None and dl and lo > dl else ""
            cells.append(f"{lo if lo is not None else float('nan'):>10.3f} / {dl or 0:>5.0f}{mark:>2}")
        print(f"  {p:30}" + "".join(f"{c:>20}" for c in cells))
    for r in results:
        if r["allocations"]:
            print(f"what holds memory at {r['disks']} disks (tracemalloc, at the stop):")
            print("\n".join("  " + line.removeprefix("ALLOCATIONS ") for line in r["allocations"]))


if __name__ == "__main__":
    main()
