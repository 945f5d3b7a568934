"""The real fail-slow traces through both servers: `iowarden replay --prometheus` against a real Prometheus and a
real VictoriaMetrics holding the traces as node_exporter's disk counters, beside `iowarden replay --passive` on
the same counters as `iowarden iostat --json` lines.

    .venv/bin/python bench/replay_perseus_servers.py [--data ../shared/data/perseus-dev] [--hosts cluster_A/host_22,...]

DATA is the data set's own layout (`cluster_X/host_N/DAY.csv` with `slow_drive_info.csv` beside the clusters), or
a directory holding that layout as `*.tar.xz` with the labels file beside it (the development sample): the same
command runs on any part of the data set.

Each host's trace is made into /proc/diskstats counters once (a row's throughput over its 15 s as 4 KiB reads,
its mean latency as each read's time: so iostat's r_await is the row's latency and r/s its throughput over 4 KiB;
the time busy and the queue, which the traces do not carry, at zero, so the rules that need them, a volume at
its limit and the burst bucket, are not exercised here (tests/integration/test_replay_prometheus.py's history
has them); a row with a missing value is a scrape that did not happen for that drive), and from those counters into three
things: the iostat lines the host would have printed (the product's own diskstats.rates_between over each pair
of scrapes, at most three scrapes apart, as the server path pairs them), an OpenMetrics file that `promtool tsdb
create-blocks-from openmetrics` backfills into a Prometheus of this run's, and the exposition text
VictoriaMetrics imports. The drives of a host are one model (its cluster's): peers, on every path.

Printed: per cluster and in all, for each path, drives named, precision and recall at the drive level against the
data set's labels, and the hours of each slow drive's trace before its first alert (median and worst); then
whether each server's alert intervals are exactly the file's, host by host (the first difference where not), and
how long each step took. The detector's parameters are the shipped ones, which were tuned on this sample: the
figures are in sample (bench/passive_perseus.py gives the held-out ones).
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._support import free_port, stop_session, wait_ready  # noqa: E402
from bench.fleet_perseus import Victoria, read_data  # noqa: E402

from iowarden.probes.diskstats import DiskCounters, DiskSample, rates_between  # noqa: E402
from tests.integration.disk_history import NODE_EXPORTER_COUNTERS  # noqa: E402

ROW_SECONDS = 15.0
REQUEST_BYTES = 4096
PAIR_SECONDS = 3 * ROW_SECONDS      # replay --prometheus's GAP_SCRAPES at this scrape interval
CLI = [sys.executable, "-m", "iowarden.daemon.cli"]


def instance_of(cluster: str, host: str) -> str:
    return f"{cluster}-{host}:9100"


def counters(rows) -> list[tuple[float, DiskCounters]]:
    """One drive's rows [(ts, throughput B/s, latency us)] as its /proc/diskstats line at each row present."""
    out, total_bytes, total_ms = [], 0.0, 0.0
    for ts, tput, lat in rows:
        if tput is None or lat is None:
            continue
        total_bytes += tput * ROW_SECONDS
        total_ms += tput * ROW_SECONDS / REQUEST_BYTES * lat / 1000
        reads, ms = round(total_bytes / REQUEST_BYTES), round(total_ms)
        # the traces say nothing of the time the drive was busy or of its queue: io_ms and weighted_io_ms stay
        # at zero rather than be made up from the 4 KiB (a queue of IOPS x latency read as a drive held at its
        # limit on every busy log drive of cluster J)
        out.append((float(ts), DiskCounters(major=8, minor=0, name="", reads=reads, sectors_read=reads * 8,
                                            read_ms=ms)))
    return out


