"""Shared test fixtures: fixture trees of /sys and /proc, and real loop-mounted XFS images.

Loop devices, mounts and blkio throttles made here are removed by the id they
were given, also when a test fails; nothing else on the machine is touched.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from iowarden.probes.common import Roots

ROOT = Path(__file__).resolve().parents[1]

# Property tests assert what the code decides, not how fast the machine draws examples: on a host busy with the
# rest of the suite (or soaks beside it) one draw took 1.7 s and Hypothesis failed a test on its own timing. Every
# property test runs with no per-example deadline and without the too-slow health check; a test's own @settings
# change the rest.
settings.register_profile("iowarden", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("iowarden")

FIXTURES = Path(__file__).parent / "fixtures"
# This run's id, in the name of every directory the tests make outside pytest's own (loop images, the lane's
# volumes): what a run left behind can be told from another run's, and removed by it
RUN_ID = os.environ.setdefault("IOWARDEN_TEST_RUN", time.strftime("%m%d-%H%M%S") + f"-{os.getpid()}")


def run_prefix(kind: str) -> str:
    """A temporary directory's prefix: iowarden-KIND-RUN_ID-."""
    return f"iowarden-{kind}-{RUN_ID}-"


def materialize(tree_file: str | Path, dest: Path) -> Roots:
    """Write a `.tree` fixture (@file/@dir/@hex/@link blocks) under dest; return its Roots."""
    kind = path = None
    body: list[str] = []

    def flush():
        if kind is None:
            return
        target = dest / path
        if kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        if kind == "file":
            target.write_text("\n".join(body) + "\n")
        elif kind == "hex":
            target.write_bytes(bytes.fromhex("".join(body)))
        elif kind == "link":
            os.symlink(body[0], target)

    for line in Path(tree_file).read_text().splitlines():
        if line.startswith("#") and kind is None:
            continue
        if line.startswith("@"):
            flush()
            head, _, rest = line[1:].partition(" ")
            kind, body = head, []
            if kind == "link":
                path, _, to = rest.partition(" -> ")
                body = [to]
            else:
                path = rest
            continue
        body.append(line)
    flush()
    return Roots.under(dest)


@pytest.fixture
def tree(tmp_path):
    """tree('storage-md-dm.tree') -> Roots of a fixture tree."""
    def make(name: str) -> Roots:
        return materialize(FIXTURES / "trees" / name, tmp_path / name.replace(".tree", ""))
    return make


def require_root():
    if os.geteuid() != 0:
        pytest.fail("this test needs root (loop devices, mounts): run the suite with sudo, "
                    "as scripts/test.sh does")


def _run(*argv: str) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True).stdout.strip()


def fresh_loop_queue(name: str) -> None:
    """A loop device keeps its queue settings (and its counters) across detach and attach: a test that drifted
    its scheduler left mq-deadline to the next test that got the same number, whose request merges it then
    measured. Every loop a test attaches starts at the loop driver's own: no elevator."""
    sched = Path(f"/sys/block/{name}/queue/scheduler")
    if "[none]" not in sched.read_text():
        sched.write_text("none")


