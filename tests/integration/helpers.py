"""Helpers for tests that run `iowarden run` as a real process, or that need a volume of a known speed."""
import json
import os
from pathlib import Path
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager



def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def own_devices(path) -> list[str]:
    """The kernel names under a path: its filesystem's device (a partition's disk), and for a loop device the
    loop devices its backing file lives on, down the stack (a stacked test volume is two loop devices)."""
    import stat as stat_
    names: list[str] = []
    try:
        st = os.stat(path)
    except OSError:
        return names
    dev = st.st_rdev if stat_.S_ISBLK(st.st_mode) else st.st_dev
    while len(names) < 4:
        link = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
        try:
            real = os.path.realpath(link)
        except OSError:
            break
        if not os.path.exists(real):
            break
        name = os.path.basename(os.path.dirname(real) if os.path.exists(os.path.join(real, "partition"))
                                else real)
        if names and not name.startswith("loop"):
            break   # the host's own disk under a test's image is everyone's: not the test's to judge
        names.append(name)
        try:
            with open(f"/sys/block/{name}/loop/backing_file") as f:
                dev = os.stat(f.read().strip()).st_dev
        except OSError:
            break
    return names


def config_text(mount, state_dir, runtime=0.5, interval=2.0, extra="", port=None, prom_extra="", address="127.0.0.1",
                tracer=False, tracer_cores=8.0):
    """A daemon's configuration for a test. The tracer (bpftrace: a second or two of compiling and some
    100 MB per daemon) is off unless the test is about it: tests/integration/test_tracer.py and a few
    daemons started from their own text run with it (those with its default CPU budget, which may pause it).
    tracer: True, or the name of its engine; tracer_cores: its CPU budget ([tracer] max_cpu_cores)."""
    if "[sampler]" not in extra:
        # confined to the test's own devices: a neighbour's busy loop device (another job's fio) must not
        # fail it; the tracer, SMART and the settings poller follow the sampler's devices
        names = own_devices(mount)
        if names:
            extra += "\n[sampler]\ndevices = [" + ", ".join(f'"{n}"' for n in names) + "]\n"
    return f"""
[tracer]
enabled = {str(bool(tracer)).lower()}
{f'engine = "{tracer}"' if isinstance(tracer, str) else ""}
interval_seconds = 2.0
# the tests about the tracer's data run probes every second on loop devices (tens of thousands of IOPS
# over 2 s windows): the CPU budget would pause it (test_blocktrace.py tests the budget)
max_cpu_cores = {tracer_cores}
[prometheus]
listen_address = "{address}:{port or free_port()}"
{prom_extra}
[daemon]
state_dir = "{state_dir}"
log_level = "debug"
[limits]
min_free_bytes = "1MiB"
min_free_ratio = 0.0
timeout_margin_seconds = 5.0
[settings]
interval_seconds = 1.0
[profiles.rr]
rw = "randread"
size = "16MiB"
runtime_seconds = {runtime}
ramp_time_seconds = 0.0
[[targets]]
name = "loop"
path = "{mount}"
profiles = ["rr"]
interval_seconds = {interval}
{extra}"""


