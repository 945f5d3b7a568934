"""The alert lifecycle's invariants, as properties over generated probe histories (no root, no fio; the
state database is a file of the test's own).

- A page is raised, and its figures re-sent, only for a metric worse than its normal at the time: a volume
  back at or better than its normal is never what a page says moved (landed code paged "read IOPS 109,809 vs
  normal 59,271 (1.9x higher)" for a volume faster than its normal, and raised a new critical alert whose
  figures were all better).
- An alert whose volume is back is closed once its detectors have seen enough probes back in band.
- Every alert says its kind's one severity (daemon/alert_kinds.py), raised or re-sent, however far its volume
  moved: the rules page on the same one, and a severity that moved would end one page and start another.
"""
import random

from hypothesis import given, settings, strategies as st

from iowarden.daemon.alert_kinds import severity_of
from iowarden.daemon.core.state import State
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.verdicts.health import Health

WARMUP = 6
SEGMENT = st.tuples(st.sampled_from([1.0, 1.0, 0.25, 0.5, 2.0, 3.0, 0.1, 1.3]), st.integers(1, 12))


def _probe(i, factor, rng):
    """A random-read probe at `factor` times its normal speed (1,000 IOPS, 1 ms p99), with a few % of noise."""
    noise = 1 + rng.uniform(-0.03, 0.03)
    iops = 1000.0 * factor * noise
    return {"target": "db", "profile": "rr", "ok": True, "error": None, "contended": False, "started_at": i,
            "read_iops": iops, "write_iops": 0.0, "read_bw_bytes": iops * 4096, "write_bw_bytes": 0.0,
            "clat_p99_seconds": 1e-3 / (factor * noise)}


def _worse(metric, value, baseline):
    return value > baseline if metric.startswith("clat") else value < baseline


class Recorder:
    """Every page's figures as they were raised or re-sent (what Alertmanager would carry)."""

    def __init__(self, state):
        self.sent = []
        self.severities = []   # (alert or its id, severity) of every raise and re-send
        opened, updated = state.open_alert, state.update_alert
        kinds = {}

        def open_alert(alert, identity, target, profile, metric, severity, evidence, causes):
            self.sent.append(("raise", alert, evidence))
            self.severities.append((alert, severity))
            aid = opened(alert, identity, target, profile, metric, severity, evidence, causes)
            kinds[aid] = alert
            return aid

        def update_alert(alert_id, severity, evidence, causes=None):
            self.sent.append(("update", None, evidence))
            self.severities.append((kinds[alert_id], severity))
            return updated(alert_id, severity, evidence, causes)
        state.open_alert, state.update_alert = open_alert, update_alert


@settings(max_examples=60, deadline=None)
@given(segments=st.lists(SEGMENT, min_size=1, max_size=8), seed=st.integers(0, 2**32 - 1))
def test_no_page_ever_says_a_metric_moved_that_is_at_or_better_than_its_normal(tmp_path_factory, segments, seed):
    rng = random.Random(seed)
    state = State(str(tmp_path_factory.mktemp("inv") / "s.db"))
    rec = Recorder(state)
    h = Health(state, DetectorParams(warmup_probes=WARMUP))
    i = 0
    for _ in range(WARMUP + 4):
        h.on_result(_probe(i, 1.0, rng), "vol", lambda since: ["a cause"])
        i += 1
    for factor, length in segments:
        for _ in range(length):
            h.on_result(_probe(i, factor, rng), "vol", lambda since: ["a cause"])
            i += 1
    for kind, alert, evidence in rec.sent:
        if alert not in (None, "VolumeDegraded"):
            continue
        for metric, m in evidence.get("metrics", {}).items():
            assert _worse(metric, m["value"], m["baseline"]), (kind, metric, m, segments)
    state.close()


@settings(max_examples=40, deadline=None)
@given(fault=st.sampled_from([0.25, 0.1, 0.4]), length=st.integers(3, 10), after=st.sampled_from([1.0, 2.0, 3.0]),
       seed=st.integers(0, 2**32 - 1))
def test_a_fault_that_ends_is_cleared_within_its_hysteresis(tmp_path_factory, fault, length, after, seed):
    """Back at its normal, or faster (a cache warm after a throttle), the alert closes within clear_probes of
    probes; nothing of it is re-sent meanwhile."""
    rng = random.Random(seed)
    state = State(str(tmp_path_factory.mktemp("clr") / "s.db"))
    rec = Recorder(state)
    params = DetectorParams(warmup_probes=WARMUP)
    h = Health(state, params)
    for i in range(WARMUP + 4):
        h.on_result(_probe(i, 1.0, rng), "vol", lambda since: [])
    i = WARMUP + 4
    for _ in range(length):
        h.on_result(_probe(i, fault, rng), "vol", lambda since: [])
        i += 1
    raised = ("VolumeDegraded", "vol", "rr") in h.open
    sent_before = len(rec.sent)
    for n in range(params.clear_probes):
        h.on_result(_probe(i, after, rng), "vol", lambda since: [])
        i += 1
    assert ("VolumeDegraded", "vol", "rr") not in h.open, (fault, length, after, raised)
    assert not [s for s in rec.sent[sent_before:] if s[0] == "update"]
    state.close()


