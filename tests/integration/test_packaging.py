"""Packages and the service: the .deb and RPM, `pip install .`, and iowarden run by a real systemd.

The systemd test boots systemd as PID 1 of a new PID and mount namespace in a
Debian root (tests/integration/systemd_root.py), installs the built .deb with apt,
and drives the service as a user would: start (active only after READY=1),
structured journal fields, reload, a volume found by a discovery rule and
written to through the sandbox, a hang killed by the watchdog, an upgrade
that keeps config and state, stop, purge.
"""
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.integration.helpers import free_port, wait_for
from tests.integration.systemd_root import BootedSystemd

pytestmark = [pytest.mark.root, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(["bash", str(ROOT / "packaging/deb/build.sh"), str(out)], check=True, capture_output=True)
    subprocess.run(["bash", str(ROOT / "packaging/deb/build.sh"), str(out)], check=True, capture_output=True,
                   env={**os.environ, "VERSION": "0.1.1"})
    subprocess.run(["bash", str(ROOT / "packaging/rpm/build.sh"), str(out)], check=True, capture_output=True)
    debs = sorted(out.glob("iowarden_*.deb"))
    rpms = sorted(out.glob("iowarden-*.rpm"))
    assert len(debs) == 2 and len(rpms) == 1
    return {"deb": debs[0], "deb_next": debs[1], "rpm": rpms[0]}


def _deb_files(deb) -> set[str]:
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], check=True, capture_output=True, text=True).stdout
    files = set()
    for line in out.splitlines():
        perms, path = line.split()[0], line.split()[5]
        if not perms.startswith("d"):
            files.add(path.lstrip(".").replace("/lib/systemd/system/", "/usr/lib/systemd/system/", 1)
                      if path.startswith("./lib/systemd/") else path.lstrip("."))
    return files


def _rpm_files(rpm) -> set[str]:
    out = subprocess.run(["rpm", "-qlvp", str(rpm)], check=True, capture_output=True, text=True).stdout
    return {line.split()[8] for line in out.splitlines() if not line.startswith("d")}


def test_deb_and_rpm_hold_the_same_files(packages):
    deb, rpm = _deb_files(packages["deb"]), _rpm_files(packages["rpm"])
    # the RPM ships byte-code; the .deb compiles it in postinst (Debian policy 6.6) and carries lintian's overrides
    assert not [p for p in deb if "__pycache__" in p]
    assert {p for p in rpm if "__pycache__" not in p} == deb - {"/usr/share/lintian/overrides/iowarden"}, (
        sorted(deb - rpm)[:10], sorted(rpm - deb)[:10])
    for path in ("/usr/bin/iowarden", "/usr/lib/systemd/system/iowarden.service", "/etc/iowarden/config.toml",
                 "/usr/share/iowarden/prometheus/iowarden.rules.yml",
                 "/usr/share/iowarden/grafana/iowarden-dashboard.json", "/usr/lib/iowarden/venv/bin/iowarden",
                 "/usr/share/man/man8/iowarden.8.gz", "/usr/lib/iowarden/blockstage.bpf.o"):
        assert path in deb, path
    assert any("/site-packages/iowarden/daemon/outputs/prometheus.py" in p for p in deb)
    # no library's own test suite (systemd-python's, psutil's): nothing in the package runs them
    shipped_tests = [p for p in deb if re.search(r"/site-packages/[^/]+/tests?/", p)]
    assert not shipped_tests, shipped_tests[:5]
    control = subprocess.run(["dpkg-deb", "-f", str(packages["deb"]), "Depends"], capture_output=True,
                             text=True).stdout
    assert "fio" in control and "xfsprogs" in control
    conffiles = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(packages["deb"])], capture_output=True).stdout
    assert b"/etc/iowarden/config.toml" in conffiles
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(packages["deb"])], capture_output=True, check=True).stdout
    script = subprocess.run(["tar", "-xO", "./usr/lib/iowarden/venv/bin/iowarden"], input=tar, capture_output=True,
                            check=True).stdout.decode()
    assert script.startswith("#!/usr/lib/iowarden/venv/bin/python"), script[:80]
    # the venv sees the distro's python3-matplotlib, which the package suggests, for characterize's plots
    cfg = subprocess.run(["tar", "-xO", "./usr/lib/iowarden/venv/pyvenv.cfg"], input=tar, capture_output=True,
                         check=True).stdout.decode()
    assert "include-system-site-packages = true" in cfg.splitlines(), cfg
    suggests = subprocess.run(["dpkg-deb", "-f", str(packages["deb"]), "Suggests"], capture_output=True,
                              text=True).stdout
    assert "python3-matplotlib" in suggests
    # the tracer's default engine: its object, built for the kernel's BPF machine, and libbpf to load it
    recommends = subprocess.run(["dpkg-deb", "-f", str(packages["deb"]), "Recommends"], capture_output=True,
                                text=True).stdout
    assert "libbpf1" in recommends and "bpftrace" in recommends, recommends
    elf = subprocess.run(["tar", "-xO", "./usr/lib/iowarden/blockstage.bpf.o"], input=tar, capture_output=True,
                         check=True).stdout
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 247, elf[:20]   # e_machine EM_BPF
    assert b".BTF" in elf and b".debug_info" not in elf   # CO-RE relocates by its BTF; no DWARF shipped
    man = subprocess.run(["tar", "-xO", "./usr/share/man/man8/iowarden.8.gz"], input=tar, capture_output=True,
                         check=True).stdout
    version = subprocess.run(["dpkg-deb", "-f", str(packages["deb"]), "Version"], capture_output=True,
                             text=True).stdout.strip()
    assert f'"iowarden {version}"' in gzip.decompress(man).decode().splitlines()[0]


