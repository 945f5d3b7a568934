"""Paths it did not make, one daemon per state directory, a job file's own
semantics, and a wall clock stepped under the daemon. The daemon as a process on the test's own loop volume;
every directory and user id here is the test's own."""
import os
import pwd
import time

import pytest

from tests.integration.helpers import config_text, rows, wait_for
from tests.integration.test_cli import iowarden

pytestmark = [pytest.mark.root, pytest.mark.slow]
NOBODY = pwd.getpwnam("nobody").pw_uid


def test_a_second_daemon_on_the_same_state_dir_exits_with_its_code_and_leaves_the_first_alone(
        shared_loop_xfs, tmp_path, daemon_factory):
    """Landed code: the second ended the first's fio as a leftover, then both probed and wrote baselines."""
    text = config_text(shared_loop_xfs.mountpoint, tmp_path / "state", runtime=2.0, interval=1.0)
    first = daemon_factory(text)
    first.wait_message("READY=1")
    db = tmp_path / "state" / "state.db"
    wait_for(lambda: rows(db, "SELECT count(*) FROM probe_results")[0][0] >= 1, timeout=60, what="a first probe")
    second = daemon_factory(text)
    assert second.proc.wait(timeout=30) == 75
    said = second.output()
    assert f"in use by another iowarden (pid {first.proc.pid})" in said and str(tmp_path / "state") in said
    assert "ended" not in said and "Traceback" not in said
    assert first.proc.poll() is None and "a previous run of iowarden left running" not in first.output()
    # the first goes on probing, and no result of it was cut short
    n = rows(db, "SELECT count(*) FROM probe_results")[0][0]
    wait_for(lambda: rows(db, "SELECT count(*) FROM probe_results")[0][0] >= n + 2, timeout=60, what="more probes")
    assert rows(db, "SELECT count(*) FROM probe_results WHERE ok = 0") == [(0,)]


def test_a_state_dir_owned_by_another_user_is_refused_and_nothing_is_written_through_their_links(
        shared_loop_xfs, tmp_path, daemon_factory):
    """Landed code: root made a database and spool segments through the user's symlinks in a 0700 root-only
    directory, and on restart deleted a root-owned *.tmp there."""
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    (private / "keep.tmp").write_text("root's own file")
    state = tmp_path / "theirs"
    state.mkdir()
    os.chown(state, NOBODY, NOBODY)
    for name, target in (("state.db", private / "state.db"), ("influx-spool", private)):
        os.symlink(target, state / name)
        os.lchown(state / name, NOBODY, NOBODY)
    text = config_text(shared_loop_xfs.mountpoint, state, runtime=0.3, interval=3600.0) + """
[influxdb]
enabled = true
url = "http://127.0.0.1:9"
org = "o"
bucket = "b"
token_env = "NO_SUCH_TOKEN_VAR"
"""
    d = daemon_factory(text)
    assert d.proc.wait(timeout=30) == 78
    out = d.output()
    assert f"state directory {state} is owned by uid {NOBODY}, not by the daemon's user (uid 0)" in out, out
    assert sorted(os.listdir(private)) == ["keep.tmp"]
    r = iowarden("check-config", "-c", str(d.cfg), check=False)
    assert r.returncode == 1 and f"daemon.state_dir: state directory {state} is owned by uid {NOBODY}" in r.stderr


def test_a_planted_database_link_in_an_own_directory_is_refused(shared_loop_xfs, tmp_path, daemon_factory):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    target = tmp_path / "elsewhere.db"
    os.symlink(target, state / "state.db")
    d = daemon_factory(config_text(shared_loop_xfs.mountpoint, state, runtime=0.3, interval=3600.0))
    assert d.proc.wait(timeout=30) == 78
    assert f"{state}/state.db is a symbolic link" in d.output()
    assert not target.exists()


def test_a_job_file_without_runtime_or_time_based_keeps_its_own_semantics(shared_loop_xfs, tmp_path):
    """Landed code: 8 MiB of reads made time based, run for the whole 60 s cap; fio alone ends it in well under
    a second. The limits cap a job; they do not change what it is."""
    import json
    job = tmp_path / "read8m.fio"
    job.write_text("[read8m]\nrw=read\nbs=1m\nsize=8m\ndirect=1\n")
    started = time.monotonic()
    r = iowarden("probe", "--path", str(shared_loop_xfs.mountpoint), "--job-file", str(job), "--json", timeout=120)
    took = time.monotonic() - started
    result = json.loads(r.stdout)[0]
    assert result["ok"], result
    assert took < 30 and result["duration_seconds"] < 10, (took, result["duration_seconds"])


FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def _budget_used(port: int) -> float:
    import re
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(r"^iowarden_budget_device_time_used_seconds\{[^}]*\} (\S+)$", text, re.M))


def test_a_wall_clock_stepped_91_days_and_back_under_the_daemon_deletes_nothing_and_keeps_the_budget(
        shared_loop_xfs, tmp_path, daemon_factory, monkeypatch):
    """Landed code: a pass while the clock was 91 days ahead deleted every probe result, and the budget ran
    on the wall clock (a step back held a spent budget, a step forward reset it). A time shim (libfaketime,
    wall clock only: DONT_FAKE_MONOTONIC) steps the running daemon's clock, and restarts it while stepped:
    each run's first retention pass compares with the last pass's clocks, kept in the database."""
    from iowarden.daemon.core.state import State
    from tests.integration.helpers import free_port
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    seeded = State(str(state_dir / "state.db"))
    for i in range(300):   # ten days of history, all within the 90 days kept
        seeded.add_probe_result({"started_at": time.time() - 10 * 86400 + i * 60, "target": "old", "profile": "rr",
                                 "device": None, "ok": True, "error": None, "contended": False, "read_iops": 1.0,
                                 "write_iops": 0.0, "read_bw_bytes": 1.0, "write_bw_bytes": 0.0,
                                 "clat_p50_seconds": 0.001, "clat_p99_seconds": 0.002, "clat_p999_seconds": 0.003,
                                 "duration_seconds": 1.0}, "old:1")
    seeded.close()
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    monkeypatch.setenv("LD_PRELOAD", FAKETIME)
    monkeypatch.setenv("FAKETIME_TIMESTAMP_FILE", str(offset))
    monkeypatch.setenv("FAKETIME_NO_CACHE", "1")
    monkeypatch.setenv("DONT_FAKE_MONOTONIC", "1")
    port = free_port()
    text = config_text(shared_loop_xfs.mountpoint, state_dir, runtime=0.3, interval=1.0, port=port)
    db = state_dir / "state.db"
    old_rows = lambda: rows(db, "SELECT count(*) FROM probe_results WHERE target = 'old'")[0][0]   # noqa: E731
    newest = lambda: rows(db, "SELECT max(started_at) FROM probe_results WHERE target = 'loop'")[0][0] or 0  # noqa: E731

    d = daemon_factory(text)
    d.wait_message("READY=1")
    wait_for(lambda: _budget_used(port) >= 2.0, timeout=90, what="probes spending 2 s of budget")
    before = _budget_used(port)
    offset.write_text("+91d\n")                                   # 91 days ahead, under the running daemon
    wait_for(lambda: newest() > time.time() + 90 * 86400, timeout=60, what="a probe stamped 91 days ahead")
    ahead = _budget_used(port)
    offset.write_text("+0\n")                                     # and back
    stepped_back_at = time.time()
    wait_for(lambda: rows(db, "SELECT count(*) FROM probe_results WHERE target = 'loop' AND started_at BETWEEN "
                              f"{stepped_back_at} AND {stepped_back_at + 3600}")[0][0] > 0,
             timeout=60, what="a probe stamped now again, after the step back")
    back = _budget_used(port)
    # the budget's window runs on the monotonic clock: a step forward did not empty it, a step back did not
    # hold it (used stays within what a minute of 0.3 s probes can spend, and keeps what it had)
    assert ahead >= before * 0.9 and back >= before * 0.9, (before, ahead, back)
    assert back < 60, back
    d.close()

    offset.write_text("+91d\n")                                   # a restart while the clock is ahead
    d = daemon_factory(text)
    d.wait_message("READY=1")
    wait_for(lambda: "retention pass skipped" in d.output(), what="the first pass refusing the stepped clock")
    d.close()
    offset.write_text("+0\n")                                     # and one after it came back
    d = daemon_factory(text)
    d.wait_message("READY=1")
    wait_for(lambda: "retention pass skipped" in d.output(), what="the first pass refusing the step back")
    assert old_rows() == 300
