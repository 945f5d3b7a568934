"""What a hostile or careless user broke, each held with the real process it lived in.

The HTTP, InfluxDB, state-database and fio-lifetime items have their own files
(test_http_hostile_clients.py, test_state_full_filesystem.py, test_influx_round_trip.py);
here: job files, target paths, and the one-shot commands' input.
"""
import os
import signal
import subprocess
import time

import pytest

from tests.integration.helpers import config_text, wait_for
from tests.integration.test_cli import iowarden

pytestmark = pytest.mark.root


# --- a job file cannot run commands, load code or change the host -------------------

@pytest.mark.parametrize("option", ["trigger-timeout=1\ntrigger=touch {marker}",
                                    "ioengine={marker}.so", "ioscheduler=bfq"])
def test_job_file_that_would_act_on_the_host_is_refused_by_check_config_and_probe(
        shared_loop_xfs, tmp_path, option):
    marker = tmp_path / "ran"
    job = tmp_path / "evil.fio"
    job.write_text(f"[global]\nrw=randread\nsize=8m\nruntime=1\n[evil]\n{option.format(marker=marker)}\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[profiles.evil]\njob_file = "{job}"\n[[targets]]\nname = "t"\npath = '
                   f'"{shared_loop_xfs.mountpoint}"\nprofiles = ["evil"]\n')
    scheduler = f"/sys/block/{shared_loop_xfs.name}/queue/scheduler"
    before = open(scheduler).read()
    r = iowarden("check-config", "-c", str(cfg), check=False)
    assert r.returncode == 78 and f"{job}:6:" in r.stderr and "not allowed" in r.stderr, r.stderr
    r = iowarden("probe", "--path", str(shared_loop_xfs.mountpoint), "--job-file", str(job), check=False)
    assert r.returncode != 0 and f"{job}:6:" in (r.stderr + r.stdout)
    time.sleep(1.5)   # what a trigger would have run has had time to
    assert not marker.exists()
    assert open(scheduler).read() == before


def test_fio_include_is_refused_before_fio_runs(tmp_path):
    job = tmp_path / "inc.fio"
    job.write_text("[global]\ninclude other.fio\n[j]\nrw=read\n")
    r = iowarden("probe", "--path", str(tmp_path), "--job-file", str(job), check=False)
    assert r.returncode != 0 and "includes are not allowed" in r.stderr, r.stderr


# --- a symlinked or system target is refused before anything is created -------------

def test_symlinked_target_writes_nothing_where_it_points(shared_loop_xfs, tmp_path):
    victim = shared_loop_xfs.mountpoint / "victim"   # stands in for /etc: a test must not write there
    victim.mkdir(exist_ok=True)
    link = tmp_path / "link"
    link.symlink_to(victim)
    r = iowarden("probe", "--path", str(link), "--size", "8MiB", "--runtime", "0.5", "--min-free-bytes", "1MiB",
                 "--json", check=False)
    assert r.returncode == 1
    assert "is a symlink" in r.stdout and "never probes through a link" in r.stdout, r.stdout
    assert os.listdir(victim) == []        # not even the .iowarden directory


def test_a_symlink_in_any_component_is_refused(shared_loop_xfs, tmp_path):
    (shared_loop_xfs.mountpoint / "real" / "data").mkdir(parents=True, exist_ok=True)
    (tmp_path / "via").symlink_to(shared_loop_xfs.mountpoint / "real")
    r = iowarden("probe", "--path", str(tmp_path / "via" / "data"), "--size", "8MiB", "--runtime", "0.5",
                 "--json", check=False)
    assert r.returncode == 1 and "is a symlink" in r.stdout, r.stdout
    assert os.listdir(shared_loop_xfs.mountpoint / "real" / "data") == []


@pytest.mark.parametrize("path", ["/proc", "/etc", "/usr/share", "/"])
def test_system_trees_are_refused_with_a_clear_message(path):
    r = iowarden("probe", "--path", path, "--size", "8MiB", "--runtime", "0.5", "--json", check=False)
    assert r.returncode == 1
    assert "never writes probe files there" in r.stdout, r.stdout
    assert not os.path.exists(os.path.join(path, ".iowarden"))


# --- fio dies with the daemon, and a restarted daemon ends a leftover one ----------

def _probes_of(owner):
    """pids of processes carrying this daemon's probe marker (fio and its job processes)."""
    import psutil
    out = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if p.environ().get("IOWARDEN_PROBE_OWNER") == owner:
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def _long_probe_config(mount, state):
    return config_text(mount, state, runtime=30.0, interval=1.0,
                       extra="").replace("[limits]\n", "[limits]\nmax_runtime_seconds = 60.0\n")


def test_kill_9_of_the_daemon_takes_its_fio_with_it(loop_xfs, tmp_path, daemon_factory):
    state = tmp_path / "state"
    d = daemon_factory(_long_probe_config(loop_xfs.mountpoint, state))
    owner = os.path.realpath(state)
    pids = wait_for(lambda: _probes_of(owner), timeout=40, what="fio running")
    time.sleep(1.0)   # into its run: job threads started
    os.kill(d.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    d.proc.wait()
    try:
        # on main: fio went on (ppid 1) for the rest of its 30 s runtime
        try:
            wait_for(lambda: not _probes_of(owner), timeout=5, what=f"fio {pids} to end with its daemon")
            print(f"fio {pids} gone {time.monotonic() - killed_at:.2f} s after kill -9 of its daemon")
        except AssertionError:
            for pid in _probes_of(owner):   # what state it was left in, for whoever reads the failure
                try:
                    status = open(f"/proc/{pid}/status").read()
                    print(pid, open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:100],
                          {k: v.strip() for k, v in (x.split(":", 1) for x in status.splitlines())
                           if k in ("State", "PPid", "SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd")})
                except OSError:
                    pass
            raise
    finally:
        for pid in _probes_of(owner):   # if it did not, this test's fio must not outlive it
            os.kill(pid, signal.SIGKILL)


def test_a_restarted_daemon_ends_a_leftover_fio_before_probing(loop_xfs, tmp_path, daemon_factory):
    state = tmp_path / "state"
    state.mkdir()
    owner = os.path.realpath(state)
    # a fio that outlived its daemon (one that ignored SIGTERM, or came from an older version)
    leftover = subprocess.Popen(
        ["fio", "--name=left", f"--filename={loop_xfs.mountpoint}/left.dat", "--size=8m", "--rw=randread",
         "--time_based=1", "--runtime=120", "--output-format=json"],
        env={**os.environ, "IOWARDEN_PROBE_OWNER": owner}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: len(_probes_of(owner)) >= 2, what="the leftover fio running (main and job process)")
        d = daemon_factory(config_text(loop_xfs.mountpoint, state, runtime=0.3, interval=1.0))
        wait_for(lambda: "probe loop/rr on" in d.output(), timeout=40, what="a probe")
        out = d.output()
        assert "left running" in out and out.index("left running") < out.index("probe loop/rr on"), out[-2000:]
        assert leftover.wait(timeout=5) is not None
        assert [p for p in _probes_of(owner) if p == leftover.pid] == []
    finally:
        if leftover.poll() is None:
            os.killpg(leftover.pid, signal.SIGKILL)
            leftover.wait()
