"""`iowarden replay --prometheus`: the passive detector over node_exporter's disk counters kept in a server.

One disk history (tests/integration/disk_history.py) is written as `iowarden iostat --json` lines and as
node_exporter's series, backfilled into a real Prometheus (promtool's OpenMetrics backfill) and imported into
a real VictoriaMetrics: replay over each server names exactly the drives and intervals that `replay
--passive` names on the file, node-mixin's NodeDiskIOSaturation fires where a queue is merely deep, and the
server's refusals (credentials, a cap on samples per query), a wrong URL, no server at all and a window
without data each get their own answer. A live node_exporter on two loop volumes, scraped every second while
one is throttled, is replayed as well.
"""
from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack

import bcrypt
import pytest

from tests.integration import servers
from tests.integration.disk_history import synthetic
from tests.integration.helpers import free_port, wait_for
from tests.integration.test_passive import iops_cap, stacked_volume, workload

CLI = [sys.executable, "-m", "iowarden.daemon.cli"]
PASSWORD = "tr0ub4dor-never-printed"


def replay(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "replay", *args], capture_output=True, text=True, timeout=timeout)


def intervals(found: list[dict]) -> list[tuple]:
    return sorted((i["device"], i["kind"], i["start"], i["end"], i["severity"]) for i in found)


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    """The history, eight hours ago: its iostat file, a Prometheus holding it (basic auth, and at most 20,000
    samples a query), and a VictoriaMetrics holding it. Yields (history, file, prometheus port, vm port)."""
    tmp = tmp_path_factory.mktemp("history")
    start = (int(time.time()) // 15) * 15 - 8 * 3600
    h = synthetic(seed=59, start=start)
    # a second host of the fleet, healthy (its own noise, its own re-created drive and gap)
    healthy = synthetic(seed=60, start=start, slow=False, instance="db-2:9100")
    lines = tmp / "iostat.jsonl"
    lines.write_text(h.iostat_lines())
    (tmp / "iostat-2.jsonl").write_text(healthy.iostat_lines())
    (tmp / "history.om").write_text(h.openmetrics()[:-len("# EOF\n")] + healthy.openmetrics())
    tsdb = tmp / "tsdb"
    made = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(tmp / "history.om"),
                           str(tsdb)], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    web = tmp / "web.yml"
    web.write_text("basic_auth_users:\n  replayer: "
                   + bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode() + "\n")
    cfg = tmp / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    prom_port, vm_port = free_port(), free_port()
    with ExitStack() as stack:
        prom = servers.Server(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tsdb}",
                               f"--web.listen-address=127.0.0.1:{prom_port}", f"--web.config.file={web}",
                               "--query.max-samples=20000", "--storage.tsdb.retention.time=30d"],
                              f"http://127.0.0.1:{prom_port}/-/ready", str(tmp / "prometheus.log"),
                              # its readiness is behind the basic auth too
                              ready_headers={"Authorization": "Basic " + base64.b64encode(
                                  f"replayer:{PASSWORD}".encode()).decode()})
        stack.callback(prom.stop)
        vm = servers.victoria_metrics(tmp / "vm", vm_port, str(tmp / "vm.log"))
        stack.callback(vm.stop)
        req = urllib.request.Request(f"http://127.0.0.1:{vm_port}/api/v1/import/prometheus",
                                     data=(h.prometheus_text() + healthy.prometheus_text()).encode(), method="POST")
        urllib.request.urlopen(req, timeout=120).read()
        urllib.request.urlopen(f"http://127.0.0.1:{vm_port}/internal/force_flush", timeout=30).read()
        # searchable about a second after the flush
        wait_for(lambda: servers.query(vm_port, "count(node_disk_info)", at=h.end)["data"]["result"], timeout=30,
                 what="the history searchable in VictoriaMetrics")
        yield h, lines, prom_port, vm_port, tmp / "iostat-2.jsonl"


