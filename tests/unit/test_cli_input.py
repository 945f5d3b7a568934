"""One-shot commands given bad input: a one-line error and exit 2, never a loop,
a hang, a traceback or a silently different answer. No root needed."""
import os
import subprocess
import sys

import pytest

from iowarden.probes.common import ParseError

IOWARDEN = [sys.executable, "-m", "iowarden.daemon.cli"]


# A hang is what these bounds catch, not a slow start: on a busy machine the interpreter alone took 3-5 s to start.
def run(*args, timeout=60):
    return subprocess.run(IOWARDEN + list(args), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args,says", [
    (["iostat", "nan"], "must be a finite number of seconds above 0"),     # looped flat out
    (["iostat", "inf", "1"], "must be a finite number of seconds above 0"),  # a traceback
    (["iostat", "1", "-5"], "must be at least 1"),                          # exited 0 after one report
    (["iostat", "0"], "must be a finite number of seconds above 0"),
    (["xfs", "--timeout", "-1"], "must be a finite number of seconds above 0"),
    (["xfs", "--timeout", "nan"], "must be a finite number of seconds above 0"),
])
def test_bad_numbers_are_refused_at_once(args, says):
    r = run(*args)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""


def test_xfs_file_on_a_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = run("xfs", "--file", str(fifo))
    assert r.returncode == 2 and "not a regular file" in r.stderr


@pytest.mark.parametrize("how", ["csv", "passive"])
def test_replay_refuses_a_fifo_and_a_device_at_once_and_bounds_what_it_reads(tmp_path, how, monkeypatch):
    """Landed code: `replay /dev/zero` read until a MemoryError (2.6 GB under a ulimit) and `replay FIFO`
    blocked for ever; both are refused now, and a recording over the bound is refused as it is read."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        argv = ("replay", str(path)) if how == "csv" else ("replay", "--passive", str(path))
        r = run(*argv)
        assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
    from iowarden.daemon.commands import replay
    big = tmp_path / "big.csv"
    big.write_text("timestamp,value\n" + "".join(f"{i},5\n" for i in range(1, 2000)))
    monkeypatch.setattr(replay, "REPLAY_MAX_BYTES", 1024)
    with pytest.raises(ParseError, match="larger than 1024 bytes"):
        replay.read_series_csv(str(big))


@pytest.mark.parametrize("rows,says", [
    ("1,5\n2,nan\n", "3: 'nan' is not a finite number"),     # was taken as 0: "no alerts"
    ("1,5\n2,inf\n", "3: 'inf' is not a finite number"),     # raised a critical alert
    ("2,5\n1,5\n", "3: timestamp 1 is not after the one before it"),   # changed the result silently
    ("1,5\n1,5\n", "3: timestamp 1 is not after the one before it"),
])
def test_replay_refuses_values_it_cannot_judge_naming_the_line(tmp_path, rows, says):
    csv = tmp_path / "s.csv"
    csv.write_text("timestamp,value\n" + rows)
    r = run("replay", str(csv))
    assert r.returncode == 2 and f"{csv}:{says}" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_relative_path_is_taken_from_the_working_directory_without_resolving_links(tmp_path, monkeypatch):
    # `probe --path rel` was refused as "not an absolute path", and characterize recorded every step failed
    from iowarden.daemon.cli import build_parser
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    for cmd in ("probe", "characterize"):
        args = build_parser().parse_args([cmd, "--path", "link/sub/.."])
        # lexical: the link stays in the path, for the probe's walk from / to refuse
        assert args.path == str(tmp_path / "link"), args.path


def test_check_config_names_target_paths_that_cannot_be_probed_here(tmp_path, capsys, monkeypatch):
    import os
    ro = tmp_path / "ro"
    ro.mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text('[profiles.p]\nrw = "randread"\n' + "".join(
        f'[[targets]]\nname = "t{i}"\npath = "{p}"\nprofiles = ["p"]\n'
        for i, p in enumerate((tmp_path / "missing", ro, tmp_path))))
    real = os.statvfs

    class ReadOnly:
        f_flag = os.ST_RDONLY
    monkeypatch.setattr(os, "statvfs", lambda p: ReadOnly() if str(p) == str(ro) else real(p))
    from iowarden.daemon import cli
    assert cli.main(["check-config", "-c", str(cfg)]) == 1
    out, err = capsys.readouterr()
    assert "valid" in out and "but on this host" in out
    assert f"targets[0] (t0): path {tmp_path / 'missing'} does not exist" in err
    assert f"targets[1] (t1): path {ro} is on a read-only file system" in err
    assert "t2" not in err


def test_version_in_every_spelling_and_the_default_configuration(capsys):
    import pytest
    from iowarden.daemon import cli
    for argv in (["--version"], ["-V"]):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == 0
    assert cli.main(["version"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and len(set(out)) == 1 and out[0].startswith("iowarden ")
    args = cli.build_parser().parse_args(["status"])
    assert args.config == "/etc/iowarden/config.toml"


def test_iostat_count_is_the_number_of_reports_as_sysstats(capsys):
    """`iostat 0.1 2` prints two reports (since boot, then one interval); with -y, two intervals."""
    from iowarden.daemon import cli
    for argv in (["iostat", "--json", "0.1", "2"], ["iostat", "--json", "-y", "0.1", "2"], ["iostat", "0.1", "1"]):
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        if "--json" in argv:
            stamps = {line.split('"timestamp": ')[1].split(",")[0] for line in out.splitlines() if line.strip()}
            assert len(stamps) == int(argv[-1]), (argv, out[:300])
        else:
            assert out.count("Device") == 1, out


def test_baseline_for_a_target_or_profile_that_does_not_exist_exits_1_and_queues_nothing(tmp_path, capsys):
    """`baseline accept --target nosuch` answered "queued for target nosuch" and exited 0."""
    from iowarden.daemon import cli
    from iowarden.daemon.core.state import State
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[profiles.p]\nrw = "randread"\n'
                   f'[[targets]]\nname = "db"\npath = "{tmp_path}"\nprofiles = ["p"]\n')
    (tmp_path / "state").mkdir()
    State(str(tmp_path / "state" / "state.db")).close()   # the daemon has run once
    for argv in (["baseline", "show", "--target", "nosuch"], ["baseline", "accept", "--target", "nosuch"],
                 ["baseline", "reset", "--profile", "nosuch"]):
        assert cli.main([*argv, "-c", str(cfg)]) == 1, argv
        err = capsys.readouterr().err
        assert "no target named 'nosuch' (known: db)" in err or "no profile named 'nosuch' (configured: p)" in err
    assert cli.main(["baseline", "show", "--target", "db", "-c", str(cfg)]) == 0
    assert "no baselines yet for target db" in capsys.readouterr().out
    assert cli.main(["baseline", "accept", "--target", "db", "-c", str(cfg)]) == 0
    assert "queued for target db" in capsys.readouterr().out
    state = State(str(tmp_path / "state" / "state.db"))
    try:
        assert state.take_baseline_requests() == [("accept", "db", None)]
    finally:
        state.close()


def test_the_passive_table_shows_the_devices_there_now_each_once():
    from iowarden.daemon.commands.status import present_views
    views = [{"device": "loop10", "identity": "loop-file:/a", "at": 10.0},
             {"device": "loop10", "identity": "loop-file:/b", "at": 30.0},
             {"device": "loop10", "identity": "loop-file:/c", "at": 20.0},
             {"device": "sdb", "identity": "wwn:1", "at": 5.0},
             {"device": "loop11", "identity": "loop-file:/gone", "at": 40.0}]
    shown = present_views(views, {"loop10": object(), "sdb": object()})
    assert [(v["device"], v["identity"]) for v in shown] == [("loop10", "loop-file:/b"), ("sdb", "wwn:1")]


def test_replay_says_when_an_alert_was_in_local_time_and_its_json_is_the_array_its_help_says(tmp_path):
    """The CSV replay's table printed raw Unix seconds; its --help promised "one JSON object per value"."""
    import json
    import time
    csv = tmp_path / "iops.csv"
    start = 1_700_000_000
    csv.write_text("".join(f"{start + 300 * i},{1000.0 if i < 30 else 100.0}\n" for i in range(40)))
    r = run("replay", str(csv))
    assert r.returncode == 0, r.stderr
    import re
    raised = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)  +open +critical$", r.stdout, re.M)
    assert raised and str(start)[:6] not in r.stdout, r.stdout
    at = time.mktime(time.strptime(raised.group(1), "%Y-%m-%d %H:%M:%S"))
    assert start + 300 * 30 <= at <= start + 300 * 39, (raised.group(1), r.stdout)   # after the drop, local time
    alerts = json.loads(run("replay", str(csv), "--json").stdout)
    assert isinstance(alerts, list) and alerts and set(alerts[0]) >= {"start", "end", "severity"}, alerts
    assert "a JSON array of the alert intervals" in run("replay", "--help").stdout.replace("\n", " ").replace(
        "  ", " ")


