"""[[discover]] rules: which mounts become targets, read from a /proc/self/mounts tree, and config errors."""
import os

import pytest

from iowarden.daemon import config
from iowarden.daemon.probing.discovery import match, read_mounts, read_only_matches, targets_now
from iowarden.probes.common import Roots

PROFILES = """
[profiles.rr]
rw = "randread"
"""

# /proc/self/mounts format (proc(5)): device mountpoint fstype options dump pass, with
# spaces in paths written as \040. A later line over the same mountpoint hides the earlier.
MOUNTS = r"""/dev/vda / ext4 rw,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
/dev/nvme1n1 /srv/db xfs rw,noatime,attr2,inode64 0 0
/dev/nvme2n1 /srv/logs ext4 ro,relatime 0 0
tmpfs /srv/scratch tmpfs rw,size=1024k 0 0
/dev/nvme3n1 /srv/old\040data xfs rw,relatime 0 0
/dev/nvme4n1 /srv/conf xfs rw,relatime 0 0
/dev/nvme5n1 /data xfs rw,relatime 0 0
/dev/sdb1 /srv/stack xfs ro,relatime 0 0
/dev/sdc1 /srv/stack xfs rw,relatime 0 0
"""


def rule(name="data", mountpoints=("/srv/*",), fstypes=("xfs", "ext4"), interval=60.0):
    return config.DiscoveryRule(name, tuple(mountpoints), tuple(fstypes), ("rr",), interval)


