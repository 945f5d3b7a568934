"""A week on call, compressed: four volumes of one size under a messy but healthy workload
page nobody; one of them throttled to a third of its load pages within 5 minutes, names only itself and
a cause, clears within 5 minutes of the throttle's removal, and is one episode per alert.

The real pieces: four stacked loop XFS volumes (each on a loop device of its own, so a throttle of the lower
device slows the volume below its block layer, as a provisioned cap does; the lower images in RAM, so the
host's disk, which the rest of the suite shares, is not under them), one daemon with the shipped
example's four profiles, a real Prometheus scraping every 15 s with the shipped rules. The workload is
tests/integration/soak_mix.py. The schedule is compressed (probes every 60 s instead of 300 s, 5 s
passive windows, a day of 240 s); the rules are the shipped ones, untouched.

Twenty minutes of wall clock: the scenario runs on the test lane, beside the rest of the suite
(tests/integration/lane.py), confined to its own devices.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.conftest import run_prefix
from tests.integration import servers
from tests.integration import logcount
from tests.integration.helpers import DaemonProc, blkio_cap, free_port
from tests.integration.soak_mix import Mix, mix_config, stacked_volumes

RULES = Path(__file__).resolve().parents[2] / "packaging" / "prometheus" / "iowarden.rules.yml"
VOLUMES = 4
BENIGN_S = 9 * 60
BASE_IOPS = 1200        # the database mix's peak on each volume
PAGE_WITHIN_S = 5 * 60
# A page from the probes clears within a minute or two of the fault's end. DeviceSlow, when the passive view
# raised it first, clears once a quarter or less of its last 40 windows (10 minutes of the example's 15 s
# windows) are slow: a fault that filled 30 of them clears once 20 have turned over, up to the whole ring
# when the busy machine slows a few windows more: the ring's ten minutes, and a minute for Prometheus' scrape
# and rule evaluation
CLEAR_WITHIN_S = 11 * 60

pytestmark = [pytest.mark.root, pytest.mark.slow]


def firing(prom_port: int) -> list[dict]:
    answer = servers.query_alerts(prom_port)
    return [a for a in answer if a["state"] == "firing"]


def identity(alert: dict) -> tuple:
    lab = alert["labels"]
    return lab["alertname"], lab.get("target", ""), lab.get("device", ""), lab.get("profile", "")


def of_volume(alert: dict, target: str, devices: set[str]) -> bool:
    lab = alert["labels"]
    return lab.get("target") == target or lab.get("device") in devices


def week_on_call(lane) -> None:
    report: list[str] = lane.report
    tmp = Path(tempfile.mkdtemp(prefix=run_prefix("lane")))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, True)
        lowers, uppers = stacked_volumes(stack, tmp, VOLUMES, in_ram=True)
        mounts = [u.mountpoint for u in uppers]
        mix = Mix(mounts, BASE_IOPS)
        mix.lay_out()
        port = free_port()
        daemon = DaemonProc(tmp, mix_config(tmp / "state", port, mounts, [v.name for v in lowers + uppers]))
        stack.callback(daemon.close)
        # what the daemon said, in the report whether the scenario passes or not (its directory goes with it)
        stack.callback(lambda: report.extend(
            ["daemon: " + x[:400] for x in daemon.output().splitlines() if "ALERT" in x or "Traceback" in x]))
        # and the sick volume's last probes: what its judgement rested on, if it was not paged in time
        stack.callback(lambda: report.extend(
            ["daemon: " + x[:400] for x in daemon.output().splitlines() if f"/{mounts[0].name}/" in x
             or f"probe {mounts[0].name}/" in x][-40:]))
        daemon.wait_message("READY=1", timeout=60)
        prom, prom_port = servers.prometheus(tmp, port, rule_files=[RULES], interval="15s")
        stack.callback(prom.stop)
        mix.start()
        stack.callback(mix.stop)
        start = time.monotonic()
        seen: dict[tuple, set] = {}     # each alert's firing episodes (their activeAt)
        descriptions: dict[tuple, str] = {}

        def look() -> list[dict]:
            now = firing(prom_port)
            for a in now:
                seen.setdefault(identity(a), set()).add(a["activeAt"])
                descriptions[identity(a)] = a["annotations"].get("summary", "") + " | " + \
                    a["annotations"].get("description", "")
            return now

        # the benign phase: the daemon learns and judges the volumes under the whole mix
        while time.monotonic() - start < BENIGN_S:
            look()
            lane.sleep(15)
        benign = dict(seen)
        report.append(f"benign phase: {BENIGN_S} s of the mix, firing alerts: {sorted(benign) or 'none'}")
        report += ["  " + line for line in mix.log[:40]]
        assert not benign, f"pages on healthy volumes: {[(k, descriptions[k]) for k in benign]}"

        # the fault: volume 0 throttled below its block layer to a third of its peak load
        sick, sick_devices = uppers[0].mountpoint.name, {uppers[0].name, lowers[0].name}
        cap = BASE_IOPS // 3
        throttled = time.monotonic()
        with blkio_cap("read_iops_device", lowers[0].major_minor, cap), \
                blkio_cap("write_iops_device", lowers[0].major_minor, cap):
            paged = lane.wait_for(lambda: [a for a in look() if of_volume(a, sick, sick_devices)],
                                  timeout=PAGE_WITHIN_S, every=5,
                                  what=f"a page for {sick} throttled to {cap} IOPS")
            took = time.monotonic() - throttled
            lane.sleep(60)   # the fault holds a minute more: every alert it raises is seen
            look()
        removed = time.monotonic()
        report.append(f"throttled {sick} ({lowers[0].name} at {cap} IOPS): firing after {took:.0f} s: "
                      f"{[identity(a) for a in paged]}")
        lane.wait_for(lambda: not [a for a in look() if of_volume(a, sick, sick_devices)],
                      timeout=CLEAR_WITHIN_S, every=5, what=f"{sick}'s alerts to clear after the throttle's removal")
        cleared = time.monotonic() - removed
        lane.sleep(60)   # and it stays cleared (a second episode would show here)
        look()
        report.append(f"cleared {cleared:.0f} s after the throttle's removal")
        for key, episodes in sorted(seen.items()):
            report.append(f"  {key}: {len(episodes)} episode(s): {descriptions[key][:600]}")
        others = [k for k in seen if k[1] not in ("", sick) or (k[2] and k[2] not in sick_devices)]
        assert not others, f"alerts for healthy volumes: {others}"
        assert all(len(e) == 1 for e in seen.values()), f"more than one episode: {seen}"
        # one fault on one volume is one page: the passive view of the same device joins the probes' page
        assert len([k for k in seen if k[1] == sick or k[2] in sick_devices]) == 1, f"more than one page: {sorted(seen)}"
        for key in seen:
            assert "Likely cause:" in descriptions[key] and "no cause found" not in descriptions[key], \
                descriptions[key]
        # the daemon's log of the whole run on busy volumes: nothing said more than once a minute uncounted
        report.extend(logcount.summary(daemon.output()))
        chatter = logcount.count(daemon.output())[1]
        assert not chatter, f"said again within a minute without a repeat count: {chatter[:10]}"


@pytest.mark.lane.with_args(week_on_call)   # with_args: a lone function would be decorated
def test_a_week_on_call_pages_once_for_the_fault_and_never_for_the_work(lane):
    lane.result(week_on_call, timeout=45 * 60)
