"""Probe profiles and user job files: what fio is asked, and what a job file may not ask."""
import pytest

from iowarden.probes.common import ParseError, parse_size_bytes
from iowarden.probes.fio_job import ProbeProfile, parse_job_file, profile_from_job_file
from iowarden.probes.fio_run import ProbeLimits, build_argv

SEED_STYLE = """
; an all-flash acceptance test, the way people write them
[global]
ioengine=libaio
direct=1
time_based
runtime=300
size=4g
bs=4k

[randwrite-qd32]
rw=randwrite
iodepth=32

[randread-qd32]
rw=randread
iodepth=32
"""


def test_job_file_global_options_fold_into_each_job():
    jobs = parse_job_file(SEED_STYLE)
    assert [n for n, _ in jobs] == ["randwrite-qd32", "randread-qd32"]
    opts = dict(jobs[0][1])
    assert opts["ioengine"] == "libaio" and opts["time_based"] == "1" and opts["rw"] == "randwrite"


def test_job_file_profile_is_capped_by_limits(tmp_path):
    p = tmp_path / "flash.fio"
    p.write_text(SEED_STYLE)
    prof = profile_from_job_file("flash", p)
    assert prof.writes
    argv = build_argv(prof, "/x/probe.dat", ProbeLimits(max_size_bytes=64 << 20, max_runtime_seconds=5), False)
    assert argv.count("--size=67108864") == 2          # 4g capped to 64 MiB in both jobs
    assert argv.count("--runtime=5000ms") == 2         # 300 s capped to 5 s
    assert argv.count("--filename=/x/probe.dat") == 2
    assert "--allow_file_create=0" in argv and "--readonly" not in argv


@pytest.mark.parametrize("line,why", [
    ("filename=/dev/sda", "iowarden chooses the probe file"),
    ("directory=/", "probe directory"),
    ("exec_prerun=rm -rf /", "never run commands"),
    ("write_lat_log=/etc/x", "outside the probe directory"),
    ("ioengine=sg", "not allowed"),
    ("rw=trimwrite", "not a workload"),
])
def test_dangerous_job_options_are_refused_with_their_line(line, why):
    text = f"[global]\nbs=4k\n[job]\nrw=read\n{line}\n"
    with pytest.raises(ParseError, match=f"<job file>:5: .*{why}"):
        parse_job_file(text)


@pytest.mark.parametrize("text,match", [
    ("bs=4k\n[job]\n", "before any"),
    ("[global]\nbs=4k\n", "no job sections"),
    ("[job\nrw=read\n", "malformed section"),
    ("[job]\nsize=lots\n", "not a size"),
    ("[job]\nruntime=soon\n", "not a time"),
])
def test_malformed_job_files(text, match):
    with pytest.raises(ParseError, match=match):
        parse_job_file(text)


def test_profile_validation_names_every_problem():
    with pytest.raises(ValueError) as e:
        ProbeProfile("bad", rw="scribble", iodepth=0, size_bytes=1000, bs_bytes=4096)
    msg = str(e.value)
    assert "rw must be one of" in msg and "iodepth must be positive" in msg and "multiple of bs" in msg


def test_readonly_argv_for_devices():
    argv = build_argv(ProbeProfile("r"), "/dev/sdz", ProbeLimits(), True)
    assert "--readonly" in argv and "--rw=randread" in argv


@pytest.mark.parametrize("text,value", [("4k", 4096), ("256MiB", 256 << 20), ("1G", 1 << 30), ("512", 512),
                                        (4096, 4096), ("1.5k", 1536)])
def test_sizes_are_binary_like_fios(text, value):
    assert parse_size_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-4k", "1.3k", True])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_size_bytes(text)


# --- the allowlist --------------------------------------------

@pytest.mark.parametrize("line,why", [
    ("trigger=id > /tmp/pwned", "never run commands"),
    ("trigger-timeout=1", "not allowed"),
    ("trigger_timeout=1", "not allowed"),
    ("ioengine=/tmp/evil.so", "not allowed in a probe"),
    ("ioengine=external:/tmp/evil.so", "not allowed in a probe"),
    ("ioscheduler=bfq", "never changes the host"),
    ("cpus_allowed=0", "not allowed"),
    ("verify_dump=1", "not allowed"),
    ("rw=randread:$(id)", "not a workload"),
    ("bs=${HOME}", "not a size"),
    ("numjobs=100000", "more than a probe needs"),
])
def test_options_outside_the_allowlist_are_refused_with_their_line(line, why):
    with pytest.raises(ParseError, match=f"<job file>:4: .*{why}"):
        parse_job_file(f"[global]\nbs=4k\n[job]\n{line}\n")


def test_fio_include_syntax_is_refused_with_its_line():
    # fio's include is `include FILE`, not `include=FILE`: the old check let it through
    with pytest.raises(ParseError, match=r"<job file>:2: .*includes are not allowed"):
        parse_job_file("[global]\ninclude other.fio\n[job]\nrw=read\n")


def test_job_names_cannot_carry_options():
    with pytest.raises(ParseError, match="job name"):
        parse_job_file("[x --trigger=id]\nrw=read\n")


def test_aliases_reach_fio_by_their_documented_name():
    jobs = parse_job_file("[j]\nreadwrite=randread\nblocksize=8k\ntimeout=3\n")
    assert jobs[0][1]["rw"] == "randread" and jobs[0][1]["bs"] == "8k" and jobs[0][1]["runtime"] == "3"


def test_the_free_space_floor_scales_with_small_volumes():
    from iowarden.probes.fio_run import free_space_floor
    gib = 1 << 30
    limits = ProbeLimits()   # 1 GiB and 10 %, the defaults
    # a 4 GiB volume: 10 % (410 MiB), not 1 GiB (which refused probes at 75 % full)
    assert free_space_floor(4 * gib, limits) == int(0.4 * gib)
    # min_free_bytes alone never asks more than 5 % of a small filesystem
    assert free_space_floor(4 * gib, ProbeLimits(min_free_ratio=0.0)) == int(0.05 * 4 * gib)
    # on large ones the larger of the two governs
    assert free_space_floor(1 << 40, limits) == int(0.1 * (1 << 40))
    assert free_space_floor(100 * gib, ProbeLimits(min_free_ratio=0.001)) == gib


def test_each_user_of_a_probe_directory_removes_only_its_own_files(tmp_path):
    """characterize deleted the daemon's 256 MiB file, and the daemon's next probe deleted characterize's
    1 GiB one: each user now has its own names and cleans only those."""
    import os
    from iowarden.probes import fio_run
    names = ["probe-268435456.dat", "probe-4096.tmp", "characterize-1073741824.dat", "adhoc-16777216.dat",
             "notes.txt", "probe-x.dat", "characterize-.dat"]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert fio_run.clean_leftovers(fd, {16 << 20}, "characterize") == ["characterize-1073741824.dat"]
        assert sorted(fio_run.clean_leftovers(fd, {256 << 20}, "daemon")) == ["probe-4096.tmp"]
        assert fio_run.clean_leftovers(fd, set(), "probe") == ["adhoc-16777216.dat"]
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path)) == ["characterize-.dat", "notes.txt", "probe-268435456.dat", "probe-x.dat"]
    assert fio_run.probe_file_name(1 << 30, "characterize") == "characterize-1073741824.dat"
    assert fio_run.probe_file_name(1 << 20) == "probe-1048576.dat"   # the daemon's: the name it always had
