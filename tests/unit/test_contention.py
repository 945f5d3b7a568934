"""Other work flooding a healthy volume (daemon/passive/contention.py), through the passive detector on
synthetic windows: no clock, no root.

A batch job's 4k random writes at queue depth 16 made the database on the same volume 10-30x slower for eight
minutes; the passive verdict said nothing and every probe was deferred as "device busy". Now the victim is paged
as VolumeContended within about five minutes (the rule's `for` adds five more before a notification), and
cleared within five minutes of the flood's end; a device slow at its usual load is still DeviceSlow, and a
load that triples along the device's curve (the day's peak, a backup of the usual kind) raises nothing.
"""
import random

import pytest

from iowarden.daemon.passive.contention import ContentionParams, ContentionRule
from iowarden.daemon.passive.detector import PassiveDetector
from iowarden.daemon.passive.values import Flow, Window
from tests import passive_traces as pt

LEARN = 2 * 240          # two hours of windows: the rule judges after one
FLOOD = 40               # ten minutes


def _window(i, rng, flood=0.0, victim=1.0, read_factor=1.0, surge=False):
    """The database's reads on their curve; `flood` IOPS of someone else's writes beside them, which make the
    reads wait `victim` times as long; `read_factor` a slow device (latency up at the same load)."""
    load = pt.load_at(i, rng, surge=(0, 10**9) if surge else None)
    ms = pt.noisy(pt.curve_ms(load), rng) * victim * read_factor
    flows = {"read": Flow(load, load * 4, ms)}
    if flood:
        flows["write"] = Flow(flood, flood * 4, 40.0)
    return Window("vdb", 1.7e9 + i * pt.WINDOW_SECONDS, pt.WINDOW_SECONDS, flows, None, None)


def _run(episode, **kw):
    """Two hours learned, then `episode` windows of the given kind, then an hour back to normal: the
    transitions with the window index they came at."""
    rng, det, out = random.Random(3), PassiveDetector(), []
    for i in range(LEARN + episode + 240):
        during = LEARN <= i < LEARN + episode
        w = _window(i, rng, **(kw if during else {}))
        out += [(i - LEARN, t.kind, t.state, t) for t in det.observe([w], [])]
    return out


def test_a_flood_of_other_work_names_the_victim_within_minutes_and_clears_after_it():
    got = _run(FLOOD, flood=4000.0, victim=15.0)
    contention = [(i, state) for i, kind, state, _ in got if kind == "contention"]
    assert [s for _, s in contention] == ["raised", "cleared"], got
    raised_at, cleared_at = contention[0][0], contention[1][0]
    assert raised_at <= 20, raised_at                       # five minutes of 15 s windows
    assert cleared_at - FLOOD <= 20, cleared_at             # five minutes after the flood's end
    t = next(t for _, kind, state, t in got if kind == "contention" and state == "raised")
    assert t.alert == "VolumeContended" and t.severity == "warning"
    assert "reads wait" in t.summary and "usual load" in t.summary, t.summary
    assert t.evidence["victim_ratio"] >= 8 and t.evidence["load_ratio"] >= 2, t.evidence
    # the device itself is not named: it serves the flood at its curve, and nothing else was raised
    assert {kind for _, kind, _, _ in got} == {"contention"}, got


def test_a_short_burst_raises_nothing():
    assert _run(12, flood=4000.0, victim=15.0) == []   # three minutes


@pytest.mark.parametrize("kw", [dict(surge=True), dict(flood=600.0, victim=2.0)],
                         ids=["load tripled along the curve", "more load, latency along the curve"])
def test_more_load_along_the_curve_is_not_contention(kw):
    assert [k for _, k, _, _ in _run(FLOOD * 3, **kw) if k == "contention"] == []


def test_a_device_slow_at_its_usual_load_is_device_slow_not_contention():
    got = _run(FLOOD * 3, read_factor=6.0)
    kinds = {kind for _, kind, state, _ in got if state == "raised"}
    assert "self" in kinds and "contention" not in kinds, got


def test_a_throttle_is_not_contention():
    """Latency up and load down: a limit (VolumeAtLimit's, or the probe's), never other work."""
    rule = ContentionRule(ContentionParams(learn_windows=20, windows=8))
    rng = random.Random(1)
    for i in range(40):
        w = _window(i, rng)
        rule.judge("vdb", w.flows, w.flows)
    states = []
    for i in range(40, 60):
        held = Window("vdb", 0, 15, {"read": Flow(50.0, 200.0, 40.0)}, None, None)
        states.append(rule.judge("vdb", held.flows, held.flows)[0])
    assert True not in states, states


def test_the_rules_minutes_are_the_same_in_windows_of_any_length():
    assert ContentionParams.for_windows_of(15.0) == ContentionParams()
    five = ContentionParams.for_windows_of(5.0)
    assert (five.windows, five.learn_windows, five.memory_windows) == (60, 720, 4320.0)


def test_a_backups_big_reads_are_not_a_victim_waiting():
    """A soak's false page on a healthy mix: VolumeContended "reads wait 64x … 159x its usual load" while a backup
    read the volume at 1 MiB a request. The reads' await was the backup's own requests' (most of the reads), not
    the database's waiting behind them: a direction whose requests are many times their usual size is no victim.
    (A flood of 4 KiB writes beside the database's reads, which keep their size and wait 15x, still pages: the
    first test here.)"""
    rng, det, out = random.Random(3), PassiveDetector(), []
    for i in range(LEARN + FLOOD + 240):
        w = _window(i, rng)
        if LEARN <= i < LEARN + FLOOD:
            db = w.flows["read"]
            w = Window(w.device, w.end, w.seconds, {"read": Flow(db.iops + 1500.0, db.kib_per_second + 1500 * 1024,
                                                                 db.await_ms * 15)})
        out += [(i - LEARN, t.kind, t.state) for t in det.observe([w], [])]
    assert out == [], out