def test_the_servers_history_gives_the_verdicts_of_the_iostat_file(backfilled, tmp_path):
    h, lines, prom_port, vm_port, healthy_lines = backfilled
    expected = json.loads(replay("--passive", str(lines), "--json").stdout)
    # the history's slow drive named, and only it (the deep but steady dm-0 and the re-created sdb are not)
    assert {i["device"] for i in expected} == {h.slow[0]}, expected
    assert all(h.slow[1] <= i["start"] <= h.slow[2] for i in expected), (expected, h.slow)
    assert json.loads(replay("--passive", str(healthy_lines), "--json").stdout) == []
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    window = ["--from", f"{h.start:.0f}", "--to", f"{h.end:.0f}", "--json"]
    for name, url, auth in (("Prometheus", f"http://127.0.0.1:{prom_port}",
                             ["--basic-auth-user", "replayer", "--password-file", str(secret)]),
                            ("VictoriaMetrics", f"http://127.0.0.1:{vm_port}", [])):
        r = replay("--prometheus", url, *auth, *window)
        assert r.returncode == 0, (name, r.stderr[-3000:])
        assert PASSWORD not in r.stdout + r.stderr
        out = json.loads(r.stdout)
        host, other = out["hosts"]
        # the healthy host: nothing from iowarden, as from its file; node-mixin on its deep dm-0 all the same
        assert other["instance"] == "db-2:9100" and other["alerts"] == [], other["alerts"]
        assert {f["device"] for f in other["node_mixin"]["firings"]} == {"dm-0"}
        assert host["instance"] == h.instance and host["devices"] == ["dm-0", "sda", "sdb", "sdc", "sdd"]
        assert host["peers"] == [["sda", "sdb", "sdc", "sdd"]], host["peers"]
        assert intervals(host["alerts"]) == intervals(expected), (name, host["alerts"], expected)
        # node-mixin pages on the queue alone: the healthy, steady dm-0, and from 30 minutes in
        firings = host["node_mixin"]["firings"]
        assert {f["device"] for f in firings} == {"dm-0"}, (name, firings)
        assert firings[0]["start"] >= h.start + 1800
        print(f"{name}: {len(host['alerts'])} iowarden alerts {intervals(host['alerts'])}, node-mixin {firings}")
    plots = tmp_path / "plots"
    text = replay("--prometheus", f"http://127.0.0.1:{vm_port}", "--from", f"{h.start:.0f}", "--to", f"{h.end:.0f}",
                  "--plot", str(plots))
    assert text.returncode == 0, text.stderr
    print(text.stdout)
    # the named drive's await against its peers', the alert shaded: a PNG and an SVG, nothing for the others
    assert sorted(p.name for p in plots.iterdir()) == [f"db-1_9100_{h.slow[0]}.png", f"db-1_9100_{h.slow[0]}.svg"]
    assert (plots / f"db-1_9100_{h.slow[0]}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{h.instance}: 5 disks" in text.stdout and "db-2:9100: 5 disks" in text.stdout
    # how many firings the scrape gap makes of node-mixin's one run on dm-0 is the server's rate() (one or two)
    assert re.search(rf"node-mixin NodeDiskIOSaturation: \d+ firings on 1 disks \(dm-0\); iowarden: {len(expected)} "
                     rf"alerts on 1 disks \({h.slow[0]}\)", text.stdout), text.stdout
    assert re.search(rf"2 hosts: node-mixin \d+ firings, iowarden {len(expected)} alerts", text.stdout), text.stdout


def test_a_refusal_a_wrong_url_no_server_and_no_data_each_say_what_is_wrong(backfilled, tmp_path):
    h, _, prom_port, _, _ = backfilled
    url = f"http://127.0.0.1:{prom_port}"
    window = ["--from", f"{h.start:.0f}", "--to", f"{h.end:.0f}"]
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")

    r = replay("--prometheus", url, *window)
    assert r.returncode == 2 and "refused the request (HTTP 401): it wants credentials" in r.stderr, r.stderr
    r = replay("--prometheus", url, "--basic-auth-user", "replayer", "--password-file", str(wrong), *window)
    assert r.returncode == 2 and "HTTP 401): the credentials given were not accepted" in r.stderr, r.stderr
    assert "not-the-password" not in r.stderr + r.stdout
    # the password on the command line, where `ps` shows it, is refused before anything is sent
    r = replay("--prometheus", f"http://replayer:{PASSWORD}@127.0.0.1:{prom_port}", *window)
    assert r.returncode == 2 and "carries credentials" in r.stderr and PASSWORD not in r.stderr, r.stderr

    closed = free_port()
    began = time.monotonic()
    r = replay("--prometheus", f"http://127.0.0.1:{closed}", "--retries", "2", *window)
    assert r.returncode == 2 and f"cannot read http://127.0.0.1:{closed}/api/v1/" in r.stderr \
        and "(2 tries)" in r.stderr, r.stderr
    assert time.monotonic() - began < 30

    # a window before the history: nothing there, said so
    auth = ["--basic-auth-user", "replayer", "--password-file", str(secret)]
    r = replay("--prometheus", url, *auth, "--from", f"{h.start - 7200:.0f}", "--to", f"{h.start - 3600:.0f}")
    assert r.returncode == 2 and "no node_exporter disk series" in r.stderr, r.stderr
    r = replay("--prometheus", url, *auth, "--instance", "nobody:9100", *window)
    assert r.returncode == 2 and "no disk counters for nobody:9100" in r.stderr, r.stderr

    # the server's cap of 20,000 samples a query: 10,000 scrapes of 40 series is refused, and the replay asks
    # for fewer at a time until it is not (the verdicts are those of the first test, read in more pieces)
    r = replay("--prometheus", url, *auth, *window, "--instance", h.instance, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hosts"][0]["alerts"], r.stdout


def test_a_live_node_exporter_names_the_throttled_volume(tmp_path):
    """node_exporter (Debian's) on two loop volumes in RAM, scraped every second by Prometheus, while one is
    capped to a quarter of its load: the replay over those minutes names it, and not the other."""
    with ExitStack() as stack:
        lower_a, a = stack.enter_context(stacked_volume(in_ram=True))
        lower_b, b = stack.enter_context(stacked_volume(in_ram=True))
        ne_port = free_port()
        ne = servers.Server(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ne_port}",
                             "--collector.disable-defaults", "--collector.diskstats",
                             # loop devices are excluded by default (and 1.5 takes no include beside an
                             # exclude): every device, and the scrape below keeps the test's own two
                             "--collector.diskstats.device-exclude="],
                            f"http://127.0.0.1:{ne_port}/metrics", str(tmp_path / "node_exporter.log"))
        stack.callback(ne.stop)
        prom_port = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: node
    static_configs:
      - targets: ['127.0.0.1:{ne_port}']
    metric_relabel_configs:
      - source_labels: [device]
        regex: '{a.name}|{b.name}'
        action: keep
