"""The XFS report on mount points whose names the mount table escapes (a space, a backslash, a line feed).

Landed code: the geometry was missing with a warning every pass, since xfs_info (Debian's script) looks the
path up again with findmnt, which prints those characters escaped; `xfs_spaceman -c info` on the path works.
"""
import pytest

from iowarden.probes import xfs

from tests.conftest import LoopXfs

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.mark.parametrize("name", ["with space", "back\\slash", "line\nfeed"])
def test_geometry_and_free_space_of_a_mount_point_the_mount_table_escapes(tmp_path, name):
    where = tmp_path / name
    fs = LoopXfs(size="300M", mountpoint=where)
    try:
        mounts = dict((mnt, dev) for dev, mnt in xfs.xfs_mounts())
        assert str(where) in mounts, "the mount table's escapes are read back to the real name"
        report = xfs.read(str(where), mounts[str(where)], timeout_seconds=60)
        assert report.geometry is not None, report.errors
        assert report.geometry.block_size_bytes == 4096
        assert report.free_space is not None and not report.errors, report.errors
    finally:
        fs.close()