def host_files(drives: dict, model: str, instance: str, where: Path) -> tuple[Path, Path, Path, int]:
    """(iostat lines, OpenMetrics, VictoriaMetrics text, samples) of one host's drives {disk: rows}."""
    lines, samples = [], 0
    om, vm = open(where / "host.om", "w"), open(where / "host.prom", "w")
    for disk, rows in sorted(drives.items()):
        points = counters(rows)
        for (t0, a), (t1, b) in zip(points, points[1:]):
            if t1 - t0 <= PAIR_SECONDS:
                r = rates_between(DiskSample(t0, {disk: a._replace(name=disk)}),
                                  DiskSample(t1, {disk: b._replace(name=disk)}))[disk]
                lines.append((t1, disk, json.dumps({"timestamp": t1, **r.as_sysstat(), "model": model})))
        base = f'device="{disk}",instance="{instance}",job="node"'
        for name, get in NODE_EXPORTER_COUNTERS:
            om.write("".join(f"{name}{{{base}}} {get(c)!r} {t:.3f}\n" for t, c in points))
            vm.write("".join(f"{name}{{{base}}} {get(c)!r} {round(t * 1000)}\n" for t, c in points))
        om.write("".join(f'node_disk_info{{{base},model="{model}"}} 1 {t:.3f}\n' for t, _ in points))
        vm.write("".join(f'node_disk_info{{{base},model="{model}"}} 1 {round(t * 1000)}\n' for t, _ in points))
        samples += 9 * len(points)
    om.write("# EOF\n")
    om.close()
    vm.close()
    path = where / "host.jsonl"
    path.write_text("\n".join(text for _, _, text in sorted(lines)) + "\n")
    return path, where / "host.om", where / "host.prom", samples


class Prometheus:
    def __init__(self, tsdb: Path, where: Path):
        self.port = free_port()
        cfg = where / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
        self.log = open(where / "prometheus.log", "w")
        self.proc = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tsdb}",
                                      f"--web.listen-address=127.0.0.1:{self.port}",
                                      "--storage.tsdb.retention.time=100y"],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_ready(self.proc, self.url + "/-/ready", "prometheus", str(where / "prometheus.log"))

    def stop(self) -> None:
        stop_session(self.proc)


