"""The settings poller's device view: two readers (its own poll, and a uevent for a new disk) and
the newest read wins, whichever finishes last, in the poller's published view and in the core's.
No root, a fake clock."""
from __future__ import annotations

from iowarden.daemon.core.core import Core
from iowarden.daemon.core.state import State
from iowarden.daemon.sources import settings as pollers
from iowarden.daemon.core.effects import health_from
from iowarden.probes.common import Roots


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_a_poll_that_began_before_a_hot_add_does_not_put_back_the_view_without_the_disk(tmp_path, monkeypatch):
    old_view, new_view = {"sda": "sda only"}, {"sda": "sda", "sdb": "the hot-added disk"}
    state = State(str(tmp_path / "state.db"))
    posted = []
    poller = pollers.SettingsPoller(Roots(), posted.append, clock=Clock())
    reads = []

    def read(roots):
        reads.append(len(reads))
        if len(reads) == 1:
            # the poll is reading sysfs when the uevent for sdb arrives and reads it, with sdb
            posted.append(poller.read_devices())   # the runtime posts a uevent's read to the core
            assert poller.devices == new_view
            return old_view
        return new_view

    monkeypatch.setattr(pollers.blockqueue, "read_sysfs_and_superblocks", read)
    monkeypatch.setattr(pollers.cpupower, "read_power_settings", lambda *a, **k: None)
    monkeypatch.setattr(pollers, "watched_settings", lambda devices, power: {})
    poller.step()
    assert reads == [0, 1]
    assert poller.devices == new_view       # the poll's older read was not published over it
    core = Core(state, health_from(state), "test")
    core.run_batch(posted)                  # nor taken by the core, which gets the uevent's read first
    assert dict(core.snapshot.devices) == new_view
    poller.step()                           # the next poll, begun after, publishes its own read
    assert poller.devices == new_view and reads == [0, 1, 2]
    state.close()


def test_each_poll_publishes_what_it_read(tmp_path, monkeypatch):
    views = iter([{"sda": 1}, {"sda": 2}])
    state = State(str(tmp_path / "state.db"))
    poller = pollers.SettingsPoller(Roots(), lambda event: None, clock=Clock())
    monkeypatch.setattr(pollers.blockqueue, "read_sysfs_and_superblocks", lambda roots: next(views))
    monkeypatch.setattr(pollers.cpupower, "read_power_settings", lambda *a, **k: None)
    monkeypatch.setattr(pollers, "watched_settings", lambda devices, power: {})
    poller.step()
    assert poller.devices == {"sda": 1}
    poller.step()
    assert poller.devices == {"sda": 2}
    state.close()


def test_a_poll_that_reads_the_same_view_publishes_the_same_object(tmp_path, monkeypatch):
    """What is kept per device view downstream (a scrape's sections, each disk's label text) is kept while
    nothing changed: an equal read is the last view itself, a changed one a new view."""
    views = iter([{"sda": 1}, {"sda": 1}, {"sda": 2}])
    poller = pollers.SettingsPoller(Roots(), lambda event: None, clock=Clock())
    monkeypatch.setattr(pollers.blockqueue, "read_sysfs_and_superblocks", lambda roots: next(views))
    monkeypatch.setattr(pollers.cpupower, "read_power_settings", lambda *a, **k: None)
    first = poller.read_devices().devices
    assert poller.read_devices().devices is first and poller.devices is first
    assert poller.read_devices().devices == {"sda": 2} and poller.devices is not first


def test_an_md_array_going_clean_and_active_by_itself_is_no_drift_but_read_only_is():
    assert {pollers.md_array_mode(s) for s in ("clean", "active", "active-idle", "write-pending")} == {"read-write"}
    assert pollers.md_array_mode("readonly") == "readonly"
    assert pollers.md_array_mode("read-auto") == "read-auto"
    assert pollers.md_array_mode(None) is None


def test_drift_is_watched_only_on_the_samplers_devices(tree):
    """The settings poller watched every device, other software's included; the sampler's
    filter ([sampler] devices / exclude_devices) governs drift too, host settings always watched."""
    from iowarden.probes import blockqueue, cpupower
    devices = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    power = cpupower.read_power_settings(tree("cpu-bare-metal.tree"), run_tuned_adm_verify=False)
    every = pollers.watched_settings(devices, power)
    only = pollers.watched_settings(devices, power, wanted=frozenset({"sdb"}))
    assert {d for d, _ in every} > {"sdb", "host"}
    assert {d for d, _ in only} == {"sdb", "host"}


def test_a_name_that_now_holds_another_device_is_no_drift(tree):
    """IowardenSettingsDrift fired whenever other software re-attached a loop device ("loop0
    scheduler: mq-deadline -> none"): a new device with the kernel's defaults, not a drifted one."""
    from dataclasses import replace
    from iowarden.probes import blockqueue, cpupower
    devices = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    power = cpupower.read_power_settings(tree("cpu-bare-metal.tree"), run_tuned_adm_verify=False)
    before = pollers.watched_settings(devices, power)
    sdb = devices["sdb"]
    other_queue = replace(sdb.queue, scheduler="none" if sdb.queue.scheduler != "none" else "mq-deadline")
    same_disk = pollers.watched_settings({**devices, "sdb": replace(sdb, queue=other_queue)}, power)
    assert [(d, s) for d, s, _, _ in pollers.settings_changes(before, same_disk)] == [("sdb", "scheduler")]
    another = pollers.watched_settings({**devices, "sdb": replace(sdb, queue=other_queue,
                                                                  identity="fs-uuid:another")}, power)
    assert pollers.settings_changes(before, another) == []


def test_the_xfs_poller_reads_only_the_filesystems_of_watched_devices(tmp_path, monkeypatch):
    """Landed code: the XFS poller read every XFS on the host, other users' included ([sampler] devices was
    ignored), and a fragmentation alert went pending for filesystems nobody asked iowarden to watch."""
    from iowarden.daemon.sources import xfs as xfs_source
    from iowarden.probes import xfs as xfs_probe
    from iowarden.probes.common import Roots
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "mounts").write_text(
        "/dev/loop3 /srv/ours xfs rw 0 0\n/dev/loop9 /srv/theirs xfs rw 0 0\n/dev/vda1 / ext4 rw 0 0\n")
    read = []
    monkeypatch.setattr(xfs_probe, "read", lambda mnt, dev, timeout: read.append(mnt) or
                        xfs_probe.XfsReport(mnt, dev, None, None, None, None, ()))
    posted = []
    poller = xfs_source.XfsPoller(Roots(proc=tmp_path / "proc"), 10.0, posted.append,
                                  wanted=lambda name: name == "loop3")
    poller.step()
    assert read == ["/srv/ours"] and list(posted[0].reports_at) == ["/srv/ours"]