""")
        prom = servers.Server(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}"], f"http://127.0.0.1:{prom_port}/-/ready",
                              str(tmp_path / "prometheus.log"))
        stack.callback(prom.stop)
        url = f"http://127.0.0.1:{prom_port}"

        # a URL that is an HTTP server but no query API: node_exporter's own
        r = replay("--prometheus", f"http://127.0.0.1:{ne_port}", "--retries", "1")
        assert r.returncode == 2 and "does not answer as a Prometheus query API" in r.stderr, r.stderr

        stack.enter_context(workload(a.mountpoint, 400, 600, rw="randread"))
        stack.enter_context(workload(b.mountpoint, 400, 600, rw="randread"))
        began = time.time()
        time.sleep(60)
        capped = time.time()
        stack.enter_context(iops_cap(lower_b.major_minor, 100))

        def named():
            r = replay("--prometheus", url, "--from", f"{began:.0f}", "--to", "now", "--scrape-interval", "1s",
                       "--window", "5", "--json")
            assert r.returncode == 0, r.stderr[-3000:]
            host = json.loads(r.stdout)["hosts"][0]
            return host if {i["device"] for i in host["alerts"]} >= {b.name} else None
        host = wait_for(named, timeout=300, what=f"the replay naming {b.name}")
        print(json.dumps(host["alerts"], indent=1))
        assert sorted(host["devices"]) == sorted([a.name, b.name]) and host["peers"] == [sorted([a.name, b.name])]
        assert {i["device"] for i in host["alerts"]} == {b.name}, host["alerts"]
        assert all(i["start"] >= capped for i in host["alerts"]), (capped, host["alerts"])
