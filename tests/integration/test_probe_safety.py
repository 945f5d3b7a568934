"""The probe's safety rules and failure modes, on a real loop-mounted XFS filesystem with real fio."""
import os
import stat
import subprocess
import textwrap
import time

import pytest

from iowarden.probes.fio_job import ProbeProfile
from iowarden.probes.fio_run import ProbeLimits, run_probe
from iowarden.probes.probe_dir import PROBE_DIR_NAME

pytestmark = pytest.mark.root

SMALL = dict(size_bytes=16 << 20, runtime_seconds=0.5, ramp_time_seconds=0)
LIMITS = ProbeLimits(min_free_bytes=1 << 20, min_free_ratio=0.0, timeout_margin_seconds=20)


def probe(path, **kw):
    limits = kw.pop("limits", LIMITS)
    fio_binary = kw.pop("fio_binary", "fio")
    return run_probe("t", str(path), ProbeProfile("p", **{**SMALL, **kw}), limits, fio_binary=fio_binary)


def test_directory_probe_lays_out_once_with_written_extents(loop_xfs):
    r1 = probe(loop_xfs.mountpoint, rw="randwrite")
    assert r1.ok, r1.error
    assert r1.device == loop_xfs.name and r1.layout_bytes == 16 << 20
    pdir = loop_xfs.mountpoint / PROBE_DIR_NAME
    assert stat.S_IMODE(os.lstat(pdir).st_mode) == 0o700
    files = os.listdir(pdir)
    assert files == ["probe-16777216.dat"]
    # no unwritten (preallocated, never written) extents: xfs_bmap -p flags 0010000
    bmap = subprocess.run(["xfs_bmap", "-v", "-p", str(pdir / files[0])], capture_output=True, text=True,
                          check=True).stdout
    flags = [line.split()[-1] for line in bmap.splitlines()[2:] if line.strip()]
    assert flags and all(not (int(f, 8) & 0o010000) for f in flags), bmap
    r2 = probe(loop_xfs.mountpoint, rw="randwrite")
    assert r2.ok and r2.layout_bytes == 0                       # reused, not laid out again


def test_symlinked_probe_directory_is_refused(loop_xfs, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, loop_xfs.mountpoint / PROBE_DIR_NAME)
    r = probe(loop_xfs.mountpoint, rw="randwrite")
    assert not r.ok and r.error.startswith("refused:") and "symlink" in r.error
    assert os.listdir(elsewhere) == []


def test_probe_directory_of_another_owner_is_refused(loop_xfs):
    os.mkdir(loop_xfs.mountpoint / PROBE_DIR_NAME)
    os.chown(loop_xfs.mountpoint / PROBE_DIR_NAME, 65534, 65534)
    r = probe(loop_xfs.mountpoint)
    assert not r.ok and "owned by uid 65534" in r.error


def test_symlinked_probe_file_is_refused(loop_xfs, tmp_path):
    pdir = loop_xfs.mountpoint / PROBE_DIR_NAME
    pdir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, pdir / "probe-16777216.dat")
    r = probe(loop_xfs.mountpoint, rw="randwrite")
    assert not r.ok and "not a regular file" in r.error
    assert victim.read_bytes() == b"precious"


def test_a_directory_no_longer_on_its_filesystem_is_refused_untouched(loop_xfs):
    # a discovered mount point: once unmounted, the path is a directory of the filesystem beneath
    under = loop_xfs.mountpoint.parent / "beneath"
    under.mkdir()
    r = run_probe("t", str(under), ProbeProfile("p", **SMALL), LIMITS,
                  expect_dev=os.stat(loop_xfs.mountpoint).st_dev)
    assert not r.ok and r.error.startswith("refused:") and "no longer on the filesystem" in r.error
    assert os.listdir(under) == []
    ok = run_probe("t", str(loop_xfs.mountpoint), ProbeProfile("p", **SMALL), LIMITS,
                   expect_dev=os.stat(loop_xfs.mountpoint).st_dev)
    assert ok.ok, ok.error


def test_raw_device_is_never_written(loop_xfs):
    before = open(loop_xfs.device, "rb").read(1 << 20)
    r = probe(loop_xfs.device, rw="randwrite")
    assert not r.ok and r.error.startswith("refused:") and "only reads devices" in r.error
    assert r.argv == ()                                          # fio never started
    r = probe(loop_xfs.device, rw="randread")
    assert r.ok, r.error
    assert "--readonly" in r.argv and r.device == loop_xfs.name and r.iops("read") > 0
    assert open(loop_xfs.device, "rb").read(1 << 20) == before


