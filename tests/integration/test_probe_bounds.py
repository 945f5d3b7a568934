"""Probe directories, job files and fio's bounds, each with the real fio or CLI process.
"""
import os
import signal
import subprocess
import time
import uuid

import psutil
import pytest

from tests.integration.helpers import config_text, in_cgroup, rows, wait_for
from tests.integration.test_cli import IOWARDEN, iowarden

pytestmark = [pytest.mark.root, pytest.mark.slow]


# --- the directory opened decides, not the spelling of its path ----------------------

@pytest.mark.parametrize("path", ["//usr/lib", "//etc", "//", "///usr//lib/", "/tmp/../usr/lib"])
def test_a_system_tree_spelled_with_leading_slashes_is_refused_and_nothing_is_created(path):
    real = os.path.join("/", path.strip("/").replace("//", "/")) if path.strip("/") else "/"
    real = os.path.normpath("/" + real.lstrip("/"))
    created = os.path.join(real, ".iowarden")
    existed = os.path.exists(created)
    try:
        r = iowarden("probe", "--path", path, "--size", "4MiB", "--runtime", "0.5", "--json", check=False)
        assert r.returncode == 1 and "never writes probe files there" in r.stdout, r.stdout
        assert existed or not os.path.exists(created)   # unguarded: /usr/lib/.iowarden/probe-4194304.dat
    finally:
        if not existed and os.path.isdir(created):
            for name in os.listdir(created):
                if name.startswith("probe-"):
                    os.unlink(os.path.join(created, name))
            os.rmdir(created)


@pytest.mark.parametrize("path", ["//etc", "//", "//usr/lib"])
def test_check_config_refuses_a_system_tree_spelled_with_leading_slashes(tmp_path, path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[profiles.p]\nrw = "randread"\n[[targets]]\nname = "t"\npath = "{path}"\nprofiles = ["p"]\n')
    r = iowarden("check-config", "-c", str(cfg), check=False)
    assert r.returncode == 78 and f"{cfg}:5: targets[0].path:" in r.stderr, r.stderr


def test_a_bind_mount_of_a_system_tree_is_refused_by_its_device_and_inode(tmp_path):
    """/etc bind-mounted (read-only, so a failure of the check could write nothing) at a path that names no
    system tree: the directory opened is /etc all the same."""
    there = tmp_path / "looks-harmless"
    there.mkdir()
    subprocess.run(["mount", "--bind", "/etc", str(there)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(there)], check=True)
        r = iowarden("probe", "--path", str(there), "--size", "4MiB", "--runtime", "0.5", "--json", check=False)
        assert r.returncode == 1 and "it is the directory /etc" in r.stdout, r.stdout
    finally:
        subprocess.run(["umount", str(there)], check=True)


# --- what fio may allocate is bounded, every block-size form --------------------------

@pytest.mark.parametrize("job", [
    "[a]\nrw=write\nbs=64m\niodepth=16\nnumjobs=4\n",                    # the issue's: 4 GiB
    "[a]\nrw=randread\nbs=4k,512m\niodepth=1\n",                          # the write direction's block
    "[a]\nrw=randread\nbsrange=4k-256m\niodepth=2\n",
    "[global]\nbssplit=4k/50:128m/50\n[a]\nrw=randread\niodepth=4\n",     # from [global]
])
def test_a_job_asking_for_more_buffers_than_the_limit_is_refused_with_its_line(tmp_path, job):
    jf = tmp_path / "big.fio"
    jf.write_text(job)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[profiles.big]\njob_file = "{jf}"\n[[targets]]\nname = "t"\npath = "{tmp_path}"\n'
                   'profiles = ["big"]\n')
    r = iowarden("check-config", "-c", str(cfg), check=False)
    assert r.returncode == 78, r.stderr
    assert f"{jf}:" in r.stderr and "limits.max_job_buffers" in r.stderr, r.stderr


def _memory_cgroup(limit_bytes):
    path = f"/sys/fs/cgroup/memory/iowarden-test-{uuid.uuid4().hex[:8]}"
    os.mkdir(path)
    with open(f"{path}/memory.limit_in_bytes", "w") as f:
        f.write(str(limit_bytes))
    return path


