"""A latency a few microseconds above its normal is not a page, however many spreads that is (no root; a state
database of the test's own). Beside other work, a healthy RAM-backed volume's qd1 probe read p50 24 us against
its normal 11 us and paged VolumeDegraded for a minute: CPU contention, not the volume."""
import random

from iowarden.daemon.core.state import State
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.verdicts.health import LATENCY_FLOOR_SECONDS
from iowarden.daemon.core.effects import StoredHealth


def _qd1(i, p50_seconds, rng):
    noise = 1 + rng.uniform(-0.02, 0.02)
    return {"target": "db", "profile": "qd1", "ok": True, "error": None, "contended": False, "started_at": i,
            "read_iops": 50_000.0 * noise, "write_iops": 0.0, "read_bw_bytes": 50_000.0 * 4096 * noise,
            "write_bw_bytes": 0.0, "clat_p50_seconds": p50_seconds * noise}


def _run(tmp_path, p50_now):
    h, rng = StoredHealth(State(str(tmp_path / "s.db")), DetectorParams(warmup_probes=6)), random.Random(2)
    events = []
    for i in range(10):
        h.on_result(_qd1(i, 11e-6, rng), "vol", lambda since: [])
    for i in range(10, 22):
        events += h.on_result(_qd1(i, p50_now, rng), "vol", lambda since: [])
    return events


def test_a_fast_volumes_latency_doubled_by_a_few_microseconds_pages_nothing(tmp_path):
    assert 24e-6 - 11e-6 < LATENCY_FLOOR_SECONDS
    assert _run(tmp_path, 24e-6) == []


def test_the_same_volume_slower_by_more_than_the_floor_pages(tmp_path):
    assert _run(tmp_path, 80e-6) == ["VolumeDegraded raised"]


def _tail(i, p999_seconds, p99_seconds, rng):
    noise = 1 + rng.uniform(-0.02, 0.02)
    return {"target": "db", "profile": "read-1m", "ok": True, "error": None, "contended": False, "started_at": i,
            "read_iops": 3000.0 * noise, "write_iops": 0.0, "read_bw_bytes": 3000.0 * 2**20 * noise,
            "write_bw_bytes": 0.0, "clat_p99_seconds": p99_seconds * noise, "clat_p999_seconds": p999_seconds * noise}


def test_a_probes_slowest_few_ios_alone_are_not_a_page_but_are_said_beside_a_metric_that_moved(tmp_path):
    """Beside a neighbour's throttle filling the dirty pages, a healthy volume's read-1m p99.9 went to 17x its
    normal (223 ms against 13.4 ms) and nothing else moved: it paged, twice."""
    h, rng = StoredHealth(State(str(tmp_path / "s.db")), DetectorParams(warmup_probes=6)), random.Random(3)
    for i in range(10):
        h.on_result(_tail(i, 13.4e-3, 5e-3, rng), "vol", lambda since: [])
    events = []
    for i in range(10, 22):
        events += h.on_result(_tail(i, 223e-3, 5e-3, rng), "vol", lambda since: [])
    assert events == [], events
    for i in range(22, 34):   # now the p99 moves too: the volume's, said with its p99.9
        events += h.on_result(_tail(i, 223e-3, 60e-3, rng), "vol", lambda since: [])
    assert events == ["VolumeDegraded raised"], events
    (alert,) = h.open.values()
    assert {"clat_p99_seconds", "clat_p999_seconds"} <= set(alert.metrics), alert.metrics
