"""[[discover]] rules: which mounts become targets, read from a /proc/self/mounts tree, and config errors."""
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
