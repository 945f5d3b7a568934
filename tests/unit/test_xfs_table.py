"""`iowarden xfs` as a person reads it: the geometry and the free-space histogram the README lists, not only in
`--json` (captured xfsprogs output; no root)."""
from iowarden.daemon.commands.inspect import xfs_text
from iowarden.probes import xfs
from tests.conftest import FIXTURES


def test_the_table_says_geometry_and_the_free_space_histogram():
    d = FIXTURES / "xfs"
    free = xfs.parse_freesp((d / "xfs_spaceman-freesp.txt").read_text())
    geometry = xfs.parse_xfs_info((d / "xfs_info.txt").read_text())
    report = xfs.XfsReport("/srv/db", "/dev/sdb1", xfs.parse_frag((d / "xfs_db-frag-fragmented.txt").read_text()),
                           free, "xfs_spaceman", geometry, ())
    text = xfs_text([report])
    assert f"{geometry.ag_count} allocation groups" in text and f"{geometry.data_blocks:,} blocks" in text, text
    assert "free space by extent size (xfs_spaceman)" in text
    said = {tuple(line.split()[:3]) for line in text.splitlines()}
    assert free.buckets and all((str(b.from_blocks), str(b.to_blocks), str(b.extents)) in said
                                for b in free.buckets), text
