"""What a Prometheus user computes from iowarden's counters, beside the reference tools.

A real Prometheus scrapes the daemon every 15 s while fio reads in bursts (2,000 I/Os, 16 at a time,
then 1.5 s idle) on one volume and the daemon probes another. Over one minute that starts at a scrape:
- the shipped recording rules' r/s, r_await and %util agree with `iostat -x 60` over the same minute
  within 2 % (1 s gauges scraped every 15 s could not: they keep one second in fifteen);
- histogram_quantile(0.99, rate(iowarden_probe_latency_seconds_bucket[...])) lies within fio's own p99
  range for the probes in that window (widened by one half-octave bucket each way: the histogram's
  buckets are that wide).
"""
import json
import math
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from iowarden.probes.common import kill_group
from tests.integration import servers
from tests.integration.helpers import config_text, free_port, own_devices, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]
RULES = Path(__file__).resolve().parents[2] / "packaging" / "prometheus" / "iowarden.rules.yml"
SCRAPE_SECONDS = 15


def recording_rule(record: str) -> str:
    """The shipped rule's expression over the minute that ends at the evaluation time.

    Its range is 61 s here, not 1m: scrape timestamps jitter by a few milliseconds (2-4 ms on this
    machine, past Prometheus' 2 ms alignment), so the scrape that began the minute can fall 2 ms
    outside a range of exactly 60 s, and rate() would then extrapolate the last 45 s to the minute.
    A second more takes in that scrape and nothing earlier (the one before is 15 s earlier); rate()
    then extrapolates by the 1 s of range before it, which divides out: the result is the counters'
    increase over the minute divided by its length, the formula the rule applies to its window."""
    rules = yaml.safe_load(RULES.read_text())
    expr = next(r["expr"] for g in rules["groups"] for r in g["rules"] if r.get("record") == record)
    assert "[1m]" in expr
    return expr.replace("[1m]", "[61s]")


def value_at(port: int, expr: str, at: float, device: str | None = None) -> float:
    res = servers.query(port, expr, at)
    assert res["status"] == "success", (expr, res)
    found = [r for r in res["data"]["result"] if device is None or r["metric"].get("device") == device]
    assert len(found) == 1, (expr, res["data"]["result"])
    return float(found[0]["value"][1])


def scrape_times(port: int, selector: str, at: float, seconds: int) -> list[float]:
    res = servers.query(port, f"{selector}[{seconds}s]", at)["data"]["result"]
    return [float(t) for t, _ in res[0]["values"]] if res else []


