"""xfs_db / xfs_spaceman / xfs_info output parsing (outputs captured from xfsprogs 6.1 here)."""
import pytest

from iowarden.probes import xfs
from iowarden.probes.common import ParseError
from tests.conftest import FIXTURES

X = FIXTURES / "xfs"


def test_frag_is_computed_from_the_counts():
    f = xfs.parse_frag((X / "xfs_db-frag-fragmented.txt").read_text())
    assert (f.actual_extents, f.ideal_extents) == (42, 4)
    assert f.fragmentation_ratio == pytest.approx((42 - 4) / 42)
    assert f.extents_per_file == pytest.approx(10.5)


def test_empty_filesystem_frag():
    f = xfs.parse_frag("actual 0, ideal 0, fragmentation factor 0.00%\n")
    assert f.fragmentation_ratio == 0.0 and f.extents_per_file == 0.0


@pytest.mark.parametrize("text", [
    "", "xfs_db: /dev/sdz is not a valid XFS filesystem (unexpected SB magic number 0x00000000)",
    "actual 10, ideal 2, fragmentation factor 80.00%\nFiles on this filesystem average 9.00 extents per file",
])
def test_frag_garbage_and_inconsistency(text):
    with pytest.raises(ParseError):
        xfs.parse_frag(text)


@pytest.mark.parametrize("name", ["xfs_spaceman-freesp.txt", "xfs_db-freesp.txt"])
def test_freesp_tables(name):
    fs = xfs.parse_freesp((X / name).read_text())
    assert fs.total_free_blocks == sum(b.blocks for b in fs.buckets)
    assert fs.total_free_extents == sum(b.extents for b in fs.buckets)
    assert all(b.from_blocks <= b.to_blocks for b in fs.buckets)


def test_freesp_rows_must_add_up():
    text = (X / "xfs_spaceman-freesp.txt").read_text().replace("212526", "999")
    with pytest.raises(ParseError, match="add up"):
        xfs.parse_freesp(text)


def test_freesp_garbage():
    with pytest.raises(ParseError):
        xfs.parse_freesp("   from      to extents  blocks    pct\n  1 2 x 4 5\n")
    with pytest.raises(ParseError):
        xfs.parse_freesp("xfs_spaceman: cannot open /mnt: Permission denied\n")


def test_xfs_info_geometry():
    g = xfs.parse_xfs_info((X / "xfs_info.txt").read_text())
    assert (g.block_size_bytes, g.data_blocks, g.ag_count, g.ag_size_blocks) == (4096, 262144, 4, 65536)
    assert g.inode_size_bytes == 512 and g.reflink is True and g.sunit_blocks == 0


def test_xfs_info_garbage():
    with pytest.raises(ParseError):
        xfs.parse_xfs_info("meta-data=/dev/sdz isize=512\n")


def test_mounts_decode_escapes_and_filter_xfs():
    text = ("/dev/sda1 / ext4 rw 0 0\n/dev/md0 /srv/my\\040data xfs rw,noatime 0 0\n"
            "proc /proc proc rw 0 0\n")
    assert xfs.parse_mounts(text)[1] == ("/dev/md0", "/srv/my data", "xfs")


@pytest.mark.parametrize("line", ["total free extents", "total free blocks many", "average free extent size ?"])
def test_freesp_totals_without_numbers(line):
    # found by the fuzz test: a truncated total line must be a ParseError, not a ValueError
    with pytest.raises(ParseError, match="without a number"):
        xfs.parse_freesp(line + "\n")
