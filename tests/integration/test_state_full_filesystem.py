"""The state database on a real filesystem that fills up, or fails and goes read-only.

A 16 MiB ext4 on a loop device holds state_dir; a filler file takes every free block
(root's reserve too: the daemon runs as root). Nothing may be moved aside or lost,
/metrics keeps showing fresh results, and the condition is a metric and one log line.
The same filesystem mounted errors=remount-ro and made to fail (ext4's trigger_fs_error, what a failing
disk's metadata error does): the daemon goes on from memory and says what it could not keep at its stop.
"""
import errno
import os
import re
import signal
import sqlite3
import subprocess
import time
import urllib.request

import pytest

from iowarden.daemon.core.state import State
from tests.conftest import LoopXfs
from tests.integration.helpers import config_text, free_port, rows, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def small_fs():
    fs = LoopXfs("16M", mkfs=("mkfs.ext4", "-q", "-F"))
    yield fs
    fs.close()


def fill(directory) -> str:
    """Take every free block of the filesystem; returns the filler's path (remove it to free them)."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            chunk = b"\0" * size
            while True:
                try:
                    if os.write(fd, chunk) == 0:
                        break
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def _old_results(db, n):
    """n results of target 'old' from an hour ago, written and closed."""
    st = State(db)
    for i in range(n):
        st.add_probe_result({"started_at": time.time() - 3600 + i, "target": "old", "profile": "rr", "device": "sdz", "ok": True,
                             "error": None, "contended": False, "read_iops": 1.0, "write_iops": 0.0,
                             "read_bw_bytes": 1.0, "write_bw_bytes": 0.0, "clat_p50_seconds": None,
                             "clat_p99_seconds": None, "clat_p999_seconds": None, "duration_seconds": 1.0}, "v")
    st.close()


def _metric(port, name):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(rf"^{name} (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def _last_success(port):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r'^iowarden_probe_last_success_timestamp_seconds\{[^}]*target="loop"[^}]*\} (\S+)$', body, re.M)
    return float(m.group(1)) if m else None


def test_started_on_a_full_filesystem_the_database_is_waited_for_not_reset(shared_loop_xfs, small_fs, tmp_path,
                                                                           daemon_factory):
    state_dir = small_fs.mountpoint / "state"
    db = str(state_dir / "state.db")
    _old_results(db, 22)
    filler = fill(small_fs.mountpoint)
    d = daemon_factory(config_text(shared_loop_xfs.mountpoint, state_dir, runtime=0.3, interval=1.0))
    wait_for(lambda: "cannot be opened now" in d.output(), timeout=20, what="the wait being logged")
    time.sleep(3)
    assert d.proc.poll() is None, d.output()
    assert "moved aside" not in d.output() and not list(state_dir.glob("state.db.corrupt-*"))
    assert d.output().count("cannot be opened now") == 1      # one line, not one per retry
    assert "Traceback" not in d.output()
    os.unlink(filler)
    d.wait_message("READY=1", timeout=30)
    wait_for(lambda: rows(db, "SELECT id FROM probe_results WHERE target = 'loop'"), what="a new probe result")
    assert len(rows(db, "SELECT id FROM probe_results WHERE target = 'old'")) == 22


def test_a_full_filesystem_while_running_keeps_every_result(shared_loop_xfs, small_fs, tmp_path, daemon_factory):
    state_dir = small_fs.mountpoint / "state"
    db = str(state_dir / "state.db")
    port = free_port()
    d = daemon_factory(config_text(shared_loop_xfs.mountpoint, state_dir, runtime=0.3, interval=1.0, port=port))
    d.wait_message("READY=1")
    wait_for(lambda: len(rows(db, "SELECT id FROM probe_results")) >= 2, what="two stored results")
    filler = fill(small_fs.mountpoint)
    full_at = time.time()
    wait_for(lambda: _metric(port, "iowarden_state_writable") == 0.0, timeout=30, what="iowarden_state_writable 0")
    seen = _results_shown_after(port, full_at)   # each must reach the database
    assert len(seen) >= 3, "/metrics stopped showing fresh results while the state filesystem was full"
    assert _metric(port, "iowarden_state_pending_writes") >= 3
    out = d.output()
    assert out.count("cannot be written now") == 1, out[-3000:]
    assert "Traceback" not in out and "crashed" not in out
    os.unlink(filler)
    wait_for(lambda: _metric(port, "iowarden_state_writable") == 1.0, timeout=30, what="writable again")
    assert _metric(port, "iowarden_state_pending_writes") == 0
    assert "is writable again" in d.output()
    con = sqlite3.connect(db)
    try:
        ends = [s + dur for s, dur in con.execute("SELECT started_at, duration_seconds FROM probe_results")]
    finally:
        con.close()
    for t in seen:
        assert any(abs(t - e) < 0.01 for e in ends), f"the result that ended at {t} was lost"


def _results_shown_after(port, since: float, seconds: float = 12.0) -> set:
    """The end times of the successful probes /metrics showed over `seconds`, of those that ended after `since`."""
    seen = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t = _last_success(port)
        if t and t > since:
            seen.add(t)
        time.sleep(0.3)
    return seen


def _read_only(mountpoint) -> bool:
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[1] == str(mountpoint):
                return "ro" in fields[3].split(",") or "emergency_ro" in fields[3].split(",")
    return False


def test_a_state_filesystem_that_fails_and_goes_read_only_costs_only_what_it_could_not_keep(
        shared_loop_xfs, small_fs, tmp_path, daemon_factory):
    state_dir = small_fs.mountpoint / "state"
    db = str(state_dir / "state.db")
    port = free_port()
    subprocess.run(["mount", "-o", "remount,errors=remount-ro", str(small_fs.mountpoint)], check=True)
    _old_results(db, 22)
    os.sync()   # on the disk before it fails: what the failure cannot take
    d = daemon_factory(config_text(shared_loop_xfs.mountpoint, state_dir, runtime=0.3, interval=1.0, port=port))
    d.wait_message("READY=1")
    wait_for(lambda: len(rows(db, "SELECT id FROM probe_results")) >= 2, what="two stored results")
    # ext4's own error path: the journal is aborted and the filesystem is read-only until it is mounted again
    with open(f"/sys/fs/ext4/{os.path.basename(small_fs.device)}/trigger_fs_error", "w") as f:
        f.write("the state filesystem fails under iowarden's test\n")
    wait_for(lambda: _read_only(small_fs.mountpoint), timeout=10, what="the filesystem read-only")
    failed_at = time.time()
    told = len(d.messages)
    wait_for(lambda: _metric(port, "iowarden_state_writable") == 0.0, timeout=30, what="iowarden_state_writable 0")
    seen = _results_shown_after(port, failed_at)
    assert len(seen) >= 3, "/metrics stopped showing fresh results when the state filesystem failed"
    assert _metric(port, "iowarden_state_pending_writes") >= 3
    since = d.messages[told:]
    assert any("WATCHDOG=1" in m for m in since) and not any("STUCK" in m for m in since), since[-5:]
    out = d.output()
    assert out.count("cannot be written now") == 1, out[-3000:]
    assert "Traceback" not in out and "moved aside" not in out
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=8) == 0, d.output()[-3000:]
    assert re.search(r"still cannot be written: \d+ waiting writes are lost at exit", d.output()), d.output()[-3000:]
    # mounted again after a check, as an operator would: the next start finds its database and goes on
    assert not small_fs.unmount(), "the failed filesystem stayed busy"
    subprocess.run(["e2fsck", "-fy", small_fs.device], capture_output=True)   # exit 1: errors corrected
    small_fs.mount()
    assert len(rows(db, "SELECT id FROM probe_results WHERE target = 'old'")) == 22
    before = len(rows(db, "SELECT id FROM probe_results"))
    d2 = daemon_factory(config_text(shared_loop_xfs.mountpoint, state_dir, runtime=0.3, interval=1.0, port=port))
    d2.wait_message("READY=1", timeout=30)
    wait_for(lambda: len(rows(db, "SELECT id FROM probe_results")) > before, what="a new stored result")
    assert "Traceback" not in d2.output() and not list(state_dir.glob("state.db.corrupt-*")), d2.output()[-3000:]
