"""What the benchmarks share: a free port, node_exporter, loop devices they make, the servers they stop."""
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time


UNIT = os.path.join(os.path.dirname(__file__), "..", "systemd", "iowarden.service")


def unit_environment() -> dict:
    """The environment the shipped unit gives the daemon (its Environment= lines: the malloc arenas), so a
    bench measures the daemon as it runs in service."""
    with open(UNIT) as f:
        pairs = [line.split("=", 1)[1].strip() for line in f if line.startswith("Environment=")]
    return {**os.environ, **dict(p.split("=", 1) for p in pairs)}


def stop_session(proc: subprocess.Popen, timeout: float = 60) -> None:
    """A server the bench started in a session of its own (start_new_session): SIGTERM to its group, then SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_ready(proc: subprocess.Popen, url: str, what: str, log: str, seconds: float = 120) -> None:
    """Until the server the bench started answers 200 at `url`; it stopped, and the bench with its log's tail,
    when it exits first or does not answer within `seconds`."""
    import urllib.request
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited: {open(log).read()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    stop_session(proc)
    raise SystemExit(f"{what} not ready in {seconds:.0f} s (its log: {log})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_exporter_path() -> str | None:
    return shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def node_exporter_or_exit() -> str:
    exporter = node_exporter_path()
    if os.geteuid() != 0 or not exporter:
        raise SystemExit("needs root and prometheus-node-exporter (apt-get install prometheus-node-exporter)")
    return exporter


LOOP_CTL_REMOVE = 0x4C81
_CREATED: set[str] = set()   # loop devices that did not exist before attach_loops made them: removed when detached


def attach_loops(work: str, count: int, first_size: str = "8M") -> list[str]:
    """Loop devices over sparse images in `work`; detach them with detach_loops() (also on failure)."""
    loops, before = [], set(os.listdir("/sys/block"))
    try:
        for i in range(count):
            img = os.path.join(work, f"d{i}.img")
            subprocess.run(["truncate", "-s", first_size if i == 0 else "8M", img], check=True)
            loops.append(subprocess.run(["losetup", "--find", "--show", img], capture_output=True, text=True,
                                        check=True).stdout.strip())
            if os.path.basename(loops[-1]) not in before:
                _CREATED.add(loops[-1])
    except BaseException:
        detach_loops(loops)
        raise
    return loops


def detach_loops(loops: list[str]) -> None:
    """Detach them, and remove the device nodes attach_loops created: a detached loop device stays in
    /proc/diskstats, and a second run beside 2,000 left over is not the run it says it is."""
    for dev in loops:
        subprocess.run(["losetup", "-d", dev], check=False)
    made = [d for d in loops if d in _CREATED]
    if not made:
        return
    fd = os.open("/dev/loop-control", os.O_RDWR)
    try:
        for dev in made:
            for _ in range(20):   # the detach completes when its last opener lets go
                try:
                    fcntl.ioctl(fd, LOOP_CTL_REMOVE, int(os.path.basename(dev)[4:]))
                    break
                except OSError:
                    time.sleep(0.05)
            _CREATED.discard(dev)
    finally:
        os.close(fd)
