"""Who is whose peer: drives of one model and size, members of one array, and loop devices only when the
configuration says which are alike (passive.loop_peers).

Two loop devices of one size are not two drives of one model: one is a database's volume over a file on a
busy disk, the other a snap image or a volume over an idle one. Peered by size, the soak's stacked loop
volumes compared a lower device carrying a backup with upper devices carrying a database, and named one.
"""
from iowarden.daemon.passive.part import peer_groups
from iowarden.daemon.passive.values import PassiveParams
from iowarden.probes.blockqueue import BlockDevice

GIB = 1 << 30


def _loop(n: int, size: int, backing: str) -> BlockDevice:
    return BlockDevice(f"loop{n}", 7, n, "loop", size, None, (), (), None, loop_backing_file=backing)


def _disk(name: str, model: str, size: int = 4000 * GIB) -> BlockDevice:
    return BlockDevice(name, 8, 0, "disk", size, None, (), (), None, udev={"ID_MODEL": model})


def _part(name: str, disk: str) -> BlockDevice:
    return BlockDevice(name, 8, 1, "partition", 100 * GIB, disk, (), (), None)


def _of(*devices: BlockDevice) -> dict:
    return {d.name: d for d in devices}


def test_loop_devices_of_one_size_are_nobodys_peers_by_default():
    devices = _of(_loop(0, GIB, "/var/lib/snapd/snaps/core_1.snap"), _loop(1, GIB, "/var/lib/snapd/snaps/lxd_2.snap"),
                  _loop(2, GIB, "/srv/images/db.img"), _disk("sda", "ST4000NM"), _disk("sdb", "ST4000NM"))
    assert peer_groups(devices) == [("sda", "sdb")]
    assert PassiveParams().loop_peers == ()


def test_loop_devices_are_peers_by_the_pattern_of_their_files_and_their_size():
    devices = _of(_loop(0, GIB, "/srv/images/db-a.img"), _loop(1, GIB, "/srv/images/db-b.img"),
                  _loop(2, 2 * GIB, "/srv/images/db-c.img"),     # one pattern, another size: not alike
                  _loop(3, GIB, "/var/lib/snapd/snaps/core.snap"),  # one size, no pattern: not a peer
                  _loop(4, GIB, "/srv/scratch/x.img"), _loop(5, GIB, "/srv/scratch/y.img"))
    groups = peer_groups(devices, loop_peers=("/srv/images/db-*.img", "/srv/scratch/*"))
    assert sorted(groups) == [("loop0", "loop1"), ("loop4", "loop5")]   # one group per pattern, never mixed


def test_disks_are_peers_by_model_and_size_and_partitions_never():
    devices = _of(_disk("sda", "ST4000NM"), _disk("sdb", "ST4000NM"), _disk("sdc", "WD4000"),
                  _disk("sdd", "ST4000NM", 8000 * GIB), _part("sda1", "sda"), _part("sda2", "sda"))
    assert peer_groups(devices) == [("sda", "sdb")]


def test_the_config_key_reaches_the_detectors_parameters():
    from types import SimpleNamespace
    from iowarden.daemon.config_schema import BASE_SECTIONS
    from iowarden.daemon.passive.values import PASSIVE_KEYS
    section = SimpleNamespace(**{k: BASE_SECTIONS["passive"][k].default for k in PASSIVE_KEYS})
    section.loop_peers = ["/srv/images/*"]
    assert PassiveParams.from_config(section).loop_peers == ("/srv/images/*",)


def test_a_long_list_of_patterns_is_refused_with_its_key(tmp_path):
    from iowarden.daemon import config
    f = tmp_path / "c.toml"
    f.write_text("[passive]\nloop_peers = [" + ", ".join(f'"/srv/{i}/*"' for i in range(65)) + "]\n")
    try:
        config.load(str(f))
    except config.ConfigError as exc:
        assert "passive.loop_peers" in str(exc) and "at most 64 entries" in str(exc), str(exc)
    else:
        raise AssertionError("65 patterns were taken")
