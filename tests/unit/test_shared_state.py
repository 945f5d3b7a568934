"""Shared state under concurrent access (hardening issue, item 10): the budget and health driven
from threads directly, no root, no fio. Fair turns on one disk (item 11) are in test_policy.py."""
import random
import threading
import time

from iowarden.daemon.verdicts.health import Health
from iowarden.daemon.probing.budget import Budget
from iowarden.daemon.core.state import State


def test_budget_status_while_workers_record_never_raises():
    """On main: 352 of 2,542 status() calls raised 'deque mutated during iteration'."""
    budget = Budget(0.01, 3600.0, 10 << 30)
    now = time.time()
    for i in range(2000):   # a day of history at ~40 s
        budget.record(("sda",), now - 86000 + i * 43, 1.0, 4096)
    errors, stop = [], threading.Event()

    def worker():
        # paced: flat out, the deque grew by millions while status() summed it, quadratic on a busy machine
        while not stop.is_set():
            budget.record(("sda",), time.time(), 0.001, 1)
            time.sleep(0.0001)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(2542):
            try:
                budget.status("sda")
            except RuntimeError as exc:
                errors.append(exc)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []


def _record(target, i, iops):
    return {"target": target, "profile": "rr", "ok": True, "error": None, "contended": False,
            "started_at": 1e9 + i, "read_iops": iops, "write_iops": 0.0, "read_bw_bytes": iops * 4096,
            "write_bw_bytes": 0.0, "clat_p50_seconds": 1e-4, "clat_p99_seconds": 2e-4, "clat_p999_seconds": 3e-4}


def test_health_fed_by_concurrent_workers_while_scrapes_read(tmp_path):
    state = State(str(tmp_path / "state.db"))
    health = Health(state)
    errors, per_worker = [], 150

    def feed(n):
        rng = random.Random(n)
        for i in range(per_worker):
            try:
                health.on_result(_record(f"t{n}", i, 1000 * rng.uniform(0.95, 1.05)), f"vol{n}", lambda since: [])
            except Exception as exc:   # noqa: BLE001 - any escape is the failure
                errors.append(exc)

    def read(stop):
        while not stop.is_set():
            try:
                health.baseline_views()
                health.open_alert_views()
            except Exception as exc:   # noqa: BLE001
                errors.append(exc)

    stop = threading.Event()
    reader = threading.Thread(target=read, args=(stop,))
    reader.start()
    workers = [threading.Thread(target=feed, args=(n,)) for n in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    reader.join()
    assert errors == []
    views = health.baseline_views()
    # every result reached its detector: window-capped, but each volume's iops detector saw them all
    iops = {v.volume: v.samples for v in views if v.metric == "read_iops"}
    assert set(iops) == {"vol0", "vol1", "vol2", "vol3"}
    assert all(n == min(per_worker, health.params.window) for n in iops.values())
    state.close()
