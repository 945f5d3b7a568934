"""The victim and the culprit, end to end: a service at a steady load, a neighbour's flood on its disk, and the page
through a real Prometheus and Alertmanager naming both with numbers; it clears after the flood; the same flood on a
disk whose service is idle pages nothing.

The disk is a loop device over an image a FUSE process serves one read at a time, 1 ms each (tests/integration/
weakfuse.py --serial): a device with one head, whose requests queue behind each other whoever sent them. Alone,
the service's reads take about a millisecond; beside a flood of reads at 32 in flight each waits behind the
flood's, some thirty times its normal. Both are read-only (fio --readonly), each in a blkio cgroup of the test's own.
"""
import json
import re
import subprocess
import time
from contextlib import ExitStack

import pytest

from tests.conftest import LoopXfs
from tests.integration import servers
from tests.integration.helpers import blkio_cgroup, config_text, end_processes, free_port, in_cgroup, wait_for
from tests.integration.test_passive import RULES
from tests.integration.test_tail import weak_disks

# alone: beside the suite's other workers the flood's reads through the FUSE-backed loop device failed with EIO (fio
# stops at its first error), so the flood never came; by itself the FUSE server serves them as a disk would
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


def _fio(cgroup, disk: str, *args):
    return subprocess.Popen(in_cgroup(cgroup, ["fio", "--name=t", f"--filename=/dev/{disk}", "--readonly",
                                               "--bs=4k", "--rw=randread", "--ioengine=libaio", "--direct=1",
                                               "--time_based", "--runtime=900", "--output=/dev/null", *args]),
                            start_new_session=True)


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
                                                 args=("--serial", "--service-ms", "1")))
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
        service = _fio(db, disk, "--iodepth=1", f"--rate_iops={SERVICE_IOPS}")
        stack.callback(end_processes, service)
        time.sleep(75)   # its normal: the rule learns a minute of the service's own windows
        flood = _fio(batch, disk, "--iodepth=32")
        t0 = time.monotonic()
        try:
            page = wait_for(lambda: next(iter(_alerts(hook, "IowardenServiceContended", "firing")), None),
                            timeout=180, what="IowardenServiceContended at the webhook")
        except AssertionError:
            print("\n".join(x[:800] for x in d.output().splitlines() if "ALERT" in x or "tracer" in x)[-6000:])
            raise
        print(f"paged {time.monotonic() - t0:.0f} s after the flood began:",
              json.dumps({"labels": page["labels"], "annotations": page["annotations"]}, indent=1))
        said = page["annotations"]["summary"] + " " + page["annotations"]["description"]
        # victim and culprit, each with numbers
        m = re.search(rf"/{db.name}'s reads wait (\d+)x their normal \(p99 [\d.,]+ \S+ vs [\d.,]+ \S+, "
                      rf"mean [\d.,]+ \S+ vs [\d.,]+ \S+\) since \d\d:\d\d; /{batch.name} is doing "
                      rf"(\d+)% of the device's requests \(4 KiB reads, [\d.,]+ MiB/s\)", said)
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
        flood = _fio(batch, disk, "--iodepth=32")
        stack.callback(end_processes, flood)
        time.sleep(150)
        later = [a for p in hook.payloads[before:] for a in p["alerts"] if a["status"] == "firing" and
                 a["labels"]["alertname"] in ("IowardenServiceContended", "IowardenVolumeContended")]
        assert not later, later
        raised = [x for x in d.output().splitlines()
                  if re.search(r"ALERT (Service|Volume)Contended (critical|warning) #", x)]
        assert len(raised) == 1, raised   # the first flood's, and none since
        print("\n".join(x[:400] for x in d.output().splitlines() if "ALERT" in x))
