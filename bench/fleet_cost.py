"""What the fleet rules cost at 10,000 volumes, beside the per-host rules, in one real Prometheus.

    .venv/bin/python bench/fleet_cost.py [--volumes 10000] [--class-size 100] [--history-minutes 245]

A fleet of one-volume hosts, `class-size` volumes a class, each exporting what a daemon exports for the fleet
(iowarden_fleet_slowdown_ratio, iowarden_volume_class_info, iowarden_probe_iops of one profile and direction,
iowarden_fleet_normal_latency_seconds in three octaves of load);
one volume in a hundred runs three times its normal, the rest about theirs. The last `history-minutes` of those
series, and of the per-volume recordings the rules' evidence reads back over its hour and its four hours
(iowarden:fleet_slowdown:spreads and the probes' and own normal's spreads, as the rules record them), are written as OpenMetrics and turned into blocks with
promtool; a Prometheus of its own starts on them with packaging/prometheus/iowarden.fleet.rules.yml and
iowarden.rules.yml and scrapes the same fleet live from this process (honor_labels: each series keeps its host),
so every evaluation reads four hours of history as it would in steady state.

Printed, after three evaluations of each group: each group's evaluation time (prometheus_rule_group_last_duration
_seconds: the per-host groups are the reference, in the same run), the series per volume, the alerts firing (the
outliers the fleet holds, as a check that the rules did their whole work), and the server's heap and RSS against
the same server on the same data with no rule files (the second part of the run). The figure at 100,000 volumes is
extrapolated linearly (every rule is a pass over the class's series; `quantile by (class)` sorts within a class).
No root; the servers are this run's, stopped by pid.
"""
import argparse
import json
import math
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._support import free_port, stop_session, wait_ready  # noqa: E402

RULES = Path(__file__).resolve().parents[1] / "packaging" / "prometheus"
FLEET_RULES, HOST_RULES = RULES / "iowarden.fleet.rules.yml", RULES / "iowarden.rules.yml"
SLOW_EVERY = 100          # one volume in this many is three times its normal
PROBE_IOPS = 3000.0
NORMAL_OCTAVES = (8, 9, 10)   # the three octaves of load a volume exports its own normal in (the daemon's most)


