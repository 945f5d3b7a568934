"""What the daemon does at its task limit (no process or thread can be started), part by part: the pids cgroup's
refusals read from the kernel's files, the endpoint's workers all started with it, a probe task that could not
start leaves nothing for the watchdog to wait on. Fixture trees and a fake clock; no root."""
import threading

import pytest

from iowarden.daemon.outputs.http_wire import TimedPool
from iowarden.daemon.registry import Registry
from iowarden.probes import tasklimit
from iowarden.probes.common import Roots


def test_the_pids_cgroup_is_v1s_where_mounted_else_the_unified_one():
    hybrid = "12:pids:/system.slice/iowarden.service\n11:memory:/system.slice/iowarden.service\n0::/x.service\n"
    assert tasklimit.parse_cgroup(hybrid) == "/system.slice/iowarden.service"
    assert tasklimit.parse_cgroup("0::/system.slice/iowarden.service\n") == "/system.slice/iowarden.service"
    assert tasklimit.parse_cgroup("3:cpu,cpuacct:/a\n") is None and tasklimit.parse_cgroup("") is None


def test_refusals_are_pids_events_max_and_unknown_is_none():
    assert tasklimit.parse_events("max 17\n") == 17
    assert tasklimit.parse_events("max 0\nmax.imposed 3\n") == 0
    assert tasklimit.parse_events("garbage\n") is None and tasklimit.parse_events("max lots\n") is None


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_refusals_are_read_from_the_daemons_own_cgroup(tmp_path, layout):
    roots = Roots(proc=tmp_path / "proc", sys=tmp_path / "sys")
    (roots.proc / "self").mkdir(parents=True)
    group = (roots.sys / "fs" / "cgroup" / ("pids" if layout == "v1" else "") / "system.slice" / "iowarden.service")
    group.mkdir(parents=True)
    (group / "pids.events").write_text("max 4\n")
    line = "5:pids:/system.slice/iowarden.service\n" if layout == "v1" else "0::/system.slice/iowarden.service\n"
    (roots.proc / "self" / "cgroup").write_text(line)
    assert tasklimit.refusals(roots) == 4
    (roots.proc / "self" / "cgroup").write_text(line.replace("iowarden.service", "../../etc"))
    assert tasklimit.refusals(roots) is None   # no path out of the hierarchy


def test_every_endpoint_worker_is_started_with_the_pool():
    pool = TimedPool(max_workers=4, thread_name_prefix="t")
    try:
        assert len(pool._threads) == 4 and all(t.is_alive() for t in pool._threads)
        assert pool.submit(lambda: 42).result(timeout=5) == 42 and len(pool._threads) == 4
    finally:
        pool.shutdown(wait=True)


def test_a_task_that_cannot_get_a_thread_leaves_no_deadline_behind(monkeypatch):
    now = [0.0]
    reg = Registry(clock=lambda: now[0])
    reg.add_tasks("probe")

    def no_thread(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError):
        reg.run_task("probe", 10.0, lambda: None)
    monkeypatch.undo()
    now[0] = 1000.0
    assert reg.stuck() == [] and reg.parts["probe"].tasks == {}
