"""The test lane (tests/integration/lane.py): scenarios one after the other on a thread, each report kept,
a failure raised in the test that owns it with the lines written before it."""
import pytest

from tests.integration.lane import Cancelled, Lane


def passes(lane):
    lane.report.append("armed after 1 s")


def fails(lane):
    lane.report.append("throttled")
    raise AssertionError("no page")


def waits(lane):
    lane.report.append("waiting")
    lane.sleep(60)


def test_each_scenario_reports_and_a_failure_keeps_what_it_said():
    lane = Lane([passes, fails])
    lane.start()
    assert lane.result(passes, 10)[0] == "armed after 1 s"
    with pytest.raises(AssertionError, match="no page"):
        lane.result(fails, 10)
    said = lane.reports()
    assert said[0] == "== lane: passes: passed" and "throttled" in said
    assert any(line.startswith("== lane: fails: failed: no page") for line in said)


def test_a_session_that_ends_cancels_the_scenario_under_way():
    lane = Lane([waits])
    lane.start()
    import time
    deadline = time.monotonic() + 30
    while "waiting" not in lane.report and time.monotonic() < deadline:
        time.sleep(0.01)
    lane.stop(10)
    assert not lane.is_alive()
    with pytest.raises(RuntimeError) as info:
        lane.result(waits, 1)
    assert isinstance(info.value.__cause__, Cancelled)