def session_nice(pid: int, nice: int) -> None:
    """The CPU share of the session `pid` leads, against the machine's other sessions. With the scheduler's
    autogroups on (here), CPU time is shared between sessions first and a thread's nice counts only within its
    own: a process started in a session of its own (start_new_session) gets one session's share, whatever its
    nice. Where autogroups are off the write fails and nothing changes."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        pass


# Where the tests that hold a latency against a reference mark themselves while they measure (one empty file per
# measuring thread, named by its pid): the lab's guest, the run's longest path, takes a larger share of the CPU
# only while no mark is there (tests/lab/vm.py, Guest.share_cpu). Shared by the run's workers through RUN_ID.
LATENCY_MARKS = Path("/dev/shm") / f"iowarden-latency-marks-{RUN_ID}"


@contextlib.contextmanager
def latency_measured():
    """While inside, this test measures a latency it holds to a reference (ioping, a served disk's fixed time):
    the lab's emulated guest is at one session's share meanwhile, as every other session is."""
    LATENCY_MARKS.mkdir(mode=0o700, exist_ok=True)
    mark = LATENCY_MARKS / f"{os.getpid()}-{threading.get_ident()}"
    mark.touch()
    try:
        yield
    finally:
        mark.unlink(missing_ok=True)


def latency_being_measured() -> bool:
    """Whether a live process of this run holds a latency mark (a worker that died with one holds nothing)."""
    try:
        names = os.listdir(LATENCY_MARKS)
    except FileNotFoundError:
        return False
    return any(os.path.exists(f"/proc/{name.split('-')[0]}") for name in names)


class LoopXfs:
    """A real XFS filesystem on a loop device backed by an image file, mounted."""

    def __init__(self, size: str = "1G", direct_io: bool = False, mountpoint: Path | None = None,
                 mkfs: tuple[str, ...] = ("mkfs.xfs", "-q", "-f"), image_dir: Path | None = None):
        """mkfs: the command that makes the filesystem (another one, e.g. a tiny ext4, where XFS's 300 MiB
        minimum is too large to fill quickly).
        direct_io: the loop device reads its image with O_DIRECT, so a read costs what the disk
        under the image costs instead of a page-cache copy by the loop worker thread.
        mountpoint: where to mount (created if absent, left in place); else a fresh temp directory.
        image_dir: where the image file lives (another LoopXfs's mountpoint makes a stacked volume
        whose slowness lies below its own block layer, as a cloud volume's throttle does)."""
        require_root()
        self.workdir = Path(tempfile.mkdtemp(prefix=run_prefix("test"), dir=image_dir))
        self.image = self.workdir / "xfs.img"
        self.mountpoint = mountpoint or self.workdir / "mnt"
        self.mountpoint.mkdir(exist_ok=True)
        self.device = None
        self.mounted = False
        try:
            _run("truncate", "-s", size, str(self.image))
            _run(*mkfs, str(self.image))
            self.device = _run("losetup", "--find", "--show", f"--direct-io={'on' if direct_io else 'off'}",
                               str(self.image))
            fresh_loop_queue(self.name)
            if direct_io:
                dio = Path(f"/sys/block/{self.name}/loop/dio").read_text().strip()
                if dio != "1":
                    raise RuntimeError(f"{self.device}: the kernel refused direct I/O to {self.image} "
                                       f"(loop/dio={dio}); the image's filesystem must support O_DIRECT")
            self.mount()
        except BaseException:
            self.close()
            raise

    @property
    def fs_uuid(self) -> str:
        """The filesystem's UUID as blkid reads it (the identity iowarden gives the loop device)."""
        return _run("blkid", "-p", "-s", "UUID", "-o", "value", self.device)

    @property
    def name(self) -> str:
        return os.path.basename(self.device)

    @property
    def major_minor(self) -> str:
        st = os.stat(self.device)
        return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"

    def mount(self):
        _run("mount", self.device, str(self.mountpoint))
        self.mounted = True

    def unmount(self) -> list[str]:
        """Unmount; the problems met (a mount that stayed busy), for close() to report."""
        problems = []
        if self.mounted:
            # A process still finishing I/O (a killed fio's job children) keeps the mount busy
            # for a moment: retry, then detach lazily rather than leave it behind.
            deadline = time.monotonic() + 30
            while True:
                if subprocess.run(["umount", str(self.mountpoint)], capture_output=True).returncode == 0:
                    break
                if time.monotonic() > deadline:
                    held_by = subprocess.run(["fuser", "-vm", str(self.mountpoint)], capture_output=True,
                                             text=True).stderr.strip()
                    problems.append(f"{self.mountpoint} was busy for 30 s and had to be unmounted lazily; "
                                    f"held by: {held_by or 'no process (an open loop device?)'}")
                    subprocess.run(["umount", "-l", str(self.mountpoint)], check=False)
                    break
                time.sleep(0.2)
            self.mounted = False
        return problems

    def _wait_released(self, timeout: float) -> None:
        """Until the loop device no longer holds this image (its loop/ directory gone, or another image bound)."""
        backing = Path(f"/sys/block/{self.name}/loop/backing_file")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if backing.read_text().strip() != str(self.image):
                    return
            except OSError:
                return
            time.sleep(0.2)

    def close(self):
        problems = self.unmount()
        if self.device:
            subprocess.run(["losetup", "-d", self.device], check=False)
            # losetup -d only marks a device still open (udev's blkid after the unmount, a probe's last
            # reader) to detach when its last user closes it; until then the image stays open, and the
            # mount that holds the image (a stacked volume's lower one) is busy
            self._wait_released(timeout=30)
            self.device = None
        shutil.rmtree(self.workdir, ignore_errors=True)
        if problems:
            raise RuntimeError("; ".join(problems))


@pytest.fixture
def loop_xfs():
    fs = LoopXfs()
    yield fs
    fs.close()


@pytest.fixture(scope="module")
def direct_loop_xfs():
    """A disk-paced volume, shared by a module's tests: the loop device reads its image with O_DIRECT, so a probe
    measures the virtio disk under the image, not the loop worker's wake-ups over the page
    cache, whose speed on this VM moves 10-35 % between windows seconds apart (idle
    polling, worker placement; docs/measurements.md). For tests that compare windows."""
    fs = LoopXfs("1G", direct_io=True)
    yield fs
    fs.close()


@pytest.fixture(scope="module")
def shared_loop_xfs():
    fs = LoopXfs("2G")
    yield fs
    fs.close()


# --- the lane: half-hour scenarios run beside the rest of the suite (tests/integration/lane.py) ---

_LANE: list = []


_CONFIG: list = []


def pytest_configure(config):
    _CONFIG.append(config)
    if not hasattr(config, "workerinput"):
        # The suite starts the CLI and the daemon as fresh processes hundreds of times; without bytecode on disk
        # (a fresh clone, or PYTHONDONTWRITEBYTECODE) each one compiles the package again: 0.26 s a start, not
        # 0.18. compileall writes it whatever the environment says; the workers and every child then read it.
        import compileall
        for package in ("daemon", "probes"):
            compileall.compile_dir(str(ROOT / package), quiet=1)
    config.addinivalue_line("markers", "lane(scenario): the test's scenario runs on the lane, beside the suite; "
                                       "the test, run last, waits for its report")
    config.addinivalue_line("markers", "alone: run after everything else, the lane included, when nothing else runs")


def _loadgroup(config) -> bool:
    return bool(getattr(config.option, "loadgroup", False))


# Integration tests of ten minutes or more (under the suite's load), handed out before the others: a worker takes
# the next test when it ends one, in this order, and in collection order these came last. In a whole run on two
# cores the days-long evidence simulations (CPU only) started at 2,436 s and ended the side-by-side tier at
# 3,251 s, two workers busy with nothing else for their last 815 s while the other two had run out of work.
LONG_FIRST = ("tests/integration/test_passive_evidence_days.py",
              "tests/integration/test_http_lockout_and_reload.py::test_nine_sources")


def _parallel() -> bool:
    """This process is one of pytest-xdist's workers (scripts/test.sh runs the suite on several)."""
    return "PYTEST_XDIST_WORKER" in os.environ


@pytest.hookimpl(tryfirst=True)   # before xdist's own, which reads the groups marked here into the test's id
def pytest_collection_modifyitems(session, config, items):
    if _parallel():
        # Workers take work in this order, each test on its own except the lab's, which share one guest (one
        # worker runs them all, its package fixture booting the guest once). The longest first: the lanes
        # (half an hour of mostly waiting, each run inline by a worker of its own), then the lab, then the
        # integration tests, the unit tests last to fill the gaps.
        # The tracer's tests take turns too: the tracer pauses when the whole host's I/O rate would cost it more
        # than its CPU budget, and one of them drives a busy disk to show that it does not. The tail rule's tests
        # are among them: each serves its disks from a FUSE process in Python whose 2 ms reads stretch when
        # another such server (the other tail test's) takes the CPU, and the weak region's tail with them.
        for item in items:
            if item.nodeid.startswith("tests/lab/"):
                item.add_marker(pytest.mark.xdist_group("lab"))
            elif item.nodeid.startswith(("tests/integration/test_tracer.py", "tests/integration/test_tracer_maps.py",
                                         "tests/integration/test_tail.py")):
                item.add_marker(pytest.mark.xdist_group("tracer"))
            elif item.nodeid.startswith("tests/integration/test_packaging.py"):
                # one worker builds the .deb and the .rpm once for the module (four minutes of pip, dpkg-deb and
                # rpmbuild), where each worker that took one of its tests built them again beside the others
                item.add_marker(pytest.mark.xdist_group("packaging"))
        order = {"lab": 1, "tracer": 2, "packaging": 3, "integration": 3}

        def rank(item) -> float:
            if item.get_closest_marker("lane"):
                return 0
            if item.nodeid.startswith(LONG_FIRST):
                return 2.5
            group = item.get_closest_marker("xdist_group")
            return order.get(group.args[0] if group else item.nodeid.split("/")[1], 4)
        items.sort(key=rank)
        return
    # the lane's tests last: by then their scenarios have had the whole run to go by; after them the tests
    # that must run alone (a storm of a thousand hotplugs would be every running daemon's to read)
    items.sort(key=lambda item: 2 if item.get_closest_marker("alone") else 1 if item.get_closest_marker("lane") else 0)


def pytest_collection_finish(session):
    if _parallel() and _loadgroup(session.config):
        ungrouped = [i.nodeid for i in session.items if i.nodeid.startswith("tests/lab/") and not i.nodeid.endswith("@lab")]
        if ungrouped:   # each worker would boot a guest of its own: say so rather than run the lab twice
            raise pytest.UsageError(f"pytest-xdist did not group the lab's tests on one worker ({ungrouped[0]}): "
                                    "pytest 9.2 and later ignore its groups (pyproject.toml pins pytest below it)")
    scenarios = [item.get_closest_marker("lane").args[0] for item in session.items
                 if item.get_closest_marker("lane") is not None]
    if scenarios and not session.config.option.collectonly and not _parallel():
        from tests.integration.lane import Lane
        lane = Lane(scenarios)
        lane.start()
        _LANE.append(lane)


def pytest_sessionfinish(session, exitstatus):
    for running in _RUNNING:
        running.stopped.set()
    for lane in _LANE:
        lane.stop()   # a scenario still running is cancelled: it removes its devices on the way out
    if not hasattr(session.config, "workerinput"):   # the controller, once every worker has ended
        shutil.rmtree(LATENCY_MARKS, ignore_errors=True)


def _phase(nodeid: str, lane: bool = False) -> str:
    parts = nodeid.split("/")
    return "lane" if lane else parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


class Timeline:
    """When each phase (unit, integration, lab, the lanes) ran and on which worker: a line as a phase begins, and
    at the end each phase's span and test time, and what each worker ran beside the others."""

    def __init__(self):
        self.began = time.monotonic()
        self.phases: dict[str, list[float]] = {}   # phase -> [first start, last end, seconds of tests, tests]
        self.started: dict[str, float] = {}
        self.long: list[tuple[str, str, float, float]] = []   # (worker, nodeid, start, end) of tests over 60 s
        self.lane_reports: list[str] = []

    def start(self, reporter, nodeid: str) -> None:
        now = time.monotonic() - self.began
        self.started[nodeid] = now
        phase = _phase(nodeid, nodeid.endswith(_LANE_TESTS))
        if phase not in self.phases:
            self.phases[phase] = [now, now, 0.0, 0]
            if reporter is not None:
                reporter.ensure_newline()
                reporter.write_line(f"== phase: {phase} (run {RUN_ID}), from {time.strftime('%H:%M:%S')}")

    def end(self, report) -> None:
        if report.when == "call" and report.nodeid.endswith(_LANE_TESTS) and not _LANE:
            # a worker ran the scenario: its report (the figures it shows) is in the test's output
            self.lane_reports.append(f"== lane: {report.nodeid.split('::')[-1]}: {report.outcome}")
            self.lane_reports += report.capstdout.splitlines()
        if report.when != "teardown" or report.nodeid not in self.started:
            return
        t0, now = self.started.pop(report.nodeid), time.monotonic() - self.began
        phase = _phase(report.nodeid, report.nodeid.endswith(_LANE_TESTS))
        span = self.phases.setdefault(phase, [t0, now, 0.0, 0])
        span[1], span[2], span[3] = max(span[1], now), span[2] + now - t0, span[3] + 1
        if now - t0 > 60:
            self.long.append((getattr(getattr(report, "node", None), "gateway", None) and report.node.gateway.id
                              or "main", report.nodeid, t0, now))

    def lines(self) -> list[str]:
        out = [f"== phases (wall {time.monotonic() - self.began:.0f} s since the first test):"]
        for phase, (t0, t1, busy, n) in sorted(self.phases.items(), key=lambda kv: kv[1][0]):
            out.append(f"   {phase:<12} {n:4d} tests, from {t0:5.0f} s to {t1:5.0f} s, {busy:6.0f} s of tests")
        if self.long:
            out.append("== tests over a minute, by worker (what ran beside what):")
            for worker, nodeid, t0, t1 in sorted(self.long):
                out.append(f"   {worker:<5} {t0:5.0f}-{t1:5.0f} s  {nodeid.split('::')[-1][:90]}")
        return out


# the lanes' tests, by their module (their phase is "lane" wherever they run)
_LANE_TESTS = ("test_first_half_hour.py::test_a_new_volume_is_armed_in_minutes_and_pages_by_minute_30",
               "test_week_on_call.py::test_a_week_on_call_pages_once_for_the_fault_and_never_for_the_work")
_TIMELINE = Timeline()


# A test's bound, setup and call each: a test that hangs fails with every thread's stack and the run goes on,
# where a hung wait would hold the whole command past CI's 90 minutes and print nothing about which test it was.
# The lanes are half-hour scenarios (24 minutes under the suite's load); no other end-to-end test takes 11, and no
# unit test 5 s: a unit test ticking a fake clock until a schedule reaches a state it never reaches spins for ever.
TEST_BOUND_SECONDS = 1200.0
LANE_BOUND_SECONDS = 2700.0
UNIT_BOUND_SECONDS = 120.0


class RanPastBound(BaseException):
    """A test over its bound: a BaseException, so that no `except Exception` in a wait takes it for a retry."""


@contextlib.contextmanager
def _bounded(item, stage: str):
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    bound = LANE_BOUND_SECONDS if item.nodeid.endswith(_LANE_TESTS) else \
        UNIT_BOUND_SECONDS if item.nodeid.startswith("tests/unit/") else TEST_BOUND_SECONDS

    def overran(signum, frame):
        sys.stderr.write(f"\n== {item.nodeid}: its {stage} ran past {bound:.0f} s; every thread's stack:\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        raise RanPastBound(f"{stage} ran past its bound of {bound:.0f} s (tests/conftest.py, _bounded)")

    previous = signal.signal(signal.SIGALRM, overran)
    signal.setitimer(signal.ITIMER_REAL, bound)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _bounded(item, "setup"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _bounded(item, "call"):
        yield


class Running(threading.Thread):
    """The controller of a side-by-side run says, every ten minutes, which tests have run longer than five: when a
    run is stopped from outside, its output still says what it was waiting on."""

    EVERY_SECONDS = 600.0
    LONGER_THAN_SECONDS = 300.0

    def __init__(self, reporter):
        super().__init__(name="tests-running", daemon=True)
        self.reporter = reporter
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.EVERY_SECONDS):
            now = time.monotonic() - _TIMELINE.began
            long = sorted((t0, nodeid) for nodeid, t0 in list(_TIMELINE.started.items())
                          if now - t0 > self.LONGER_THAN_SECONDS)
            if long:
                self.reporter.ensure_newline()
                self.reporter.write_line(f"== {time.strftime('%H:%M:%S')} ({now:.0f} s) still running: " +
                                         "; ".join(f"{n.split('/')[-1]} ({now - t0:.0f} s)" for t0, n in long))


def pytest_sessionstart(session):
    config = session.config
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            _RUNNING.append(Running(reporter))
            _RUNNING[-1].start()


_RUNNING: list[Running] = []


def pytest_runtest_logstart(nodeid, location):
    reporter = _CONFIG[0].pluginmanager.get_plugin("terminalreporter") if _CONFIG else None
    _TIMELINE.start(reporter, nodeid)


def pytest_runtest_logreport(report):
    _TIMELINE.end(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The lane's reports, passed or not: their figures (time to arm, to page, to clear) are what they show."""
    for lane in _LANE:
        for line in lane.reports():
            terminalreporter.write_line(line)
    for line in _TIMELINE.lane_reports + _TIMELINE.lines() + setup_notes():
        terminalreporter.write_line(line)


def _setup_notes_path() -> Path:
    return Path(tempfile.gettempdir()) / f"iowarden-test-{RUN_ID}-setup-notes.txt"


def setup_note(line: str) -> None:
    """A line on how long a shared fixture's setup took (the lab's guest), printed in the run's summary: a
    fixture's own output is captured on the worker that ran it."""
    with open(_setup_notes_path(), "a") as f:
        f.write(line.rstrip("\n") + "\n")


def setup_notes() -> list[str]:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return []   # the controller prints them, once
    path = _setup_notes_path()
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    path.unlink(missing_ok=True)
    return lines


@pytest.fixture
def lane(request):
    marker = request.node.get_closest_marker("lane")
    if marker is None:
        pytest.fail("the lane fixture is for tests marked @pytest.mark.lane.with_args(scenario)")
    if _parallel():
        # a worker of its own runs the scenario now; the others take the rest of the suite meanwhile
        from tests.integration.lane import Lane
        own = Lane([marker.args[0]])
        own.start()
        yield own
        own.stop()
        return
    if not _LANE:
        pytest.fail("the lane did not start")
    yield _LANE[0]
