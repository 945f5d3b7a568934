"""The alert's sentence: one text for the page, `status`, the journal and InfluxDB (golden), bounded,
and an acknowledgement that reaches the running daemon with who and why."""
import logging
import os

from prometheus_client.core import GaugeMetricFamily  # noqa: F401 - the families below are of this kind

from iowarden.daemon.commands import status
from iowarden.daemon.commands.tables import table
from iowarden.daemon.snapshot import AlertView, Snapshot
from iowarden.daemon.core.state import State
from iowarden.daemon.outputs.alert_metrics import alert_families
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.core.effects import StoredHealth
from iowarden.daemon.verdicts.sentence import MAX_TEXT_CHARS, alert_text
from tests.conftest import FIXTURES

GOLDEN = FIXTURES / "golden" / "sentences.txt"
COLLAPSE = {"read_iops": {"value": 163.0, "baseline": 63257.0, "z": 40.1, "reason": "shift"},
            "clat_p50_seconds": {"value": 0.200, "baseline": 0.000289, "z": 38.0, "reason": "shift"},
            "clat_p999_seconds": {"value": 0.41, "baseline": 0.0021, "z": 30.0, "reason": "shift"}}
LIMIT = ("above the block layer: a cgroup I/O limit holds loop7 (7:7) at 200 read IOPS (blkio.throttle."
         "read_iops_device of the root cgroup: every process not in a cgroup of its own); the probe's I/Os took "
         "200 ms at the median while loop7 answered in 0.26 ms at 1% util")
CASES = {
    "collapse under a cgroup limit": ("VolumeDegraded", "db", "/srv/db", ("loop7",), "fs-uuid:feba0e80", "randread-4k",
                                      COLLAPSE, [LIMIT, "passive: loop7 is at its limit: 200 IOPS, queue 31.0, await 0.3 ms"]),
    "moved with nothing to explain it": ("VolumeDegraded", "db", "/srv/db", ("sdb",), "wwn:0x5000", "read-1m",
                                         {"read_bw_bytes": {"value": 2.0e8, "baseline": 4.1e8}}, []),
    "a member slower than its peers": ("SlowMember", None, "/srv/md", ("sdc",), "wwn:0x5001", "passive", {},
                                       ["sdc is slower than its peers (sdb, sdd): await 9.10 ms vs 1.20 ms (7.6x) at "
                                        "comparable load over 3 h", "drive sdc fails its own SMART assessment"]),
    "a probe that cannot run": ("ProbeFailing", "db", "/srv/db", ("sdb",), "target:db", "randwrite-4k", {},
                                ["refused: the volume is full, not slow: 97% used, 130 MiB free; the probe's file would "
                                 "leave 26 MiB, below the floor of 409 MiB (limits.min_free_bytes / min_free_ratio). "
                                 "Free space on it, or shrink the profile's size"]),
}


def _render_all() -> str:
    out = []
    for name, args in CASES.items():
        t = alert_text(*args)
        out.append(f"[{name}]\nwhere: {t.where}\nwhat: {t.what}\ncause: {t.cause}\nmore: {t.more_causes}\n"
                   f"runbook: #{t.runbook_anchor}\nsentence: {t.sentence()}\n")
    return "\n".join(out)


def test_the_sentences_match_the_golden_file():
    text = _render_all()
    if os.environ.get("IOWARDEN_REGENERATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    # the collapse is said with its numbers, the worst first, and its cause with the limit's value
    assert "read IOPS 163 vs normal 63,257 (388x lower)" in text
    assert text.index("p50 latency 200 ms vs normal 289 µs (692x higher)") < text.index("read IOPS 163")


def test_a_metric_back_past_its_normal_is_said_the_right_way_round():
    """An open alert's metric better than its normal (a latency back below it) reads "2.6x lower", never the
    "0.38x higher" of the week lane's page."""
    metrics = {"clat_p999_seconds": {"value": 0.00211, "baseline": 0.00554},
               "write_iops": {"value": 2100.0, "baseline": 2000.0}}
    what = alert_text("VolumeDegraded", "db", "/srv/db", ("loop2",), "fs-uuid:b6", "randwrite-4k", metrics, []).what
    assert "p99.9 latency 2.11 ms vs normal 5.54 ms (2.6x lower)" in what
    assert "write IOPS 2,100 vs normal 2,000 (1.1x higher)" in what


def test_every_label_value_is_bounded_however_many_causes():
    t = alert_text("VolumeDegraded", "x" * 5000, "/m" * 3000, tuple(f"sd{i}" for i in range(900)), "v" * 900, "p",
                   {f"clat_p{i}_seconds": {"value": 1.0, "baseline": 0.001} for i in range(100)},
                   ["c" * 1000] * 50)
    assert all(len(v) <= MAX_TEXT_CHARS for v in (t.where, t.what, t.cause, t.more_causes))
    assert "\n" not in t.sentence()


def _snapshot(alert: AlertView) -> Snapshot:
    return Snapshot(taken_at=0.0, version="t", alerts=(alert,))


def test_the_info_series_says_what_the_journal_and_status_say(tmp_path, caplog):
    st = State(str(tmp_path / "s.db"))
    h = StoredHealth(st, DetectorParams(warmup_probes=6))
    h.place_of = lambda name, passive: ("/srv/db", ("loop7",))
    for i in range(12):
        h.on_result(_result(i, 1000.0 * (1 + 0.01 * (i % 3))), "fs-uuid:f1", lambda since: [LIMIT])
    with caplog.at_level(logging.ERROR, logger="iowarden"):
        for i in range(12, 20):
            h.on_result(_result(i, 3.0), "fs-uuid:f1", lambda since: [LIMIT])
    (view,) = h.open_alert_views()
    journal = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("ALERT VolumeDegraded"))
    # the page: the labels of iowarden_alert_info, as the rule's annotations read them
    _, _, info, acked, _ = alert_families(_snapshot(view))
    (sample,) = info.samples
    lab = sample.labels
    assert lab["cause"] == LIMIT and lab["where"].startswith("db") and "read IOPS 3 vs normal" in lab["what"]
    page = f"{lab['where']}: {lab['what']}. Likely cause: {lab['cause']}"
    assert page in journal
    # status, from the database the daemon wrote: the same where/what and the same cause
    (row,) = st.alerts(open_only=True)
    text = status.sentence_of(row)
    assert f"{text.where}: {text.what}. Likely cause: {text.cause}" == page
    rendered = status.render({"probes": [], "baselines": [], "alerts": [row], "drift": [], "budget": {}}, table)
    assert f"  {text.where}: {text.what}" in rendered and f"  likely cause: {LIMIT}" in rendered
    assert acked.samples == []
    st.close()


