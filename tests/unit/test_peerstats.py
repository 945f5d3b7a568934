"""Peer statistics in O(n log n) (issue 38's quadratic peer medians): the same figures as the member-by-member
computation they replace, and the peer rules at 1,024 members over 100 windows timed (printed: the bench,
not the test, holds the figure)."""
import random
import statistics
import time

from hypothesis import given, settings, strategies as st

from iowarden.daemon.passive.peerstats import leave_one_out_medians


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 50), st.floats(-1e6, 1e6, allow_nan=False), max_size=40))
def test_leave_one_out_medians_equal_the_member_by_member_medians(values):
    got = leave_one_out_medians(values)
    for k in values:
        rest = [v for j, v in values.items() if j != k]
        if rest:
            assert abs(got[k] - statistics.median(rest)) <= 1e-9 * max(1.0, abs(statistics.median(rest)))
        else:
            assert k not in got


def test_the_peer_rules_over_1024_members_for_100_windows():
    """One group of 1,024 alike disks, one of them 4x slower from the first window: the group rules run every
    window (landed: 180 ms a window at 1,024, 3.7 s at 4,000, from member-by-member peer medians)."""
    from iowarden.daemon.passive.detector import PassiveDetector
    from tests import passive_traces as pt
    members = tuple(f"d{i:04d}" for i in range(1024))
    rng = random.Random(7)
    det = PassiveDetector()
    raised, started = [], time.monotonic()
    for i in range(100):
        load = pt.load_at(i, rng)
        batch = [pt.window(m, i, load, pt.noisy(pt.curve_ms(load), rng) * (4.0 if m == "d0007" else 1.0))
                 for m in members]
        raised += [t for t in det.observe(batch, [members]) if t.state == "raised"]
    took = time.monotonic() - started
    print(f"peer rules, 1,024 members x 100 windows: {took:.2f} s ({took * 10:.1f} ms a window)")
    assert {t.device for t in raised if t.kind == "peers"} <= {"d0007"}
