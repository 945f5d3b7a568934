"""What the daemon does at the kernel's limits on its resources, part by part. At its task limit (no process or
thread can be started): the pids cgroup's refusals read from the kernel's files, the endpoint's workers all started
with it, a probe task that could not start leaves nothing for the watchdog to wait on. Short of file descriptors:
the endpoint's connections take at most half, sd_notify never raises, a setting that cannot be read is no drift.
Fixture trees and a fake clock; no root."""
import threading

import pytest

from iowarden.daemon import service
from iowarden.daemon.outputs.http_wire import TimedPool, connection_cap
from iowarden.daemon.registry import Registry
from iowarden.daemon.sources.settings import IDENTITY, known_settings, settings_changes
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


def test_connections_take_at_most_half_the_descriptors():
    assert connection_cap(8192, 512) == 512 and connection_cap(1024, 512) == 512
    assert connection_cap(64, 512) == 32 and connection_cap(1, 512) == 1


def test_sd_notify_out_of_descriptors_is_dropped_not_raised(monkeypatch):
    def no_socket(*args, **kwargs):
        raise OSError(24, "Too many open files")
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setattr(service.socket, "socket", no_socket)
    service.notify("WATCHDOG=1")   # the main loop's next second tries again


def test_a_setting_that_cannot_be_read_is_no_drift_and_reads_back_as_it_was():
    first = {("host", "pm_qos_cpu_dma_latency_usec"): 2000000000, ("sdb", "scheduler"): "none",
             ("sdb", IDENTITY): "wwn-1"}
    unreadable = {**first, ("host", "pm_qos_cpu_dma_latency_usec"): None}
    now = known_settings(first, unreadable)
    assert now == first and settings_changes(first, now) == []
    back = known_settings(now, first)
    assert settings_changes(now, back) == []
    changed = {**first, ("host", "pm_qos_cpu_dma_latency_usec"): 0}
    assert settings_changes(back, known_settings(back, changed)) == [
        ("host", "pm_qos_cpu_dma_latency_usec", 2000000000, 0)]
