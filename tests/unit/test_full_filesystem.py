"""A full filesystem is why its device is slow, not the device itself.

A volume that ran out of space made its own device and the disk under its loop file 6-8x slower than their
normal for reads at the same load (XFS flushes and retries every write before it fails it with ENOSPC); the
page said "the device itself". The probes of that volume had been refused minutes before because it was full:
that refusal is the evidence the page now names.
"""
import dataclasses
import os
from types import MappingProxyType, SimpleNamespace

import pytest

from iowarden.daemon.core import space
from iowarden.daemon.core.core import Core
from iowarden.daemon.core.state import State
from iowarden.daemon.events import TargetsChanged
from iowarden.daemon.verdicts.causes import Evidence, ProbeWindow, likely_causes
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.core.effects import health_from
from iowarden.probes.blockqueue import BlockDevice
from iowarden.probes.fio_run import ProbeLimits, ProbeResult, free_space_check
from iowarden.probes.probe_dir import VolumeFull

NOW = 50_000.0   # the core's monotonic clock
DEVICES = MappingProxyType({   # vol1's XFS on loop8, whose image file lives on loop7's filesystem
    "loop7": BlockDevice("loop7", 7, 7, "loop", 1 << 30, None, (), (), None),
    "loop8": BlockDevice("loop8", 7, 8, "loop", 1 << 29, None, (), (), None, loop_backing_devno="7:7"),
    "loop9": BlockDevice("loop9", 7, 9, "loop", 1 << 29, None, (), (), None),
})


def _result(profile: str, used: float | None, device: str = "loop8") -> ProbeResult:
    return ProbeResult("vol1", "/srv/vol1", device, profile, used is None, None if used is None else
                       "refused: the volume is full, not slow", 1.8e9, 0.0 if used is not None else 2.0,
                       space_used_ratio=used)


def _full(*timed) -> dict:
    """The core's record after these results, each (monotonic seconds when it arrived, result)."""
    full: dict = {}
    for at, r in timed:
        space.note(full, r, at)
    return full


def test_a_refusal_for_space_carries_how_full_the_volume_is(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(VolumeFull) as refused:
            free_space_check(fd, 0, ProbeLimits(min_free_ratio=1.0))   # no filesystem leaves all of itself free
    finally:
        os.close(fd)
    assert 0.0 <= refused.value.used_ratio <= 1.0 and str(refused.value).startswith("the volume is full, not slow")


def test_the_full_volume_is_named_on_its_own_device_and_on_the_disk_under_its_file():
    full = _full((NOW - 600, _result("read-1m", 0.97)), (NOW - 240, _result("randwrite-4k", 1.0)))
    (on_it,) = space.causes(full, {"loop8"}, DEVICES, NOW)
    assert on_it.startswith("the filesystem on it is full: vol1 (/srv/vol1) was 100% used when its last probe was "
                            "refused for space 4 min ago")
    (above,) = space.causes(full, {"loop7"}, DEVICES, NOW)
    assert above.startswith("the filesystem above it is full: vol1") and "loop7's I/O waits behind that" in above
    assert space.causes(full, {"loop9"}, DEVICES, NOW) == []   # another disk: not its filesystem


def test_a_probe_that_ran_since_or_a_refusal_long_ago_says_nothing_of_space():
    later_ok = _full((NOW - 600, _result("randwrite-4k", 1.0)), (NOW - 60, _result("randread-4k", None)))
    assert space.causes(later_ok, {"loop8"}, DEVICES, NOW) == []
    long_ago = _full((NOW - 2 * 3600, _result("randwrite-4k", 1.0)))
    assert space.causes(long_ago, {"loop8"}, DEVICES, NOW) == []


def test_a_passive_page_on_a_full_volumes_disk_names_the_space_not_the_device(tmp_path):
    clock = [NOW]
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st, DetectorParams()), "test", clock=lambda: clock[0])
    core.known.devices = DEVICES
    slow = SimpleNamespace(kind="self")
    assert any(c.startswith("the device itself") for c in core.passive_causes(slow, "loop7"))
    space.note(core.known.full, _result("randwrite-4k", 1.0), NOW - 180)
    causes = core.passive_causes(slow, "loop7")
    assert causes[0].startswith("the filesystem above it is full: vol1")
    assert not any(c.startswith("the device itself") for c in causes)
    clock[0] += 3600   # an hour on, with no probe since: no longer said
    assert any(c.startswith("the device itself") for c in core.passive_causes(slow, "loop7"))
    space.note(core.known.full, _result("randwrite-4k", 1.0), clock[0])
    core.run_batch([TargetsChanged((), dropped=(("vol1", "its mount went away"),))])
    assert core.known.full == {}   # a volume gone is forgotten with its other series
    st.close()


