"""A probe on a busy disk judged by the device's total (daemon/verdicts/contended.py), as a pure function."""
from hypothesis import given, strategies as st

from iowarden.daemon.verdicts.contended import (CONTENDED_RECOVERED, CONTENDED_SHORTFALL, SATURATING_QUEUE_DEPTH,
                                                Totals, judge)


def totals(share, depth=32, slowdown=None):
    return Totals(10_000 * share, 40e6 * share, 10_000.0, 40e6, depth, slowdown)


def test_two_short_probes_in_a_row_raise_and_one_does_not():
    assert judge(totals(0.05), strikes=0, is_open=False, last_deep_held=None).action is None
    v = judge(totals(0.05), strikes=1, is_open=False, last_deep_held=None)
    assert v.action == "raise" and "delivered 500 IOPS in total" in v.said and "gets 10,000" in v.said


@given(share=st.floats(0.0, 3.0), depth=st.integers(1, SATURATING_QUEUE_DEPTH - 1), strikes=st.integers(0, 5))
def test_a_shallow_probe_never_raises_nor_counts_as_short(share, depth, strikes):
    """At queue depth 1 the probe waits behind the other work: its total is what the users ask, not what the
    device can give."""
    v = judge(totals(share, depth), strikes, is_open=False, last_deep_held=None)
    assert not v.short and v.action is None


@given(share=st.floats(0.0, 3.0), slowdown=st.one_of(st.none(), st.floats(0.5, 10.0)),
       held=st.sampled_from([None, True, False]))
def test_it_clears_only_on_a_total_back_near_its_normal_or_the_passive_view_at_its_normal(share, slowdown, held):
    v = judge(totals(share, slowdown=slowdown), strikes=3, is_open=True, last_deep_held=held)
    assert v.action in (None, "clear")
    if v.action == "clear":
        assert share >= CONTENDED_RECOVERED or (slowdown is not None and slowdown <= 1.5 and not v.held)
    if share < CONTENDED_SHORTFALL:
        assert v.short and v.action is None   # a volume still far short stays open
