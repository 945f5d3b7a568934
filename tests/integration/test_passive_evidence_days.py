"""Evidence over days of simulated windows against the peers: the passive detector's long simulations (each
several seconds of CPU, so outside the unit tier's minute), on the same synthetic traces and fake clock as
tests/unit/test_passive_evidence.py, no root."""
import pytest

from iowarden.daemon.passive.detector import PassiveDetector
from iowarden.daemon.passive.values import PassiveParams

from tests import passive_traces as pt
from tests.unit.test_passive_evidence import DAY, HOUR, TWELVE, _run


@pytest.mark.parametrize("seed", [1])
def test_one_drive_of_twelve_at_1_3x_its_peers_for_three_days_is_named_within_a_day(seed):
    # one drive 1.3x its peers at equal load, +-15 % noise (log-normal, with rare spikes), a tenfold daily load cycle
    det, raised = _run(pt.peer_trace(seed, 3 * DAY, members=12, slow={0: 1.3}))
    named = [(i, t) for i, t in raised if t.kind == "peers"]
    assert [t.device for _, t in named] == ["sda"], [(i, t.device, t.kind) for i, t in raised]
    first, t = named[0]
    assert first < DAY, f"named after {first / HOUR:.1f} h"
    assert t.evidence["rule"] == "evidence" and 1.2 <= t.evidence["ratio"] <= 1.4, t.evidence
    assert "1.3" in t.summary or "1.2" in t.summary
    assert not [x for x in raised if x[1].device != "sda"]   # no other drive, of any kind


@pytest.mark.parametrize("seed", [1])
def test_twelve_healthy_drives_moving_1_5x_together_for_an_hour_are_never_named(seed):
    shift = (DAY + 6 * HOUR, DAY + 7 * HOUR, 1.5)   # a workload change in the second day
    _, raised = _run(pt.peer_trace(seed, 3 * DAY, members=12, shift=shift))
    assert raised == [], [(i, t.device, t.kind, t.summary) for i, t in raised]


def test_the_evidence_drains_and_the_alert_clears_when_the_drive_is_replaced():
    det, raised = _run(pt.peer_trace(4, DAY, members=12, slow={0: 1.4}))
    assert any(t.kind == "peers" and t.device == "sda" for _, t in raised)
    cleared = []
    for batch in pt.peer_trace(5, 2 * DAY, members=12):
        cleared += [t for t in det.observe(batch, [TWELVE]) if t.state == "cleared" and t.kind == "peers"]
    assert [t.device for t in cleared] == ["sda"]


@pytest.mark.parametrize("slow, within", [({0: 2.2, 5: 2.2, 9: 2.2}, HOUR), ({0: 1.3, 3: 1.3, 6: 1.3, 9: 1.3}, DAY)])
def test_a_quarter_of_a_group_slow_from_the_first_window_is_named_and_no_healthy_drive(slow, within):
    """Three of twelve at 2.2x (+-15 % noise, the daily load cycle) named within the hour they show;
    four of twelve at 1.3x within a day. The sick do not drag the reference: the host's spread is measured
    on the drives that are not outliers."""
    det, raised = _run(pt.peer_trace(3, DAY + HOUR, members=12, slow=slow))
    first = {}
    for i, t in raised:
        first.setdefault(t.device, i)
    sick = {TWELVE[m] for m in slow}
    assert set(first) == sick, {d: (i / HOUR, [t.summary for j, t in raised if t.device == d][:1]) for d, i in first.items()}
    late = {d: round(i / HOUR, 2) for d, i in first.items() if i > within}
    assert not late, f"named after (hours): {late}"


def _size(obj, seen=None) -> int:
    """Every element held by the detector, recursively: a bound on what it keeps."""
    seen = seen if seen is not None else set()
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    n = 1
    if isinstance(obj, dict):
        n += sum(_size(k, seen) + _size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)) or type(obj).__name__ == "deque":
        n += sum(_size(x, seen) for x in obj)
    elif type(obj).__name__ == "array":
        n += len(obj)                  # numbers held flat: one element each
    elif hasattr(obj, "__dict__"):
        n += _size(vars(obj), seen)
    elif hasattr(type(obj), "__slots__"):
        n += sum(_size(getattr(obj, name), seen) for name in type(obj).__slots__)
    return n


def test_memory_per_device_is_bounded_over_a_simulated_month():
    """A month of 5-minute windows (8,640 of them; the structures are sized in windows, so a month of 15 s
    windows holds the same) for twelve drives: what the detector holds after a week is what it holds after
    a month."""
    params = PassiveParams(window_seconds=300.0, evidence_block_windows=12)
    det = PassiveDetector(params)
    month = 30 * 288
    sizes = {}
    for i, batch in enumerate(pt.peer_trace(8, month, members=12, slow={0: 1.3})):
        det.observe(batch, [TWELVE])
        if i + 1 in (7 * 288, month):
            sizes[i + 1] = _size(det)
    week, whole = sizes[7 * 288], sizes[month]
    print(f"elements held: {week} after a week, {whole} after a month ({whole / 12:.0f} per drive)")
    assert whole <= week * 1.05, sizes
