"""Health decides and returns what changed; it is built from its parameters and what was saved, with no
database, no callback and no core. What it returns is enough to build it again after a restart."""
import random

from iowarden.daemon.verdicts.changes import (AlertClosed, AlertRaised, AlertUpdated, BaselineSaved, BaselinesDropped,
                                              PinChanged, Said, transitions)
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.verdicts.health import Health, Saved

PARAMS = DetectorParams(warmup_probes=6)
PLACE = ("/srv/db", ("vdb",))


def _probe(i, factor, rng, ok=True):
    iops = 1000.0 * factor * (1 + rng.uniform(-0.03, 0.03))
    return {"target": "db", "profile": "rr", "ok": ok, "error": None if ok else "fio exited 1", "contended": False,
            "started_at": i, "read_iops": iops, "write_iops": 0.0, "read_bw_bytes": iops * 4096,
            "write_bw_bytes": 0.0, "clat_p99_seconds": 1e-3 / factor}


def _saved_from(changes, next_alert_id) -> Saved:
    """What the state database would hold after these changes: the latest baseline of each metric, the pins,
    the alerts raised and not closed (rows as State.alerts gives them)."""
    baselines, pins, alerts = {}, {}, {}
    for c in changes:
        if isinstance(c, BaselineSaved):
            baselines[(c.identity, c.profile, c.metric)] = (c.identity, c.profile, c.metric, c.learned_at, c.state)
        elif isinstance(c, PinChanged):
            pins[c.target] = c.identity
        elif isinstance(c, AlertRaised):
            alerts[c.id] = {"id": c.id, "alert": c.alert, "identity": c.identity, "target": c.target,
                            "profile": c.profile, "raised_at": c.raised_at, "evidence": dict(c.evidence),
                            "causes": list(c.causes)}
        elif isinstance(c, AlertClosed):
            alerts.pop(c.id)
    return Saved({t: i for t, i in pins.items() if i}, tuple(baselines.values()), tuple(alerts.values()),
                 next_alert_id)


def test_a_page_raised_before_a_restart_is_cleared_after_it_under_its_own_id():
    rng, h, changes = random.Random(1), Health(PARAMS), []
    for i in range(10):
        changes += h.on_result(_probe(i, 1.0, rng), "wwn-0x5000c500a1b2c3d4", lambda since: [], place=PLACE)
    assert {type(c) for c in changes} == {BaselineSaved, PinChanged}   # learning writes, pages nothing
    for i in range(10, 16):
        changes += h.on_result(_probe(i, 0.25, rng), "wwn-0x5000c500a1b2c3d4", lambda since: ["a limit"],
                               place=PLACE)
    (raised,) = [c for c in changes if isinstance(c, AlertRaised)]
    assert (raised.alert, raised.target, raised.causes, raised.evidence["where"]["mountpoint"]) == \
        ("VolumeDegraded", "db", ("a limit",), "/srv/db")
    # the sentence is decided with the verdict: the place the core gave, the figures, the cause
    assert raised.sentence.startswith("db on /srv/db (vdb, wwn-0x5000c500a1b2c3d4): rr probe:")
    assert "(4x lower)" in raised.sentence and raised.sentence.endswith("Likely cause: a limit")
    assert [c for c in changes if isinstance(c, AlertUpdated)]   # the figures of each later probe, re-sent

    again = Health(PARAMS, _saved_from(changes, h.next_alert_id))
    assert again.pins == {"db": "wwn-0x5000c500a1b2c3d4"}
    assert [(a.alert, a.id) for a in again.open_alert_views()] == [("VolumeDegraded", raised.id)]
    after = []
    for i in range(16, 30):
        after += again.on_result(_probe(i, 1.0, rng), "wwn-0x5000c500a1b2c3d4", lambda since: [], place=PLACE)
    (closed,) = [c for c in after if isinstance(c, AlertClosed)]
    assert (closed.id, closed.alert, closed.why) == (raised.id, "VolumeDegraded", "back to its baseline")
    assert transitions(after) == ["VolumeDegraded cleared"] and not again.open


def test_operators_requests_come_in_with_what_the_core_read_and_go_out_as_changes():
    rng, h, changes = random.Random(2), Health(PARAMS, Saved(next_alert_id=41)), []
    for i in range(20):
        changes += h.on_result(_probe(i, 1.0 if i < 10 else 0.2, rng), "serial:S1", lambda since: [])
    (raised,) = [c for c in changes if isinstance(c, AlertRaised)]
    assert raised.id == 41   # after every id saved before, never one of them again

    acked = h.apply_requests([("ack", str(raised.id), None, ("alice", "a disk swap at 3"))], lambda t: "serial:S1")
    assert [type(c) for c in acked] == [Said] and "alice" in acked[0].args
    assert [(a.acked_by, a.ack_note) for a in h.open_alert_views()] == [("alice", "a disk swap at 3")]
    # an ack of an alert nobody has open, and one whose record the core could not read, change nothing
    assert h.apply_requests([("ack", "999", None, ("bob", "")), ("ack", str(raised.id), None, None)],
                            lambda t: "serial:S1") == []

    reset = h.apply_requests([("reset", "db", None, None)], lambda t: "serial:S1")
    kinds = [type(c) for c in reset]
    assert kinds[0] is PinChanged and reset[0] == PinChanged("db", None)
    assert BaselinesDropped("serial:S1", "rr") in reset and kinds[-1] is AlertClosed
    assert reset[-1].why == "baseline reset" and not h.open and not h.detectors


def test_a_failing_probe_pages_after_two_and_a_dropped_target_takes_its_page_with_it():
    rng, h = random.Random(3), Health(PARAMS)
    first = h.on_result(_probe(0, 1.0, rng, ok=False), "serial:S1", lambda since: [])
    second = h.on_result(_probe(1, 1.0, rng, ok=False), "serial:S1", lambda since: [], place=PLACE)
    assert first == [] and transitions(second) == ["ProbeFailing raised"]
    assert second[0].causes == ("fio exited 1",) and second[0].severity == "warning"
    dropped = h.target_dropped("db", "unmounted")
    assert transitions(dropped) == ["ProbeFailing cleared"] and dropped[0].why == "unmounted"
    assert h.target_dropped("db", "unmounted") == []
