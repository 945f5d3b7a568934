"""A tool's output is bounded while it is read.

Every external tool runs through probes.common.run_tool. These tests put stand-ins on PATH (or name them
as the configured binary) that print what a broken or hostile tool would, and run the readers the daemon
runs: smartctl, xfs_db / xfs_spaceman / xfs_info, tuned-adm. No root, no devices.
"""
import json
import os
import signal
import resource
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from iowarden.probes import blocktrace, cpupower, smart, xfs
from iowarden.probes.common import ParseError, Roots, run_tool

EXAMPLES = int(os.environ.get("IOWARDEN_FUZZ_EXAMPLES", "40"))


def _stand_in(directory, name: str, body: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)
    return path


def test_a_tool_printing_600_mb_is_killed_at_the_cap_and_the_reader_stays_small(tmp_path):
    """Landed code: RSS 9 -> 907 MB in 6 s (communicate() read everything before the 1 MiB check)."""
    tool = _stand_in(tmp_path, "smartctl", "exec head -c 600000000 /dev/zero")
    # in a child process, so its peak RSS is the reader's alone
    code = textwrap.dedent(f"""
        import time
        from iowarden.probes import smart
        t = time.monotonic()
        h = smart.read("sda", "/dev", {tool!r}, 20.0)
        # VmHWM: this process image's own peak (ru_maxrss would carry the forking pytest's size over exec)
        hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
        print(round(time.monotonic() - t, 2), hwm // 1024)
        print(h.error)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    first, error = out.strip().split("\n")
    seconds, rss_mib = first.split()
    assert "printed more than 1048576 bytes" in error and "killed" in error
    assert float(seconds) < 5
    assert int(rss_mib) < 150, f"peak RSS {rss_mib} MiB"


def test_a_child_left_holding_stdout_does_not_hold_the_reader(tmp_path):
    """Landed code: the SMART part hung for the child's life (communicate() after the kill had no timeout)."""
    pidfile = tmp_path / "left.pid"
    tool = _stand_in(tmp_path, "smartctl", f"echo '{{}}'\nsetsid sleep 240 &\necho $! > {pidfile}\nexit 0")
    started = time.monotonic()
    try:
        h = smart.read("sda", "/dev", tool, timeout_seconds=1.0)
    finally:   # the child it left, by its pid: no other `sleep 240` on the machine is this test's
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    assert time.monotonic() - started < 3.0
    assert h.error   # '{}' is no smartctl report


def test_a_silent_tool_is_killed_at_its_whole_deadline_with_its_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    tool = _stand_in(tmp_path, "slow", f"sleep 60 &\necho $! > {pidfile}\necho partial\nwait")
    started = time.monotonic()
    run = run_tool([tool], timeout_seconds=1.0)
    assert time.monotonic() - started < 3.0
    assert run.error == "slow timed out after 1 s and was killed" and run.stdout == "partial\n"
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.05)   # reaped by init
    assert not os.path.exists(f"/proc/{child}") or "Z" in open(f"/proc/{child}/stat").read().split()[2]


def test_stderr_is_bounded_too(tmp_path):
    tool = _stand_in(tmp_path, "noisy", "head -c 50000000 /dev/zero >&2")
    run = run_tool([tool], timeout_seconds=20.0)
    assert "on its stderr" in run.error and len(run.stderr) <= 1 << 20


def test_a_smart_value_no_drive_can_have_is_that_fields_loss_not_the_passes():
    """Landed code: 1e999 raised OverflowError out of parse() and the pass lost every drive."""
    doc = {"smartctl": {"exit_status": 0}, "device": {"protocol": "NVMe"}, "smart_status": {"passed": True},
           "temperature": {"current": 41},
           "nvme_smart_health_information_log": {"critical_warning": 0, "media_errors": "MEDIA", "available_spare": 100,
                                                 "percentage_used": "USED"}}
    text = json.dumps(doc).replace('"MEDIA"', "1e999").replace('"USED"', "-1e999")
    h = smart.parse("nvme0n1", text)
    assert h.error is None and h.passed is True and h.temperature_celsius == 41
    assert h.media_errors is None and h.percentage_used is None and h.available_spare_ratio == 1.0


def test_a_bpftrace_entry_that_is_no_count_is_a_parse_error():
    for value in ("1e999", "-1", "true", "18446744073709551616"):
        with pytest.raises(ParseError):
            blocktrace.parse_message('{"type":"map","data":{"@ns":{"1,0,0":%s}}}' % value)
    many = ",".join(f'"{i},0,0":1' for i in range(blocktrace.MAX_MAP_ENTRIES + 1))
    with pytest.raises(ParseError):
        blocktrace.parse_message('{"type":"map","data":{"@ns":{%s}}}' % many)


