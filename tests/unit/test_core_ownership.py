"""One owner in fact: the state database written only on the core thread, one handler per event type,
and the races two threads can run into, each held by a test that hammers the two threads involved.

The race tests make the interpreter switch threads every microsecond so that an interleaving that
breaks shows up within the test's few thousand rounds (unguarded, the first two raised within a
second: "dictionary changed size during iteration", and a KeyError for a profile a reload removed).
"""
from __future__ import annotations

import dataclasses
import inspect
import random
import sys
import threading
from types import MappingProxyType

import pytest

from iowarden.daemon import events
from iowarden.daemon.core.core import HANDLERS, Core
from iowarden.daemon.events import Housekeeping
from iowarden.daemon.core.state import State
from iowarden.daemon.core.state_schema import OffCoreWrite
from iowarden.daemon.core.effects import health_from
from iowarden.probes import diskstats
from iowarden.probes.common import Roots
from tests.unit.test_policy import Clock, FakeRun, _cfg, _target


@pytest.fixture
def fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _hammer(*fns, seconds: float = 1.5) -> list[Exception]:
    """Each function called in a loop on a thread of its own until one raises or the time is up."""
    errors, stop = [], threading.Event()

    def run(fn):
        try:
            while not stop.is_set():
                fn()
        except Exception as exc:   # noqa: BLE001 - the test's finding
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(f,)) for f in fns]
    for th in threads:
        th.start()
    stop.wait(seconds)
    stop.set()
    for th in threads:
        th.join()
    return errors


def test_every_event_type_has_exactly_one_handler_on_the_core():
    types = {obj for _, obj in inspect.getmembers(events, inspect.isclass)
             if obj.__module__ == events.__name__ and dataclasses.is_dataclass(obj)}
    assert types == set(HANDLERS), (types ^ set(HANDLERS))
    assert all(getattr(t, "__dataclass_params__").frozen for t in types)   # events are immutable values
    assert len(set(HANDLERS.values())) == len(HANDLERS)


def test_the_database_is_written_only_on_the_core_thread(tmp_path):
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st), "test")
    core.start()
    try:
        with pytest.raises(OffCoreWrite, match="not the core"):
            st.add_drift("sda", None, "scheduler", "none", "bfq")
        with pytest.raises(OffCoreWrite):
            st.save_baseline("wwn:1", "passive", "view", 1.0, {})
        with pytest.raises(OffCoreWrite):
            st.retry_pending()
        core.post(Housekeeping("retry_writes"))      # the same, asked of the core: no error
        core.post(Housekeeping("retention"))
    finally:
        core.stop(5.0)
    assert core.events_total == 2
    # the core closed the database on its own thread after its last write: nothing is left to any other
    import sqlite3
    with pytest.raises(sqlite3.ProgrammingError):
        st.db.execute("SELECT 1")


def test_reads_stay_open_to_every_thread(tmp_path):
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st), "test")
    core.start()
    try:
        assert st.load_baselines() == [] and st.alerts() == [] and st.probe_results() == []
    finally:
        core.stop(5.0)


def test_the_passive_part_reads_the_samplers_published_reading_while_the_sampler_steps(tmp_path, fast_switching,
                                                                                       monkeypatch):
    """Unguarded, the passive thread called sampler.wanted(), which inserted into the sampler's partition
    cache while the sampler rebuilt it (a dict comprehension over it) when devices went away."""
    from iowarden.daemon.passive.values import PassiveParams
    from iowarden.daemon.passive.part import PassiveWatch
    from iowarden.daemon.sources import sampler as samplermod
    from tests.unit.test_passive import published

    names = [f"sd{chr(97 + i)}" for i in range(26)]
    t = [0.0]

    def read(roots):   # devices come and go every sample: the cache is pruned every time
        t[0] += 1.0
        present = random.sample(names, 13)
        return diskstats.DiskSample(t[0], {n: diskstats.DiskCounters(8, i, n, reads=int(t[0]) * 10, io_ms=int(t[0]))
                                           for i, n in enumerate(present)})

    monkeypatch.setattr(samplermod.diskstats, "read", read)
    monkeypatch.setattr(samplermod.diskstats, "is_partition", lambda name, roots: False)
    monkeypatch.setattr(samplermod.pressure, "read", lambda roots: None)
    s = samplermod.Sampler(Roots(), [])
    st = State(str(tmp_path / "s.db"))
    part = PassiveWatch(PassiveParams(window_seconds=0.001), published(lambda: s.reading), st, lambda e: None)
    errors = _hammer(s.step, part.step)
    st.close()
    assert not errors, errors
    # read only: a proxy, or the sampler's lazily computed rates (a Mapping with no way to write to it)
    from collections.abc import Mapping, MutableMapping
    rates = s.reading.rates
    assert isinstance(rates, Mapping) and not isinstance(rates, MutableMapping), type(rates)
    assert not hasattr(rates, "__setitem__") and isinstance(s.reading.sampled, frozenset)


