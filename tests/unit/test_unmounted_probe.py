"""A discovered volume unmounted between the scheduler's check and the probe's open (the probe was
refused "no longer on the filesystem it was found on" and stored as a failure of a volume that was simply gone).
Fake clock, a fake probe, no root."""
import dataclasses

import pytest

from iowarden.daemon.core.core import Core
from iowarden.daemon.core.state import State
from iowarden.daemon.events import ProbeFinished, ProbesCounted, ProbeStarted
from iowarden.daemon.probing import scheduler as schedmod
from iowarden.daemon.core.effects import health_from
from iowarden.probes.common import Roots
from iowarden.probes.fio_run import ProbeResult
from iowarden.probes.pathstat import PathAnswer
from tests.unit.test_policy import Clock, _cfg, _target


def test_a_volume_unmounted_as_its_probe_begins_is_a_volume_gone_not_a_failed_probe(tmp_path, monkeypatch):
    mounted = {"dev": 42}

    def probe_meets_the_unmount(target, path, profile, limits, roots, **kw):
        mounted["dev"] = 7   # unmounted after the scheduler's check, before the probe's open
        return ProbeResult(target, path, None, profile.name, False,
                           f"refused: {path} is no longer on the filesystem it was found on (unmounted?)", 0.0, 0.0)
    monkeypatch.setattr(schedmod, "run_isolated", probe_meets_the_unmount)

    class Paths:   # the path's answer (pathstat): the filesystem on it now
        def latest(self, path):
            return PathAnswer(path, 0.0, st_dev=mounted["dev"], st_mode=0o40755)

        def check(self, paths):
            return {p: self.latest(p) for p in paths}
    cfg = _cfg(_target("new", 1.0))
    posted = []
    sampler = type("S", (), {"recent_util_percent": lambda self, d, s=5: 0.0, "io_pressure": None})()
    sch = schedmod.Scheduler(cfg, Roots(), sampler, posted.append, clock=Clock(), devices=lambda: {},
                             spawn=lambda name, fn: fn(), paths=Paths())
    d = sch.due[0]
    d.target = dataclasses.replace(d.target, found_on_dev=42)
    sch._run(d, ("sdb",), False, 0.0)
    (finished,) = [e for e in posted if isinstance(e, ProbeFinished)]
    assert finished.unmounted and sch.skipped()[("new", "unmounted")] == 1

    # the core forgets the probe (its device no longer watched) and stores nothing for it
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st), "test")
    for e in [ProbeStarted("new", "rr", "loop2", ("loop2",))] + [e for e in posted if not isinstance(e, ProbeStarted)]:
        core.handle(e)
    assert st.probe_results() == [] and core.known.probing == {}
    assert not [a for a in st.alerts() if a["alert"] == "ProbeFailing"]
    st.close()


@pytest.mark.parametrize("discovered", [False, True])
def test_a_path_that_could_not_be_asked_is_a_failed_probe_that_says_why_not_a_volume_gone(monkeypatch, discovered):
    ran = []
    monkeypatch.setattr(schedmod, "run_isolated", lambda *a, **kw: ran.append(a))
    why = "iowarden cannot start a process: a task limit is reached (the unit's TasksMax, …)"

    class Paths:   # no child could be started: nothing is known of the path
        def latest(self, path):
            return PathAnswer(path, 0.0, error=why, asked=False)

        def check(self, paths):
            return {p: self.latest(p) for p in paths}
    posted = []
    sampler = type("S", (), {"recent_util_percent": lambda self, d, s=5: 0.0, "io_pressure": None})()
    sch = schedmod.Scheduler(_cfg(_target("db", 1.0)), Roots(), sampler, posted.append, clock=Clock(),
                             devices=lambda: {}, spawn=lambda name, fn: fn(), paths=Paths(),
                             pin_check=lambda target, device: f"target {target.name} is now on no block device")
    d = sch.due[0]
    if discovered:   # found on a filesystem by a rule: not asked is not "another filesystem there now"
        d.target = dataclasses.replace(d.target, found_on_dev=42)
        assert sch.still_mounted(d.target)
    sch._run(d, ("sdb",), False, 0.0)
    (finished,) = [e for e in posted if isinstance(e, ProbeFinished)]
    assert not ran and not finished.result.ok and not finished.unmounted
    assert finished.result.error.endswith(f"could not be checked: {why}"), finished.result.error
    assert "no block device" not in finished.result.error


def test_a_configured_target_is_probed_only_on_the_filesystem_the_pin_check_approved(monkeypatch):
    """Another filesystem mounted over a configured target just after its pin check: the probe's child is
    given the filesystem of the answer the check approved, and refuses a directory no longer on it before it
    makes anything there (tests/unit/test_probe_child.py holds the child to that)."""
    seen = {}

    def probe(target, path, profile, limits, roots, **kw):
        seen.update(kw)
        return ProbeResult(target, path, "loop2", profile.name, False, "refused: not on the filesystem", 0.0, 0.0)
    monkeypatch.setattr(schedmod, "run_isolated", probe)

    class Paths:   # the answer the pin check was given: a directory on device 42
        def latest(self, path):
            return PathAnswer(path, 0.0, st_dev=42, st_mode=0o40755)

        def check(self, paths):
            return {p: self.latest(p) for p in paths}
    sampler = type("S", (), {"recent_util_percent": lambda self, d, s=5: 0.0, "io_pressure": None})()
    sch = schedmod.Scheduler(_cfg(_target("db", 1.0)), Roots(), sampler, [].append, clock=Clock(),
                             devices=lambda: {}, spawn=lambda name, fn: fn(), paths=Paths())
    d = sch.due[0]
    assert d.target.found_on_dev is None   # configured, not discovered: no filesystem was recorded for it
    sch._run(d, ("sdb",), False, 0.0)
    assert seen["expect_dev"] == 42


def test_a_probes_device_time_is_posted_before_its_result(monkeypatch):
    """A snapshot that holds a probe's result holds the budget it spent: the core applies events in order,
    so the scheduler's counters carrying the probe's device time come before the ProbeFinished."""
    clock = Clock()

    def probe(target, path, profile, limits, roots, **kw):
        clock.now += 2.5
        return ProbeResult(target, path, "sdb", profile.name, True, None, clock.now - 2.5, 2.5)
    monkeypatch.setattr(schedmod, "run_isolated", probe)

    class Paths:
        def latest(self, path):
            return PathAnswer(path, 0.0, st_dev=42, st_mode=0o40755)

        def check(self, paths):
            return {p: self.latest(p) for p in paths}
    posted = []
    sampler = type("S", (), {"recent_util_percent": lambda self, d, s=5: 0.0, "io_pressure": None})()
    sch = schedmod.Scheduler(_cfg(_target("db", 1.0)), Roots(), sampler, posted.append, clock=clock,
                             devices=lambda: {}, spawn=lambda name, fn: fn(), paths=Paths())
    sch.device_of = lambda target: "sdb"
    sch.physical_disks(sch.due[0].target)
    for _ in range(2):
        sch._run(sch.due[0], ("sdb",), False, 0.0)
        finished = max(i for i, e in enumerate(posted) if isinstance(e, ProbeFinished))
        counted = [e for e in posted[:finished] if isinstance(e, ProbesCounted)]
        assert counted, [type(e).__name__ for e in posted]
        spent = sum(isinstance(e, ProbeFinished) for e in posted) * 2.5
        assert counted[-1].budget["sdb"].device_seconds_used == pytest.approx(spent)
