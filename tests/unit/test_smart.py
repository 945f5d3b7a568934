"""Drive health from smartctl's JSON: the parser on SATA, NVMe and standby answers, the source's reader
against a stand-in smartctl, its metrics, and its causes in an alert the core raises. No root."""
from __future__ import annotations

import os
import stat
from types import MappingProxyType

import pytest

from iowarden.daemon.sources import smart as source
from iowarden.daemon.sources.smart import SmartReading
from iowarden.probes import smart
from iowarden.probes.common import ParseError, Roots
from tests.conftest import FIXTURES

NVME = (FIXTURES / "smart" / "nvme-critical.json").read_text()
SATA = (FIXTURES / "smart" / "sata-healthy.json").read_text()
STANDBY = (FIXTURES / "smart" / "standby.json").read_text()


def test_nvme_health_log_in_base_units():
    h = smart.parse("nvme0n1", NVME)
    assert (h.protocol, h.passed, h.critical_warning, h.media_errors, h.error_log_entries) == ("NVMe", False, 4, 2, 14)
    assert (h.temperature_celsius, h.warning_temperature_seconds, h.percentage_used) == (47, 180.0, 3.0)
    assert (h.available_spare_ratio, h.available_spare_threshold_ratio) == (1.0, 0.1)


def test_sata_bad_sectors_error_log_and_temperature_from_the_attributes():
    h = smart.parse("sdb", SATA)
    assert (h.protocol, h.passed, h.critical_warning) == ("ATA", True, None)
    assert h.media_errors == 8 + 1 + 1          # reallocated + pending + offline uncorrectable
    assert (h.error_log_entries, h.temperature_celsius, h.percentage_used) == (3, 36, None)


def test_a_disk_in_standby_is_not_woken_and_has_no_figures():
    h = smart.parse("sdc", STANDBY)
    assert h.standby and h.error is None and h.media_errors is None


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"json_format_version": [1, 0]}', "{" * 100000])
def test_what_is_not_smartctl_json_is_a_parse_error(text):
    with pytest.raises(ParseError):
        smart.parse("sda", text)


def test_an_answer_that_could_not_ask_the_drive_says_why():
    text = '{"smartctl": {"exit_status": 2, "messages": [{"string": "Smartctl open device: /dev/sdq failed: No such device"}]}}'
    h = smart.parse("sdq", text)
    assert h.error and "No such device" in h.error


def _section(**values):
    """The [smart] section as the daemon has it (a frozen dataclass from the schema), with these values."""
    import dataclasses

    from iowarden.daemon import config
    return dataclasses.replace(config.parse("").section("smart"), **values)