def test_utc_prints_instants_in_utc_as_date_u_does(tmp_path):
    csv = tmp_path / "iops.csv"
    start = 1_700_000_000   # 2023-11-14 22:13:20 UTC
    csv.write_text("".join(f"{start + 300 * i},{1000.0 if i < 30 else 100.0}\n" for i in range(40)))
    env_tz = {"TZ": "Asia/Kolkata"}   # +05:30: a local time is not the UTC one
    import os
    import subprocess
    local = subprocess.run(IOWARDEN + ["replay", str(csv)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, **env_tz}).stdout
    utc = subprocess.run(IOWARDEN + ["replay", str(csv), "--utc"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env_tz}).stdout
    import calendar
    import re
    import time
    stamp = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)"
    at_utc = calendar.timegm(time.strptime(re.search(stamp, utc).group(1), "%Y-%m-%d %H:%M:%S"))
    at_local = calendar.timegm(time.strptime(re.search(stamp, local).group(1), "%Y-%m-%d %H:%M:%S"))
    assert at_local - at_utc == 5.5 * 3600, (utc, local)                  # the same instant, said two ways
    assert start + 300 * 30 <= at_utc <= start + 300 * 39, utc              # and the UTC one is the instant


def test_an_xfs_report_that_could_not_be_read_says_why_on_stderr_beside_its_json(monkeypatch, capsys):
    """`xfs --json` exits 1 when a filesystem could not be read; the JSON carries the error, and a script that
    reads only the exit status got an empty stderr."""
    import argparse
    from iowarden.daemon.commands import inspect
    from iowarden.probes import xfs
    monkeypatch.setattr(xfs, "xfs_mounts", lambda roots: [("/dev/loop9", "/srv/db")])
    monkeypatch.setattr(xfs, "read", lambda mnt, dev, timeout: xfs.XfsReport(mnt, dev, None, None, None, None,
                                                                             ("xfs_db: timed out after 120 s",)))
    rc = inspect.cmd_xfs(argparse.Namespace(file=None, mounts=[], json=True, timeout=120.0))
    out = capsys.readouterr()
    assert rc == 1 and "timed out" in out.out
    assert out.err == "iowarden xfs: /srv/db: xfs_db: timed out after 120 s\n"
