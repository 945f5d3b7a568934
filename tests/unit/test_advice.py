"""The page's do-line fits the device: "replace it" only for a physical drive with evidence from itself."""
from types import MappingProxyType

import pytest

from iowarden.daemon.outputs.alert_metrics import alert_families
from iowarden.daemon.snapshot import PASSIVE_PROFILE, AlertView, Snapshot
from iowarden.daemon.sources.smart import SmartReading
from iowarden.daemon.verdicts.advice import KINDS, advice, device_kind
from iowarden.probes.blockqueue import BlockDevice
from iowarden.probes.smart import DriveHealth

DAY = 86400.0


def dev(name, kind="disk", model="", parent=None, slaves=(), backing=None):
    return BlockDevice(name=name, major=8, minor=0, kind=kind, size_bytes=10 ** 12, parent=parent, slaves=slaves,
                       holders=(), queue=None, udev={"ID_MODEL": model} if model else {}, loop_backing_file=backing)


VIEW = {d.name: d for d in (
    dev("sda", model="ST4000NM0035-1V4107"), dev("sda1", kind="partition", parent="sda"),
    dev("nvme1n1", model="Amazon Elastic Block Store"), dev("sdb", model="PersistentDisk"),
    dev("vda"), dev("sdc", model="QEMU_HARDDISK"), dev("loop3", kind="loop", backing="/srv/images/db.img"),
    dev("md0", kind="md"), dev("dm-2", kind="dm", slaves=("sdd", "sde")))}


@pytest.mark.parametrize("name,kind", [("sda", "drive"), ("sda1", "drive"), ("nvme1n1", "cloud volume"),
                                       ("sdb", "cloud volume"), ("vda", "virtual disk"), ("sdc", "virtual disk"),
                                       ("loop3", "loop device"), ("md0", "array"), ("dm-2", "array")])
def test_each_kind_of_device_is_told_from_what_the_kernel_and_udev_say(name, kind):
    assert device_kind(VIEW[name], VIEW) == kind
    assert device_kind(None, VIEW) == "unknown"


def test_replace_is_said_only_of_a_drive_with_evidence_from_itself():
    for kind in KINDS:
        for alert in ("DeviceSlow", "SlowMember"):
            quiet = advice(alert, kind, "sda", [], open_days=0.2)
            # a few slow hours are not evidence enough to replace anything, whatever the device
            assert "replace it" not in quiet.replace("replace it only", ""), (kind, quiet)
    said = advice("SlowMember", "drive", "sda", ["3 new media errors on sda since iowarden started"], 0.1)
    assert "replace it" in said and "3 new media errors on sda" in said
    assert "plan its replacement" in advice("DeviceSlow", "drive", "sda", [], open_days=4.0)
    # evidence from a drive's log is no evidence about a cloud volume: its provider replaces it
    cloud = advice("SlowMember", "cloud volume", "nvme1n1", [], open_days=9.0)
    assert "provider" in cloud and "replace" not in cloud
    assert "/srv/images/db.img" in advice("DeviceSlow", "loop device", "loop3", [], 0.0, below="/srv/images/db.img")
    assert advice("VolumeAtLimit", "drive", "sda", [], 0.0) == ""


def _passive(alert, device, raised_at=0.0):
    return AlertView(alert=alert, volume="v", profile=PASSIVE_PROFILE, target=device, severity="warning",
                     raised_at=raised_at, id=1, causes=("the device itself",))


def _advice_label(snapshot):
    _, _, info, _, _ = alert_families(snapshot)
    (sample,) = info.samples
    return sample.labels["advice"]


def test_the_page_reads_the_advice_from_the_device_view_and_the_drives_log():
    cloud = Snapshot(taken_at=10.0, version="t", alerts=(_passive("SlowMember", "nvme1n1"),), devices=VIEW)
    assert "provider" in _advice_label(cloud)
    failing = SmartReading(unix_time=5.0, drives=(DriveHealth(device="sda", media_errors=12),),
                           media_errors_at_start=MappingProxyType({"sda": 10}))
    # the alert on the partition, the drive's log under its disk
    on_partition = Snapshot(taken_at=10.0, version="t", alerts=(_passive("DeviceSlow", "sda1"),), devices=VIEW,
                            sources={"smart": failing})
    said = _advice_label(on_partition)
    assert "2 new media errors on sda" in said and "replace it" in said
    healthy_days = Snapshot(taken_at=5 * DAY, version="t", alerts=(_passive("DeviceSlow", "sda", raised_at=DAY),),
                            devices=VIEW)
    assert "Slow for 4 days" in _advice_label(healthy_days)


def test_status_and_the_journal_say_the_advice_the_page_says(tmp_path, caplog):
    """The facts the advice needs are kept with the alert: the journal's ALERT line ends with the do-line, and
    `status`, reading the state database only, says it with the alert's age."""
    import logging
    from types import SimpleNamespace
    from iowarden.daemon.core.state import State
    from iowarden.daemon.verdicts.advice import advice_of, device_facts
    from iowarden.daemon.core.effects import StoredHealth
    devices = {"sdc": SimpleNamespace(name="sdc", kind="disk", parent=None, slaves=(), udev={"ID_MODEL": "ST4000NM"},
                                      loop_backing_file=None)}
    facts = device_facts("sdc", devices, lambda disks: [])
    assert facts == {"kind": "drive", "drive_says": [], "below": ""}
    state = State(str(tmp_path / "state.db"))
    health = StoredHealth(state)
    t = SimpleNamespace(alert="SlowMember", device="wwn:sdc", kind="peers", state="raised",
                        summary="sdc reads 3.1x slower than its peers", evidence={"ratio": 3.1})
    with caplog.at_level(logging.ERROR, logger="iowarden"):
        health.on_passive(t, "sdc", (), facts)
    line = next(r.getMessage() for r in caplog.records if "ALERT SlowMember" in r.getMessage())
    assert line.endswith(advice_of("SlowMember", "sdc", facts, 0.0)) and "smartctl -x /dev/sdc" in line
    row = state.alerts(open_only=True)[0]
    assert row["evidence"]["device_facts"] == facts
    # damaged facts read back are taken as unknown, never a crash
    assert advice_of("SlowMember", "sdc", {"kind": 7, "drive_says": "x"}, 0.0).startswith("Look at what the device")
    from iowarden.daemon.commands.status import render
    from iowarden.daemon.commands.tables import table
    text = render({"probes": [], "baselines": [], "alerts": state.alerts(open_only=True), "drift": [], "budget": {},
                   "capability": {}, "passive": [], "sources": {}, "next_probes": {}}, table)
    assert "  do: Read its SMART log (smartctl -x /dev/sdc)" in text, text