def test_recording_rules_agree_with_iostat_over_a_minute_and_the_histogram_p99_with_fio(
        direct_loop_xfs, loop_xfs, tmp_path, daemon_factory, request):
    bursts_fs = direct_loop_xfs   # disk-paced (O_DIRECT under the loop device): r_await is the disk's, not 0.03 ms
    dev = bursts_fs.name
    port = free_port()
    state = tmp_path / "state"
    # The probes run on a volume of their own. On the measured one, a probe's queue of reads (a few ms each,
    # beside the bursts' 0.5 ms) that iostat's minute and Prometheus' begin or end on different sides of
    # moved r_await by 4 %: iostat starts whenever its process gets the CPU, the scrapes on their own grid.
    devices = ", ".join(f'"{n}"' for n in sorted({*own_devices(bursts_fs.mountpoint),
                                                  *own_devices(loop_xfs.mountpoint)}))
    d = daemon_factory(config_text(loop_xfs.mountpoint, state, runtime=1.0, interval=10.0, port=port,
                                   extra="[budget]\ndevice_time_ratio = 1.0\n"
                                   "[scheduling]\ndefer_util_percent = 100.0\n"
                                   f"[sampler]\ndevices = [{devices}]\n"))
    d.wait_message("READY=1")
    prom, pport = servers.prometheus(tmp_path, port, rule_files=[RULES], interval=f"{SCRAPE_SECONDS}s")
    request.addfinalizer(prom.stop)
    work = bursts_fs.mountpoint / "bursts"
    work.mkdir(exist_ok=True)
    load = subprocess.Popen(
        ["fio", f"--directory={work}", "--name=bursts", "--rw=randread", "--bs=4k", "--size=64m", "--direct=1",
         "--ioengine=libaio", "--iodepth=16", "--time_based", "--runtime=240", "--thinktime=1500000",
         "--thinktime_blocks=2000", "--output=/dev/null"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        sel = f'iowarden_disk_reads_completed_total{{device="{dev}"}}'
        wait_for(lambda: servers.query(pport, sel)["data"]["result"], timeout=60, what="the counters in Prometheus")
        last = float(servers.query(pport, f"timestamp({sel})")["data"]["result"][0]["value"][1])
        # the minute starts at a scrape: the first one at least 3 s away (fio past its layout)
        start = last + SCRAPE_SECONDS * math.ceil((time.time() + 3 - last) / SCRAPE_SECONDS)
        time.sleep(max(0.0, start - time.time()))
        ref = subprocess.run(["iostat", "-d", "-x", "-y", "-o", "JSON", dev, "60", "1"], capture_output=True,
                             text=True, timeout=90, check=True)
        time.sleep(max(0.0, start + 60 + 2 - time.time()))   # the scrape at the minute's end is in
    finally:
        kill_group(load)
        load.wait()
    row = json.loads(ref.stdout)["sysstat"]["hosts"][0]["statistics"][0]["disk"][0]
    stamps = scrape_times(pport, sel, start + 60.5, 62)
    end = min(stamps, key=lambda t: abs(t - (start + 60)))
    assert abs(end - (start + 60)) < 0.1 and abs(stamps[0] - (end - 60)) < 0.1, stamps
    assert servers.query(pport, f"count_over_time({sel}[61s])", end)["data"]["result"][0]["value"][1] == "5"
    ours = {
        "r/s": value_at(pport, recording_rule("device:iowarden_disk_reads:rate1m"), end, dev),
        "r_await": 1000 * value_at(pport, recording_rule("device:iowarden_disk_read_await_seconds:rate1m"), end, dev),
        "util": 100 * value_at(pport, recording_rule("device:iowarden_disk_utilization:ratio_rate1m"), end, dev),
    }
    report = [f"{k}: iostat -x 60 {row[k]:.2f}, recording rule {v:.2f}" for k, v in ours.items()]
    print("\n".join(report))
    assert row["r/s"] > 50, "the bursts did not reach the device"
    for k, v in ours.items():
        # sysstat prints two decimals: 2 % or one unit in its last digit
        assert abs(v - row[k]) <= max(0.02 * row[k], 0.011), "\n".join(report)
    # the recorded series exist: Prometheus loaded and evaluated the shipped rules
    assert servers.query(pport, f'device:iowarden_disk_reads:rate1m{{device="{dev}"}}')["data"]["result"]

    # the probe histogram: the p99 of the probes of the last three minutes, from rate() of the cumulative buckets
    window = 180
    at = end
    hq = value_at(pport, 'histogram_quantile(0.99, sum by (le) (rate(iowarden_probe_latency_seconds_bucket'
                         f'{{profile="rr",direction="read"}}[{window}s])))', at)
    first = min(scrape_times(pport, 'iowarden_probe_latency_seconds_count{profile="rr",direction="read"}', at, window))
    with sqlite3.connect(state / "state.db") as db:
        p99s = [r[0] for r in db.execute(
            "SELECT clat_p99_seconds FROM probe_results WHERE ok = 1 AND profile = 'rr' "
            "AND started_at + duration_seconds BETWEEN ? AND ?", (first - 2, at + 2))]
    print(f"histogram p99 over {window} s: {hq * 1e6:.0f} us; fio's p99 of the {len(p99s)} probes: "
          f"{min(p99s) * 1e6:.0f}-{max(p99s) * 1e6:.0f} us")
    assert len(p99s) >= 5
    assert min(p99s) / math.sqrt(2) <= hq <= max(p99s) * math.sqrt(2)