def test_free_space_floor_refuses_before_writing(loop_xfs):
    # 95 % of the filesystem must stay free: no probe file fits (min_free_bytes alone is capped at 5 % of it)
    r = probe(loop_xfs.mountpoint, limits=ProbeLimits(min_free_ratio=0.95))
    assert not r.ok and "the volume is full, not slow" in r.error and "below the floor" in r.error
    assert os.listdir(loop_xfs.mountpoint / PROBE_DIR_NAME) == []


def test_leftovers_are_removed_not_accumulated(loop_xfs):
    pdir = loop_xfs.mountpoint / PROBE_DIR_NAME
    pdir.mkdir(mode=0o700)
    (pdir / "probe-4096.dat").write_bytes(b"x" * 4096)           # a size no profile uses any more
    (pdir / "probe-16777216.tmp").write_bytes(b"half")            # a layout interrupted by a crash
    (pdir / "notes.txt").write_text("not ours")
    r = probe(loop_xfs.mountpoint)
    assert r.ok, r.error
    assert sorted(os.listdir(pdir)) == ["notes.txt", "probe-16777216.dat"]


def test_size_and_runtime_are_capped(loop_xfs):
    r = run_probe("t", str(loop_xfs.mountpoint), ProbeProfile("big", size_bytes=512 << 20, runtime_seconds=600),
                  ProbeLimits(max_size_bytes=8 << 20, max_runtime_seconds=1, min_free_bytes=0, min_free_ratio=0))
    assert r.ok, r.error
    assert "--size=8388608" in r.argv and "--runtime=1000ms" in r.argv
    assert r.duration_seconds < 30


def test_missing_fio_is_a_failed_result(loop_xfs):
    r = probe(loop_xfs.mountpoint, fio_binary="/nonexistent/fio")
    assert not r.ok and "not found" in r.error


def test_fio_failure_is_a_failed_result(loop_xfs):
    r = probe(loop_xfs.mountpoint, ioengine="no_such_engine")
    assert not r.ok and "fio exited with 1" in r.error


def test_hung_fio_is_killed_with_its_children(loop_xfs, tmp_path):
    pidfile = tmp_path / "child.pid"
    fake = tmp_path / "fio"
    # a stand-in for a fio whose job process hangs in D state: parent and child both sleep
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        sleep 300 &
        echo $! > {pidfile}
        sleep 300
        """))
    fake.chmod(0o755)
    t0 = time.monotonic()
    r = probe(loop_xfs.mountpoint, fio_binary=str(fake), limits=ProbeLimits(
        min_free_bytes=0, min_free_ratio=0, timeout_margin_seconds=1.5))
    assert not r.ok and "timed out" in r.error
    assert time.monotonic() - t0 < 20
    child = int(pidfile.read_text())
    time.sleep(0.2)
    try:  # gone, or a zombie waiting for whoever reaps orphans here
        state = open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z"), f"fio's child {child} survived the timeout (state {state})"


@pytest.mark.parametrize("what", ["missing", "regular file"])
def test_bad_targets(tmp_path, what):
    path = tmp_path / "t"
    if what == "regular file":
        path.write_text("x")
    r = probe(path)
    assert not r.ok and (("No such file" in r.error) if what == "missing" else "neither a directory" in r.error)


def test_real_fio_past_its_timeout_leaves_no_process(loop_xfs):
    """fio's job processes leave fio's process group: a timeout must still kill them all."""
    from iowarden.probes.common import run_tool
    started = []
    run = run_tool(["fio", "--name=long", f"--directory={loop_xfs.mountpoint}", "--rw=randread", "--size=16m",
                    "--time_based", "--runtime=60", "--numjobs=2", "--output-format=json"], timeout_seconds=3,
                   on_start=started.append)
    assert "timed out" in run.error
    time.sleep(0.3)
    leftovers = subprocess.run(["pgrep", "-f", f"directory={loop_xfs.mountpoint}"], capture_output=True,
                               text=True).stdout.split()
    def running(pid):
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
    alive = [p for p in leftovers if running(p)]
    assert alive == [], f"fio processes survived the timeout: {alive}"


def test_cleanup_removes_only_our_files(loop_xfs, tmp_path):
    from iowarden.probes.fio_run import remove_probe_dir
    assert probe(loop_xfs.mountpoint).ok
    pdir = loop_xfs.mountpoint / PROBE_DIR_NAME
    (pdir / "notes.txt").write_text("not ours")
    removed = remove_probe_dir(str(loop_xfs.mountpoint))
    assert removed == [str(pdir / "probe-16777216.dat")] and os.listdir(pdir) == ["notes.txt"]
    (pdir / "notes.txt").unlink()
    assert remove_probe_dir(str(loop_xfs.mountpoint)) == [str(pdir)] and not pdir.exists()
