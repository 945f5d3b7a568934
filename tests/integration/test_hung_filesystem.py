"""A target whose filesystem stops answering costs that target only.

Landed code: the scheduler blocked in os.stat(target.path) and every target's probes stopped; the watchdog was
withheld 10 s later; SIGTERM did not end the daemon in 22 s; a restart while it hung blocked in the
configuration's load before READY=1. Here a FUSE filesystem of the test's own blocks every request beside a
healthy loop XFS target.
"""
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .helpers import DaemonProc, config_text, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.root]

HANGFUSE = Path(__file__).with_name("hangfuse.py")
STOP_TIMEOUT_SECONDS = 20     # the unit's TimeoutStopSec


def _config(healthy, hung_dir, state, port):
    # probes every 2 s for the test's minute: the budget is not what it tests
    text = config_text(healthy.mountpoint, state, runtime=0.3, interval=2.0, port=port,
                       extra="[budget]\ndevice_time_ratio = 1.0\n")
    return text + f"""
[[targets]]
name = "nfs"
path = "{hung_dir}"
profiles = ["rr"]
interval_seconds = 2.0
"""


def _probes_of(out: str, target: str) -> int:
    return len(re.findall(rf"probe {target}/rr on ", out))


def _snapshot_time(body: str) -> float:
    m = re.search(r"^iowarden_snapshot_timestamp_seconds (\S+)$", body, re.M)
    assert m, "no iowarden_snapshot_timestamp_seconds in the scrape"
    return float(m.group(1))


def test_a_hung_filesystem_costs_its_target_only(shared_loop_xfs, tmp_path):
    mnt, control = tmp_path / "nfs", tmp_path / "hang"
    mnt.mkdir()
    server = subprocess.Popen([sys.executable, str(HANGFUSE), str(mnt), str(control)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    daemons = []
    try:
        wait_for(lambda: os.path.ismount(mnt) or server.poll() is not None, timeout=30, what="the FUSE mount")
        assert server.poll() is None, server.stdout.read().decode(errors="replace")[-2000:]
        port = free_port()
        d = DaemonProc(tmp_path, _config(shared_loop_xfs, mnt, tmp_path / "state", port))
        daemons.append(d)
        d.wait_message("READY=1", timeout=60)
        wait_for(lambda: _probes_of(d.output(), "loop") >= 1, timeout=60, what="a first probe of the healthy target")

        control.write_text("hang")                 # from here every request to the filesystem blocks
        wait_for(lambda: "did not answer within 5 s: its filesystem is hung" in d.output(), timeout=60,
                 what="the hung target said")
        said = [ln for ln in d.output().splitlines() if "its filesystem is hung" in ln]
        print("journal:", said[0])
        assert str(mnt) in said[0] and "nfs/rr" in said[0]

        before = _probes_of(d.output(), "loop")
        d.messages.clear()
        took, stamps = [], []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            # a scrape held by the hung filesystem would wait out this timeout and raise
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            took.append(time.monotonic() - t0)
            stamps.append(_snapshot_time(body))
            time.sleep(1)
        out = d.output()
        after = _probes_of(out, "loop")
        pings = sum(m.count("WATCHDOG=1") for m in d.drain())
        median = statistics.median(took)
        print(f"beside the hung target: {after - before} probes of the healthy one in 20 s, {pings} watchdog pings, "
              f"/metrics median {median:.2f} s, slowest {max(took):.2f} s (load average {os.getloadavg()[0]:.1f}); "
              f"snapshots {stamps[0]:.0f} .. {stamps[-1]:.0f}")
        assert after - before >= 4, "the healthy target's probes stopped"
        assert pings >= 15 and "watchdog ping withheld" not in out
        # scrapes answer at once, and from snapshots the core kept publishing (a core held by the hung
        # target would leave every scrape a fast answer from a frozen snapshot); on a machine this busy a
        # render can wait seconds for a CPU, which is the machine, not the hung target
        assert median < 1.0
        assert stamps[-1] - stamps[0] >= 10, stamps
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert re.search(r'iowarden_alert_active\{[^}]*alert="ProbeFailing"[^}]*target="nfs"', body), \
            [ln for ln in body.splitlines() if "alert_active" in ln]

        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        d.proc.wait(timeout=STOP_TIMEOUT_SECONDS + 10)
        took = time.monotonic() - t0
        print(f"SIGTERM to exit with the filesystem hung: {took:.1f} s")
        assert took < STOP_TIMEOUT_SECONDS

        # a restart while it still hangs: the configuration's load says the path, and the daemon serves
        again = DaemonProc(tmp_path, _config(shared_loop_xfs, mnt, tmp_path / "state", port))
        daemons.append(again)
        t0 = time.monotonic()
        try:
            again.wait_message("READY=1", timeout=60)
        except AssertionError:
            print(f"the restarted daemon ended with {again.proc.poll()}")
            raise
        print(f"restarted to READY=1 with the filesystem hung: {time.monotonic() - t0:.1f} s")
        assert "did not answer within 5 s: its filesystem is hung" in again.output()
    finally:
        control.unlink(missing_ok=True)            # every request waiting is answered, every stuck stat ends
        for d in daemons:
            d.close()
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