def test_a_probe_page_on_a_full_volume_puts_the_space_first_and_not_the_device():
    full = "the filesystem on it is full: vol1 (/srv/vol1) was 99% used ..."
    ev = Evidence(physical_disks=("loop8",), device="loop8", devices={}, drift=[], contended=False,
                  foreign_util_percent=None, window=ProbeWindow("loop8", 0.030, 25.0, 97.0), foreign_share=0.0)
    assert likely_causes(ev)[0].startswith("the device itself")
    causes = likely_causes(Evidence(**{**ev.__dict__, "full": [full]}))
    assert causes[0] == full and not any(c.startswith("the device itself") for c in causes)


def test_a_childs_answer_with_a_used_share_out_of_range_is_a_failed_probe(monkeypatch):
    """The child's answer is read with a bound on its size already; the share it says is read with its range."""
    import json
    from iowarden.probes import probe_child
    from iowarden.probes.common import ToolRun
    from iowarden.probes.fio_job import ProbeProfile
    answer = {"result": {"device": "loop8", "error": "refused: the volume is full, not slow", "started_at": 1.0,
                         "duration_seconds": 0.1, "layout_bytes": 0, "ramp_seconds": 0.0, "argv": [],
                         "needs_root": False, "space_used_ratio": 7.5}, "stdout": None}
    monkeypatch.setattr(probe_child, "run_tool", lambda argv, **kw: ToolRun(argv, 0, json.dumps(answer), "", 0.1, None))
    r = probe_child.run_isolated("t", "/srv/t", ProbeProfile("rr", size_bytes=1 << 20), ProbeLimits())
    assert not r.ok and "space_used_ratio out of range: 7.5" in r.error and r.space_used_ratio is None
    answer["result"]["space_used_ratio"] = 0.97
    r = probe_child.run_isolated("t", "/srv/t", ProbeProfile("rr", size_bytes=1 << 20), ProbeLimits())
    assert r.space_used_ratio == 0.97 and r.error.startswith("refused: the volume is full")


def test_a_full_volume_tried_every_minute_is_said_once_a_minute_not_once_a_profile(tmp_path):
    """Each profile of a full volume is tried again every minute (suspicion.py): four refusals a minute reach
    the core, and the journal says one line a minute, then how many more; a probe's other failures are each
    said."""
    import logging

    from iowarden.daemon.events import ProbeFinished
    from iowarden.daemon.logs import RepeatFilter

    clock = [NOW]
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st, DetectorParams()), "test", clock=lambda: clock[0])
    core.known.devices = DEVICES
    said = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    handler.addFilter(RepeatFilter(clock=lambda: clock[0]))
    logger = logging.getLogger("iowarden")
    logger.addHandler(handler)
    try:
        for minute in range(3):
            for k, profile in enumerate(("randread-4k", "randwrite-4k", "read-1m", "randread-4k-qd1")):
                clock[0] = NOW + minute * 61.0 + k
                core.run_batch([ProbeFinished(_result(profile, 0.97), ("loop8",), False)])
        refused = [x for x in said if x.startswith("probes of vol1 refused")]
        assert len(refused) == 3 and "3 more like this" in refused[1], said
        broken = dataclasses.replace(_result("read-1m", None), ok=False, error="fio exited 1")
        for _ in range(2):
            core.run_batch([ProbeFinished(broken, ("loop8",), False)])
        assert sum("fio exited 1" in x for x in said) == 2, said
    finally:
        logger.removeHandler(handler)
        st.close()
