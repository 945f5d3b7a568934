"""The core under every thread at once: probe workers posting results, the sampler and the passive
part stepping, reloads changing the targets, and scrapes rendering /metrics from the published snapshot,
together for a minute with the interpreter switching threads every microsecond. Nothing may raise on any
thread (the core's included: an event it failed to handle is counted by its log), and the database ends
with exactly the rows of the results posted: the one owner lost none and wrote none twice.

IOWARDEN_STRESS_SECONDS shortens or lengthens the minute."""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
import random
import threading
import time

from prometheus_client import CollectorRegistry

from iowarden.daemon.core.core import Core
from iowarden.daemon.core.state import State
from iowarden.daemon.events import ProbeFinished, ProbeStarted, TargetsChanged
from iowarden.daemon.outputs import exposition
from iowarden.daemon.outputs.prometheus import SnapshotCollector
from iowarden.daemon.passive.values import PassiveParams
from iowarden.daemon.passive.part import PassiveWatch
from iowarden.daemon.sources import sampler as samplermod
from iowarden.daemon.core.effects import health_from
from iowarden.probes import diskstats
from iowarden.probes.common import Roots
from tests.unit.test_core import _result
from tests.unit.test_core_ownership import _cfgs, _hammer, fast_switching  # noqa: F401 - the fixture

STRESS_SECONDS = float(os.environ.get("IOWARDEN_STRESS_SECONDS", "60"))
DEVICES = [f"sd{c}" for c in "bcdefgh"]


class _Failures(logging.Handler):
    """The core logs an event it could not handle (and goes on): here that is a failure."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record):
        if record.exc_info or not record.getMessage().startswith("ALERT "):   # an alert is the core's work
            self.records.append(record.getMessage()[:300])


def test_the_core_under_every_thread_for_a_minute_loses_and_duplicates_nothing(tmp_path, fast_switching,  # noqa: F811
                                                                            monkeypatch):
    t = [0.0]
    lock = threading.Lock()

    def read(roots):   # devices busy and coming and going: the sampler's and the passive part's every path
        with lock:
            t[0] += 1.0
            now = t[0]
        present = random.sample(DEVICES, 5)
        return diskstats.DiskSample(now, {n: diskstats.DiskCounters(8, 16 * i, n, reads=int(now) * (50 + i),
                                                                     read_ms=int(now) * (20 + i),
                                                                     sectors_read=int(now) * 800, io_ms=int(now) * 9,
                                                                     weighted_io_ms=int(now) * 30)
                                          for i, n in enumerate(present)})
    monkeypatch.setattr(samplermod.diskstats, "read", read)
    monkeypatch.setattr(samplermod.diskstats, "is_partition", lambda name, roots: False)
    monkeypatch.setattr(samplermod.pressure, "read", lambda roots: None)

    failures = _Failures()
    logging.getLogger("iowarden").addHandler(failures)
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st), "test")
    core.start()
    sampler = samplermod.Sampler(Roots(), [], core.post)
    passive = PassiveWatch(PassiveParams(window_seconds=0.001), lambda: core.snapshot, st, core.post)
    a, b = _cfgs()
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: core.snapshot))
    numbers = itertools.count()
    posted: list[int] = []
    posted_lock = threading.Lock()

    def worker(target: str):
        i = next(numbers)
        device = random.choice(DEVICES)
        core.post(ProbeStarted(target, "rr", device))
        r = _result(i, random.uniform(500, 5000), ok=random.random() > 0.1, target=target, device=device)
        r = dataclasses.replace(r, contended=random.random() < 0.3)
        core.post(ProbeFinished(r, (device,), random.random() < 0.05))
        with posted_lock:
            posted.append(i)
        time.sleep(0.02)   # a busy daemon posts a few results a second; this is hundreds, not a flood to drain

    flip = itertools.count()

    def reload():
        cfg = b if next(flip) % 2 else a
        core.post(TargetsChanged(tuple(cfg.targets), (("logs", "target dropped: no longer mounted"),)
                                 if cfg is b else ()))
        time.sleep(0.05)

    def scrape():
        body = exposition.render(registry)
        assert body.startswith(b"# HELP") or not body, body[:200]

    try:
        errors = _hammer(functools.partial(worker, "db"), functools.partial(worker, "logs"),
                         functools.partial(worker, "web"), sampler.step, passive.step, reload, scrape, scrape,
                         seconds=STRESS_SECONDS)
        drained_from = time.monotonic()
        assert core.stop(300.0), "the core did not drain what was posted"
        print(f"{len(posted)} results, {core.events_total} events in {STRESS_SECONDS:g} s; the core drained the "
              f"rest in {time.monotonic() - drained_from:.1f} s")
    finally:
        logging.getLogger("iowarden").removeHandler(failures)
    assert not errors, errors
    assert not failures.records, failures.records[:5]
    stored = sorted(int(round((r["started_at"] - 1.7e9) / 60)) for r in State(str(tmp_path / "s.db")).probe_results(
        limit=10 ** 7))
    assert len(posted) > 100, f"only {len(posted)} results in {STRESS_SECONDS} s: the threads did not run"
    assert stored == sorted(posted), (len(stored), len(posted))
