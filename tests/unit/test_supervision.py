"""Every part thread supervised: a loop that fails is counted, said and
started again with backoff; a thread that ends withholds the watchdog; a wait never overflows.

Real threads, short cadences, no root. Each test stops what it starts.
"""
import threading
import time

import pytest

from iowarden.daemon import registry as registrymod
from iowarden.daemon.registry import Registry
from tests.thread_frames import blocked_in


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def running():
    made = []

    def start(reg):
        stop = threading.Event()
        reg.start(stop)
        made.append((reg, stop))
        return stop
    yield start
    for reg, stop in made:
        stop.set()
        reg.join(2.0)


def test_a_fault_in_any_part_loop_is_counted_logged_once_and_the_part_restarted(tmp_path, monkeypatch, running,
                                                                                caplog):
    monkeypatch.setattr(registrymod, "RESTART_BACKOFF_SECONDS", 0.05)
    fault = tmp_path / "fault"
    monkeypatch.setenv("IOWARDEN_TEST_FAULT_FILE", str(fault))
    reg = Registry()
    names = ["sampler", "passive", "scheduler", "discovery", "settings", "xfs", "retention", "state", "influxdb"]
    for n in names:
        reg.add(n, 0.05, 1.0, lambda: None)
    running(reg)
    for n in names:   # one part at a time, as the issue asks: inject into each
        before = reg.stats()[n]
        fault.write_text(n)
        assert _wait(lambda: reg.stats()[n].restarts_total >= before.restarts_total + 1), n
        fault.unlink()
        runs = reg.stats()[n].runs_total
        assert _wait(lambda: reg.stats()[n].runs_total > runs + 2), f"{n} did not run again after its restart"
        assert all(t.is_alive() for t in (p.thread for p in reg.parts.values()))
    assert "fault injected into part influxdb" in caplog.text and "Traceback" in caplog.text
    assert reg.stuck() == []


# the part's thread ends on a SystemExit by design; pytest reports any exception that ends a thread
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_part_whose_thread_ends_is_stuck_at_once(running):
    reg = Registry()

    def ends():
        raise SystemExit("a part ended")   # not an Exception: the loop cannot go on
    reg.add("sampler", 0.05, 60.0, ends)
    reg.add("settings", 0.05, 60.0, lambda: None)
    running(reg)
    assert _wait(lambda: not reg.parts["sampler"].thread.is_alive())
    assert reg.stuck() == ["sampler"]


def test_a_loop_that_keeps_failing_backs_off_and_is_stuck_when_it_makes_no_progress(tmp_path, monkeypatch, running):
    monkeypatch.setattr(registrymod, "RESTART_BACKOFF_SECONDS", 0.05)
    monkeypatch.setattr(registrymod, "RESTART_BACKOFF_MAX_SECONDS", 0.2)
    fault = tmp_path / "fault"
    fault.write_text("settings")
    monkeypatch.setenv("IOWARDEN_TEST_FAULT_FILE", str(fault))
    reg = Registry()
    reg.add("settings", 0.1, 0.2, lambda: None)
    started = time.monotonic()
    running(reg)
    # backoff 0.05, 0.1, 0.2: the fourth failure cannot come before 0.35 s (without backoff, within ms)
    assert _wait(lambda: reg.stats()["settings"].restarts_total >= 4)
    took = time.monotonic() - started
    assert took >= 0.35, f"4 restarts in {took:.3f} s: no backoff between them"
    # no step has completed for longer than cadence + deadline
    assert _wait(lambda: reg.stuck() == ["settings"]), reg.stuck()


def test_a_cadence_past_threading_timeout_max_waits_without_overflow(running):
    reg = Registry()
    reg.add("xfs", threading.TIMEOUT_MAX * 10, 60.0, lambda: None)
    stop = running(reg)
    assert _wait(lambda: reg.stats()["xfs"].runs_total == 1)
    # in the wait for its next run, past the step: the wait of TIMEOUT_MAX x 10 did not overflow there
    assert _wait(lambda: blocked_in(reg.parts["xfs"].thread, "wait", below="_loop"))
    part = reg.stats()["xfs"]
    assert part.restarts_total == 0 and part.last_error is None and reg.parts["xfs"].thread.is_alive()
    stop.set()
    reg.join(2.0)
    assert not reg.parts["xfs"].thread.is_alive()   # a long wait still ends on the stop


