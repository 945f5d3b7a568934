"""The host as a layer in the passive detector (daemon/passive/host.py): synthetic windows, no clock, no root.

A slowdown most of a host's disks share (its CPUs starved, one store under every volume) raised DeviceSlow on
whichever disk crossed first, "the device itself". Now a disk is slow on its own only beyond what its neighbours
share; one disk slow alone is still named as fast as before, and a host of two disks has no host layer.
"""
import pytest

from iowarden.daemon.passive import host
from iowarden.daemon.passive.detector import PassiveDetector
from tests import passive_traces as pt

DAY = pt.DAY_WINDOWS
SLOW_FOR = 240   # an hour of 15 s windows


def _host(count, slow, factor=4.0, stacks=None):
    """`count` disks of one host, none peers of another (different models, loop volumes): a day learned, then
    an hour with the disks in `slow` `factor` times their normal at the same load. The raises of that hour."""
    traces = [pt.device_trace(10 + k, DAY + SLOW_FOR, slow_from=DAY if k in slow else None, factor=factor,
                              device=f"vd{k}") for k in range(count)]
    det, raised = PassiveDetector(), []
    for i, batch in enumerate(zip(*traces)):
        raised += [(i, t) for t in det.observe(list(batch), [], stacks) if t.state == "raised"]
    return det, raised


def test_a_host_whose_every_disk_slows_together_names_no_device():
    det, raised = _host(5, slow={0, 1, 2, 3, 4})
    assert [(t.device, t.kind) for _, t in raised if t.kind == "self"] == [], raised
    assert det.host_ratio is not None and det.host_ratio > 2.5, det.host_ratio   # the host's, said as such


def test_a_slowdown_most_of_a_disks_neighbours_share_names_none_of_them():
    _, raised = _host(5, slow={0, 1, 3, 4})   # each slow disk: three of its four neighbours slow with it
    assert [t.device for _, t in raised if t.kind == "self"] == []


@pytest.mark.parametrize("count", [3, 5])
def test_one_disk_slow_alone_is_named_within_minutes_as_before(count):
    _, raised = _host(count, slow={1})
    named = [(i, t.device) for i, t in raised if t.kind == "self"]
    assert [d for _, d in named] == ["vd1"], raised
    assert named[0][0] - DAY <= 40, named   # ten minutes of windows


def test_two_disks_have_no_host_layer_and_each_is_judged_alone():
    _, raised = _host(2, slow={0, 1})
    assert sorted(t.device for _, t in raised if t.kind == "self") == ["vd0", "vd1"]


def test_a_slow_member_and_its_array_are_not_each_others_host():
    # vd0 is an array over vd1 (and vd2): vd1 slows and with it vd0; vd3 and vd4 are the host's other disks
    _, raised = _host(5, slow={0, 1}, stacks={"vd0": ("vd1", "vd2")})
    assert "vd1" in {t.device for _, t in raised if t.kind == "self"}, raised


def test_the_neighbours_are_the_others_less_the_stacked():
    related = host.related_by_stack({"md0": ("sda", "sdb")})
    assert related["sda"] == {"md0", "sdb"}
    got = host.neighbours_median({"md0": 4.0, "sda": 4.0, "sdb": 1.0, "sdc": 1.0, "sdd": 3.0}, related)
    assert got["sda"] == 2.0            # sdc and sdd only
    assert got["sdc"] == 3.5            # md0, sda, sdb, sdd
    assert "x" not in host.neighbours_median({"x": 9.0, "y": 1.0}, {})   # one neighbour: no host
