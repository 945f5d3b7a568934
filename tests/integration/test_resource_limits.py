"""The daemon at the kernel's limits on its resources.

- Its task limit (the unit's TasksMax; here a cgroup v1 pids group of the test's own whose pids.max is set to what
  the daemon holds while idle): no process or thread can be started, so no probe can run. /metrics answers every
  scrape, the watchdog is fed, every probe that is due is a failed probe that says the limit is why (not a volume
  gone or a disk too slow), and probes run again once the limit is raised.
- Its file descriptors (a hard limit of 64, as a start with a low LimitNOFILE): 80 idle connections take at most
  half of them, a scrape from another address is answered, probes go on, the watchdog is fed, and no setting is
  said to have drifted because it could not be read.
"""
import http.client
import os
import socket
import time
import urllib.request

import pytest

from tests.conftest import LoopXfs
from tests.integration.helpers import DaemonProc, config_text, free_port, in_cgroup, rows, v1_cgroup, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _scrape(port) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def _fio_running(cgroup) -> bool:
    for pid in (cgroup / "cgroup.procs").read_text().split():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() in ("fio", "stat") or "probe_child" in open(f"/proc/{pid}/cmdline").read():
                    return True
        except OSError:
            pass
    return False


def test_at_its_task_limit_the_daemon_serves_says_why_its_probes_fail_and_recovers(tmp_path):
    port = free_port()
    fs = LoopXfs("512M")
    with v1_cgroup("pids", "iowarden-test-tasks") as cgroup:
        d = DaemonProc(tmp_path, config_text(fs.mountpoint, tmp_path / "state", runtime=0.3, interval=2.0, port=port),
                       on_host=lambda argv: in_cgroup(cgroup, argv))
        try:
            d.wait_message("READY=1")
            wait_for(lambda: "loop/rr ok" in " ".join(d.messages[-3:]), timeout=60, what="a first good probe")
            # between probes (no fio, no probe child, no stat child): the daemon's own threads only
            wait_for(lambda: not _fio_running(cgroup), timeout=30, what="a moment between probes")
            (cgroup / "pids.max").write_text((cgroup / "pids.current").read_text().strip())
            limited_at, told = time.monotonic(), len(d.messages)
            answered = 0
            while time.monotonic() - limited_at < 25:
                _scrape(port)   # every one answers: the endpoint's workers were started with it
                answered += 1
                time.sleep(1)
            refused = int((cgroup / "pids.events").read_text().split()[1])
            assert refused > 0, "the limit refused no task: the test did not reach it"
            out = d.output()
            assert "a task limit is reached" in out, out[-3000:]
            assert "no block device" not in out and "Traceback" not in out, out[-3000:]
            since = d.messages[told:]
            assert any("WATCHDOG=1" in m for m in since) and not any("STUCK" in m for m in since), since[-5:]
            assert d.proc.poll() is None
            (cgroup / "pids.max").write_text("max")
            told = len(d.messages)
            wait_for(lambda: "loop/rr ok" in " ".join(d.messages[told:]), timeout=60,
                     what="a good probe once the limit is raised")
        finally:
            d.close()
            fs.close()


def test_idle_connections_past_a_low_descriptor_limit_take_half_of_it_and_nothing_else_stops(tmp_path):
    port = free_port()
    fs = LoopXfs("512M")
    socks = []
    d = DaemonProc(tmp_path, config_text(fs.mountpoint, tmp_path / "state", runtime=0.3, interval=1.0, port=port),
                   on_host=lambda argv: ["prlimit", "--nofile=64:64", "--", *argv])
    try:
        d.wait_message("READY=1")
        db = str(tmp_path / "state" / "state.db")
        wait_for(lambda: rows(db, "SELECT id FROM probe_results WHERE ok = 1"), timeout=60, what="a first good probe")
        told = len(d.messages)
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(80)]
        wait_for(lambda: len(os.listdir(f"/proc/{d.proc.pid}/fd")) >= 40, what="the connections held")
        held = rows(db, "SELECT count(*) FROM probe_results")[0][0]
        for _ in range(8):   # Prometheus from another address than the 80
            scrape = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=("127.0.0.2", 0))
            scrape.request("GET", "/metrics")
            assert scrape.getresponse().status == 200
            scrape.close()
            time.sleep(1)
        assert len(os.listdir(f"/proc/{d.proc.pid}/fd")) <= 56, "the connections took more than half the descriptors"
        wait_for(lambda: rows(db, "SELECT count(*) FROM probe_results")[0][0] >= held + 3, what="probes going on")
        since = d.messages[told:]
        assert any("WATCHDOG=1" in m for m in since) and not any("STUCK" in m for m in since), since[-5:]
        out = d.output()
        assert d.proc.poll() is None and "Traceback" not in out and "setting drift" not in out, out[-3000:]
    finally:
        for s in socks:
            s.close()
        d.close()
        fs.close()