# ---- the fuzzer: any bytes, any size, any value, through every tool reader ------------------------

_extreme = st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "1" * 5000, "-0", "18446744073709551616",
                            "[]", "{}", "null", "true", '"x"', "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]"
                                                                    "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"])


def _smart_doc(value: str) -> bytes:
    doc = json.loads((FIXTURE_SMART / "nvme-healthy.json").read_text()) if (FIXTURE_SMART / "nvme-healthy.json").exists() \
        else {"smartctl": {"exit_status": 0}, "nvme_smart_health_information_log": {}}
    doc.setdefault("nvme_smart_health_information_log", {})["media_errors"] = "@@"
    doc["temperature"] = {"current": "@@"}
    return json.dumps(doc).replace('"@@"', value).encode()


from tests.conftest import FIXTURES   # noqa: E402
FIXTURE_SMART = FIXTURES / "smart"

payloads = st.one_of(
    st.binary(max_size=4096),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=64), st.integers(1, 200_000)),   # up to ~12 MB
    _extreme.map(_smart_doc),
    _extreme.map(lambda v: f"Free space fragmentation {v}\nactual {v}, ideal {v}, fragmentation factor {v}%\n".encode()),
)


@pytest.fixture(scope="module")
def fake_tools(tmp_path_factory):
    """smartctl, xfs_db, xfs_spaceman, xfs_info and tuned-adm that print the file PAYLOAD, on PATH first."""
    bin_dir = tmp_path_factory.mktemp("fake-tools")
    payload = bin_dir / "PAYLOAD"
    payload.write_bytes(b"")
    for name in ("smartctl", "xfs_db", "xfs_spaceman", "xfs_info", "tuned-adm"):
        _stand_in(str(bin_dir), name, f"cat {payload}")
    etc = tmp_path_factory.mktemp("etc-root")
    (etc / "etc" / "tuned").mkdir(parents=True)
    (etc / "etc" / "tuned" / "active_profile").write_text("throughput-performance\n")
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}:{old}"
    try:
        yield payload, Roots.under(etc)
    finally:
        os.environ["PATH"] = old


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(payloads)
def test_every_tool_reader_answers_whatever_the_tool_prints(fake_tools, payload_bytes):
    payload, roots = fake_tools
    payload.write_bytes(payload_bytes)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    h = smart.read("sda", "/dev", "smartctl", timeout_seconds=10.0)
    assert isinstance(h, smart.DriveHealth)
    report = xfs.read("/mnt/x", "/dev/sdz", timeout_seconds=10.0)
    assert isinstance(report, xfs.XfsReport)
    tuned = cpupower.read_tuned(roots, True)
    assert tuned.active_profile == "throughput-performance" and tuned.verify_ok in (True, False, None)
    assert time.monotonic() - started < 30
    # a reader keeps at most its cap of a tool's output: the peak grows by far less than 12 MB x 5 tools
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024


def test_a_reaped_process_is_never_signalled_by_its_old_pid(monkeypatch):
    """A stop kills every probe process it tracked; one that ended and was reaped may have a pid (and a process
    group of that number) that is another process's by now: it is left alone."""
    import subprocess
    from iowarden.probes import common
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    signalled = []
    monkeypatch.setattr(common.os, "killpg", lambda pid, sig: signalled.append(pid))
    common.kill_group(proc)
    assert signalled == []
    live = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        common.kill_group(live)
        assert signalled == [live.pid]
    finally:
        live.kill()
        live.wait()


def test_every_tool_speaks_the_c_locale_whatever_the_hosts(monkeypatch):
    """systemd hands a service /etc/locale.conf's LANG: under de_DE xfs_db's fragmentation factor would come with
    a decimal comma and tuned-adm's words translated. A tool is run with LC_ALL=C, with or without an env of
    the caller's."""
    from iowarden.probes.common import run_tool
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    monkeypatch.setenv("LC_NUMERIC", "de_DE.UTF-8")
    said = run_tool(["sh", "-c", 'echo "$LC_ALL"; printf "%.2f" 12.34'], timeout_seconds=10).stdout.split()
    assert said == ["C", "12.34"], said
    own = run_tool(["sh", "-c", 'echo "$LC_ALL $MINE"'], timeout_seconds=10, env={"PATH": "/usr/bin:/bin", "MINE": "x"})
    assert own.stdout.split() == ["C", "x"], own.stdout
