"""A volume's class across the fleet (daemon/passive/classes.py): derived from what the machine says, the config's
word first. Pure, no root."""
from iowarden.daemon.passive.classes import MAX_CLASS_CHARS, volume_class
from iowarden.probes.blockqueue import BlockDevice, MdArray, MdMember

GIB = 1 << 30


def _disk(name, model="Amazon Elastic Block Store", firmware="1.0", size=500 * GIB, kind="disk", **kw):
    udev = {"ID_MODEL": model, "ID_REVISION": firmware} if model else {}
    return BlockDevice(name, 259, 0, kind, size, kw.pop("parent", None), kw.pop("slaves", ()), (), None,
                       udev=udev, **kw)


def test_a_disk_is_its_model_firmware_and_size_and_the_config_wins():
    devices = {"nvme1n1": _disk("nvme1n1")}
    assert volume_class("nvme1n1", devices) == ("Amazon Elastic Block Store/1.0/500GiB", "model")
    assert volume_class("nvme1n1", devices, "gp3-500") == ("gp3-500", "config")
    devices = {"sdb": _disk("sdb", model="SAMSUNG_MZ7LH960", firmware="HXT7404Q", size=960197124096)}
    assert volume_class("sdb", devices) == ("SAMSUNG MZ7LH960/HXT7404Q/894GiB", "model")
    assert volume_class("sdz", devices) == ("unknown", "unknown")


def test_an_array_is_its_layout_over_its_members_class_and_a_partition_its_disk():
    members = {f"nvme{i}n1": _disk(f"nvme{i}n1") for i in range(1, 5)}
    md = BlockDevice("md0", 9, 0, "md", 2000 * GIB, None, tuple(members), (), None,
                     md=MdArray("raid0", 0, 4, "clean", None, None, None,
                                tuple(MdMember(n, ("in_sync",), str(i)) for i, n in enumerate(members))))
    devices = {**members, "md0": md}
    assert volume_class("md0", devices) == ("md:raid0:4xAmazon Elastic Block Store/1.0/500GiB", "layout")
    lvm = BlockDevice("dm-0", 253, 0, "dm", 1000 * GIB, None, ("nvme1n1", "nvme2n1"), (), None)
    mixed = {**devices, "dm-0": lvm, "nvme2n1": _disk("nvme2n1", firmware="2.0")}
    assert volume_class("dm-0", mixed) == ("dm:2xmixed", "layout")   # unlike members: no class of one kind
    one = BlockDevice("dm-1", 253, 1, "dm", 500 * GIB, None, ("nvme3n1",), (), None)
    assert volume_class("dm-1", {**devices, "dm-1": one}) == ("Amazon Elastic Block Store/1.0/500GiB", "model")
    part = _disk("nvme1n1p1", kind="partition", parent="nvme1n1", size=100 * GIB)
    assert volume_class("nvme1n1p1", {**devices, "nvme1n1p1": part})[0] == "Amazon Elastic Block Store/1.0/500GiB/part"


def test_a_drive_with_no_medium_has_no_class():
    # the lab guest's floppy controller, empty, says a size of a few sectors: a class of its own for nothing
    devices = {"fd0": _disk("fd0", model=None, size=4096), "vdb": _disk("vdb", model=None, size=256 << 20),
               "loop9": _disk("loop9", model=None, size=0, kind="loop")}
    assert volume_class("fd0", devices) == ("", "no medium")
    assert volume_class("loop9", devices) == ("", "no medium")     # a loop device with no file behind it
    assert volume_class("vdb", devices) == ("disk/256MiB", "size")
    assert volume_class("fd0", devices, "floppies") == ("floppies", "config")   # the config's word still wins


def test_a_class_is_a_label_value_printable_and_bounded():
    devices = {"sdb": _disk("sdb", model="X\x1b[31m" + "y" * 400)}
    klass, _ = volume_class("sdb", devices)
    assert "\x1b" not in klass and len(klass) <= MAX_CLASS_CHARS