def replay(*args) -> list:
    r = subprocess.run([*CLI, "replay", *args, "--json"], capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"replay {' '.join(args)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def intervals(found: list[dict]) -> list[tuple]:
    def at(t):
        return None if t is None else round(t, 3)   # an interval still open at the window's end has no end
    return sorted((i["device"], i["kind"], at(i["start"]), at(i["end"]) or 0.0, i["severity"]) for i in found)


def figures(name: str, found: dict, hours: dict, kinds: dict, slow: set, hosts: list) -> None:
    """Per cluster and in all: named, precision, recall, hours before the first alert."""
    for cluster in sorted({c for c, _ in hosts}) + ["all"]:
        mine = [(c, h) for c, h in hosts if cluster in ("all", c)]
        named = {(c, h, d) for c, h in mine for d in found[(c, h)]}
        labelled = {x for x in slow if (x[0], x[1]) in mine}
        right = named & labelled
        p = len(right) / len(named) if named else float("nan")
        r = len(right) / len(labelled) if labelled else float("nan")
        when = sorted(hours[(c, h)][d] for c, h, d in right)
        said = f"median {statistics.median(when):.1f} h, worst {when[-1]:.1f} h" if when else "none found"
        print(f"  {name:16s} {cluster:10s} named {len(named):3d}, slow {len(labelled):2d}: precision {p:.2f} "
              f"recall {r:.2f}; hours of trace before the first alert: {said}")
    counts = Counter((kind, "slow" if (c, h, d) in slow else "healthy")
                     for (c, h), named in kinds.items() if (c, h) in hosts for d, kind in named)
    print(f"  {name:16s} alerts by kind on slow and healthy drives: "
          + ", ".join(f"{k} {w} {n}" for (k, w), n in sorted(counts.items())))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "perseus-dev"))
    ap.add_argument("--hosts", help="comma-separated cluster_X/host_N: only these")
    args = ap.parse_args()
    t_start = time.monotonic()
    drives, slow = read_data(Path(args.data))
    by_host: dict = defaultdict(dict)
    for (cluster, host, disk), rows in drives.items():
        by_host[(cluster, host)][disk] = rows
    hosts = sorted(by_host)
    if args.hosts:
        wanted = {tuple(x.split("/")) for x in args.hosts.split(",")}
        hosts = [h for h in hosts if h in wanted]
        if not hosts:
            raise SystemExit(f"none of {args.hosts} in {args.data}")
    took: dict = defaultdict(float)
    took["read the data"] = time.monotonic() - t_start
    with tempfile.TemporaryDirectory(prefix="iowarden-perseus-servers-") as tmp:
        where = Path(tmp)
        tsdb = where / "tsdb"
        vm = Victoria(where)
        prom = None
        try:
            files, spans, total = {}, {}, 0
            for cluster, host in hosts:
                t = time.monotonic()
                host_dir = where / f"{cluster}-{host}"
                host_dir.mkdir()
                lines, om, text, n = host_files(by_host[(cluster, host)], cluster, instance_of(cluster, host),
                                                host_dir)
                total += n
                files[(cluster, host)] = lines
                stamps = [ts for rows in by_host[(cluster, host)].values() for ts, _, _ in rows]
                spans[(cluster, host)] = (min(stamps) - 60, max(stamps) + 60)
                took["counters made"] += time.monotonic() - t
                t = time.monotonic()
                made = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(om),
                                       str(tsdb)], capture_output=True, text=True, timeout=1800)
                if made.returncode != 0:
                    raise SystemExit(f"promtool on {cluster}/{host}: {made.stderr[-2000:]}")
                om.unlink()
                took["promtool backfill"] += time.monotonic() - t
                t = time.monotonic()
                with open(text, "rb") as f:
                    req = urllib.request.Request(vm.url + "/api/v1/import/prometheus", data=f, method="POST",
                                                 headers={"Content-Length": str(text.stat().st_size)})
                    urllib.request.urlopen(req, timeout=1800).read()
                text.unlink()
                took["VictoriaMetrics import"] += time.monotonic() - t
            vm.flush()
            t = time.monotonic()
            prom = Prometheus(tsdb, where)
            took["Prometheus start on the blocks"] += time.monotonic() - t
            time.sleep(2)     # VictoriaMetrics: searchable about a second after the flush
            print(f"{len(hosts)} hosts, {sum(len(by_host[h]) for h in hosts)} drives, {total:,} samples in each "
                  f"server")
            paths = {"file (--passive)": {}, "Prometheus": {}, "VictoriaMetrics": {}}
            for cluster, host in hosts:
                inst = instance_of(cluster, host)
                t = time.monotonic()
                paths["file (--passive)"][(cluster, host)] = replay("--passive", str(files[(cluster, host)]))
                took["replay --passive"] += time.monotonic() - t
                window = ["--instance", inst, "--from", f"{spans[(cluster, host)][0]:.0f}",
                          "--to", f"{spans[(cluster, host)][1]:.0f}"]
                for name, url in (("Prometheus", prom.url), ("VictoriaMetrics", vm.url)):
                    t = time.monotonic()
                    out = replay("--prometheus", url, *window)
                    took[f"replay --prometheus ({name})"] += time.monotonic() - t
                    mine = [h for h in out["hosts"] if h["instance"] == inst]
                    paths[name][(cluster, host)] = mine[0]["alerts"] if mine else []
            # hours of each drive's trace (its rows, 15 s each) before its first alert
            found, hours, kinds = {}, {}, {}
            for name, per_host in paths.items():
                found[name], hours[name] = {}, {}
                kinds[name] = {key: [(a["device"], a["kind"]) for a in alerts] for key, alerts in per_host.items()}
                for key, alerts in per_host.items():
                    first: dict = {}
                    for a in alerts:
                        first[a["device"]] = min(first.get(a["device"], a["start"]), a["start"])
                    found[name][key] = set(first)
                    hours[name][key] = {d: sum(1 for ts, _, _ in by_host[key][d] if ts <= s) * ROW_SECONDS / 3600
                                        for d, s in first.items()}
            print("\nper path: drives named against the data set's labels")
            for name in paths:
                figures(name, found[name], hours[name], kinds[name], slow, hosts)
            print("\nthe servers' intervals against the file's, host by host")
            for name in ("Prometheus", "VictoriaMetrics"):
                same = [k for k in hosts if intervals(paths[name][k]) == intervals(paths["file (--passive)"][k])]
                print(f"  {name}: the same alerts (device, kind, start, end, severity) on {len(same)} of "
                      f"{len(hosts)} hosts; {sum(len(paths[name][k]) for k in hosts)} alerts in all, the file "
                      f"{sum(len(paths['file (--passive)'][k]) for k in hosts)}")
                for k in hosts:
                    a, b = intervals(paths[name][k]), intervals(paths["file (--passive)"][k])
                    if a != b:
                        only_server = [x for x in a if x not in b][:2]
                        only_file = [x for x in b if x not in a][:2]
                        print(f"    {k[0]}/{k[1]}: only from the server {only_server}, only from the file {only_file}")
        finally:
            if prom is not None:
                prom.stop()
            vm.stop()
    print("\ntime taken, s")
    for step, seconds in took.items():
        print(f"  {step:34s} {seconds:8.1f}")
    print(f"  {'whole bench':34s} {time.monotonic() - t_start:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