def test_an_ack_reaches_the_running_daemon_with_who_and_why(tmp_path):
    st = State(str(tmp_path / "s.db"))
    h = StoredHealth(st, DetectorParams(warmup_probes=6))
    for i in range(12):
        h.on_result(_result(i, 1000.0 * (1 + 0.01 * (i % 3))), "vol", lambda since: [])
    for i in range(12, 20):
        h.on_result(_result(i, 3.0), "vol", lambda since: [])
    (row,) = st.alerts(open_only=True)
    other = State(str(tmp_path / "s.db"))   # `iowarden ack` is a process of its own
    assert other.ack_alert(row["id"], "planned throttle", by="alice")
    assert not other.ack_alert(row["id"] + 99, "no such alert", by="alice")
    other.close()
    h.apply_requests(lambda target: "vol")
    (view,) = h.open_alert_views()
    assert (view.acked_by, view.ack_note) == ("alice", "planned throttle")
    _, _, _, acked, _ = alert_families(_snapshot(view))
    (sample,) = acked.samples
    assert sample.labels == {"alert": "VolumeDegraded", "volume": "vol", "profile": "rr", "by": "alice",
                             "note": "planned throttle"}
    rendered = status.render({"probes": [], "baselines": [], "alerts": st.alerts(open_only=True), "drift": [],
                              "budget": {}}, table)
    assert "acknowledged by alice: planned throttle" in rendered
    st.close()


def _result(i, iops):
    return {"target": "db", "profile": "rr", "ok": True, "error": None, "contended": False, "started_at": i,
            "read_iops": iops, "write_iops": 0.0, "read_bw_bytes": iops * 4096, "write_bw_bytes": 0.0}


def test_a_fallback_identity_is_never_pinned_and_never_refuses_the_volume_found_next(tmp_path):
    """A device attached just before the start, probed before the daemon's first read of the devices, was
    pinned as kernel:loop1; every later probe (on its fs-uuid) was then refused as a different volume."""
    from iowarden.daemon.probing.pins import pin_refusal
    h = StoredHealth(State(str(tmp_path / "s.db")), DetectorParams())
    h.on_result(_result(0, 1000.0), "kernel:loop1", lambda since: [])
    assert "db" not in h.pins and h.pin_refusal("db", "fs-uuid:f1") is None
    h.on_result(_result(1, 1000.0), "fs-uuid:f1", lambda since: [])
    assert h.pins["db"] == "fs-uuid:f1" and h.pin_refusal("db", "fs-uuid:other") is not None
    # a kernel: pin an earlier version stored is not held against the volume either
    assert pin_refusal({"db": "kernel:loop1"}, "db", "fs-uuid:f1") is None


def test_the_also_line_never_says_the_time_goes_to_the_device_beside_a_limit_above_the_block_layer():
    """A throttled volume's page said "Likely cause: above the block layer: a cgroup I/O limit ..." and then "Also:
    loop2: p99 read 170 µs ..., the time goes to the device": the tracer times requests from the block layer down,
    so its figure leaves out the time the limit held them above it. Beside such a cause it is left out; beside a
    cause in the device it stays."""
    from iowarden.daemon.sources.tracer_views import TIME_GOES_TO
    tracer = f"loop2: p99 read 170 µs over the last 60 s, 100% of it in the device: {TIME_GOES_TO}the device"
    metrics = {"read_iops": {"value": 24.0, "baseline": 59271.0}}
    above = ("above the block layer: a cgroup I/O limit holds loop2 (7:2) at 50 read IOPS (blkio.throttle."
             "read_iops_device of the root cgroup); the probe's I/Os took 20 ms at the median")
    t = alert_text("VolumeDegraded", "db", "/srv/db", ("loop2",), "fs-uuid:b6", "rr", metrics,
                   [above, tracer, "md0 is resyncing"])
    assert t.cause == above and t.more_causes == "md0 is resyncing", t
    device = "the device itself: loop2 took 19.8 ms per I/O at 100% util"
    t = alert_text("VolumeDegraded", "db", "/srv/db", ("loop2",), "fs-uuid:b6", "rr", metrics, [device, tracer])
    assert t.cause == device and t.more_causes == tracer
