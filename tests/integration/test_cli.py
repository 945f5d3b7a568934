"""The commands end to end, as a user runs them, on a real loop-mounted XFS filesystem."""
import json
import re
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.root
IOWARDEN = [sys.executable, "-m", "iowarden.daemon.cli"]


def iowarden(*args, check=True, user=None, timeout=300):
    prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"] if user else []
    r = subprocess.run(prefix + IOWARDEN + list(args), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"exit {r.returncode}: {r.stderr}")
    return r


def test_probe_from_config_prints_every_profile(shared_loop_xfs, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"""
[limits]
min_free_bytes = "1MiB"
min_free_ratio = 0.0
[profiles.rr]
rw = "randread"
size = "32MiB"
runtime_seconds = 1.0
ramp_time_seconds = 0.0
[profiles.sw]
rw = "write"
bs = "1MiB"
iodepth = 4
size = "32MiB"
runtime_seconds = 1.0
ramp_time_seconds = 0.0
[[targets]]
name = "data"
path = "{shared_loop_xfs.mountpoint}"
profiles = ["rr", "sw"]
""")
    out = json.loads(iowarden("probe", "-c", str(cfg), "--json").stdout)
    assert [(o["target"], o["profile"], o["ok"]) for o in out] == [("data", "rr", True), ("data", "sw", True)]
    for key in ("device", "error", "read_iops", "write_iops", "read_bw_bytes", "write_bw_bytes",
                "clat_p50_seconds", "clat_p99_seconds", "clat_p999_seconds"):
        assert key in out[0]
    assert out[0]["device"] == shared_loop_xfs.name
    assert out[0]["read_iops"] > 0 and out[1]["write_bw_bytes"] > 0 and out[1]["read_iops"] == 0
    assert 0 < out[0]["clat_p50_seconds"] <= out[0]["clat_p99_seconds"] <= out[0]["clat_p999_seconds"] < 1
    table = iowarden("probe", "-c", str(cfg), "--profile", "rr").stdout
    assert re.search(r"p99\.9 [mun]sec", table) and "rr" in table and "sw" not in table
    assert table.count("profile") == 1


def test_probe_refusal_is_reported_and_exits_1(shared_loop_xfs):
    r = iowarden("probe", "--path", shared_loop_xfs.device, "--rw", "randwrite", "--json", check=False)
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out[0]["ok"] is False and "only reads devices" in out[0]["error"]


def test_probe_with_a_users_job_file(shared_loop_xfs, tmp_path):
    job = tmp_path / "acceptance.fio"
    job.write_text("[global]\nioengine=libaio\ndirect=1\nbs=4k\nsize=32m\nruntime=1\ntime_based\n"
                   "[randwrite-qd8]\nrw=randwrite\niodepth=8\n")
    out = json.loads(iowarden("probe", "--path", str(shared_loop_xfs.mountpoint), "--job-file", str(job),
                              "--min-free-bytes", "1M", "--min-free-ratio", "0", "--json").stdout)
    assert out[0]["ok"] and out[0]["write_iops"] > 0


def test_iostat_json_lines(shared_loop_xfs):
    lines = iowarden("iostat", "-y", "--json", shared_loop_xfs.name, "0.3", "2").stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 2 and all(r["disk_device"] == shared_loop_xfs.name for r in rows)
    assert {"r/s", "rkB/s", "r_await", "aqu-sz", "util", "timestamp"} <= set(rows[0])
    r = iowarden("iostat", "-d", "nosuchdisk", check=False)
    assert r.returncode != 0 and "no device matches" in r.stderr


def _column_ends(line: str) -> list[int]:
    return [m.end() for m in re.finditer(r"\S+", line)]


@pytest.mark.parametrize("flags", [["-x", "DEV"], ["-x", "-d", "DEV"], ["-c"]])
def test_iostat_text_is_laid_out_as_sysstats(shared_loop_xfs, flags):
    """The since-boot report of `iostat -x DEV` and ours, side by side: the same lines, blank lines and
    headers, every value ending in the same column, and the values themselves close (both are since boot)."""
    flags = [shared_loop_xfs.name if f == "DEV" else f for f in flags]
    ref = subprocess.run(["iostat", *flags], capture_output=True, text=True, check=True,
                         env={**os.environ, "LC_ALL": "C", "S_COLORS": "never"}).stdout.split("\n")
    ours = iowarden("iostat", *flags).stdout.split("\n")
    assert len(ours) == len(ref), (ref, ours)
    for theirs, mine in zip(ref, ours):
        if not theirs.strip() or theirs.startswith(("Linux", "avg-cpu:", "Device")):
            assert mine == theirs
            continue
        assert _column_ends(mine) == _column_ends(theirs), f"\n{theirs}\n{mine}"
        a, b = theirs.split(), mine.split()
        assert a[0] == b[0] or a[0].replace(".", "").isdigit()
        for x, y in zip(a, b):
            if x.replace(".", "").isdigit():
                assert abs(float(x) - float(y)) <= max(0.6, 0.02 * float(x)), f"\n{theirs}\n{mine}"


