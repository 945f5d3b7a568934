"""`iowarden settings`: one long identity (a loop device's backing path) does not widen every row."""
import dataclasses

from iowarden.daemon.commands.inspect import settings_table
from iowarden.probes import blockqueue


def test_a_long_backing_path_leaves_the_other_columns_where_they_were(tree):
    devices = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    plain = settings_table(devices).splitlines()
    name = next(iter(devices))
    long = {**devices, name: dataclasses.replace(devices[name], identity="loop-file:/" + "x" * 280)}
    wide = settings_table(long).splitlines()
    assert len(wide) == len(plain) > 1
    for before, after in zip(plain, wide):
        cut = plain[0].index("identity")
        assert after[:cut] == before[:cut], (before, after)   # every column but the last is as it was
    assert max(len(x) for x in wide) > 280 > max(len(x) for x in wide if "x" * 280 not in x)