def _remove_cgroup(path):
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.1)


def _probe_in_cgroup(cgroup, *args):
    return subprocess.run(in_cgroup(cgroup, [*IOWARDEN, *args]), capture_output=True, text=True, timeout=120)


def test_fio_in_a_memory_cgroup_gets_only_jobs_within_the_bound(shared_loop_xfs, tmp_path):
    """A 1.5 GiB cgroup, as the issue's: the 4 GiB job never starts fio (unbounded, fio grew to 4.2 GB and was
    OOM-killed); one within the bound runs, and the cgroup's peak stays near what it asked for."""
    cg = _memory_cgroup(1536 << 20)
    try:
        big = tmp_path / "big.fio"
        big.write_text("[a]\nrw=write\nbs=64m\niodepth=16\nnumjobs=4\nsize=256m\n")
        r = _probe_in_cgroup(cg, "probe", "--path", str(shared_loop_xfs.mountpoint), "--job-file", str(big),
                             "--json")
        assert r.returncode == 2 and "big.fio:5: job 'a'" in r.stderr and "limits.max_job_buffers" in r.stderr, r.stderr
        with open(f"{cg}/memory.max_usage_in_bytes") as f:
            assert int(f.read()) < 400 << 20   # the CLI alone: fio never started
        with open(f"{cg}/memory.failcnt") as f:
            assert int(f.read()) == 0
        ok = tmp_path / "ok.fio"
        ok.write_text("[a]\nrw=randread\nbs=1m\niodepth=16\nnumjobs=4\nsize=64m\nruntime=1\n")
        r = _probe_in_cgroup(cg, "probe", "--path", str(shared_loop_xfs.mountpoint), "--job-file", str(ok), "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        with open(f"{cg}/memory.failcnt") as f:
            assert int(f.read()) == 0
    finally:
        _remove_cgroup(cg)


# --- a job file is a regular file, bounded, never followed through a link, never quoted ----

def _check(tmp_path, job_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[profiles.p]\njob_file = "{job_path}"\n[[targets]]\nname = "t"\npath = "{tmp_path}"\n'
                   'profiles = ["p"]\n')
    t0 = time.monotonic()
    r = iowarden("check-config", "-c", str(cfg), check=False, timeout=20)
    return r, time.monotonic() - t0


def test_dev_zero_a_fifo_and_a_huge_file_are_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.fio"
    with open(huge, "wb") as f:
        f.truncate(64 << 20)
    for path, why in (("/dev/zero", "not a regular file"), (fifo, "not a regular file"),
                      (huge, "larger than 65536 bytes")):
        r, took = _check(tmp_path, path)
        # unguarded: /dev/zero OOM-killed check-config at 1.5 GiB in 3 s; the FIFO hung until killed
        assert r.returncode == 78 and why in r.stderr, (path, r.stderr)
        assert took < 10, (path, took)


def test_a_symlinked_job_file_is_not_followed_and_nothing_of_a_non_job_file_is_quoted(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\n")
    link = tmp_path / "job.fio"
    link.symlink_to(secret)
    r, _ = _check(tmp_path, link)
    assert r.returncode == 78 and "symbolic link" in r.stderr, r.stderr
    assert "$6$" not in r.stderr and "root:" not in r.stderr
    # the same content named directly: refused as no job file, with nothing of it quoted
    r, _ = _check(tmp_path, secret)
    assert r.returncode == 78 and "not a fio job file" in r.stderr, r.stderr
    assert "$6$" not in r.stderr and "root" not in r.stderr.replace(str(tmp_path), "")


# --- a job without runtime= runs for the longest allowed, and ramp_time is capped -----

def _config_with_job(mount, state, job, max_runtime):
    return (config_text(mount, state, runtime=0.3, interval=3600.0)
            .replace("[limits]\n", f"[limits]\nmax_runtime_seconds = {max_runtime}\n")
            .replace('[profiles.rr]\nrw = "randread"\nsize = "16MiB"\nruntime_seconds = 0.3\nramp_time_seconds = 0.0\n',
                     f'[profiles.rr]\njob_file = "{job}"\n'))


@pytest.mark.parametrize("job, least, most", [
    # the deadline is the runtime fio is given (the limit's 3 s), not the profile's 0: else killed after 1 s.
    # time_based: these jobs ask to run for their time (a job keeps its own semantics: without it,
    # 16 MiB of reads end when they are read, test_state_dir_and_clock.py::test_a_job_file_without_runtime_...)
    # the upper bounds leave a busy machine its slow fio start (one clean-clone run beside other fio jobs
    # and a bench took longer than 9 s) and still fail the 68.7 s an uncapped ramp takes
    ("[a]\nrw=randread\nbs=4k\nsize=16m\ntime_based\n", 2.8, 25.0),
    ("[a]\nrw=randread\nbs=4k\nsize=16m\nruntime=1\nramp_time=1000h\ntime_based\n", 3.8, 30.0),   # uncapped: 68.7 s
])
def test_runtime_and_ramp_are_capped_by_the_limit_and_the_probe_succeeds(shared_loop_xfs, tmp_path, job, least, most):
    jf = tmp_path / "j.fio"
    jf.write_text(job)
    cfg = tmp_path / "c.toml"
    cfg.write_text(_config_with_job(shared_loop_xfs.mountpoint, tmp_path / "state", jf, 3.0)
                   # a timeout from the profile's runtime (0 + this margin) would kill fio in 3 s: still caught,
                   # and fio has 3 s to start on a busy machine
                   .replace("timeout_margin_seconds = 5.0", "timeout_margin_seconds = 3.0"))
    t0 = time.monotonic()
    r = iowarden("probe", "-c", str(cfg), "--json", check=False, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0 and '"ok": true' in r.stdout, r.stdout
    assert least < took < most, took


# --- an offset past the probe file is refused; the file is kept --------------------------

def test_an_offset_past_the_probe_file_is_refused_and_the_file_is_not_laid_out_again(shared_loop_xfs, tmp_path):
    mount = shared_loop_xfs.mountpoint
    first = iowarden("probe", "--path", str(mount), "--size", "16MiB", "--runtime", "0.3", "--json", check=False)
    assert first.returncode == 0, first.stdout
    probe_file = mount / ".iowarden" / "adhoc-16777216.dat"   # `iowarden probe`'s own file
    inode = os.stat(probe_file).st_ino
    jf = tmp_path / "far.fio"
    jf.write_text("[a]\nrw=randread\nbs=4k\nsize=16m\noffset=1P\nruntime=0.3\n")
    r = iowarden("probe", "--path", str(mount), "--job-file", str(jf), "--json", check=False)
    assert r.returncode == 1 and "past the end of the probe file" in r.stdout, r.stdout
    assert os.stat(probe_file).st_ino == inode     # unguarded, fio unlinked it, and the next probe laid it out again
    again = iowarden("probe", "--path", str(mount), "--size", "16MiB", "--runtime", "0.3", "--json", check=False)
    assert '"layout_bytes": 0' in again.stdout, again.stdout


# --- a daemon stopped while its fio ran takes the finished result, not a timeout ------------

def test_sigstop_during_a_probe_keeps_the_probe_that_finished(shared_loop_xfs, tmp_path, daemon_factory):
    state = tmp_path / "state"
    # a margin of 3 s: on the loaded machine fio's own 2 s run took over 3 s (a real timeout, not the stop's)
    text = (config_text(shared_loop_xfs.mountpoint, state, runtime=2.0, interval=2.0)
            .replace("timeout_margin_seconds = 5.0", "timeout_margin_seconds = 3.0"))
    d = daemon_factory(text)
    d.wait_message("READY=1")
    daemon = psutil.Process(d.proc.pid)

    def fio_running():
        return [c for c in daemon.children(recursive=True) if c.name() == "fio"]
    wait_for(fio_running, timeout=30, what="the probe's fio")
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(9.0)   # fio (2 s) ends meanwhile; the timeout (2 s + 3 s) passes on the clock
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    db = str(state / "state.db")
    got = wait_for(lambda: rows(db, "SELECT ok, error FROM probe_results ORDER BY id"), timeout=30, what="the probe's result")
    assert got[0][0] == 1, got           # unguarded: failed, "fio timed out after 3 s"