def test_the_fleet_signal_is_five_minutes_of_a_volumes_latency_over_its_own_normal_and_exported_with_its_class():
    """iowarden_fleet_slowdown_ratio: near 1 on a healthy day whatever its load, the factor a volume slowed by once
    five minutes of it have passed; beside it the volume's class."""
    import types
    from iowarden.daemon.passive.detector import PassiveDetector
    from iowarden.daemon.passive.metrics import passive_families
    from tests import passive_traces as pt
    det = PassiveDetector()
    day = pt.DAY_WINDOWS // 4
    trace = list(pt.device_trace(7, day + 40, slow_from=day + 20, factor=3.0))
    ratios = []
    for i, w in enumerate(trace):
        det.observe([w], [])
        v = det.views()[0]
        if i == day - 1:
            ratios.append(v.fleet_ratio)
    healthy = ratios[0]
    assert 0.85 <= healthy <= 1.2, healthy
    slowed = det.views()[0].fleet_ratio
    assert 2.4 <= slowed <= 3.6, slowed   # twenty windows of 3x: the five minutes' median is the factor
    name = trace[0].device
    snap = types.SimpleNamespace(passive=((name, name, det.views()[0]),), devices={name: _disk(name)},
                                 classes={}, passive_host_ratio=None)
    fams = {f.name: f for f in passive_families(snap)}
    assert fams["iowarden_fleet_slowdown_ratio"].samples[0].value == slowed
    empty = types.SimpleNamespace(**{**vars(snap), "devices": {name: _disk(name, model=None, size=4096)}})
    assert not {f.name: f for f in passive_families(empty)}["iowarden_volume_class_info"].samples   # no medium
    info = fams["iowarden_volume_class_info"].samples[0].labels
    assert info["class"] == "Amazon Elastic Block Store/1.0/500GiB" and info["source"] == "model"
    snap.classes = {name: "gp3-500"}
    info = {f.name: f for f in passive_families(snap)}["iowarden_volume_class_info"].samples[0].labels
    assert (info["class"], info["source"]) == ("gp3-500", "config")


def test_the_fleet_level_is_a_volumes_own_normal_by_octave_of_load_the_same_for_twins_and_higher_for_a_slow_one():
    """iowarden_fleet_normal_latency_seconds: two volumes of one class under the same traffic learn the same normal
    in each octave of load, one slow from its first day learns it that many times higher (its own ratio says 1:
    only its class can tell); no octave before 20 minutes of it, at most three a direction."""
    import types
    from iowarden.daemon.passive.detector import PassiveDetector
    from iowarden.daemon.passive.metrics import passive_families
    from iowarden.daemon.passive.values import FLEET_OCTAVES
    from tests import passive_traces as pt
    levels = {}
    for name, factor in (("sda", 1.0), ("sdb", 1.0), ("sdc", 2.0)):
        det = PassiveDetector()
        trace = list(pt.device_trace(11 if name != "sdb" else 12, pt.DAY_WINDOWS // 4, slow_from=0, factor=factor,
                                     device=name))
        for i, w in enumerate(trace):
            det.observe([w], [])
            if i == 60:   # a quarter of an hour: nothing learned enough to stand for the volume
                assert det.views()[0].fleet_normal == ()
        view = det.views()[0]
        assert 1 <= len(view.fleet_normal) <= FLEET_OCTAVES and {f.direction for f in view.fleet_normal} == {"read"}
        levels[name] = {f.octave: f.median_ms for f in view.fleet_normal}
        if factor != 1.0:
            assert 0.8 <= view.fleet_ratio <= 1.25, view.fleet_ratio   # normal to itself
            snap = types.SimpleNamespace(passive=((name, name, view),), devices={name: _disk(name)}, classes={},
                                         passive_host_ratio=None)
            fam = {f.name: f for f in passive_families(snap)}["iowarden_fleet_normal_latency_seconds"]
            assert {(s.labels["direction"], s.labels["load_unit"], int(s.labels["load_octave"]), s.value)
                    for s in fam.samples} == {("read", f.load_unit, f.octave, f.median_ms / 1e3)
                                              for f in view.fleet_normal}
    shared = set(levels["sda"]) & set(levels["sdb"]) & set(levels["sdc"])
    assert shared, levels
    for k in shared:
        assert 0.85 <= levels["sdb"][k] / levels["sda"][k] <= 1.15, (k, levels)
        assert 1.7 <= levels["sdc"][k] / levels["sda"][k] <= 2.3, (k, levels)
