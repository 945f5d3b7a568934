"""A new volume is protected within minutes: the daemon's first half hour, from a fresh state directory
with the shipped example's probe settings.

The shipped example probes each volume every 300 s and arms a baseline after 12 probes: without the
warm-up that is an hour before the first alert can fire. While a profile is learning it is probed every
`warmup_interval_seconds` (60) under a budget of its own (`warmup_device_time_ratio`), so the volume is
armed in about twelve minutes. The volume is throttled to 200 IOPS at minute 20 (a cgroup v1 limit on
the volume, as a provisioned-IOPS cap or an empty burst bucket holds it) and the alert must fire by
minute 30, naming the limit.

Half an hour of wall clock: the scenario runs on the test lane, beside the rest of the suite
(tests/integration/lane.py), confined to its own device.
"""
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import LoopXfs, run_prefix
from tests.integration import logcount
from tests.integration.helpers import DaemonProc, blkio_cap, free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"
THROTTLE_AT_S = 20 * 60
ALERT_BY_S = 30 * 60
CAP_IOPS = 200

pytestmark = [pytest.mark.root, pytest.mark.slow]


def replaced(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"config.example.toml changed: {old!r} is not there once"
    return text.replace(old, new)


def in_section(text: str, header: str, old: str, new: str) -> str:
    """`old` replaced at its first line after the section's header."""
    head, sep, rest = text.partition(f"\n{header}\n")
    assert sep and f"\n{old}\n" in rest, f"config.example.toml changed: no {old!r} in {header}"
    return head + sep + rest.replace(f"{old}\n", f"{new}\n", 1)


def example_config(mount: Path, state_dir: Path, port: int, device: str) -> str:
    """The shipped example as it is, but for where: its target, state, port and devices are the test's.
    (The tracer is off: bpftrace would time every I/O of the whole suite running beside it.)"""
    text = EXAMPLE.read_text()
    text = replaced(text, 'state_dir = "/var/lib/iowarden"', f'state_dir = "{state_dir}"')
    text = replaced(text, 'listen_address = ":29110"', f'listen_address = "127.0.0.1:{port}"')
    text = replaced(text, 'path = "/var/lib/iowarden"', f'path = "{mount}"')
    text = in_section(text, "[sampler]", "devices = []", f'devices = ["{device}"]')
    return in_section(text, "[tracer]", "enabled = true", "enabled = false")


def families(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(body)}


def value(fams: dict, name: str, **labels) -> float | None:
    for s in fams.get(name, []):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def first_half_hour(lane) -> None:
    report: list[str] = lane.report
    tmp = Path(tempfile.mkdtemp(prefix=run_prefix("lane")))
    vol = LoopXfs("2G", direct_io=True)
    daemon = None
    try:
        port = free_port()
        daemon = DaemonProc(tmp, example_config(vol.mountpoint, tmp / "state", port, vol.name))
        daemon.wait_message("READY=1", timeout=60)
        start = time.monotonic()
        device = vol.name
        armed_at = None
        budget_at_arming = ""
        alerts_before: list[str] = []
        while time.monotonic() - start < THROTTLE_AT_S:
            fams = families(port)
            learning = [s for s in fams.get("iowarden_baseline_learning", []) if s.value == 1]
            if armed_at is None and fams.get("iowarden_baseline_learning") and not learning:
                armed_at = time.monotonic() - start
                budget_at_arming = (
                    f"device time {value(fams, 'iowarden_budget_device_time_used_seconds', device=device):.1f}"
                    f" s of the warm-up's "
                    f"{value(fams, 'iowarden_budget_warmup_device_time_allowed_seconds', device=device):.0f} s "
                    f"an hour (the routine budget: "
                    f"{value(fams, 'iowarden_budget_routine_device_time_used_seconds', device=device):.1f} s of "
                    f"{value(fams, 'iowarden_budget_device_time_allowed_seconds', device=device):.0f} s); "
                    f"written {value(fams, 'iowarden_budget_written_bytes', device=device) / 2**20:.0f} MiB of "
                    f"{value(fams, 'iowarden_budget_written_allowed_bytes', device=device) / 2**20:.0f} MiB "
                    f"allowed a day")
            alerts_before += [f"{s.labels['alert']} {s.labels.get('profile', '')}"
                              for s in fams.get("iowarden_alert_active", []) if s.value == 1]
            lane.sleep(15)
        report.append(f"armed (no profile learning) {armed_at:.0f} s after the start" if armed_at is not None
                      else "NOT armed by minute 20")
        report.append(f"the warm-up's budget when armed: {budget_at_arming}")
        assert armed_at is not None, "the example's profiles were still learning at minute 20"
        assert not alerts_before, f"alerts on a healthy new volume before the throttle: {sorted(set(alerts_before))}"
        throttled = time.monotonic()
        with blkio_cap("read_iops_device", vol.major_minor, CAP_IOPS), \
                blkio_cap("write_iops_device", vol.major_minor, CAP_IOPS):
            fams = lane.wait_for(
                lambda: (f := families(port)) and value(f, "iowarden_alert_active", alert="VolumeDegraded") == 1
                and f, timeout=ALERT_BY_S - (throttled - start), every=5,
                what=f"VolumeDegraded by minute 30 (throttled to {CAP_IOPS} IOPS at minute 20)")
        fired = time.monotonic()
        info = next(s.labels for s in fams["iowarden_alert_info"] if s.labels["alert"] == "VolumeDegraded")
        report.append(f"VolumeDegraded {fired - start:.0f} s after the start, {fired - throttled:.0f} s after "
                      f"the throttle")
        report += [f"  where: {info['where']}", f"  what: {info['what']}", f"  cause: {info['cause']}"]
        assert fired - start <= ALERT_BY_S
        assert str(vol.mountpoint) in info["where"] and device in info["where"], info
        assert "cgroup I/O limit" in info["cause"] and f"{CAP_IOPS}" in info["cause"], info
        # its log over the half hour, a throttled device's minutes included: nothing said twice a minute uncounted
        report.extend(logcount.summary(daemon.output()))
        chatter = logcount.count(daemon.output())[1]
        assert not chatter, f"said again within a minute without a repeat count: {chatter[:10]}"
    finally:
        try:
            if daemon is not None:
                daemon.close()
        finally:
            vol.close()
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.lane.with_args(first_half_hour)   # with_args: a lone function would be decorated
def test_a_new_volume_is_armed_in_minutes_and_pages_by_minute_30(lane):
    lane.result(first_half_hour, timeout=45 * 60)
