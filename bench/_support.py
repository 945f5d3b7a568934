"""What the benchmarks beside node_exporter share: a free port, the exporter, loop devices they make."""
import os
import shutil
import socket
import subprocess


UNIT = os.path.join(os.path.dirname(__file__), "..", "systemd", "iowarden.service")


def unit_environment() -> dict:
    """The environment the shipped unit gives the daemon (its Environment= lines: the malloc arenas), so a
    bench measures the daemon as it runs in service."""
    with open(UNIT) as f:
        pairs = [line.split("=", 1)[1].strip() for line in f if line.startswith("Environment=")]
    return {**os.environ, **dict(p.split("=", 1) for p in pairs)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_exporter_or_exit() -> str:
    exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if os.geteuid() != 0 or not exporter:
        raise SystemExit("needs root and prometheus-node-exporter (apt-get install prometheus-node-exporter)")
    return exporter


def attach_loops(work: str, count: int, first_size: str = "8M") -> list[str]:
    """Loop devices over sparse images in `work`; detach them with detach_loops() (also on failure)."""
    loops = []
    try:
        for i in range(count):
            img = os.path.join(work, f"d{i}.img")
            subprocess.run(["truncate", "-s", first_size if i == 0 else "8M", img], check=True)
            loops.append(subprocess.run(["losetup", "--find", "--show", img], capture_output=True, text=True,
                                        check=True).stdout.strip())
    except BaseException:
        detach_loops(loops)
        raise
    return loops


def detach_loops(loops: list[str]) -> None:
    for dev in loops:
        subprocess.run(["losetup", "-d", dev], check=False)
