"""The victim and the culprit, end to end: a service at a steady load, a neighbour's flood on its disk, and the page
through a real Prometheus and Alertmanager naming both with numbers; it clears after the flood; the same flood on a
disk whose service is idle pages nothing.

The disk is a loop device over an image a FUSE process serves one read at a time, 1 ms each and 10 ms more a MiB
(tests/integration/weakfuse.py --serial --ms-per-mib 10): a device with one head, whose requests queue behind each
other whoever sent them. Alone, the service's 4 KiB reads take about 1.5 ms; beside a flood of 1 MiB reads (a
backup's) each waits behind the few of the flood's the kernel has sent on (the loop device and FUSE let four or so
reach the server at once, whatever the flood's depth), some twenty times its normal (34.6 ms against 1.4 ms with
fio alone on this machine). Both are read-only (fio --readonly), each in a blkio cgroup of the test's own.
"""
import json
import re
import subprocess
import time
import urllib.request
from contextlib import ExitStack

import pytest

from tests.conftest import LoopXfs
from tests.integration import servers
from tests.integration.helpers import blkio_cgroup, config_text, end_processes, free_port, in_cgroup, wait_for
from tests.integration.test_passive import RULES
from tests.integration.test_tail import weak_disks

# alone: the disk is a Python process, whose service time beside the suite's workers would be theirs to set
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.alone]

SERVICE_IOPS = 100       # the database's steady reads, one at a time


def _config(target, state, port, disk: str) -> str:
    """A daemon probing its own target once an hour (not the subject), judging 5 s windows, learning a service's
    normal for a minute, and sampling and tracing `disk` with its compiled engine, per cgroup."""
    own = target.device.removeprefix("/dev/")
    extra = (f"\n[passive]\nwindow_seconds = 5.0\nservice_learn_seconds = 60.0\n"
             f"[sampler]\ndevices = [\"{own}\", \"{disk}\"]\n")
    text = config_text(target.mountpoint, state, interval=3600.0, port=port, tracer="compiled", extra=extra)
    return text.replace("[tracer]\n", f"[tracer]\ndevices = [\"{disk}\"]\nper_cgroup = true\n", 1)


def _fio(cgroup, disk: str, bs: str, *args):
    return subprocess.Popen(in_cgroup(cgroup, ["fio", "--name=t", f"--filename=/dev/{disk}", "--readonly",
                                               f"--bs={bs}", "--rw=randread", "--ioengine=libaio", "--direct=1",
                                               "--time_based", "--runtime=900", "--output=/dev/null", *args]),
                            start_new_session=True)


def _cgroup_lines(port: int, disk: str) -> list[str]:
    """What the daemon exports of each cgroup's requests on the disk: said when the page does not come."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [x for x in text.splitlines() if f'device="{disk}"' in x and
            re.match(r"iowarden_cgroup_(io_latency_seconds_(sum|count)|share_ratio)\b", x)]


def _normal_ms(port: int, disk: str, cgroup_name: str) -> float | None:
    """The mean latency the daemon learned as the cgroup's normal on the disk (None until learned)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for x in text.splitlines():
        if x.startswith("iowarden_service_normal_latency_seconds{") and f'device="{disk}"' in x and \
                f'cgroup="/{cgroup_name}"' in x and 'stat="mean"' in x and 'direction="read"' in x:
            return float(x.rsplit(" ", 1)[1]) * 1e3
    return None


def _alerts(hook, alertname: str, status: str):
    """Alerts of that name and status in every notification the webhook received."""
    return [a for p in hook.payloads for a in p["alerts"]
            if a["labels"]["alertname"] == alertname and a["status"] == status]


