"""A real systemd, booted as PID 1 of a new PID and mount namespace in a Debian root, for tests.

The root is made once per machine with debootstrap (a few minutes) and kept as a
template under /var/cache; each test boots a copy. Nothing of the host's is
changed: the mounts are private to the namespace and end with it, and the copy
is removed afterwards. Stop kills only the PID 1 we started.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

TEMPLATE = Path("/var/cache/iowarden-tests/bookworm-systemd")
MARKER = ".iowarden-template-complete"
PACKAGES = "systemd,systemd-sysv,dbus,python3,fio,xfsprogs,util-linux"
MIRROR = "http://deb.debian.org/debian"


def ensure_template() -> Path:
    if (TEMPLATE / MARKER).exists():
        return TEMPLATE
    tmp = TEMPLATE.with_name(TEMPLATE.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm", str(tmp), MIRROR],
                   check=True, capture_output=True)
    (tmp / MARKER).touch()
    shutil.rmtree(TEMPLATE, ignore_errors=True)
    tmp.rename(TEMPLATE)
    return TEMPLATE


BOOT = """set -e
# the root a mount point of its own: systemd's sandboxing (ProtectSystem=, PrivateTmp=, ...)
# sets up mount namespaces from "/" and fails with 226/NAMESPACE on a plain chroot directory
mount --bind "$ROOT" "$ROOT"
# shared, as systemd makes "/" on a real host (it leaves that to the container manager when
# it sees one): a file system mounted later then reaches the services' mount namespaces
mount --make-shared "$ROOT"
mount -t proc proc "$ROOT/proc"
mount --rbind /sys "$ROOT/sys"
mount --make-rslave "$ROOT/sys"
mount --rbind /dev "$ROOT/dev"
mount --make-rslave "$ROOT/dev"
mount -t tmpfs tmpfs "$ROOT/run"
mount -t tmpfs tmpfs "$ROOT/tmp"
export container=other
exec chroot "$ROOT" /lib/systemd/systemd --system
"""


class BootedSystemd:
    def __init__(self, workdir: Path):
        self.root = workdir / "root"
        subprocess.run(["cp", "-a", str(ensure_template()), str(self.root)], check=True)
        shutil.copy("/etc/resolv.conf", self.root / "etc" / "resolv.conf")
        self.console = open(workdir / "systemd-console.log", "w+")
        self.unshare = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount", "--propagation", "private", "sh", "-c", BOOT],
            env={**os.environ, "ROOT": str(self.root)}, stdout=self.console, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.pid = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.pid is None:
            kids = psutil.Process(self.unshare.pid).children()
            if kids and kids[0].name() == "systemd":
                self.pid = kids[0].pid
            time.sleep(0.1)
        if self.pid is None:
            self.stop()
            raise RuntimeError("systemd did not start: " + self.console_text()[-2000:])
        self.wait_running()

    def console_text(self) -> str:
        self.console.flush()
        self.console.seek(0)
        return self.console.read()

    def run(self, *argv: str, check: bool = True, timeout: float = 300, env: dict | None = None):
        cmd = ["nsenter", "-t", str(self.pid), "-p", "-m", "chroot", str(self.root),
               "/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
               *[f"{k}={v}" for k, v in (env or {}).items()], *argv]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r

    def wait_running(self, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                return state
            time.sleep(0.5)
        raise AssertionError(f"systemd not running after {timeout} s: {state}")

    def stop(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)  # PID 1 of its namespace: everything in it ends
            except ProcessLookupError:
                pass
        try:
            self.unshare.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.unshare.pid, signal.SIGKILL)
            self.unshare.wait()
        self.console.close()
        shutil.rmtree(self.root, ignore_errors=True)
