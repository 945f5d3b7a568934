"""Every command of the README's table, run as its row shows it, against a daemon that has probed a loop XFS
(the commands keep the README's word). Each row's command has an example here, or the test fails:
a command added to the README without one is a command nobody ran. Each example checks its exit code and
that what the README says it prints (a column, a key, a section) is there; a filter that names nothing
exits 1 and says so."""
import json
import re
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.integration.helpers import DaemonProc, config_text, rows
from tests.unit.test_readme_commands import README, _rows

pytestmark = pytest.mark.root
IOWARDEN = [sys.executable, "-m", "iowarden.daemon.cli"]


def run(*args, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run(IOWARDEN + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def _iostat_json_keys() -> list[str]:
    """The keys the README promises in `iostat --json` (its row's backticked `r/s`, `rkB/s`, ...)."""
    row = next(line for line in README.read_text().splitlines() if line.startswith("| `iowarden iostat [-x]"))
    keys = re.findall(r"`([a-z_-]+(?:/s)?)`", row.split("sysstat's own keys", 1)[1])
    assert len(keys) >= 4, row
    return keys


def examples(cfg, mount, device, tmp) -> dict[str, list[tuple]]:
    """command -> [(argv, exit code, a check of the output)]: what the README's row for it promises."""
    bad = tmp / "bad.toml"
    bad.write_text(cfg.read_text().replace("[limits]", "[limits]\nmin_free_byte = 1"))
    csv = tmp / "series.csv"
    # a volume at 1000 IOPS for 150 minutes, then at 100: the detector's interval opens at the fall
    csv.write_text("timestamp,value\n" + "".join(f"{1_700_000_000 + i * 60},{1000 if i < 150 else 100}\n"
                                                 for i in range(200)))
    day = tmp / "day.jsonl"

    def record_day(out):
        day.write_text(out)
        return [json.loads(x) for x in out.splitlines()]
    keys = _iostat_json_keys()
    return {
        "run": [(["run", "--help"], 0, lambda out: "-c" in out)],
        "status": [(["status", "-c", cfg], 0,
                    lambda out: "last probe" in out and "normal (band)" in out and "budget " + device in out
                    and ("no open alerts" in out or "ALERT #" in out))],
        "baseline": [(["baseline", "show", "-c", cfg], 0, lambda out: "rr read IOPS" in out and "probes" in out),
                     (["baseline", "show", "-c", cfg, "--target", "nosuch"], 1, lambda out: True),
                     (["baseline", "accept", "-c", cfg, "--target", "nosuch"], 1, lambda out: "queued" not in out),
                     (["baseline", "reset", "-c", cfg, "--profile", "nosuch"], 1, lambda out: "queued" not in out)],
        "ack": [(["ack", "987654", "-c", cfg, "--note", "looking"], 1, lambda out: True)],
        "replay": [(["replay", "--metric", "iops", csv], 0, lambda out: "start" in out and "severity" in out
                    # the alert's start as an instant in local time (1,700,009,xxx s): the day and the hour
                    and re.search("^" + time.strftime("%Y-%m-%d %H:", time.localtime(1700009500)), out, re.M)),
                   (["replay", "--passive", day, "--window", "1"], 0, lambda out: "devices" in out)],
        "characterize": [(["characterize", "--path", mount, "--sweep", "qd,bs", "--dry-run"], 0,
                          lambda out: "qd" in out and "bs" in out and "randread" in out)],
        "check-config": [(["check-config", "-c", cfg], 0, lambda out: "valid" in out),
                         (["check-config", "-c", bad], 78, lambda out: True)],
        "probe": [(["probe", "-c", cfg, "--profile", "rr"], 0,
                   lambda out: all(w in out for w in ("IOPS", "MiB/s", "p50", "p99", "p99.9", "p99.99"))),
                  (["probe", "--path", mount, "--rw", "randread", "--bs", "4k", "--iodepth", "4", "--numjobs", "1",
                    "--size", "32MiB", "--runtime", "1", "--json"], 0,
                   lambda out: json.loads(out)[0]["read_iops"] > 0),
                  (["probe", "-c", cfg, "--target", "nosuch"], 1, lambda out: True)],
        "iostat": [(["iostat", "-x", "-d", device, "1", "2"], 0,
                    lambda out: all(c in out for c in ("Device", "r/s", "rkB/s", "r_await", "aqu-sz", "%util"))
                    and device in out and "avg-cpu" not in out),
                   (["iostat", "-c", "1", "1"], 0, lambda out: "avg-cpu" in out and "%iowait" in out),
                   (["iostat", "--json", device, "1", "3"], 0,
                    lambda out: all(k in o for o in record_day(out) for k in keys)),
                   (["iostat", "--latency", device, "2", "1"], 0,
                    lambda out: ("p50" in out and "I/Os" in out) or "no I/O on the traced disks" in out)],
        "xfs": [([ "xfs", mount], 0, lambda out: "frag %" in out and device in out)],
        "settings": [(["settings"], 0, lambda out: all(c in out for c in ("scheduler", "identity", device)))],
    }


def test_every_command_of_the_readme_runs_as_its_row_says(shared_loop_xfs, tmp_path):
    documented = {command for command, _ in _rows()}
    mount, device = shared_loop_xfs.mountpoint, shared_loop_xfs.name
    daemon = DaemonProc(tmp_path, config_text(mount, tmp_path / "state"))
    try:
        daemon.wait_message("READY=1", timeout=60)
        deadline = time.monotonic() + 120   # the warm-up's probes: status and baseline show have rows to show
        while time.monotonic() < deadline:
            try:
                if rows(tmp_path / "state" / "state.db", "select count(*) from probe_results")[0][0] >= 2:
                    break
            except sqlite3.OperationalError:   # the database is made by the daemon's first write
                pass
            time.sleep(0.5)
        else:
            raise AssertionError(f"no probe in 120 s: {daemon.output()[-2000:]}")
        table = examples(daemon.cfg, mount, device, tmp_path)
        assert documented <= set(table), f"README commands without an example here: {documented - set(table)}"
        wrong = []
        for command in sorted(documented):
            for argv, code, check in table[command]:
                t = time.monotonic()
                r = run(*argv)
                print(f"{time.monotonic() - t:6.1f} s  iowarden {' '.join(map(str, argv))}")
                said = r.stdout + r.stderr
                if r.returncode != code:
                    wrong.append(f"iowarden {' '.join(map(str, argv))}: exit {r.returncode}, not {code}: {said[-600:]}")
                elif code == 1 and not r.stderr.strip():
                    wrong.append(f"iowarden {' '.join(map(str, argv))}: exit 1 without saying why")
                elif not check(r.stdout if code == 0 else said):
                    wrong.append(f"iowarden {' '.join(map(str, argv))}: not what the README says: {said[-800:]}")
        assert not wrong, "\n".join(wrong)
    finally:
        daemon.close()
