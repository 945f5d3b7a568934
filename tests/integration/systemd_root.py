"""A real systemd, booted as PID 1 of a new PID and mount namespace in a Debian root, for tests.

The root is made once per machine with debootstrap (a few minutes) and kept as a
template under /var/cache; each test boots a copy. Nothing of the host's is
changed: the mounts are private to the namespace and end with it, and the copy
is removed afterwards. Stop kills only the PID 1 we started.

The systemd gets a cgroup namespace of its own, rooted at a cgroup of this boot's
in every hierarchy: a systemd that sees the host's cgroup roots as its own trims
every empty cgroup in them when it starts (measured: another test's blkio group,
made a moment before its workload joined it, vanished while a boot ran beside it),
and moves the host's processes about. Its cgroups are removed after it stops.
"""
from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
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


_BOOTS = itertools.count(1)

# joins the cgroups named before "--" and execs what follows: the boot's processes start in its own cgroups
_JOIN_THEN_EXEC = ("import os, sys\n"
                   "end = sys.argv.index('--')\n"
                   "for path in sys.argv[1:end]:\n"
                   "    with open(path, 'w') as f:\n"
                   "        f.write(str(os.getpid()))\n"
                   "os.execvp(sys.argv[end + 1], sys.argv[end + 1:])\n")


def cgroup_mounts(mountinfo: str) -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of every cgroup and cgroup2 mount in a /proc/PID/mountinfo text."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if fields[dash + 1] in ("cgroup", "cgroup2"):
            found.append((fields[4], fields[dash + 1], fields[dash + 3]))
    return found


def make_cgroups(mounts: list[tuple[str, str, str]], name: str) -> list[Path]:
    """A cgroup called `name` under the root of every hierarchy; a cpuset one gets its parent's CPUs and memory
    nodes (an empty cpuset takes no process)."""
    made = []
    for mountpoint, _, _ in mounts:
        path = Path(mountpoint) / name
        path.mkdir(exist_ok=True)
        made.append(path)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists():
                (path / knob).write_text((Path(mountpoint) / knob).read_text())
    return made


def remove_cgroups(tops: list[Path], timeout: float = 10.0) -> list[Path]:
    """Remove each cgroup and what systemd made under it, deepest first; a group whose processes are still
    exiting is retried until `timeout`. Returns what could not be removed."""
    deadline = time.monotonic() + timeout
    left = list(tops)
    while left:
        still = []
        for top in left:
            if not top.exists():
                continue
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            for d in [*dirs, top]:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    still.append(top)
                    break
        left = still
        if left:
            if time.monotonic() > deadline:
                return left
            time.sleep(0.1)
    return []


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
# the cgroup hierarchies again, from inside this cgroup namespace: each shows this boot's cgroup as its root
# (the bound copy goes first: a file system cannot be mounted twice on one point)
printf '%s\n' "$CGROUP_MOUNTS" | while read -r fstype options mountpoint; do
    umount "$ROOT$mountpoint"
    mount -t "$fstype" -o "$options" "$fstype" "$ROOT$mountpoint"
done
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
        mounts = cgroup_mounts(Path("/proc/self/mountinfo").read_text())
        self.cgroups = make_cgroups(mounts, f"iowarden-systemd-{os.getpid()}-{next(_BOOTS)}")
        self.unshare = subprocess.Popen(
            [sys.executable, "-c", _JOIN_THEN_EXEC, *[str(p / "cgroup.procs") for p in self.cgroups], "--",
             "unshare", "--cgroup", "--pid", "--fork", "--mount", "--propagation", "private", "sh", "-c", BOOT],
            env={**os.environ, "ROOT": str(self.root),
                 "CGROUP_MOUNTS": "\n".join(" ".join((fstype, options, mp)) for mp, fstype, options in mounts)},
            stdout=self.console, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.pid is None:
            kids = psutil.Process(self.unshare.pid).children()
            if kids and kids[0].name() == "systemd":
                self.pid = kids[0].pid
            time.sleep(0.1)
        if self.pid is None:
            console = self.console_text()[-2000:]
            try:
                self.stop()
            except AssertionError as e:   # what stop could not remove is said with the start's failure, not instead
                console += f"\n{e}"
            raise RuntimeError("systemd did not start: " + console)
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
        left = remove_cgroups(self.cgroups)
        if left:
            raise AssertionError(f"the booted systemd's cgroups are still there: {left}")