class DaemonProc:
    started = 0

    def __init__(self, tmp_path, cfg_text, on_host=lambda argv: argv):
        """on_host wraps the daemon's argv to run it elsewhere (netns.Host.argv: on another host)."""
        DaemonProc.started += 1
        self.cfg = tmp_path / "config.toml"
        self.cfg.write_text(cfg_text)
        self.sock_path = str(tmp_path / f"notify-{DaemonProc.started}.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.sock_path)
        self.sock.settimeout(0.2)
        self.log = open(tmp_path / f"daemon-{DaemonProc.started}.log", "w+")
        env = {**os.environ, "NOTIFY_SOCKET": self.sock_path}
        env.pop("INVOCATION_ID", None)
        env.pop("JOURNAL_STREAM", None)
        self.proc = subprocess.Popen(on_host([sys.executable, "-m", "iowarden.daemon.cli", "run", "-c", str(self.cfg)]),
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        # every datagram read as it comes, on a thread: the socket's queue holds 10 (net.unix.max_dgram_qlen)
        # and the daemon, which never blocks on it, drops what does not fit; read only while a test waits,
        # a busy machine lost STOPPING=1 that way
        self.messages: list[str] = []
        self._reading = threading.Event()
        self._reading.set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        while self._reading.is_set():
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except socket.timeout:
                continue
            except OSError:
                return

    def wait_message(self, text, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in m for m in list(self.messages)):
                return
            if self.proc.poll() is not None:
                time.sleep(0.3)   # what it sent before it exited is still being read
                if any(text in m for m in list(self.messages)):
                    return
                raise AssertionError(f"daemon exited: {self.output()}")
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} from the daemon in {timeout} s; got {self.messages[-5:]}")

    def drain(self):
        """Every message received so far (a reader thread collects them as they come)."""
        time.sleep(0.3)
        return list(self.messages)

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def close(self):
        if self.proc.poll() is None:
            # SIGTERM first: the daemon kills its fio (which runs in a session of its own)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=8)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reading.clear()
        self._reader.join(2)
        self.sock.close()
        self.log.close()


def rows(db, sql):
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def end_processes(*procs, timeout: float = 15.0) -> None:
    """Ask the test's own processes to end (SIGTERM), then kill what is still there after `timeout`."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def baselines_armed(db, profile: str, warmup: int = 12) -> bool:
    """Every metric of the profile has learned its warm-up (the daemon's saved detector state): armed, which a
    count of probes is not on a busy machine (a contended probe is not learned)."""
    states = [json.loads(s) for (s,) in rows(db, f"SELECT state FROM baselines WHERE profile = '{profile}'")]
    return bool(states) and all(len(s["values"]) >= warmup for s in states)


def wait_for(fn, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


_CGROUPS_MADE = [0]


@contextmanager
def blkio_cgroup(prefix: str = "iowarden-test-app"):
    """A cgroup v1 blkio group of the test's own (a named workload, as a systemd unit would be): its path under
    the hierarchy's root, e.g. /iowarden-test-app-1234-1. Its tasks go back to the root and it is removed on exit."""
    with v1_cgroup("blkio", prefix) as path:
        yield path


@contextmanager
def v1_cgroup(controller: str, prefix: str):
    """A group of the test's own in one cgroup v1 hierarchy (/sys/fs/cgroup/CONTROLLER/PREFIX-PID-N): its tasks go
    back to the root and it is removed on exit."""
    _CGROUPS_MADE[0] += 1
    root = Path("/sys/fs/cgroup") / controller
    path = root / f"{prefix}-{os.getpid()}-{_CGROUPS_MADE[0]}"
    path.mkdir()
    try:
        yield path
    finally:
        for _ in range(50):
            for pid in (path / "cgroup.procs").read_text().split():
                try:
                    (root / "cgroup.procs").write_text(pid)
                except OSError:
                    pass   # gone meanwhile
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)


# joins the cgroup named in argv[1] and execs argv[2:]: a process of its own, single-threaded, does the join, so
# the test's threads (a daemon's log readers) cannot deadlock or fail it as a preexec_fn in a forked copy can
_JOIN_THEN_EXEC = ("import os, sys\n"
                   "with open(sys.argv[1], 'w') as f:\n"
                   "    f.write(str(os.getpid()))\n"
                   "os.execvp(sys.argv[2], sys.argv[2:])\n")


def in_cgroup(cgroup, argv: list[str]) -> list[str]:
    """argv run as a member of a cgroup v1 group (its directory): joined before the program starts, so every
    process and thread it makes is charged there from its first I/O."""
    return [sys.executable, "-c", _JOIN_THEN_EXEC, f"{cgroup}/cgroup.procs", *argv]


@contextmanager
def cgroup_cap(cgroup: Path, kind: str, major_minor: str, value: int):
    """A blkio throttle in one cgroup of the test's own, removed by its device id on exit."""
    f = cgroup / f"blkio.throttle.{kind}"
    f.write_text(f"{major_minor} {value}")
    try:
        yield
    finally:
        if cgroup.exists():
            f.write_text(f"{major_minor} 0")


@contextmanager
def blkio_cap(kind: str, major_minor: str, value: int):
    """Cap one device with a cgroup v1 blkio throttle (kind: read_iops_device, write_iops_device,
    read_bps_device, write_bps_device), as a cloud volume's provisioned IOPS or throughput (or an
    exhausted burst budget) caps it. The rule is removed by its device id on exit. Tests run in the
    root blkio cgroup: the cap applies to them and the daemons they start."""
    path = f"/sys/fs/cgroup/blkio/blkio.throttle.{kind}"
    with open(path, "w") as f:
        f.write(f"{major_minor} {value}")
    try:
        yield
    finally:
        with open(path, "w") as f:
            f.write(f"{major_minor} 0")


def read_iops_cap(major_minor: str, iops: int):
    return blkio_cap("read_iops_device", major_minor, iops)


def ram_backing(stack, where: Path, size_mib: int) -> Path:
    """A tmpfs of the test's own at `where` (created), unmounted by the ExitStack `stack`: images of loop
    volumes placed there are off the host's disk, which the rest of the suite shares and stalls (a stall beside
    the lane paged a healthy week-lane volume and read an idle probe at 223 IOPS). tmpfs takes no O_DIRECT on
    this kernel: a loop device over a file here reads it buffered (it is memory either way)."""
    where.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}M,mode=0700", "iowarden-test-backing",
                    str(where)], check=True, capture_output=True, timeout=30)
    stack.callback(subprocess.run, ["umount", str(where)], capture_output=True, timeout=60)
    return where
