"""The alert lifecycle's invariants, as properties over generated probe histories (no root, no fio): Health
built from its parameters, judged by the changes it returns (the last test here writes them to a state
database of its own, as the core does).

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
from iowarden.daemon.core.effects import StoredHealth
from iowarden.daemon.verdicts.changes import AlertClosed, AlertRaised, AlertUpdated
from iowarden.daemon.verdicts.health import Health, Saved

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
    """Health built from its parameters alone (no database, no core), and every change it returned: each page's
    figures as they were raised or re-sent (what Alertmanager would carry), with their severities."""

    def __init__(self, params: DetectorParams):
        self.health = Health(params)
        self.changes = []

    def feed(self, record, causes=("a cause",)):
        self.changes += self.health.on_result(record, "vol", lambda since: list(causes))

    @property
    def sent(self):
        kinds = {c.id: c.alert for c in self.changes if isinstance(c, AlertRaised)}
        return [("raise", c.alert, c.evidence) if isinstance(c, AlertRaised) else ("update", kinds[c.id], c.evidence)
                for c in self.changes if isinstance(c, (AlertRaised, AlertUpdated))]

    @property
    def severities(self):
        kinds = {c.id: c.alert for c in self.changes if isinstance(c, AlertRaised)}
        return [(c.alert if isinstance(c, AlertRaised) else kinds[c.id], c.severity)
                for c in self.changes if isinstance(c, (AlertRaised, AlertUpdated))]


@settings(max_examples=60, deadline=None)
@given(segments=st.lists(SEGMENT, min_size=1, max_size=8), seed=st.integers(0, 2**32 - 1))
def test_no_page_ever_says_a_metric_moved_that_is_at_or_better_than_its_normal(segments, seed):
    rng = random.Random(seed)
    rec = Recorder(DetectorParams(warmup_probes=WARMUP))
    i = 0
    for _ in range(WARMUP + 4):
        rec.feed(_probe(i, 1.0, rng))
        i += 1
    for factor, length in segments:
        for _ in range(length):
            rec.feed(_probe(i, factor, rng))
            i += 1
    for kind, alert, evidence in rec.sent:
        if alert != "VolumeDegraded":
            continue
        for metric, m in evidence.get("metrics", {}).items():
            assert _worse(metric, m["value"], m["baseline"]), (kind, metric, m, segments)


@settings(max_examples=40, deadline=None)
@given(fault=st.sampled_from([0.25, 0.1, 0.4]), length=st.integers(3, 10), after=st.sampled_from([1.0, 2.0, 3.0]),
       seed=st.integers(0, 2**32 - 1))
def test_a_fault_that_ends_is_cleared_within_its_hysteresis(fault, length, after, seed):
    """Back at its normal, or faster (a cache warm after a throttle), the alert closes within clear_probes of
    probes; nothing of it is re-sent meanwhile, and what it returns says so: one close, of the alert raised."""
    rng = random.Random(seed)
    params = DetectorParams(warmup_probes=WARMUP)
    rec = Recorder(params)
    for i in range(WARMUP + 4):
        rec.feed(_probe(i, 1.0, rng), causes=())
    i = WARMUP + 4
    for _ in range(length):
        rec.feed(_probe(i, fault, rng), causes=())
        i += 1
    raised = ("VolumeDegraded", "vol", "rr") in rec.health.open
    sent_before, changes_before = len(rec.sent), len(rec.changes)
    for n in range(params.clear_probes):
        rec.feed(_probe(i, after, rng), causes=())
        i += 1
    assert ("VolumeDegraded", "vol", "rr") not in rec.health.open, (fault, length, after, raised)
    assert not [s for s in rec.sent[sent_before:] if s[0] == "update"]
    closed = [c for c in rec.changes[changes_before:] if isinstance(c, AlertClosed)]
    if raised:
        opened = [c for c in rec.changes if isinstance(c, AlertRaised)]
        assert [c.id for c in closed] == [opened[-1].id] and closed[0].alert == "VolumeDegraded"


def _history(segments, seed) -> Recorder:
    """A normal learned, then each (factor of normal, probes) in turn; a factor None is a failing probe."""
    rng = random.Random(seed)
    rec = Recorder(DetectorParams(warmup_probes=WARMUP))
    i = 0
    for factor, length in [(1.0, WARMUP + 4)] + segments:
        for _ in range(length):
            record = _probe(i, factor or 1.0, rng)
            if factor is None:
                record = {**record, "ok": False, "error": "fio exited 1"}
            rec.feed(record)
            i += 1
    return rec


@settings(max_examples=40, deadline=None)
@given(segments=st.lists(st.tuples(st.sampled_from([1.0, 0.25, 0.5, 0.02, 0.7, 2.0, None]), st.integers(1, 10)),
                         min_size=1, max_size=8), seed=st.integers(0, 2**32 - 1))
def test_every_alert_says_its_kinds_one_severity_however_far_it_moved(segments, seed):
    """Histories of probes at 2 % to 200 % of normal and failing probes (None): each raise and re-send of
    VolumeDegraded and ProbeFailing carries the severity of its kind, and so does every open alert's view."""
    rec = _history(segments, seed)
    assert all(severity == severity_of(alert) for alert, severity in rec.severities), rec.severities
    assert all(a.severity == severity_of(a.alert) for a in rec.health.open_alert_views())


@settings(max_examples=40, deadline=None)
@given(segments=st.lists(st.tuples(st.sampled_from([1.0, 0.25, 0.5, 0.02, 2.0, None]), st.integers(1, 8)),
                         min_size=1, max_size=8), seed=st.integers(0, 2**32 - 1))
def test_each_alert_is_raised_once_and_closed_once_and_ids_are_never_reused(segments, seed):
    """Over any history the changes tell one story: per (alert, volume, profile) raises and closes alternate,
    every update and close names an alert that is open, and no id is given twice; a Health built again from
    what those changes saved (the next id, the open alerts) goes on from the same place."""
    rec = _history(segments, seed)
    open_ids, ids = {}, set()
    for c in rec.changes:
        if isinstance(c, AlertRaised):
            assert c.id not in ids and (c.alert, c.identity, c.profile) not in open_ids.values()
            ids.add(c.id)
            open_ids[c.id] = (c.alert, c.identity, c.profile)
        elif isinstance(c, AlertUpdated):
            assert c.id in open_ids
        elif isinstance(c, AlertClosed):
            assert open_ids.pop(c.id) == (c.alert, c.identity, c.profile)
    assert sorted(open_ids.values()) == sorted(rec.health.open)
    again = Health(rec.health.params, Saved(next_alert_id=rec.health.next_alert_id))
    assert again.next_alert_id > max(ids, default=0)


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
    h = StoredHealth(state, DetectorParams(warmup_probes=WARMUP))
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
