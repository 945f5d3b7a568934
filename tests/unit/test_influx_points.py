"""InfluxDB points from probe results: a failed probe is a point too, without figures."""
from types import SimpleNamespace

from iowarden.daemon.outputs.wiring import InfluxOutput
from iowarden.probes.fio import parse
from iowarden.probes.fio_run import ProbeResult

from tests.conftest import FIXTURES


def _points(result: ProbeResult) -> list[str]:
    out = InfluxOutput.__new__(InfluxOutput)   # only the mapping: no server, no spool
    lines: list[str] = []
    out.host, out.writer = "h1", SimpleNamespace(add=lines.extend)
    out.probe_result(result.to_json(), "fs-uuid:abc")
    return lines


def _result(ok: bool, error: str | None) -> ProbeResult:
    report = parse((FIXTURES / "fio" / "fio-3.33-randrw-json+.json").read_text())
    return ProbeResult("data", "/srv", "sdb", "rr", ok, error, 1_700_000_000.5, 3.2, report)


def test_a_measured_probe_carries_its_figures():
    (point,) = _points(_result(True, None))
    assert point.startswith("iowarden_probe,device=sdb,host=h1,profile=rr,target=data,volume=fs-uuid:abc ")
    assert "read_iops=" in point and "clat_p99_seconds=" in point and "ok=true" in point
    assert point.endswith(" 1700000000500000000")


def test_a_failed_probe_is_a_point_with_its_reason_and_no_figures():
    # fio killed at shutdown can leave a partial report: not a measurement of the volume
    (point,) = _points(_result(False, "interrupted: iowarden is stopping"))
    assert "ok=false" in point and 'error="interrupted: iowarden is stopping"' in point
    assert "duration_seconds=3.2" in point
    assert "read_iops" not in point and "clat_" not in point


def test_one_vocabulary_every_layer_agrees_on():
    from iowarden.probes.vocabulary import metrics_of
    from iowarden.probes.vocabulary import HIGHER_IS_WORSE, LOWER_IS_WORSE, MEASURED_METRICS
    record = _result(True, None).to_json()
    assert set(MEASURED_METRICS) <= set(record)                  # the record carries every figure by name
    judged = metrics_of(record)
    assert judged and all(m in HIGHER_IS_WORSE | LOWER_IS_WORSE for m in judged)   # each has a direction
    (point,) = _points(_result(True, None))
    assert all(f"{m}=" in point for m in MEASURED_METRICS if record[m] is not None)


def test_one_vocabulary_of_queue_settings():
    import dataclasses
    from iowarden.daemon.sources.settings import QUEUE_FIELDS
    from iowarden.probes.blockqueue import QueueSettings
    from iowarden.probes.vocabulary import QUEUE_INT_SETTINGS, QUEUE_WORD_SETTINGS, WATCHED_QUEUE_SETTINGS
    fields = {f.name for f in dataclasses.fields(QueueSettings)}
    assert set(QUEUE_INT_SETTINGS) | set(QUEUE_WORD_SETTINGS) <= fields   # every name is a field read from sysfs
    assert set(WATCHED_QUEUE_SETTINGS) <= set(QUEUE_INT_SETTINGS) | set(QUEUE_WORD_SETTINGS)
    assert QUEUE_FIELDS == WATCHED_QUEUE_SETTINGS                         # drift watches the vocabulary's list


def test_the_output_takes_what_the_core_told_once_in_order_and_counts_what_it_missed():
    """The core calls no output: it numbers what it tells (probe results, alert and drift events) in each
    snapshot, and the InfluxDB output takes what is past the last number it took."""
    from iowarden.daemon.core.core import TOLD_KEPT, Core
    from iowarden.daemon.core.effects import health_from
    from iowarden.daemon.core.state import State
    import tempfile
    import os
    with tempfile.TemporaryDirectory() as d:
        st = State(os.path.join(d, "s.db"))
        core = Core(st, health_from(st), "t")
        out = InfluxOutput.__new__(InfluxOutput)
        lines: list[str] = []
        out.host, out.writer, out.get_snapshot = "h1", SimpleNamespace(add=lines.extend, points_dropped_total=0), \
            lambda: core.snapshot
        out._told_taken = 0
        core.tell("probe", {"record": _result(True, None).to_json(), "identity": "fs-uuid:abc"})
        core.tell("event", {"kind": "drift", "device": "sdb", "volume": "fs-uuid:abc", "setting": "scheduler",
                            "old": "none", "new": "bfq"})
        core.publish()
        out.take_told()
        out.take_told()                       # nothing new: nothing sent twice
        assert [line.split(",")[0] for line in lines] == ["iowarden_probe", "iowarden_event"]
        assert "setting=scheduler" in lines[1] and 'new="bfq"' in lines[1]
        for i in range(TOLD_KEPT + 5):        # more than a snapshot keeps between two takes
            core.tell("event", {"kind": "drift", "device": "sdb", "setting": "nr_requests", "old": i, "new": i + 1})
        core.publish()
        out.take_told()
        assert len(lines) == 2 + TOLD_KEPT and out.writer.points_dropped_total == 5
        st.close()
