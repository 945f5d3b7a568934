"""Peer statistics in O(n log n): the same figures as the member-by-member computation they replace (the
peer rules at 1,024 members are run in tests/integration/test_peer_scale.py: seconds, not a unit's moment)."""
import statistics

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