@settings(max_examples=40, deadline=None)
@given(segments=st.lists(st.tuples(st.sampled_from([1.0, 0.25, 0.5, 0.02, 0.7, 2.0, None]), st.integers(1, 10)),
                         min_size=1, max_size=8), seed=st.integers(0, 2**32 - 1))
def test_every_alert_says_its_kinds_one_severity_however_far_it_moved(tmp_path_factory, segments, seed):
    """Histories of probes at 2 % to 200 % of normal and failing probes (None): each raise and re-send of
    VolumeDegraded and ProbeFailing carries the severity of its kind, and so does every open alert's view."""
    rng = random.Random(seed)
    state = State(str(tmp_path_factory.mktemp("sev") / "s.db"))
    rec = Recorder(state)
    h = Health(state, DetectorParams(warmup_probes=WARMUP))
    i = 0
    for factor, length in [(1.0, WARMUP + 4)] + segments:
        for _ in range(length):
            record = _probe(i, factor or 1.0, rng)
            if factor is None:
                record = {**record, "ok": False, "error": "fio exited 1"}
            h.on_result(record, "vol", lambda since: ["a cause"])
            i += 1
    assert all(severity == severity_of(alert) for alert, severity in rec.severities), rec.severities
    assert all(a.severity == severity_of(a.alert) for a in h.open_alert_views())
    state.close()


_PROBE_FIELD = {"read_iops": "read_iops", "read_bw_bytes": "read_bw_bytes", "clat_p99_seconds": "clat_p99_seconds"}


@settings(max_examples=40, deadline=None)
@given(segments=st.lists(st.tuples(st.sampled_from([0.25, 0.1, 0.4, 0.02, 0.6]), st.integers(1, 6)),
                         min_size=1, max_size=6), seed=st.integers(0, 2**32 - 1))
def test_an_open_alert_says_the_figures_of_the_last_probe_not_those_it_was_raised_on(tmp_path_factory, segments,
                                                                                      seed):
    """A fault that deepens or eases while it is open: after every probe, each figure the open alert carries
    (what its page and /metrics say) is that probe's own, not the one it was raised on."""
    rng = random.Random(seed)
    state = State(str(tmp_path_factory.mktemp("now") / "s.db"))
    h = Health(state, DetectorParams(warmup_probes=WARMUP))
    i = 0
    for factor, length in [(1.0, WARMUP + 4)] + segments:
        for _ in range(length):
            probe = _probe(i, factor, rng)
            h.on_result(probe, "vol", lambda since: ["a cause"])
            i += 1
            alert = h.open.get(("VolumeDegraded", "vol", "rr"))
            if alert is None:
                continue
            for metric, m in alert.metrics.items():
                if metric in _PROBE_FIELD:
                    assert m["value"] == probe[_PROBE_FIELD[metric]], (metric, m, probe, segments)
    state.close()


LIMITS = {"on": "a cgroup I/O limit holds vdb (254:16) at 200 read IOPS",
          "below": "below vdb: a cgroup I/O limit holds vdc (254:32) at 200 read IOPS"}


@settings(max_examples=200, deadline=None)
@given(probe_ms=st.floats(0.01, 500), await_ms=st.one_of(st.none(), st.floats(0.0, 200)),
       util=st.floats(0, 100), contended=st.booleans(), foreign_share=st.one_of(st.none(), st.floats(0, 1)),
       foreign_util=st.one_of(st.none(), st.floats(0, 100)), limited=st.sampled_from(["", "on", "below"]),
       traced=st.booleans())
def test_the_also_line_never_contradicts_the_cause(probe_ms, await_ms, util, contended, foreign_share,
                                                   foreign_util, limited, traced):
    """Whatever the probe and its device did in the same seconds: the device itself is never named beside time
    above the block layer or beside others' work on it; and beside a cause above the block layer, no line says
    the time goes to the device."""
    from iowarden.daemon.sources.tracer_views import TIME_GOES_TO
    from iowarden.daemon.verdicts.causes import ABOVE_BLOCK_LAYER, Evidence, ProbeWindow, likely_causes
    from iowarden.daemon.verdicts.sentence import alert_text
    window = ProbeWindow("vdb", probe_ms / 1e3, await_ms, util)
    ev = Evidence(("vdb",), "vdb", {}, [], contended, foreign_util, window=window, foreign_share=foreign_share,
                  cgroup_limits=[LIMITS[limited]] if limited else [],
                  sources=[f"{TIME_GOES_TO}the device (tracer: 90% of each I/O's time)"] if traced else [])
    causes = likely_causes(ev)
    above = [c for c in causes if c.startswith(ABOVE_BLOCK_LAYER)]
    device = [c for c in causes if c.startswith("the device itself")]
    others = [c for c in causes if c.startswith("contention")]
    # others' work and a limit above the block layer go together (their I/O spends the limit iowarden's shares);
    # the device's own slowness goes with neither
    assert not (above and device) and not (others and device), causes
    # a limit held on a device below it (a loop device over a throttled one) is why the device's own await is
    # long: never "the device itself" beside it
    assert not (limited == "below" and device), causes
    text = alert_text("VolumeDegraded", "db", "/srv/db", ("vdb",), "fs-uuid:x", "rr", {}, causes)
    if text.cause.startswith(ABOVE_BLOCK_LAYER):
        assert TIME_GOES_TO not in text.more_causes, text