class Fleet:
    """Every volume's labels and its current values, moved a little each scrape."""

    def __init__(self, volumes: int, class_size: int, seed: int = 7):
        self.rng = random.Random(seed)
        self.volumes = [{"instance": f"host{i:06d}:29110", "job": "iowarden", "device": "nvme1n1",
                         "volume": f"nvme-eui.{i:016x}", "class": f"class{i // class_size:04d}"}
                        for i in range(volumes)]
        self.slow = {i for i in range(volumes) if i % SLOW_EVERY == SLOW_EVERY // 2}

    def ratio(self, i: int) -> float:
        base = 3.0 if i in self.slow else 1.0
        return base * math.exp(self.rng.gauss(0.0, 0.08))

    def iops(self, i: int) -> float:
        base = PROBE_IOPS / (3.0 if i in self.slow else 1.0)
        return base * math.exp(self.rng.gauss(0.0, 0.05))

    def normal_seconds(self, i: int, octave: int) -> float:
        """Its own normal in an octave of load: the class's (a millisecond an octave up from 0.5 ms), three
        times that for a slow volume, a few per cent apart otherwise."""
        base = 0.0005 * 2 ** (octave - NORMAL_OCTAVES[0]) * (3.0 if i in self.slow else 1.0)
        return base * math.exp(self.rng.gauss(0.0, 0.03))


def _labels(d: dict) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def _own(v: dict) -> dict:
    return {k: v[k] for k in ("instance", "job", "device", "volume")}


def history(fleet: Fleet, path: Path, start: float, minutes: int) -> int:
    """OpenMetrics of the series and the evidence recordings, a sample a minute; returns the samples written."""
    n = 0
    with open(path, "w") as f:
        # OpenMetrics wants each family's samples together: one family at a time, every volume, every minute
        families = [
            ("iowarden_fleet_slowdown_ratio", lambda i, v: (_own(v), fleet.ratio(i))),
            ("iowarden_volume_class_info", lambda i, v: ({**_own(v), "class": v["class"], "source": "config"}, 1.0)),
            ("iowarden_probe_iops", lambda i, v: ({**_own(v), "target": "db", "profile": "rr", "direction": "read"},
                                                  fleet.iops(i))),
            # the recordings the hour-long evidence reads back: here as the rules would have recorded them
            ("iowarden:fleet_slowdown:spreads", lambda i, v: (v, math.log(fleet.ratio(i)) / 0.15)),
            ("iowarden:fleet_probe:spreads", lambda i, v: (v, -math.log(fleet.iops(i) / PROBE_IOPS) / 0.15)),
            ("iowarden:fleet_normal:spreads", lambda i, v: (v, (math.log(3.0) if i in fleet.slow else 0.0) / 0.05)),
        ]
        for name, value in families:
            f.write(f"# TYPE {name} gauge\n")
            for i, v in enumerate(fleet.volumes):
                for m in range(minutes):
                    labels, x = value(i, v)
                    f.write(f"{name}{{{_labels(labels)}}} {x:.6g} {start + 60 * m:.0f}\n")
                    n += 1
        name = "iowarden_fleet_normal_latency_seconds"
        f.write(f"# TYPE {name} gauge\n")
        for i, v in enumerate(fleet.volumes):
            for octave in NORMAL_OCTAVES:
                labels = _labels({**_own(v), "direction": "read", "load_unit": "iops", "load_octave": str(octave)})
                for m in range(minutes):
                    f.write(f"{name}{{{labels}}} {fleet.normal_seconds(i, octave):.6g} {start + 60 * m:.0f}\n")
                    n += 1
        f.write("# EOF\n")
    return n


def live_text(fleet: Fleet) -> bytes:
    out = []
    for i, v in enumerate(fleet.volumes):
        own = _labels(_own(v))
        out.append(f"iowarden_fleet_slowdown_ratio{{{own}}} {fleet.ratio(i):.6g}")
        out.append(f'iowarden_volume_class_info{{{own},class="{v["class"]}",source="config"}} 1')
        out.append(f'iowarden_probe_iops{{{own},target="db",profile="rr",direction="read"}} {fleet.iops(i):.6g}')
        for octave in NORMAL_OCTAVES:
            out.append(f'iowarden_fleet_normal_latency_seconds{{{own},direction="read",load_unit="iops",'
                       f'load_octave="{octave}"}} {fleet.normal_seconds(i, octave):.6g}')
    return ("\n".join(out) + "\n").encode()


def serve(fleet: Fleet) -> tuple[ThreadingHTTPServer, int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = live_text(fleet)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


class Prometheus:
    def __init__(self, where: Path, blocks: Path, target_port: int, rule_files: list[Path]):
        self.port = free_port()
        data = where / "tsdb"
        shutil.copytree(blocks, data)
        cfg = where / "prometheus.yml"
        rules = "".join(f"  - {r}\n" for r in rule_files)
        cfg.write_text("global:\n  scrape_interval: 15s\n  evaluation_interval: 1m\n"
                       + (f"rule_files:\n{rules}" if rules else "")
                       + f"scrape_configs:\n  - job_name: fleet\n    honor_labels: true\n    scrape_timeout: 14s\n"
                         f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n")
        self.log = open(where / "prometheus.log", "w")
        self.proc = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data}",
                                      f"--web.listen-address=127.0.0.1:{self.port}",
                                      "--storage.tsdb.retention.time=30d"],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_ready(self.proc, f"http://127.0.0.1:{self.port}/-/ready", "prometheus", str(where / "prometheus.log"),
                   seconds=180)

    def query(self, expr: str) -> list:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=60) as r:
            return json.loads(r.read())["data"]["result"]

    def alerts_firing(self) -> dict[str, int]:
        """Firing alerts per alerting rule, as the rule manager holds them."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/rules?type=alert", timeout=60) as r:
            groups = json.loads(r.read())["data"]["groups"]
        out: dict[str, int] = {}
        for g in groups:
            for rule in g["rules"]:
                out[rule["name"]] = out.get(rule["name"], 0) + sum(1 for a in rule.get("alerts", ())
                                                                    if a.get("state") == "firing")
        return out

    def own_metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
            return r.read().decode()

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        stop_session(self.proc)


def _metric(text: str, name: str, **labels) -> list[tuple[dict, float]]:
    out = []
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        body, value = line.rsplit(" ", 1)
        got = dict(kv.split("=", 1) for kv in body[len(name) + 1:-1].split('",') if "=" in kv) \
            if body != name else {}
        got = {k: v.strip('"') for k, v in got.items()}
        if all(got.get(k) == v for k, v in labels.items()):
            out.append((got, float(value)))
    return out


def wait_evaluations(p: Prometheus, groups: int, times: int, timeout: float) -> str:
    """Prometheus's own metrics once every group has been evaluated `times` times."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = p.own_metrics()
        counts = [v for _, v in _metric(text, "prometheus_rule_group_iterations_total")]
        if len(counts) >= groups and min(counts) >= times:
            return text
        time.sleep(5)
    raise SystemExit(f"the rule groups were not evaluated {times} times in {timeout:.0f} s")


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--volumes", type=int, default=10000)
    ap.add_argument("--class-size", type=int, default=100)
    ap.add_argument("--history-minutes", type=int, default=245)
    ap.add_argument("--keep", help="keep the run's files here (default: a temporary directory, removed)")
    a = ap.parse_args()
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            raise SystemExit(f"needs {tool} (apt-get install prometheus)")
    where = Path(a.keep or tempfile.mkdtemp(prefix="iowarden-fleet-cost-"))
    where.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(a.volumes, a.class_size)
    server, target_port = serve(fleet)
    try:
        end = math.floor(time.time() / 60) * 60 - 120     # the history ends before the live scrapes begin
        t0 = time.monotonic()
        samples = history(fleet, where / "history.om", end - 60 * a.history_minutes, a.history_minutes)
        made = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(where / "history.om"),
                               str(where / "blocks")], capture_output=True, text=True)
        if made.returncode != 0:
            raise SystemExit(f"promtool: {made.stderr[-2000:]}")
        (where / "history.om").unlink()
        print(f"{a.volumes:,} volumes in {a.volumes // a.class_size} classes of {a.class_size}; "
              f"{samples:,} samples of {a.history_minutes} min history in {time.monotonic() - t0:.0f} s")

        ruled = Prometheus(where / "with-rules", where / "blocks", target_port, [FLEET_RULES, HOST_RULES])
        try:
            groups = len(_metric(ruled.own_metrics(), "prometheus_rule_group_rules"))
            text = wait_evaluations(ruled, groups, 3, timeout=600)
            rows = sorted(_metric(text, "prometheus_rule_group_last_duration_seconds"),
                          key=lambda r: -r[1])
            firing = ruled.alerts_firing()
            recorded = ruled.query('count({__name__=~"iowarden:fleet.*"})')
            exported = ruled.query('count({__name__=~"iowarden_fleet_slowdown_ratio|iowarden_volume_class_info'
                                   '|iowarden_probe_iops|iowarden_fleet_normal_latency_seconds"})')
            heap_rules = _metric(ruled.own_metrics(), "go_memstats_heap_inuse_bytes")
            rss_rules = ruled.rss_bytes()
        finally:
            ruled.stop()
        bare = Prometheus(where / "no-rules", where / "blocks", target_port, [])
        try:
            time.sleep(45)    # three scrapes of the live fleet, as the ruled server had
            heap_bare = _metric(bare.own_metrics(), "go_memstats_heap_inuse_bytes")
            rss_bare = bare.rss_bytes()
        finally:
            bare.stop()

        print("\nrule group evaluation time (last evaluation), slowest first:")
        for labels, seconds in rows:
            group = labels.get("rule_group", "?").rsplit(";", 1)[-1]
            file = Path(labels.get("rule_group", "?").split(";")[0]).name
            print(f"  {group:<22} {file:<28} {seconds * 1e3:9.1f} ms")
        fleet_s = sum(s for lab, s in rows if FLEET_RULES.name in lab.get("rule_group", ""))
        host_s = sum(s for lab, s in rows if HOST_RULES.name in lab.get("rule_group", ""))
        print(f"  the fleet file: {fleet_s:.2f} s a minute at {a.volumes:,} volumes "
              f"(~{fleet_s * 100_000 / a.volumes:.1f} s at 100,000, of its 60 s interval); the per-host file "
              f"(reference, same server): {host_s:.2f} s")
        n_exported = float(exported[0]["value"][1]) if exported else 0.0
        n_recorded = float(recorded[0]["value"][1]) if recorded else 0.0
        print(f"series: {n_exported / a.volumes:.1f} exported and {n_recorded / a.volumes:.2f} recorded per volume "
              f"(fleet recordings, with the per-class ones spread over the volumes)")
        print("alerts firing:", ", ".join(f"{name} {n}" for name, n in sorted(firing.items()) if n) or "none",
              f"(the fleet holds {len(fleet.slow)} volumes three times their normal)")
        hr = heap_rules[0][1] if heap_rules else 0.0
        hb = heap_bare[0][1] if heap_bare else 0.0
        print(f"memory: heap in use {_gib(hr)} with the rules, {_gib(hb)} without (reference); "
              f"RSS {_gib(rss_rules)} vs {_gib(rss_bare)}")
    finally:
        server.shutdown()
        if not a.keep:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
