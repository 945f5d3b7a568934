"""Shared state under concurrent access: the budget and health driven
from threads directly, no root, no fio. Fair turns on one disk are in test_policy.py."""
import random
import threading
import time

from iowarden.daemon.core.effects import health_from
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
        # a fixed number of records, paced: bounded by time instead, the deque grew with the machine's load while
        # status() summed it, so a busy machine made the test quadratic (38 s at load 15, past its bound at 30)
        for _ in range(1500):
            if stop.is_set():
                return
            budget.record(("sda",), time.time(), 0.001, 1)
            time.sleep(0.0001)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    calls = 0
    try:
        # every call while the workers record: the race is only there while they run
        while calls < 2542 and any(t.is_alive() for t in threads) or calls < 200:
            try:
                budget.status("sda")
            except RuntimeError as exc:
                errors.append(exc)
            calls += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert calls >= 200


def _record(target, i, iops):
    return {"target": target, "profile": "rr", "ok": True, "error": None, "contended": False,
            "started_at": 1e9 + i, "read_iops": iops, "write_iops": 0.0, "read_bw_bytes": iops * 4096,
            "write_bw_bytes": 0.0, "clat_p50_seconds": 1e-4, "clat_p99_seconds": 2e-4, "clat_p999_seconds": 3e-4}


def test_the_core_fed_by_concurrent_workers_reloads_and_scrapes_loses_nothing(tmp_path):
    """Health lives on the core thread only (no lock). Four probe workers post results, a reload
    thread posts new targets, a scraper renders every snapshot, with the GIL switching every microsecond:
    no exception, every result a row, every result in its volume's detector."""
    import sys
    from iowarden.daemon.core.core import Core
    from iowarden.daemon.events import ProbeFinished, TargetsChanged
    from iowarden.daemon.config import Target
    from tests.unit.test_core import _result
    from tests.unit.test_exporter import scrape
    state = State(str(tmp_path / "state.db"))
    core = Core(state, health_from(state), "test")
    errors, per_worker, workers_n = [], 150, 4
    targets = tuple(Target(f"t{n}", f"/srv/t{n}", ("rr",), 300.0) for n in range(workers_n))

    def feed(n):
        rng = random.Random(n)
        for i in range(per_worker):
            try:
                core.post(ProbeFinished(_result(i, 1000 * rng.uniform(0.95, 1.05), target=f"t{n}",
                                                device=f"sd{chr(97 + n)}"), (f"sd{chr(97 + n)}",), False))
            except Exception as exc:   # noqa: BLE001 - any escape is the failure
                errors.append(exc)

    def reload(stop):
        while not stop.is_set():
            core.post(TargetsChanged(targets))
            time.sleep(0.01)

    def read(stop):
        while not stop.is_set():
            try:
                scrape(core.snapshot)
            except Exception as exc:   # noqa: BLE001
                errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    stop = threading.Event()
    core.start()
    try:
        helpers = [threading.Thread(target=read, args=(stop,)), threading.Thread(target=reload, args=(stop,))]
        for t in helpers:
            t.start()
        workers = [threading.Thread(target=feed, args=(n,)) for n in range(workers_n)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        stop.set()
        for t in helpers:
            t.join()
    finally:
        sys.setswitchinterval(old)
        assert core.stop(30.0)
    assert errors == []
    check = State(str(tmp_path / "state.db"))
    try:
        rows = check.db.execute("SELECT target, count(*) FROM probe_results GROUP BY target").fetchall()
    finally:
        check.close()
    assert dict(rows) == {f"t{n}": per_worker for n in range(workers_n)}
    iops = {v.volume: v.samples for v in core.snapshot.baselines if v.metric == "read_iops"}
    assert len(iops) == workers_n and all(n == min(per_worker, core.health.params.window) for n in iops.values())