def test_a_flood_that_hurts_a_service_pages_victim_and_culprit_and_clears_and_no_victim_pages_nothing(
        tmp_path, daemon_factory):
    port = free_port()
    with ExitStack() as stack:
        target = LoopXfs("512M")
        stack.callback(target.close)
        (disk,) = stack.enter_context(weak_disks(tmp_path, names=("shared.img",),
                                                 args=("--serial", "--service-ms", "1", "--ms-per-mib", "10")))
        db = stack.enter_context(blkio_cgroup("iowarden-test-db"))
        batch = stack.enter_context(blkio_cgroup("iowarden-test-batch"))
        hook = servers.Webhook()
        stack.callback(hook.stop)
        am, amport = servers.alertmanager(tmp_path, hook.port)
        stack.callback(am.stop)
        prom, _ = servers.prometheus(tmp_path, port, rule_files=[RULES], alertmanager_port=amport, interval="5s")
        stack.callback(prom.stop)
        d = daemon_factory(_config(target, tmp_path / "state", port, disk))
        d.wait_message("READY=1")
        service = _fio(db, disk, "4k", "--iodepth=1", f"--rate_iops={SERVICE_IOPS}")
        stack.callback(end_processes, service)
        # its normal: the rule learns a minute of the service's own windows, then shows it
        normal = wait_for(lambda: _normal_ms(port, disk, db.name), timeout=180, what="the service's normal")
        print(f"the service's normal: {normal:.2f} ms")
        flood = _fio(batch, disk, "1M", "--iodepth=32")
        stack.callback(end_processes, flood)   # before the disk goes: its reads would fail with EIO
        t0 = time.monotonic()
        seen = []   # the daemon's counts each half minute, said if the page does not come

        def paged():
            if not seen or time.monotonic() - seen[-1][0] >= 30:
                seen.append((time.monotonic(), _cgroup_lines(port, disk)))
            return next(iter(_alerts(hook, "IowardenServiceContended", "firing")), None)
        try:
            page = wait_for(paged, timeout=180, what="IowardenServiceContended at the webhook")
        except AssertionError:
            print("\n".join(x[:800] for x in d.output().splitlines() if "ALERT" in x or "tracer" in x)[-6000:])
            for at, lines in seen:
                print(f"+{at - t0:.0f} s:", *lines, sep="\n  ")
            raise
        print(f"paged {time.monotonic() - t0:.0f} s after the flood began:",
              json.dumps({"labels": page["labels"], "annotations": page["annotations"]}, indent=1))
        said = page["annotations"]["summary"] + " " + page["annotations"]["description"]
        # victim and culprit, each with numbers
        m = re.search(rf"/{db.name}'s reads wait (\d+)x their normal \(p99 [\d.,]+ \S+ vs [\d.,]+ \S+, "
                      rf"mean [\d.,]+ \S+ vs [\d.,]+ \S+\) since \d\d:\d\d; /{batch.name} is doing "
                      rf"(\d+)% of the device's requests \(\d+ [KM]iB reads, [\d.,]+ MiB/s\)", said)
        assert m and int(m.group(1)) >= 8 and int(m.group(2)) >= 50, said
        assert page["labels"]["severity"] == "critical" and page["labels"]["device"] == disk, page["labels"]
        end_processes(flood)
        t1 = time.monotonic()
        wait_for(lambda: _alerts(hook, "IowardenServiceContended", "resolved"), timeout=180,
                 what="IowardenServiceContended resolved at the webhook")
        print(f"resolved {time.monotonic() - t1:.0f} s after the flood ended")
        # the same flood with the service idle: it hurts no one, and pages nothing (nor the device's own rule)
        end_processes(service)
        time.sleep(30)
        before = len(hook.payloads)
        flood = _fio(batch, disk, "1M", "--iodepth=32")
        stack.callback(end_processes, flood)
        time.sleep(150)
        later = [a for p in hook.payloads[before:] for a in p["alerts"] if a["status"] == "firing" and
                 a["labels"]["alertname"] in ("IowardenServiceContended", "IowardenVolumeContended")]
        assert not later, later
        raised = [x for x in d.output().splitlines()
                  if re.search(r"ALERT (Service|Volume)Contended (critical|warning) #", x)]
        assert len(raised) == 1, raised   # the first flood's, and none since
        print("\n".join(x[:400] for x in d.output().splitlines() if "ALERT" in x))
