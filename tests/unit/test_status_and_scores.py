"""What was not measured is not shown as zero: the deviation score during warm-up and after a
restart, and `status` in units a person reads (the daemon-core issue's "unknown exported as zero"
and "human status"). No root."""
import pytest

from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.core.effects import StoredHealth
from iowarden.daemon.snapshot import BaselineView, Snapshot
from iowarden.daemon.core.state import State
from iowarden.daemon.commands.status import baseline_rows, render
from iowarden.daemon.commands.tables import human_bytes, table
from iowarden.daemon.wording import human_metric, human_seconds, latency_columns, latency_unit, metric_label
from tests.unit.test_exporter import scrape


def _record(i, iops, p99=85e-6):
    return {"target": "t", "profile": "rr", "ok": True, "error": None, "contended": False, "started_at": 1e9 + i,
            "read_iops": iops, "write_iops": 0.0, "read_bw_bytes": iops * 4096, "write_bw_bytes": 0.0,
            "clat_p50_seconds": 40e-6, "clat_p99_seconds": p99, "clat_p999_seconds": 2e-4,
            "device": "sdb", "duration_seconds": 3.0}


def test_deviation_is_absent_while_learning_and_survives_a_restart(tmp_path):
    params = DetectorParams(warmup_probes=4)
    st = State(str(tmp_path / "state.db"))
    h = StoredHealth(st, params)
    for i in range(3):
        h.on_result(_record(i, 1000.0 + i), "vol", lambda since: [])
    views = {v.metric: v for v in h.baseline_views()}
    assert views["read_iops"].learning and views["read_iops"].deviation_score is None
    for i in range(3, 8):
        h.on_result(_record(i, 1000.0 + i % 3), "vol", lambda since: [])
    h.on_result(_record(9, 500.0), "vol", lambda since: [])            # half: clearly worse
    before = {v.metric: v.deviation_score for v in h.baseline_views()}
    assert before["read_iops"] > 5
    st.close()
    st2 = State(str(tmp_path / "state.db"))
    after = {v.metric: v.deviation_score for v in StoredHealth(st2, params).baseline_views()}
    # on main: 0.0 after every restart until the next probe
    assert after["read_iops"] == pytest.approx(before["read_iops"], rel=0.25)
    st2.close()


def test_the_exposition_leaves_out_an_unjudged_score():
    snap = Snapshot(taken_at=0.0, version="t", baselines=(
        BaselineView("v1", "rr", "read_iops", None, None, None, 2, True),
        BaselineView("v2", "rr", "read_iops", 1000.0, 0.05, 1.5, 20, False)))
    text = scrape(snap)
    assert 'iowarden_deviation_score{metric="read_iops",profile="rr",volume="v2"} 1.5' in text
    assert 'iowarden_deviation_score{metric="read_iops",profile="rr",volume="v1"}' not in text
    assert 'iowarden_baseline_learning{metric="read_iops",profile="rr",volume="v1"} 1.0' in text


def test_human_units():
    assert human_seconds(85e-6) == "85 µs" and human_seconds(1.25e-3) == "1.25 ms" and human_seconds(2.5) == "2.5 s"
    assert human_metric("read_iops", 12345.6) == "12346 IOPS"   # tables print numbers plain, as fio does
    assert human_metric("write_bw_bytes", 3 << 20) == "3.0 MiB/s"
    assert human_metric("clat_p99_seconds", 4e-4) == "400 µs" and human_metric("read_iops", None) is None


def test_status_shows_warm_up_as_such_and_latencies_in_their_units(tmp_path):
    st = State(str(tmp_path / "state.db"))
    h = StoredHealth(st, DetectorParams(warmup_probes=12))
    for i in range(3):
        h.on_result(_record(i, 1000.0), "vol-learning", lambda since: [])
    h2 = StoredHealth(st, DetectorParams(warmup_probes=3))
    for i in range(6):
        h2.on_result({**_record(i, 2000.0), "target": "u"}, "vol-known", lambda since: [])
    rows = baseline_rows(st, DetectorParams(warmup_probes=12))
    out = render({"probes": [_record(9, 1000.0)], "baselines": rows, "alerts": [], "drift": [], "budget": {}},
                 table)
    learning = [line for line in out.splitlines() if "vol-learning" in line and "read IOPS" in line][0]
    assert "learning 3/12" in learning          # on main: a one-sample warm-up printed as a "baseline"
    assert "85 µs" in out and "0.00" not in out  # on main: p99 printed as 0.00 seconds
    assert "p99 nsec" in out and " 85000" in out and "_seconds" not in out   # fio's unit for a column under 100 µs
    assert "_seconds" not in out   # a unit per column; no key whose unit the cell contradicts
    st.close()


def test_latency_columns_share_one_unit_chosen_as_fio_chooses_it():
    """fio's rule (stat.c): msec when min > 2 ms and max > 100 ms, usec when min > 2 µs and max > 100 µs."""
    assert latency_unit([64e-6, 660e-6]) == ("usec", 1e-6)
    assert latency_unit([40e-6, 90e-6]) == ("nsec", 1e-9)          # all under 100 µs: fio prints nsec
    assert latency_unit([3e-3, 250e-3]) == ("msec", 1e-3)
    assert latency_unit([1e-3, 250e-3]) == ("usec", 1e-6)          # a 1 ms value keeps the column in usec
    headers, rows = latency_columns({"p50": [64e-6, None], "p99": [2.9e-3, None]})
    assert headers == ["p50 usec", "p99 usec"] and rows == [[64, 2900], [None, None]]
    out = table(["x", *headers], [["a", *rows[0]], ["b", *rows[1]]])
    assert out.splitlines()[1].endswith("64      2900")


def test_metric_labels_and_sizes_for_people():
    assert metric_label("clat_p99_seconds") == "p99 latency" and metric_label("clat_p999_seconds") == "p99.9 latency"
    assert metric_label("read_bw_bytes") == "read bandwidth" and metric_label("write_iops") == "write IOPS"
    assert human_bytes(1 << 30) == "1 GiB" and human_bytes(10 << 30) == "10 GiB" and human_bytes(1536 << 20) == "1.5 GiB"
    assert human_bytes(512) == "512 B"