def test_settings_json(shared_loop_xfs):
    out = json.loads(iowarden("settings", "--json").stdout)
    dev = out["block_devices"][shared_loop_xfs.name]
    assert dev["kind"] == "loop" and dev["identity"] == f"fs-uuid:{shared_loop_xfs.fs_uuid}"
    assert dev["queue"]["scheduler"] in dev["queue"]["schedulers_available"]
    assert out["power"]["cpus"] and "pm_qos_cpu_dma_latency_usec" in out["power"]
    assert "scheduler" in iowarden("settings").stdout


def test_xfs_report_and_refusal(shared_loop_xfs):
    # its own filesystem only: the report of every XFS mount on a busy machine exits 1 when another job's
    # filesystem cannot be read in time, which says nothing of this one
    out = json.loads(iowarden("xfs", "--json", str(shared_loop_xfs.mountpoint)).stdout)
    mine = [r for r in out if r["mountpoint"] == str(shared_loop_xfs.mountpoint)]
    assert mine and mine[0]["geometry"]["block_size_bytes"] == 4096 and mine[0]["free_space"]["total_free_blocks"] > 0
    r = iowarden("xfs", "/proc", check=False)
    assert r.returncode != 0 and "not an XFS mount point" in r.stderr
    missing = shared_loop_xfs.mountpoint / "no-such-file"
    r = iowarden("xfs", "--file", str(missing), check=False)
    assert r.returncode == 1 and r.stderr == (f"iowarden xfs: cannot count the extents of {missing}: "
                                              "No such file or directory\n")


def test_without_root_the_message_says_what_needs_root(shared_loop_xfs):
    r = iowarden("probe", "--path", str(shared_loop_xfs.mountpoint), "--runtime", "1", "--json",
                 check=False, user=65534)
    assert r.returncode == 77 and "Traceback" not in r.stderr   # the documented "needs root", not 1
    assert "needs root" in json.loads(r.stdout)[0]["error"]
    r = iowarden("check-config", "-c", "/root/nonexistent.toml", check=False, user=65534)
    assert r.returncode == 78 and "Traceback" not in r.stderr


def test_test_script_explains_it_needs_root(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                        "bash", os.path.join(root, "scripts", "test.sh")], capture_output=True, text=True)
    assert r.returncode == 77 and "needs root" in r.stderr


def test_run_serves_metrics_where_its_listen_address_flag_says_and_keeps_it_over_a_reload(tmp_path):
    import signal
    import urllib.request
    from tests.integration.helpers import DaemonProc, free_port, wait_for
    configured, flagged = free_port(), free_port()
    d = DaemonProc(tmp_path, f'[prometheus]\nlisten_address = "127.0.0.1:{configured}"\n'
                             f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n',
                   on_host=lambda argv: argv + ["--web.listen-address", f"127.0.0.1:{flagged}"])
    try:
        d.wait_message("READY=1")

        def served(port):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return r.status == 200 and b"iowarden_build_info" in r.read()
            except OSError:
                return False
        assert served(flagged) and not served(configured)
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload" in d.output().lower(), timeout=60, what="the reload said in the log")
        wait_for(lambda: served(flagged), timeout=30, what="metrics still on the flag's address after a reload")
        assert not served(configured), "the reload moved /metrics to the configured port"
    finally:
        d.close()


def test_probe_of_a_target_nobody_configured_names_the_known_ones(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[profiles.rr]\nrw = "randread"\nsize = "32MiB"\n\n'
                   f'[[targets]]\nname = "db"\npath = "{tmp_path}"\nprofiles = ["rr"]\n')
    r = iowarden("probe", "-c", str(cfg), "--target", "nope", check=False)
    assert r.returncode != 0 and "no target named 'nope' (known: db)" in r.stderr, r.stderr