def _fake_smartctl(tmp_path, answers: dict[str, str]):
    """A stand-in smartctl: prints the fixture named for the device it is asked about (its last argument)."""
    for dev, text in answers.items():
        (tmp_path / f"{dev}.json").write_text(text)
    exe = tmp_path / "smartctl"
    exe.write_text(f'#!/bin/sh\nfor a; do last="$a"; done\ncat "{tmp_path}/$(basename "$last").json"\nexit 0\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def test_the_reader_asks_every_drive_but_not_loop_md_dm_or_virtio_and_keeps_the_first_media_errors(tmp_path):
    sys_block = tmp_path / "root" / "sys" / "block"
    for name in ("sda", "nvme0n1", "loop0", "md0", "dm-0", "vda", "zram0"):
        (sys_block / name).mkdir(parents=True)
    roots = Roots.under(tmp_path / "root")
    assert source.drives_to_ask(roots, []) == ["nvme0n1", "sda"]
    assert source.drives_to_ask(roots, ["vd*"]) == ["vda"]
    exe = _fake_smartctl(tmp_path, {"sda": SATA, "nvme0n1": NVME})
    read = source.start(_section(smartctl_path=exe, timeout_seconds=10.0), roots)
    first = read()
    assert [(h.device, h.media_errors) for h in first.drives] == [("nvme0n1", 2), ("sda", 10)]
    (tmp_path / "sda.json").write_text(SATA.replace('"value": 8, "string": "8"', '"value": 11, "string": "11"'))
    second = read()
    assert dict(second.media_errors_at_start) == {"nvme0n1": 2, "sda": 10}   # judged against the first pass
    assert source.causes(second, {"sda"}) == [
        "3 new media errors on sda since iowarden started (13 in all): the drive is remapping or failing reads"]
    with pytest.raises(TypeError):
        second.media_errors_at_start["sda"] = 0     # a reading is immutable


def test_a_missing_smartctl_is_a_reading_that_says_so_not_a_crash(tmp_path):
    sys_block = tmp_path / "root" / "sys" / "block"
    (sys_block / "sda").mkdir(parents=True)
    read = source.start(_section(smartctl_path=str(tmp_path / "nope"), timeout_seconds=5.0),
                        Roots.under(tmp_path / "root"))
    (h,) = read().drives
    assert h.error and "not found" in h.error


def _reading(**at_start) -> SmartReading:
    return SmartReading(1.7e9, (smart.parse("sdb", NVME), smart.parse("sdc", SATA)),
                        MappingProxyType(at_start or {"sdb": 2, "sdc": 10}))


def test_causes_name_the_critical_warning_and_the_failing_assessment_only_for_the_disks_asked_about():
    causes = source.causes(_reading(), {"sdb"})
    assert causes[0] == "SMART critical warning on sdb (0x04): reliability degraded by media or internal errors"
    assert "drive sdb fails its own SMART assessment" in causes
    assert source.causes(_reading(), {"sdc"}) == []            # old bad sectors are not news
    assert source.causes(_reading(), {"sdz"}) == []
    assert source.causes(None, {"sdb"}) == []


def test_a_volume_degraded_on_a_disk_with_a_critical_warning_says_so(tmp_path):
    """Through the core: a SourceRead, then results that degrade: the alert's causes carry the warning."""
    import dataclasses

    from iowarden.daemon.core.core import Core
    from iowarden.daemon.events import ProbeFinished, SourceRead, TargetsChanged
    from iowarden.daemon.core.state import State
    from iowarden.daemon.verdicts.detect import DetectorParams
    from iowarden.daemon.core.effects import health_from
    from iowarden.probes import fio
    from iowarden.probes.fio_run import ProbeResult
    from tests.unit.test_policy import _cfg, _target

    report = fio.parse((FIXTURES / "fio" / "fio-3.33-randrw-json+.json").read_text())

    def result(i, iops):
        d = report.directions
        rep = dataclasses.replace(report, directions={**d, "read": dataclasses.replace(d["read"], iops=iops)})
        return ProbeResult("db", "/srv/db", "sdb", "rr", True, None, 1.7e9 + 60 * i, 2.1, rep)

    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st, DetectorParams(warmup_probes=6)), "test")
    core.run_batch([TargetsChanged(_cfg(_target("db", 300.0)).targets), SourceRead("smart", _reading())])
    core.run_batch([ProbeFinished(result(i, 38000.0 * (1 + 0.01 * (i % 3))), ("sdb",)) for i in range(12)])
    core.run_batch([ProbeFinished(result(i, 9000.0), ("sdb",)) for i in range(12, 20)])
    (alert,) = st.alerts(open_only=True)
    assert alert["alert"] == "VolumeDegraded"
    assert any(c.startswith("SMART critical warning on sdb (0x04)") for c in alert["causes"]), alert["causes"]
    st.close()


def test_the_metrics_carry_the_stable_identity_and_leave_out_what_a_drive_did_not_report(tree):
    from iowarden.probes import blockqueue
    devices = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    snap = type("Snap", (), {"devices": devices})()
    fams = {f.name: f for f in source.families(_reading(), snap)}
    (warn,) = fams["iowarden_smart_critical_warning"].samples
    assert warn.labels == {"device": "sdb", "volume": devices["sdb"].identity} and warn.value == 4
    assert {s.labels["device"] for s in fams["iowarden_smart_media_errors"].samples} == {"sdb", "sdc"}
    assert fams["iowarden_smart_media_errors"].type == "counter"
    assert not fams["iowarden_smart_available_spare_ratio"].samples[1:]     # SATA has no spare figure
    assert list(source.families(None, snap)) == []
    assert os.path.basename(__file__) == "test_smart.py"