def _cfgs():
    a = _cfg(_target("db", 1.0) + _target("logs", 1.0))
    # a reload that renames the profile and drops a target, as an operator's edit would
    text_b = (_target("db", 1.0) + _target("web", 1.0)).replace('profiles = ["rr"]', 'profiles = ["rr2"]')
    b = _cfg(text_b, extra='[profiles.rr2]\nrw = "randread"\nruntime_seconds = 1.0\n')
    return a, b


def test_a_reload_never_races_the_scheduler_step(fast_switching):
    """Unguarded, configure() (discovery, a reload, a uevent: other threads) replaced cfg and due while step()
    read them without the lock, and wrote _disks_of while configure iterated it; the scheduler's snapshot
    copy (budget_view) iterated it too."""
    a, b = _cfgs()
    clock = Clock()
    sch = FakeRun(a, Roots(), type("S", (), {"recent_util_percent": lambda self, d, s=5: 0.0,
                                              "io_pressure": None})(), post=None, rng=random.Random(0), clock=clock,
                  device_of={"db": "sdb", "logs": "sdc", "web": "sdd"})
    flip = iter(range(10**9))

    def reload():
        cfg = b if next(flip) % 2 else a
        sch.configure(cfg, cfg.targets)

    def step():
        clock.now += 5.0
        sch.running.clear()
        sch._busy_disks.clear()
        sch.step()

    errors = _hammer(step, reload, sch.budget_view)
    assert not errors, errors
    sch.configure(b, b.targets)
    assert {(d.target.name, d.profile) for d in sch.due} == {("db", "rr2"), ("web", "rr2")}


def test_the_architecture_doc_names_every_event_and_the_folders_it_describes_exist():
    """docs/architecture.md is written from the code: its events table and its layout stay true."""
    import re
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "architecture.md").read_text()
    for event in HANDLERS:
        assert f"`{event.__name__}(" in doc, f"{event.__name__} is not in docs/architecture.md's events table"
    for folder in re.findall(r"^  (\w+)/ ", doc, flags=re.M):
        assert (repo / "daemon" / folder).is_dir(), folder
    for module in re.findall(r"\b([a-z_]+/[a-z_]+\.py)\b", doc):
        assert (repo / "daemon" / module).exists() or (repo / module).exists() or \
            (repo / "tests" / module).exists(), module


def test_a_contended_result_is_handled_beside_the_passive_views(tmp_path):
    """The core looked up the passive view of a contended probe's device in tuples it took
    for views ('tuple' object has no attribute 'device'), and every contended result failed to be judged."""
    import dataclasses
    from iowarden.daemon.events import ProbeFinished
    from iowarden.daemon.passive.values import DeviceView
    from tests.unit.test_core import _result
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st), "test")
    view = DeviceView("wwn:1", {"read": 1.1}, {"read": 0.5}, {"read": 40}, None, None, ())
    core.known.passive_views = (("dm-0", "wwn:1", view),)
    result = dataclasses.replace(_result(1, 900.0), contended=True)
    core.handle(ProbeFinished(result, ("sdb",), False))   # raised before
    assert [r["contended"] for r in st.probe_results()] == [1]
    st.close()
