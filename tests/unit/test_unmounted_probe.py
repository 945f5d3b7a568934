"""A discovered volume unmounted between the scheduler's check and the probe's open (the probe was
refused "no longer on the filesystem it was found on" and stored as a failure of a volume that was simply gone).
Fake clock, a fake probe, no root."""
import dataclasses

import pytest

from iowarden.daemon.core.core import Core
from iowarden.daemon.core.state import State
from iowarden.daemon.events import ProbeFinished, ProbeStarted
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