def test_lintian_and_rpmlint_find_nothing_not_overridden_with_a_reason(packages):
    lint = subprocess.run(["lintian", "--fail-on", "error,warning", str(packages["deb"])], capture_output=True,
                          text=True, timeout=600)
    tags = [line for line in lint.stdout.splitlines() if line[:2] in ("E:", "W:")]
    assert lint.returncode == 0 and tags == [], lint.stdout + lint.stderr
    rpmlint = subprocess.run(["rpmlint", "-r", str(ROOT / "packaging/rpm/iowarden.rpmlintrc"), str(packages["rpm"])],
                             capture_output=True, text=True, timeout=600)
    assert "0 errors, 0 warnings" in rpmlint.stdout, rpmlint.stdout + rpmlint.stderr


def test_pip_install_gives_a_console_script(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check", str(ROOT)],
                   check=True, capture_output=True)
    r = subprocess.run([str(venv / "bin/iowarden"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "run" in r.stdout and "check-config" in r.stdout
    r = subprocess.run([str(venv / "bin/iowarden"), "check-config", "-c", str(ROOT / "config.example.toml")],
                       capture_output=True, text=True)
    # 1 when this host has no /var/lib/iowarden (the example's target): valid, and says what is missing
    assert r.returncode in (0, 1) and "valid" in r.stdout, r.stderr
    assert r.returncode == 0 or "/var/lib/iowarden does not exist" in r.stderr, r.stderr
    # every module of the installed package imports (a subpackage missing from the wheel would not)
    r = subprocess.run([str(venv / "bin/python"), "-c", "import iowarden.daemon.runtime, "
                        "iowarden.daemon.outputs.prometheus, iowarden.daemon.outputs.http, "
                        "iowarden.daemon.outputs.influx"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _score(unit: str) -> float:
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", unit], capture_output=True,
                         text=True).stdout
    return float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out).group(1))


def test_unit_verifies_and_its_exposure_score_is_recorded(tmp_path):
    unit = tmp_path / "iowarden.service"
    # ExecStart must exist for verify; the installed path is checked inside the real systemd below
    unit.write_text((ROOT / "systemd/iowarden.service").read_text().replace("/usr/bin/iowarden", "/bin/true"))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    score = _score(str(ROOT / "systemd/iowarden.service"))
    assert score <= 3.5
    assert f"{score}" in (ROOT / "README.md").read_text(), f"README must record the exposure score {score}"
    reference = Path("/lib/systemd/system/prometheus-node-exporter.service")
    if reference.exists():
        assert score < _score(str(reference))


def _serves(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def _show(sd, *props) -> dict:
    out = sd.run("systemctl", "show", "iowarden", "-p", ",".join(props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _journal(sd) -> list[dict]:
    out = sd.run("journalctl", "-u", "iowarden", "-o", "json", "--no-pager", check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


TEST_CONFIG = """
[prometheus]
listen_address = "127.0.0.1:{port}"
[limits]
min_free_bytes = "1MiB"
min_free_ratio = 0.0
[budget]
device_time_ratio = 1.0
[profiles.rr]
rw = "randread"
size = "16MiB"
runtime_seconds = 0.5
ramp_time_seconds = 0.0
{more}
[[targets]]
name = "state"
path = "/var/lib/iowarden"
profiles = [{profiles}]
interval_seconds = 2.0
"""


def _discovered_volume_probes(sd) -> list[str]:
    return [e.get("MESSAGE", "") for e in _journal(sd) if e.get("TARGET") == "disk:/srv/vol1"
            and e.get("PROBE") == "rw2"]


def _messages_about_the_volume(sd) -> list[str]:
    return [e.get("MESSAGE", "") for e in _journal(sd) if e.get("TARGET") in ("disk:/srv/vol1", "/srv/vol1")]


def _after_restart(sd, starts: str) -> str:
    """Restart the service; the first message about /srv/vol1 from then on that starts so."""
    seen = len(_messages_about_the_volume(sd))
    sd.run("systemctl", "restart", "iowarden")
    return wait_for(lambda: [m for m in _messages_about_the_volume(sd)[seen:] if m.startswith(starts)],
                    timeout=60, what=f"{starts!r} about /srv/vol1 after the restart")[0]


def _discovered_volume_is_probed_and_dropped(sd, tmp_path, dropin):
    """A [[discover]] rule for /srv/* under the unit's ProtectSystem=strict sandbox."""
    img = tmp_path / "srv-vol1.img"
    subprocess.run(["truncate", "-s", "320M", str(img)], check=True)
    subprocess.run(["mkfs.xfs", "-q", "-f", str(img)], check=True)
    dev = subprocess.run(["losetup", "--find", "--show", str(img)], capture_output=True, text=True,
                         check=True).stdout.strip()
    mountpoint = sd.root / "srv" / "vol1"
    in_systemd_ns = ["nsenter", "-t", str(sd.pid), "-m"]   # where the service's mounts come from
    try:
        # mounted while the service runs: found, and writable (a new mount keeps its own flags)
        mountpoint.mkdir(parents=True)
        subprocess.run(in_systemd_ns + ["mount", dev, str(mountpoint)], check=True)
        first = wait_for(lambda: _discovered_volume_probes(sd), timeout=60,
                         what="a probe of the volume mounted under /srv")[0]
        assert "write" in first and "failed" not in first, first
        # already mounted when the service starts: the sandbox makes it read-only, and the
        # daemon says why it is not probed ...
        warned = _after_restart(sd, "/srv/vol1 ")
        assert "read-only" in warned and "ReadWritePaths=" in warned, warned
        # ... until ReadWritePaths= names the directory the mount points live under
        (dropin / "discover.conf").write_text("[Service]\nReadWritePaths=/srv\n")
        sd.run("systemctl", "daemon-reload")
        allowed = _after_restart(sd, "probe ")
        assert "write" in allowed and "failed" not in allowed, allowed
        # unmounted: dropped
        wait_for(lambda: subprocess.run(in_systemd_ns + ["umount", str(mountpoint)],
                                        capture_output=True).returncode == 0, what="the volume unmounted")
        wait_for(lambda: [e for e in _journal(sd) if e.get("TARGET") == "disk:/srv/vol1"
                          and "dropped" in e.get("MESSAGE", "")], what="the target dropped")
    finally:
        subprocess.run(in_systemd_ns + ["umount", str(mountpoint)], capture_output=True)
        subprocess.run(["losetup", "-d", dev], check=False)


def test_service_under_a_real_systemd(packages, tmp_path):
    sd = BootedSystemd(tmp_path)
    try:
        shutil.copy(packages["deb"], sd.root / "root" / packages["deb"].name)
        shutil.copy(packages["deb_next"], sd.root / "root" / packages["deb_next"].name)
        sd.run("apt-get", "install", "-y", "--no-install-recommends", f"/root/{packages['deb'].name}",
               env={"DEBIAN_FRONTEND": "noninteractive"}, timeout=600)
        sd.run("systemd-analyze", "verify", "/lib/systemd/system/iowarden.service")
        assert _show(sd, "UnitFileState")["UnitFileState"] == "enabled"

        # start: active only once READY=1 came, after the first diskstats sample
        sd.run("systemctl", "stop", "iowarden")
        port = free_port()
        conf = sd.root / "etc/iowarden/config.toml"
        conf.write_text(TEST_CONFIG.format(port=port, more="", profiles='"rr"'))
        sd.run("systemctl", "start", "iowarden")
        st = _show(sd, "ActiveState", "SubState", "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic",
                   "MainPID", "StatusText")
        assert (st["ActiveState"], st["SubState"]) == ("active", "running")
        assert int(st["ActiveEnterTimestampMonotonic"]) - int(st["ExecMainStartTimestampMonotonic"]) >= 500_000
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "iowarden_build_info" in body

        # the journal carries structured fields
        # (a result carries its DEVICE; on a busy machine a deferral, with TARGET and PROBE only, may come first)
        probe_entries = wait_for(lambda: [e for e in _journal(sd) if e.get("PROBE") == "rr" and e.get("TARGET")
                                          and e.get("DEVICE")], timeout=60, what="a probe result in the journal")
        assert probe_entries[0]["TARGET"] == "state" and probe_entries[0]["MESSAGE"].startswith("probe state/rr")
        assert "devices sampled" in _show(sd, "StatusText")["StatusText"]

        # reload applies a changed configuration
        more = '[profiles.rw2]\nrw = "randwrite"\nsize = "16MiB"\nruntime_seconds = 0.5\nramp_time_seconds = 0.0\n'
        conf.write_text(TEST_CONFIG.format(port=port, more=more, profiles='"rr", "rw2"'))
        pid = _show(sd, "MainPID")["MainPID"]
        sd.run("systemctl", "reload", "iowarden")
        wait_for(lambda: [e for e in _journal(sd) if e.get("PROBE") == "rw2"], timeout=60,
                 what="a probe of the reloaded profile")
        assert _show(sd, "MainPID")["MainPID"] == pid
        assert any("configuration reloaded" in e.get("MESSAGE", "") for e in _journal(sd))

        # a [[discover]] rule: volumes mounted under /srv, through the sandbox
        dropin = sd.root / "etc/systemd/system/iowarden.service.d"
        dropin.mkdir(parents=True)
        rule = ('[scheduling]\ndiscover_interval_seconds = 1.0\n[[discover]]\nname = "disk"\n'
                'mountpoints = ["/srv/*"]\nfstypes = ["xfs"]\nprofiles = ["rw2"]\ninterval_seconds = 2.0\n')
        conf.write_text(TEST_CONFIG.format(port=port, more=more + rule, profiles='"rr", "rw2"'))
        sd.run("systemctl", "reload", "iowarden")
        _discovered_volume_is_probed_and_dropped(sd, tmp_path, dropin)
        shutil.rmtree(dropin)
        sd.run("systemctl", "daemon-reload")

        # a hung part: the watchdog ping stops, systemd kills and restarts the daemon
        dropin.mkdir(parents=True)
        (dropin / "test-watchdog.conf").write_text(
            "[Service]\nWatchdogSec=5\nEnvironment=IOWARDEN_TEST_HANG_FILE=/var/lib/iowarden/hang\n")
        sd.run("systemctl", "daemon-reload")
        sd.run("systemctl", "restart", "iowarden")
        pid = _show(sd, "MainPID")["MainPID"]
        (sd.root / "var/lib/iowarden/hang").write_text("sampler")
        wait_for(lambda: _show(sd, "MainPID")["MainPID"] not in (pid, "0"), timeout=60, what="a watchdog restart")
        assert int(_show(sd, "NRestarts")["NRestarts"]) >= 1
        log = sd.run("journalctl", "-u", "iowarden", "--no-pager", check=False).stdout
        assert "Watchdog timeout" in log
        (sd.root / "var/lib/iowarden/hang").unlink()
        wait_for(lambda: _show(sd, "ActiveState")["ActiveState"] == "active", timeout=30, what="active again")
        shutil.rmtree(dropin)
        sd.run("systemctl", "daemon-reload")

        # /metrics down and not to be had again: the watchdog withheld, systemd restarts the daemon
        dropin.mkdir(parents=True)
        (dropin / "test-watchdog.conf").write_text(
            "[Service]\nWatchdogSec=5\nEnvironment=IOWARDEN_TEST_DOWN_FILE=/var/lib/iowarden/down\n")
        sd.run("systemctl", "daemon-reload")
        sd.run("systemctl", "restart", "iowarden")
        wait_for(lambda: _serves(port), timeout=60, what="/metrics before the switch")
        pid, restarts = _show(sd, "MainPID")["MainPID"], int(_show(sd, "NRestarts")["NRestarts"])
        (sd.root / "var/lib/iowarden/down").write_text("metrics-endpoint")
        wait_for(lambda: not _serves(port), timeout=30, what="/metrics down")
        wait_for(lambda: _show(sd, "MainPID")["MainPID"] not in (pid, "0"), timeout=60,
                 what="a watchdog restart while /metrics is down")
        assert int(_show(sd, "NRestarts")["NRestarts"]) > restarts
        log = sd.run("journalctl", "-u", "iowarden", "--no-pager", check=False).stdout
        assert "metrics endpoint is down" in log and re.search(
            r"parts not completing: [^\n]*metrics-endpoint[^\n]*watchdog ping withheld", log), log[-3000:]
        (sd.root / "var/lib/iowarden/down").unlink()
        wait_for(lambda: _serves(port), timeout=60, what="/metrics again after the switch")
        shutil.rmtree(dropin)
        sd.run("systemctl", "daemon-reload")

        # an upgrade keeps the configuration and the state
        results = int(sd.run("/usr/lib/iowarden/venv/bin/python3", "-c",
                             "import sqlite3; print(sqlite3.connect('/var/lib/iowarden/state.db')"
                             ".execute('select count(*) from probe_results').fetchone()[0])").stdout)
        assert results > 0
        sd.run("apt-get", "install", "-y", "--no-install-recommends", f"/root/{packages['deb_next'].name}",
               env={"DEBIAN_FRONTEND": "noninteractive"}, timeout=600)
        assert "0.1.1" in sd.run("dpkg-query", "-W", "-f=${Version}", "iowarden").stdout
        assert f"127.0.0.1:{port}" in conf.read_text()
        wait_for(lambda: _show(sd, "ActiveState")["ActiveState"] == "active", timeout=30,
                 what="active after the upgrade")
        after = int(sd.run("/usr/lib/iowarden/venv/bin/python3", "-c",
                           "import sqlite3; print(sqlite3.connect('/var/lib/iowarden/state.db')"
                           ".execute('select count(*) from probe_results').fetchone()[0])").stdout)
        assert after >= results

        # a clean stop, then purge leaves nothing behind
        sd.run("systemctl", "stop", "iowarden")
        st = _show(sd, "ActiveState", "Result")
        assert (st["ActiveState"], st["Result"]) == ("inactive", "success")
        sd.run("apt-get", "purge", "-y", "iowarden", env={"DEBIAN_FRONTEND": "noninteractive"})
        for path in ("etc/iowarden", "var/lib/iowarden", "usr/lib/iowarden", "usr/bin/iowarden",
                     "lib/systemd/system/iowarden.service", "etc/systemd/system/multi-user.target.wants/iowarden.service"):
            assert not os.path.lexists(sd.root / path), f"/{path} left behind by purge"
        assert "iowarden" not in sd.run("systemctl", "list-unit-files", "--no-pager", check=False).stdout
    finally:
        sd.stop()
