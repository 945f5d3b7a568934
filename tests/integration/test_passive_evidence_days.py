"""Evidence over days of simulated windows against the peers: the passive detector's long simulations (each
several seconds of CPU, so outside the unit tier's minute), on the same synthetic traces and fake clock as
tests/unit/test_passive_evidence.py, no root."""
import pytest

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
