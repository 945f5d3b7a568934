"""Property-based: whatever bytes the kernel or a tool hands over, a parser answers or raises ParseError.

IOWARDEN_FUZZ_EXAMPLES=20000 runs a deeper search than the suite's default.
"""
import json
import os

from hypothesis import given, settings, strategies as st

from iowarden.daemon import config
from iowarden.probes import blockqueue, diskstats, fio, fio_job, fs_uuid, xfs
from iowarden.probes.common import ParseError
from tests.conftest import FIXTURES

EXAMPLES = int(os.environ.get("IOWARDEN_FUZZ_EXAMPLES", "300"))
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400)
numbers_and_words = st.lists(st.one_of(st.integers(-5, 2**64), st.sampled_from(["sda", "x", "", "-", "1.5"])),
                             max_size=22).map(lambda xs: " ".join(map(str, xs)))


def _only_parse_errors(fn, arg):
    try:
        fn(arg)
    except ParseError:
        pass


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(numbers_and_words, max_size=5).map("\n".join))
def test_diskstats(s):
    _only_parse_errors(diskstats.parse, s)


@settings(max_examples=EXAMPLES, deadline=None)
@given(text)
def test_fio_text(s):
    _only_parse_errors(fio.parse, s)


REAL = json.loads((FIXTURES / "fio" / "fio-3.33-randrw-json+.json").read_text())
leaf = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**12), st.floats(allow_nan=False), st.text(max_size=5))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.sampled_from(["iops", "bw_bytes", "io_bytes", "runtime", "clat_ns", "bins", "percentile", "N", "error"]),
       leaf)
def test_fio_json_with_a_field_replaced(key, value):
    doc = json.loads(json.dumps(REAL))
    job = doc["jobs"][0]
    targets = {"error": job, "clat_ns": job["read"], "bins": job["read"]["clat_ns"],
               "percentile": job["read"]["clat_ns"], "N": job["read"]["clat_ns"]}
    targets.get(key, job["read"])[key] = value
    _only_parse_errors(fio.parse, json.dumps(doc))


@settings(max_examples=EXAMPLES, deadline=None)
@given(text)
def test_xfs_outputs(s):
    for fn in (xfs.parse_frag, xfs.parse_freesp, xfs.parse_xfs_info):
        _only_parse_errors(fn, s)


@settings(max_examples=EXAMPLES, deadline=None)
@given(text)
def test_scheduler_and_udev(s):
    _only_parse_errors(blockqueue.parse_scheduler, s)
    blockqueue.parse_udev_db(s)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.one_of(st.binary(max_size=2048), st.binary(max_size=2044).map(lambda b: b"XFSB" + b)))
def test_filesystem_head(head):
    value = fs_uuid.parse_fs_uuid(head)
    assert value is None or len(value) == 36


@settings(max_examples=EXAMPLES, deadline=None)
@given(text)
def test_job_files(s):
    _only_parse_errors(fio_job.parse_job_file, s)


@settings(max_examples=EXAMPLES, deadline=None)
@given(text)
def test_config_text(s):
    try:
        config.parse(s, "fuzz.toml")
    except config.ConfigError as e:
        assert all(err.startswith("fuzz.toml:") for err in e.errors)


# Every option name fio 3.33 documents that a probe must never use, a few it may, and noise:
# whatever job file these make, nothing outside the allowlist reaches fio's argv.
_FIO_OPTION_NAMES = sorted(set(fio_job.ALLOWED_JOB_OPTIONS) | set(fio_job.OPTION_ALIASES) | {
    "trigger", "trigger-timeout", "trigger_timeout", "trigger-file", "trigger_cmd", "trigger-remote-cmd",
    "exec_prerun", "exec_postrun", "ioscheduler", "filename", "directory", "opendir", "nrfiles",
    "write_iolog", "read_iolog", "write_bw_log", "write_lat_log", "write_iops_log", "write_hist_log",
    "cpus_allowed", "cpumask", "verify", "verify_dump", "verify_state_save", "create_on_open", "unlink",
    "unlink_each_loop", "pre_read", "exitall", "exitall_on_error", "kb_base", "lockfile", "uid", "gid",
    "chroot", "mem", "iomem", "hugepage-size", "include", "cgroup", "cgroup_nodelete", "prio", "nice",
    "allow_mounted_write", "filename_format", "output", "output-format", "daemonize", "client", "server"})
_ENGINE_VALUES = ["libaio", "io_uring", "sg", "exec", "external:/tmp/x.so", "/tmp/x.so", "net", "filecreate"]


@settings(max_examples=EXAMPLES * 3, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_FIO_OPTION_NAMES + ["ioengine"] * 5),
                          st.one_of(st.sampled_from(_ENGINE_VALUES + ["4k", "1", "randread", "$x", "a;b"]),
                                    st.text(max_size=20)),
                          st.booleans()), max_size=12),
       st.text(alphabet="abcxyz-_ $[]", min_size=1, max_size=10))
def test_no_option_outside_the_allowlist_ever_reaches_fio(options, name):
    from iowarden.probes.fio_run import ProbeLimits, build_argv
    body = "".join(f"{k}={v}\n" if with_value else f"{k}\n" for k, v, with_value in options)
    text = f"[global]\n{body}[{name}]\nrw=randread\n"
    try:
        jobs = fio_job.parse_job_file(text)
    except ParseError:
        return
    prof = fio_job.ProbeProfile(name="p", jobs=tuple((n, tuple(sorted(o.items()))) for n, o in jobs))
    try:
        argv = build_argv(prof, "/x/probe.dat", ProbeLimits(), readonly=False)
    except ValueError:
        return   # a value build_argv cannot use (e.g. numjobs=0) fails before fio, as a refused profile
    own = {"output-format", "thread", "readonly", "name", "filename", "allow_file_create", "fallocate",
           "group_reporting"}
    for arg in argv[1:]:
        assert arg.startswith("--"), arg
        key, _, value = arg[2:].partition("=")
        assert key in fio_job.ALLOWED_JOB_OPTIONS or key in own, arg
        assert "$" not in value and "\n" not in value, arg
        if key == "ioengine":
            assert value in fio_job.ALLOWED_ENGINES
