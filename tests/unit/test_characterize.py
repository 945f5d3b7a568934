"""The characterize policy: the plan, its budget, the knee and the IOPS-to-bandwidth turn, on numbers."""
import pytest

from iowarden.daemon import characterize as ch


def qd_points(cap=2000.0, per_io_seconds=0.0004):
    """A volume that serves `1/per_io_seconds` IOPS per queue slot up to a ceiling (Little's law)."""
    out = []
    for q in ch.QD_STEPS:
        iops = min(q / per_io_seconds, cap)
        out.append(ch.Point("qd", q, iops, iops * 4096, q / iops, None, None))
    return out


def test_the_knee_is_the_depth_that_reaches_the_ceiling_and_saturation_the_ceiling():
    depth, sat = ch.knee(qd_points())
    assert sat == 2000.0
    assert depth == 1          # 1 slot at 0.4 ms is 2,500 IOPS: capped from the start
    depth, sat = ch.knee(qd_points(cap=20000.0))
    assert depth == 8 and sat == 20000.0   # 8 slots reach 20,000; 16 only add latency


def test_a_volume_that_keeps_scaling_has_its_knee_at_the_deepest_step():
    assert ch.knee(qd_points(cap=1e9))[0] == 64


def test_failed_steps_are_not_points_of_the_curve():
    pts = qd_points(cap=20000.0) + [ch.Point("qd", 128, 0.0, 0.0, None, None, None, ok=False, error="boom")]
    assert ch.knee(pts) == (8, 20000.0)
    assert ch.knee([]) == (None, None)


def test_bandwidth_bound_from_the_block_size_that_reaches_the_bytes_ceiling():
    iops_cap, bps_cap = 2000.0, 32 * 2 ** 20
    pts = [ch.Point("bs", b, min(iops_cap, bps_cap / b), min(iops_cap * b, bps_cap), None, None, None)
           for b in ch.BS_STEPS]
    assert ch.bandwidth_bound_from(pts) == 16384


def test_the_plan_its_time_budget_and_the_write_budget():
    steps = ch.plan(["qd", "bs"], 2 ** 30, 3.0, 1.0, writes=True)
    assert [s.sweep for s in steps].count("qd-write") == len(ch.QD_STEPS)
    kept, dropped = ch.within_budget(steps, 60.0)
    assert sum(ch.step_seconds(s) for s in kept) <= 60.0 and dropped and kept + dropped == steps
    assert ch.write_step_allowed(2 ** 30, 2 ** 30, 4 * 2 ** 30)
    assert not ch.write_step_allowed(3 * 2 ** 30 + 1, 2 ** 30, 4 * 2 ** 30)
    with pytest.raises(ValueError, match="unknown sweep 'zz'"):
        ch.plan(["zz"], 2 ** 30, 3.0, 1.0, writes=False)
    # every block-size step keeps the one probe file (no second layout)
    assert {s.profile.size_bytes for s in steps if s.sweep == "bs"} == {2 ** 30}
