"""The probing layer's one reader of the rest of the daemon: every answer comes from the snapshot it is given."""
from types import MappingProxyType

from iowarden.daemon.config import Target
from iowarden.daemon.probing.published import Published
from iowarden.daemon.snapshot import Snapshot
from iowarden.probes.blockqueue import BlockDevice


def _disk(name: str, identity: str) -> BlockDevice:
    return BlockDevice(name, 8, 16, "disk", 10 << 30, None, (), (), None, identity=identity)


def _snapshot(pins: dict, devices: dict) -> Snapshot:
    return Snapshot(0.0, "test", pins=MappingProxyType(pins), devices=MappingProxyType(devices))


def test_a_target_is_refused_on_another_volume_than_its_pin_as_published():
    snap = [_snapshot({"db": "wwn-0xaaa"}, {"sdb": _disk("sdb", "wwn-0xaaa"), "sdc": _disk("sdc", "wwn-0xbbb")})]
    published = Published(lambda: snap[0])
    db = Target("db", "/srv/db", ("rr",), 60.0)
    assert published.pin_refusal(db, "sdb") is None
    refusal = published.pin_refusal(db, "sdc")
    assert refusal and "wwn-0xbbb" in refusal and "wwn-0xaaa" in refusal and "baseline reset --target db" in refusal
    # a device the view does not know yet has no stable identity: refused as well, never guessed
    assert "kernel:sdd" in published.pin_refusal(db, "sdd")
    # the core publishes a reset pin: the next read follows it, nothing is cached here
    snap[0] = _snapshot({}, snap[0].devices)
    assert published.pin_refusal(db, "sdc") is None


def test_a_discovered_target_follows_its_mount_not_a_pin():
    published = Published(lambda: _snapshot({"data": "wwn-0xaaa"}, {"sdc": _disk("sdc", "wwn-0xbbb")}))
    found = Target("data", "/data", ("rr",), 60.0, found_on_dev=2049)
    assert published.pin_refusal(found, "sdc") is None


def test_before_the_first_snapshot_nothing_is_suspected_or_refused():
    published = Published(lambda: None)
    assert published.suspected("db", "rr") is None
    assert published.pin_refusal(Target("db", "/srv/db", ("rr",), 60.0), "sdb") is None
    assert published.recent_util_percent("sdb") is None and published.io_pressure is None


def test_the_device_view_is_the_snapshots_once_it_holds_one(tmp_path):
    from iowarden.probes.common import Roots
    view = {"sdb": _disk("sdb", "wwn-0xaaa")}
    assert dict(Published(lambda: _snapshot({}, view), Roots(sys=tmp_path)).devices()) == view
    # before it: sysfs under the roots given (here an empty tree), not the machine's
    assert dict(Published(lambda: None, Roots(sys=tmp_path)).devices()) == {}


def test_a_profile_whose_normal_still_learns_is_said_so_per_target_as_published():
    """A warm-up probe the core set aside (a busy device short of the quiet ones' figure) is counted by the
    scheduler but not learned: the scheduler keeps the profile's warm-up while the core says it still learns."""
    from iowarden.daemon.snapshot import BaselineView, ProbeView

    def snapshot(learning: bool) -> Snapshot:
        return Snapshot(0.0, "test", probes=(ProbeView("db", "rr", "wwn-0xaaa", None, None),
                                             ProbeView("db", "sw", "wwn-0xaaa", None, None)),
                        baselines=(BaselineView("wwn-0xaaa", "rr", "read_iops", 1.0, 0.1, None, 11, learning),
                                   BaselineView("wwn-0xaaa", "rr", "clat_p99_seconds", 1.0, 0.1, None, 11, True),
                                   BaselineView("wwn-0xaaa", "sw", "write_iops", 1.0, 0.1, 0.0, 12, False)))
    snap = [snapshot(True)]
    published = Published(lambda: snap[0])
    assert published.still_learning("db", "rr") and not published.still_learning("db", "sw")
    assert not published.still_learning("other", "rr")
    snap[0] = snapshot(False)   # a new snapshot is read anew
    assert not published.still_learning("db", "rr")
    assert not Published(lambda: None).still_learning("db", "rr")
