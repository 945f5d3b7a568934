"""Events and snapshots are values, all the way down: what a part posts and what the core publishes is read by
other threads (the core, the scrape, the InfluxDB writer) while its maker goes on, so nothing in it may change.
A walk over every field, into every mapping, tuple and record, finds any list, dict, set or record that is
not frozen; the walk is shown finding each of those on a value made wrong on purpose."""
import dataclasses
import enum
import types
from pathlib import Path

import pytest

from iowarden.daemon.core.core import Core
from iowarden.daemon.events import DisksSampled, ProbeFinished
from iowarden.daemon.snapshot import Snapshot, frozen
from iowarden.probes import diskstats
from iowarden.probes.fio_run import ProbeResult, interpret_output
from tests.unit.test_core import _result, parts  # noqa: F401  (the fixture: a core on real fixture trees)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LEAVES = (type(None), bool, int, float, complex, str, bytes, range, enum.Enum)


def mutable_parts(value, path: str = "value", seen: set | None = None) -> list[str]:
    """Where in `value` something could be changed in place: a path and the type found there."""
    seen = set() if seen is None else seen
    if isinstance(value, LEAVES) or id(value) in seen:
        return []
    seen.add(id(value))
    out = []
    if isinstance(value, (tuple, frozenset)):
        for i, v in enumerate(value):
            out += mutable_parts(v, f"{path}[{i}]", seen)
    elif isinstance(value, types.MappingProxyType):
        for k, v in value.items():
            out += mutable_parts(k, f"{path} key {k!r}", seen) + mutable_parts(v, f"{path}[{k!r}]", seen)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        if not type(value).__dataclass_params__.frozen:
            out.append(f"{path}: {type(value).__name__} (a dataclass that is not frozen)")
        for f in dataclasses.fields(value):
            out += mutable_parts(getattr(value, f.name), f"{path}.{f.name}", seen)
    else:
        out.append(f"{path}: {type(value).__name__}")
    return out


def _fio_result() -> ProbeResult:
    """A result as a probe makes it: fio's real JSON+ output read into it."""
    base = ProbeResult("db", "/srv/db", "dm-0", "rr", False, None, 1.7e9, 2.0, argv=["fio", "--name=rr"])
    return interpret_output(base, (FIXTURES / "fio" / "fio-3.33-randrw-json+.json").read_text(), None)


def test_a_probe_result_read_from_fio_is_a_value():
    result = _fio_result()
    assert result.ok and result.report.directions["read"].clat_histogram
    assert mutable_parts(result, "result") == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.error = "changed after it was posted"


def test_a_sample_read_from_diskstats_is_a_value():
    sample = diskstats.DiskSample(1.0, diskstats.parse((FIXTURES / "diskstats" / "linux-6.18-20-fields.txt").read_text()))
    assert sample.counters and mutable_parts(sample, "sample") == []
    with pytest.raises(TypeError):
        sample.counters["sda"] = None


def test_what_the_core_publishes_is_frozen_all_the_way_down(parts, monkeypatch):  # noqa: F811
    """The core's fixture posts what the parts post on real fixture trees (the targets, two settings polls, a
    sample, an XFS report); then probe results. Every one of them is walked as the core takes it."""
    walked, found, run_batch = [], [], Core.run_batch

    def walking(self, events):
        for e in events:
            walked.append(type(e).__name__)
            found.extend(mutable_parts(e, type(e).__name__))
        return run_batch(self, events)
    monkeypatch.setattr(Core, "run_batch", walking)
    core = parts.new_core()
    events = [ProbeFinished(_fio_result(), ("sdb",), False)]
    events += [ProbeFinished(_result(i, 38000.0 * (1 + 0.01 * (i % 3)))) for i in range(12)]
    events += [ProbeFinished(_result(12, 0.0, ok=False, target="logs", device="md1")),
               DisksSampled(diskstats.DiskSample(3.0, {}), types.MappingProxyType({}), None, 1.7e9 + 3)]
    core.run_batch(events)
    assert {"TargetsChanged", "SettingsRead", "DisksSampled", "XfsRead", "ProbeFinished"} <= set(walked)
    assert found == []
    snap = core.snapshot
    assert snap.probes and snap.budget and snap.drift_total and snap.parts   # a snapshot with something in it
    assert mutable_parts(snap, "snapshot") == []


def test_the_walk_finds_what_can_be_changed():
    @dataclasses.dataclass
    class Loose:
        x: int = 0
    wrong = Snapshot(0.0, "v", skipped_total={("db", "busy"): 1}, parts=types.MappingProxyType({"a": [1]}),
                     probes=(Loose(),), sources=types.MappingProxyType({"s": {1, 2}}))
    found = mutable_parts(wrong, "snapshot")
    assert "snapshot.skipped_total: dict" in found
    assert "snapshot.parts['a']: list" in found
    assert "snapshot.probes[0]: Loose (a dataclass that is not frozen)" in found
    assert "snapshot.sources['s']: set" in found
    # and what the core does to such values before it publishes them
    assert mutable_parts(Snapshot(0.0, "v", skipped_total=frozen({("db", "busy"): 1}),
                                  parts=frozen({"a": [1]}), sources=frozen({"s": {1, 2}})), "snapshot") == []


def test_the_passive_parts_events_and_a_snapshot_with_its_alert_are_values(tmp_path):
    """The passive part's real events (a volume held at its limit: transitions, views, curves and evidence to
    save), each walked as the core takes it, and the snapshot that then holds the alert and the views."""
    from iowarden.daemon.core.state import State
    from iowarden.daemon.passive.values import PassiveParams
    from iowarden.daemon.passive.part import PassiveWatch
    from iowarden.daemon.verdicts.detect import DetectorParams
    from iowarden.daemon.core.effects import health_from
    from tests.unit.test_passive import FakeSampler, held_at_a_limit, published

    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st, DetectorParams()), "test")
    found, kinds = [], set()

    def post(e):
        found.extend(mutable_parts(e, type(e).__name__))
        kinds.add((type(e).__name__, bool(e.transitions), bool(e.saves)))
        core.run_batch([e])
    sampler = FakeSampler()
    part = PassiveWatch(PassiveParams(window_seconds=15), published(lambda: sampler.reading), st, post)
    for _, sampler.last_sample in held_at_a_limit():
        part.step()
    post(part.final_event())
    assert ("PassiveJudged", True, True) in kinds   # a transition and its saves were among them
    assert found == []
    core.publish()
    assert core.snapshot.alerts and core.snapshot.passive
    assert mutable_parts(core.snapshot, "snapshot") == []
    st.close()


def test_a_sources_reading_is_a_value():
    """What the cgroup source posts (SourceRead's value) read from a real cgroup v2 tree, read twice so its
    rates are there too."""
    from iowarden.daemon.events import SourceRead
    from iowarden.daemon.sources import cgroups
    from iowarden.probes.common import Roots
    read = cgroups.start(type("S", (), {"max_cgroups": 100})(), Roots.under(FIXTURES / "cgroup" / "v2"))
    read()
    view = read()
    assert view.limits and mutable_parts(SourceRead("cgroups", view), "SourceRead") == []