@pytest.fixture
def proc(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mounts").write_text(MOUNTS)
    return Roots(proc=tmp_path)


def test_read_mounts_decodes_paths_reads_ro_and_keeps_the_top_mount(proc):
    mounts = {m[1]: m for m in read_mounts(proc)}
    assert mounts["/srv/old data"] == ("/dev/nvme3n1", "/srv/old data", "xfs", False)
    assert mounts["/srv/logs"][3] is True
    assert mounts["/srv/stack"] == ("/dev/sdc1", "/srv/stack", "xfs", False)  # the later mount hides sdb1


def test_rules_match_writable_mounts_of_their_types_and_leave_configured_paths_alone(proc):
    configured = (config.Target("conf", "/srv/conf/", ("rr",), 300.0),)
    devs = {"/srv/db": 101, "/srv/old data": 103, "/srv/stack": 105}
    found = match((rule(),), read_mounts(proc), configured, devs.get)
    assert [(t.name, t.path, t.found_on_dev, t.interval_seconds) for t in found] == [
        ("data:/srv/db", "/srv/db", 101, 60.0),
        ("data:/srv/old data", "/srv/old data", 103, 60.0),
        ("data:/srv/stack", "/srv/stack", 105, 60.0),
    ]  # not: ro /srv/logs, tmpfs /srv/scratch, the configured /srv/conf, /data (no pattern)
    assert read_only_matches((rule(),), read_mounts(proc)) == ["/srv/logs"]  # these are warned about


def test_first_matching_rule_wins_and_a_vanished_mountpoint_is_skipped(proc):
    rules = (rule("ext", fstypes=("ext4",)), rule("db", mountpoints=("/srv/db",)), rule("any"))
    devs = {"/srv/db": 1, "/srv/old data": None, "/srv/stack": 3, "/srv/conf": 4}
    found = {t.name for t in match(rules, read_mounts(proc), (), devs.get)}
    assert found == {"db:/srv/db", "any:/srv/stack", "any:/srv/conf"}


def test_targets_now_adds_what_the_rules_find_on_this_machine(tmp_path):
    cfg = config.parse(PROFILES + f"""
[[targets]]
name = "fixed"
path = "{tmp_path}"
profiles = ["rr"]
[[discover]]
name = "root"
mountpoints = ["/"]
fstypes = ["ext4", "xfs", "overlay", "btrfs", "tmpfs"]
profiles = ["rr"]
""")
    names = [t.name for t in targets_now(cfg)]
    assert names[0] == "fixed"
    assert names[1:] in ([], ["root:/"])  # "/" when it is writable and of a listed type


def test_discover_config_errors_name_line_and_key():
    text = PROFILES + """
[[targets]]
name = "db"
path = "/srv/db"
profiles = ["rr"]

[[discover]]
name = "db"
mountpoints = ["srv/*"]
profiles = ["rw"]
fstype = ["xfs"]

[[discover]]
name = "empty"
mountpoints = []
profiles = ["rr"]
interval_seconds = 0.5
"""
    with pytest.raises(config.ConfigError) as exc:
        config.parse(text, "c.toml")
    errors = exc.value.errors
    expected = [
        "c.toml:11: discover[0].name: name 'db' is used twice",
        "c.toml:12: discover[0].mountpoints: must be absolute glob patterns, got 'srv/*'",
        "c.toml:13: discover[0].profiles: no profile named 'rw'",
        "c.toml:14: discover[0].fstype: unknown key (did you mean 'fstypes'?)",
        "c.toml:18: discover[1].mountpoints: must name at least one pattern",
        "c.toml:20: discover[1].interval_seconds: must be at least 1",
    ]
    for e in expected:
        assert any(x.startswith(e) for x in errors), (e, errors)
    assert len(errors) == len(expected), errors


def test_a_valid_rule_is_parsed_with_defaults():
    cfg = config.parse(PROFILES + '[[discover]]\nname = "d"\nmountpoints = ["/srv/*"]\nprofiles = ["rr"]\n')
    assert cfg.discover == (config.DiscoveryRule("d", ("/srv/*",), ("xfs", "ext4"), ("rr",), 300.0),)


def test_discovered_targets_are_capped_and_the_rest_counted():
    """10,000 discovered targets took a scheduler step of 28.8 s against its 10 s
    deadline, and nothing capped them."""
    from iowarden.daemon.config import DiscoveryRule
    from iowarden.daemon.probing.discovery import match, over_limit
    rules = (DiscoveryRule("vol", ("/srv/*",), ("xfs",), ("rr",), 3600.0),)
    mounts = [(f"/dev/sd{i}", f"/srv/v{i}", "xfs", False) for i in range(10_000)] + [("/dev/x", "/srv/ro", "xfs", True)]
    found = match(rules, mounts, (), lambda m: 42, limit=1000)
    assert len(found) == 1000 and found[0].path == "/srv/v0"
    assert over_limit(rules, mounts, (), len(found)) == 9000


class _Watch:
    """pathstat's interface with the answers a stat child would give (st_dev per path)."""

    def __init__(self, devs):
        self.devs = devs

    def check(self, paths, timeout_seconds=5.0):
        from iowarden.probes.pathstat import PathAnswer
        return {p: PathAnswer(p, 0.0, self.devs[p], 0o040755) for p in paths if p in self.devs}


def _discover_cfg():
    return config.parse(PROFILES + """
[[discover]]
name = "db"
mountpoints = ["/srv/db"]
fstypes = ["xfs"]
profiles = ["rr"]
""")


def _mountinfo(proc, lines):
    (proc.proc / "self" / "mountinfo").write_text("".join(f"{i} 1 {dn} / {mnt} rw,relatime shared:1 - x y rw\n"
                                                          for i, (mnt, dn) in enumerate(lines, 20)))


def test_a_volume_unmounted_between_the_table_and_the_stat_is_not_taken_with_the_directory_beneath(proc):
    """The mount table still listed /srv/db when read; the stat, a moment later, answered for the root filesystem's
    directory underneath. Taking that st_dev made the probe's filesystem check pass on the root filesystem and
    the probe wrote <mountpoint>/.iowarden there."""
    from iowarden.daemon.probing.discovery import discover
    root, vol = os.makedev(254, 1), os.makedev(259, 3)
    cfg = _discover_cfg()
    _mountinfo(proc, [("/", "254:1")])                         # read after the stat: unmounted by then
    assert discover(cfg, proc, watch=_Watch({"/srv/db": root})).targets == ()
    _mountinfo(proc, [("/", "254:1"), ("/srv/db", "259:3")])   # still mounted: the volume's own device
    found = discover(cfg, proc, watch=_Watch({"/srv/db": vol})).targets
    assert [(t.name, t.found_on_dev) for t in found] == [("db:/srv/db", vol)]
    # remounted in between: listed again, but the stat saw the directory beneath
    assert discover(cfg, proc, watch=_Watch({"/srv/db": root})).targets == ()


def test_a_mount_whose_files_show_a_device_of_their_own_is_still_taken():
    """btrfs gives each subvolume an anonymous device: a mount of one is listed in mountinfo under another number
    than the one its files show, yet it is plainly not the filesystem beneath."""
    from iowarden.daemon.probing.discovery import still_the_mount
    devnos = [("/", "254:1"), ("/srv", "0:31"), ("/srv/db", "0:31")]
    assert still_the_mount("/srv/db", os.makedev(0, 31), devnos)
    assert still_the_mount("/srv/db", os.makedev(0, 44), devnos)      # the subvolume's own
    assert not still_the_mount("/srv/db", os.makedev(0, 31), devnos[:2])   # gone from the table
    assert not still_the_mount("/srv/db", os.makedev(254, 1), [("/", "254:1"), ("/srv/db", "0:44")])