def test_the_influxdb_summary_of_the_same_sample_twice_is_no_interval_not_a_crash(tmp_path):
    """Item 16: after SIGSTOP/SIGCONT the InfluxDB part found the snapshot's sample unchanged and raised
    "interval must be positive, got 0.0" (the part failed, on every flush until the sampler caught up)."""
    from types import SimpleNamespace

    from iowarden.daemon.outputs.wiring import InfluxOutput
    from iowarden.probes import diskstats
    from tests.integration.helpers import free_port
    line = "   8       0 sda 10 0 80 5 20 0 160 9 0 14 14 0 0 0 0 3 1"
    sample = diskstats.DiskSample(100.0, diskstats.parse(line))
    snap = SimpleNamespace(disk_sample=sample, disk_rates={"sda": None}, devices={}, told=())
    c = SimpleNamespace(url=f"http://127.0.0.1:{free_port()}", org="o", bucket="b", token_file="", token_env="",
                        spool_max_bytes=1 << 20, timeout_seconds=1.0, iostat_interval_seconds=0.0)
    out = InfluxOutput(c, str(tmp_path / "influx-spool"), lambda: snap)
    out.step()
    out.step()   # the same sample again: unguarded, ValueError
    later = diskstats.DiskSample(101.0, diskstats.parse(line.replace(" 10 0 80", " 20 0 160")))
    snap.disk_sample = later
    out.step()
    spooled = "".join(open(p).read() for p in out.writer.spool.segments())
    assert spooled.count("iowarden_disk,") == 1 and "r_per_s=10.0" in spooled, spooled


def test_a_task_is_counted_a_crash_said_and_a_hung_one_stuck(running, caplog):
    """The probe workers are tasks of a supervised part: each run counted, a crash counted and
    said with its traceback, and one running past its deadline makes the part stuck (the watchdog sees it)."""
    clock = [0.0]
    reg = Registry(clock=lambda: clock[0])
    reg.add_tasks("probe")
    running(reg)
    reg.run_task("probe", 10.0, lambda: None).join(5)
    assert reg.stats()["probe"].runs_total == 1 and reg.stats()["probe"].errors_total == 0

    def crash():
        raise RuntimeError("a worker's bug")
    reg.run_task("probe", 10.0, crash).join(5)
    s = reg.stats()["probe"]
    assert s.runs_total == 2 and s.errors_total == 1 and "a worker's bug" in s.last_error
    assert "part probe: a task crashed" in caplog.text and "Traceback" in caplog.text
    assert reg.stuck() == []
    release = threading.Event()
    hung = reg.run_task("probe", 10.0, release.wait)
    clock[0] += 9.0
    assert reg.stuck() == []
    clock[0] += 2.0          # past its deadline, still running
    assert reg.stuck() == ["probe"]
    release.set()
    hung.join(5)
    assert reg.stuck() == [] and reg.stats()["probe"].runs_total == 3


def test_a_crashed_probe_worker_is_a_failed_probe_on_record(tmp_path, monkeypatch):
    """The fault switch in a probe worker: its probe is posted as a failed result (never lost), its disks
    freed for the next probe, and the crash is its part's to count."""
    from iowarden.daemon.events import ProbeFinished
    from iowarden.probes.common import Roots
    from tests.unit.test_policy import Clock, _cfg, _target
    fault = tmp_path / "fault"
    fault.write_text("probe")
    monkeypatch.setenv("IOWARDEN_TEST_FAULT_FILE", str(fault))
    posted = []
    sampler = type("S", (), {"recent_util_percent": lambda self, d, s=5: 0.0, "io_pressure": None})()
    cfg = _cfg(_target("db", 1.0))
    from iowarden.daemon.probing.scheduler import Scheduler
    reg = Registry()
    reg.add_tasks("probe")
    sch = Scheduler(cfg, Roots(), sampler, posted.append, clock=Clock(), devices=lambda: {},
                    spawn=reg.run_task)
    d = sch.due[0]
    sch.start_worker(d, ("sdb",), False, 0.0)
    assert _wait(lambda: reg.stats()["probe"].runs_total == 1)
    finished = [e for e in posted if isinstance(e, ProbeFinished)]
    assert len(finished) == 1 and not finished[0].result.ok
    assert finished[0].result.error.startswith("crashed: InjectedFault")
    assert reg.stats()["probe"].errors_total == 1 and "sdb" not in sch._busy_disks
