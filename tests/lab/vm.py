"""One lab guest under QEMU (TCG): its disks, its QMP socket, and its guest agent.

The host drives the guest three ways, each chosen for being reliable under TCG:
- QMP (`qmp.sock`) for what a hypervisor does: hot-add/remove disks, throttle a disk;
- the QEMU guest agent (`qga.sock`, virtio-serial) to run commands in the guest and read
  their exit code and output: no console scraping, no login;
- a user-mode NIC with one forwarded port, so the host scrapes the guest's /metrics as
  Prometheus would.
Every file of a run lives in its run directory; stop() ends QEMU (quit,
then SIGKILL of the one process we started) and the directory goes with the test's tmp.
"""
from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import latency_being_measured, session_nice

from .image import Image

BOOT_NICE = -12  # the guest's nice while it boots and is set up (see Guest.__init__)
TEST_NICE = -5   # its session's nice for the tests while no other test measures a latency (Guest.share_cpu)
VCPUS = 2        # the tests' guest: fio on one vCPU and a tracer on the other (guest_trace.py)


@dataclass(frozen=True)
class Disk:
    """A guest disk. bus: virtio (serial), scsi (serial and WWN) or nvme (its own controller)."""
    id: str
    bus: str
    size_mib: int = 256
    serial: str = ""
    wwn: str = ""      # 0x-prefixed 64-bit NAA, scsi only

    def device_args(self) -> dict:
        drive = f"drv-{self.id}"
        if self.bus == "virtio":
            # a queue per vCPU of the tests' guest, as QEMU gives a guest that boots with them all (it sizes
            # the default by the vCPUs present at boot, and the guest boots with one: Guest.add_vcpus)
            return {"driver": "virtio-blk-pci", "id": self.id, "drive": drive, "serial": self.serial,
                    "num-queues": VCPUS}
        if self.bus == "scsi":
            args = {"driver": "scsi-hd", "id": self.id, "drive": drive, "bus": "scsi0.0", "serial": self.serial}
            if self.wwn:
                args["wwn"] = self.wwn
            return args
        if self.bus == "nvme":
            return {"driver": "nvme", "id": self.id, "drive": drive, "serial": self.serial}
        raise ValueError(f"unknown bus {self.bus!r}")


class LabError(RuntimeError):
    pass


class _JsonSocket:
    """Newline-delimited JSON over a unix socket (QMP and the guest agent speak it alike)."""

    def __init__(self, path: Path, timeout: float):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.buf = b""

    def send(self, obj: dict) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def recv(self) -> dict:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise LabError("socket closed")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        line = line.strip()
        return json.loads(line) if line else self.recv()

    def close(self) -> None:
        self.sock.close()


class Qmp:
    def __init__(self, path: Path):
        self.conn = _JsonSocket(path, timeout=30)
        self.conn.recv()                      # the greeting
        self.execute("qmp_capabilities")
        self.events: list[dict] = []

    def execute(self, command: str, **arguments) -> object:
        self.conn.send({"execute": command, "arguments": arguments} if arguments else {"execute": command})
        while True:
            reply = self.conn.recv()
            if "event" in reply:
                getattr(self, "events", []).append(reply)
                continue
            if "error" in reply:
                raise LabError(f"QMP {command}: {reply['error'].get('desc')}")
            return reply.get("return")


class Agent:
    """The QEMU guest agent: run a command in the guest, get its exit code and output."""

    def __init__(self, path: Path):
        self.path = path
        self.ids = itertools.count(int(time.time()) % 100000)
        self.conn: _JsonSocket | None = None

    def _sync(self, timeout: float) -> None:
        # A fresh connection may hold an answer meant for a request sent before the agent
        # was up: sync with a new id and drop everything before its answer.
        conn = _JsonSocket(self.path, timeout=timeout)
        sync_id = next(self.ids)
        try:
            conn.send({"execute": "guest-sync", "arguments": {"id": sync_id}})
            while conn.recv().get("return") != sync_id:
                pass
        except BaseException:
            # QEMU serves one client at a time: a connection left open blocks the next
            conn.close()
            raise
        self.conn = conn

    def wait_up(self, deadline: float, alive) -> None:
        last = None
        while time.monotonic() < deadline:
            if not alive():
                raise LabError("QEMU exited while the guest was booting")
            try:
                self._sync(timeout=3)
                return
            except (OSError, LabError, ValueError) as e:
                last = repr(e)
                time.sleep(1)
        raise LabError(f"the guest agent did not answer in time ({last})")

    def call(self, command: str, **arguments) -> object:
        if self.conn is None:
            # the last call broke off with its answer unread: a new connection, synced past that late answer, so
            # it is never read as the answer to this one (it once handed a test another command's PNG)
            self._sync(timeout=30)
        assert self.conn is not None
        try:
            self.conn.send({"execute": command, "arguments": arguments})
            reply = self.conn.recv()
        except (OSError, ValueError, LabError):
            self.conn.close()
            self.conn = None
            raise
        if "error" in reply:
            raise LabError(f"guest agent {command}: {reply['error'].get('desc')}")
        return reply.get("return")

    def run(self, argv: list[str], timeout: float = 120, stdin: bytes | None = None) -> tuple[int, str, str]:
        args = {"path": argv[0], "arg": argv[1:], "capture-output": True}
        if stdin is not None:
            args["input-data"] = base64.b64encode(stdin).decode()
        pid = self.call("guest-exec", **args)["pid"]
        deadline = time.monotonic() + timeout
        while True:
            status = self._exec_status(pid, deadline, argv)
            if status.get("exited"):
                out = base64.b64decode(status.get("out-data", "")).decode(errors="replace")
                err = base64.b64decode(status.get("err-data", "")).decode(errors="replace")
                return status.get("exitcode", -status.get("signal", 0) or -1), out, err
            if time.monotonic() > deadline:
                raise LabError(f"guest command timed out after {timeout}s: {argv}")
            time.sleep(0.2)

    def _exec_status(self, pid: int, deadline: float, argv: list[str]) -> dict:
        """guest-exec-status, waited out: a guest short of memory under TCG can leave its agent unanswering
        for tens of seconds (seen once in the small-RAM guest's working-set sweep). A new connection, synced
        past the late answer, asks again until the command's own deadline."""
        resync_failed = None   # what the last new connection met: the news, not a closed one's bad descriptor
        while True:
            try:
                return self.call("guest-exec-status", pid=pid)
            except (OSError, LabError) as e:   # a timeout, a closed or failed connection; not an agent's error
                if isinstance(e, LabError) and "socket closed" not in str(e):
                    raise
                if time.monotonic() > deadline:
                    raise LabError(f"the guest agent stopped answering while {argv} ran "
                                   f"({resync_failed or e!r})") from e
            if self.conn is not None:
                self.conn.close()
                self.conn = None
            try:
                self._sync(timeout=30)
                resync_failed = None
            except (OSError, ValueError, LabError) as e:
                resync_failed = f"a new connection: {e!r}"
                time.sleep(1)


class Guest:
    def __init__(self, image: Image, rundir: Path, disks: list[Disk], memory_mib: int = 1024,
                 share: Path | None = None, boot_timeout: float = 600):
        self.rundir = rundir
        self.disks = {d.id: d for d in disks}
        rundir.mkdir(parents=True, exist_ok=True)
        # The guest's disks and its root overlay in RAM where there is room: the host's disk is shared with other
        # work (two fio jobs at 6,000 IOPS, the lanes' volumes), and every disk a scenario slows is slowed by
        # QEMU's own throttle, not by whatever else the host's disk serves. (The guest's slow setup beside the
        # suite was its CPU, not this.)
        self.disk_dir, self.disk_cache = _disk_dir(rundir, sum(d.size_mib for d in disks) + OVERLAY_ROOM_MIB)
        overlay = self.disk_dir / "root.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(image.disk), "-F", "raw",
                        str(overlay)], check=True)
        self.metrics_port = _free_port()
        # The guest is the run's longest path. Its boot and setup (a minute and a half of CPU alone) start
        # beside three other workers and took 11 minutes at an equal share, so they run at BOOT_NICE (a larger
        # share of the CPU, every QEMU thread inheriting it) and the guest returns to an equal share once set
        # up (at_equal_share). At nice -5 beside the lanes' mixes (some twenty fio threads and loop workers
        # runnable, a load average of 15-18) QEMU still had a fifth of a core and the setup took 11 minutes,
        # and at -12 the same: the kernel's autogroups are on here, so CPU is shared between sessions first
        # and a thread's nice counts only within its session (QEMU is one of some twenty). So the session's
        # own nice (/proc/PID/autogroup) is set too (session_nice): beside a full run the guest then
        # answered in 43 s where the run's own took 300 s.
        # Not niced the other way: by 10, the package's install passed 5 minutes and by 5 a
        # throttled member's peer ratio fell back within seconds. The lanes' loop devices slow with the
        # host's CPU all together, which their detectors take for the host's, not a device's.
        # One vCPU while it boots and is set up, the second plugged in for the tests (add_vcpus). Under TCG each
        # vCPU is a host thread; on a host busy with wakeup-heavy work (fio threads, daemons) the two are seldom
        # on a CPU at once, and the kernel's cross-CPU waits (IPIs, text patching, TLB shootdowns) then stall
        # the one that runs: beside a paced fio load the boot took 110 s with two and 71 s with one.
        argv = ["nice", "-n", str(BOOT_NICE), "qemu-system-x86_64", "-accel", "tcg", "-cpu", "max",
                "-smp", f"1,maxcpus={VCPUS}", "-m", str(memory_mib),
                "-display", "none", "-vga", "none", "-parallel", "none", "-monitor", "none", "-no-reboot",
                "-serial", f"file:{rundir / 'console.log'}",
                "-kernel", str(image.kernel), "-initrd", str(image.initrd),
                "-append", "root=LABEL=labroot rw console=ttyS0 panic=-1 systemd.show_status=1 " + BOOT_MASKS,
                "-drive", f"file={overlay},if=none,id=drv-root,format=qcow2,cache=unsafe",
                "-device", f"virtio-blk-pci,drive=drv-root,id=root,serial=labroot,num-queues={VCPUS}",
                "-qmp", f"unix:{rundir / 'qmp.sock'},server=on,wait=off",
                "-chardev", f"socket,path={rundir / 'qga.sock'},server=on,wait=off,id=qga0",
                "-device", "virtio-serial-pci", "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
                "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.metrics_port}-:29110",
                "-device", "virtio-net-pci,netdev=n0,romfile=",
                "-device", f"virtio-scsi-pci,id=scsi0,num_queues={VCPUS}",
                # entropy for the guest's getrandom(): without it, early Python start-ups stall under TCG
                "-device", "virtio-rng-pci"]
        if share is not None:
            argv += ["-virtfs", f"local,path={share},mount_tag=hostshare,security_model=none,readonly=on"]
        for disk in disks:
            path = self.disk_file(disk)
            argv += ["-drive", f"file={path},if=none,id=drv-{disk.id},format=raw,cache={self.disk_cache},aio=threads",
                     "-device", ",".join([disk.device_args()["driver"]] +
                                         [f"{k}={v}" for k, v in disk.device_args().items() if k != "driver" and v])]
        self.log = open(rundir / "qemu.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        session_nice(self.proc.pid, BOOT_NICE)
        try:
            self.agent = Agent(rundir / "qga.sock")
            self.agent.wait_up(time.monotonic() + boot_timeout, alive=lambda: self.proc.poll() is None)
            self.qmp = Qmp(rundir / "qmp.sock")
        except Exception as e:
            self.stop()
            raise LabError(f"{e}\nQEMU: {self.text('qemu.log')[-1500:]}\nconsole: {self.text('console.log')[-3000:]}")

    def add_vcpus(self, timeout: float = 120) -> None:
        """Plug in the vCPUs the guest booted without and bring them online: the tests' guest has VCPUS."""
        for cpu in [c for c in self.qmp.execute("query-hotpluggable-cpus") if "qom-path" not in c]:
            self.qmp.execute("device_add", driver=cpu["type"], id=f"vcpu{cpu['props'].get('core-id', 0)}",
                             **cpu["props"])
        deadline = time.monotonic() + timeout
        while True:
            # ACPI adds a hotplugged CPU offline; udev in Debian's guest does not online it
            self.sh("for c in /sys/devices/system/cpu/cpu[0-9]*/online; do "
                    "[ \"$(cat $c)\" = 1 ] || echo 1 > $c 2>/dev/null || true; done")
            if self.run(["nproc"]).strip() == str(VCPUS):
                return
            if time.monotonic() > deadline:
                raise LabError(f"the guest has {self.run(['nproc']).strip()} CPUs online, not {VCPUS}, "
                               f"{timeout:.0f} s after they were plugged in")
            time.sleep(1)

    def at_equal_share(self) -> None:
        """QEMU's session and every thread back to the default nice (threads inherit the nice of the one that
        made them). The session's share for the tests is share_cpu's."""
        session_nice(self.proc.pid, 0)
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                os.setpriority(os.PRIO_PROCESS, int(task.name), 0)
            except (ProcessLookupError, FileNotFoundError):
                pass   # a worker thread that has just ended

    def share_cpu(self, poll_seconds: float = 1.0) -> None:
        """Keep QEMU's session at TEST_NICE (about three sessions' share) while no test of the run measures a
        latency against a reference (tests/conftest.py, latency_measured), and at an equal share while one does.
        Beside two fio jobs and the other workers, the lab's tests at -5 ended 420 s sooner (1,695 s against
        2,231 s at an equal share), the run's longest path; but that whole time, a QD1 read's p50 was 1.1-2x
        ioping's and a FUSE-served disk's weak tail went unnamed for 360 s: what those tests hold is the machine's
        latency, and the guest's share moved it. A mark is looked for every poll_seconds."""
        self._share_stop = threading.Event()

        def keep() -> None:
            current = None
            while self.proc.poll() is None:
                wanted = 0 if latency_being_measured() else TEST_NICE
                if wanted != current:
                    session_nice(self.proc.pid, wanted)
                    current = wanted
                if self._share_stop.wait(poll_seconds):
                    return
        self._share_keeper = threading.Thread(target=keep, name="lab-cpu-share", daemon=True)
        self._share_keeper.start()

    def text(self, name: str) -> str:
        try:
            return (self.rundir / name).read_text(errors="replace")
        except OSError:
            return ""

    def disk_file(self, disk: Disk) -> Path:
        path = self.disk_dir / f"{disk.id}.img"
        if not path.exists():
            with open(path, "wb") as f:
                f.truncate(disk.size_mib << 20)
        return path

    # -- commands in the guest --------------------------------------------------------
    def run(self, argv: list[str], timeout: float = 120, check: bool = True) -> str:
        try:
            rc, out, err = self.agent.run(argv, timeout=timeout)
        except LabError as e:
            # an agent that stops answering is a guest that hung, rebooted or ran out of memory: its console says
            raise LabError(f"{e}\nQEMU {'running' if self.proc.poll() is None else f'exited {self.proc.returncode}'}"
                           f"; console: {self.text('console.log')[-3000:]}") from e
        if check and rc != 0:
            raise LabError(f"in the guest, {argv} exited {rc}: {err.strip()[-2000:]} {out.strip()[-500:]}")
        return out

    def sh(self, script: str, timeout: float = 120, check: bool = True) -> str:
        return self.run(["/bin/sh", "-c", script], timeout=timeout, check=check)

    def write(self, path: str, text: str) -> None:
        rc, _, err = self.agent.run(["/usr/bin/tee", path], stdin=text.encode())
        if rc != 0:
            raise LabError(f"writing {path} in the guest: {err}")

    def install(self, deb: Path) -> None:
        """Install a package from the host's share (mounted read-only over 9p), as a user installs it."""
        self.sh("mkdir -p /mnt/host && mount -t 9p -o trans=virtio,version=9p2000.L,ro hostshare /mnt/host")
        # a deadline, not a pace: on a machine busy with other work the emulated CPU gets what is left
        self.run(["dpkg", "-i", f"/mnt/host/{deb.name}"], timeout=900)

    # -- what a hypervisor does -----------------------------------------------------------
    def throttle(self, disk_id: str, iops: int) -> None:
        """Cap a disk's IOPS while it runs (0 lifts the cap)."""
        qdev = next((b["qdev"] for b in self.qmp.execute("query-block")
                     if b.get("qdev") in (disk_id, f"/machine/peripheral/{disk_id}/virtio-backend")), None)
        if qdev is None:
            raise LabError(f"no block backend for {disk_id}")
        self.qmp.execute("block_set_io_throttle", id=qdev, bps=0, bps_rd=0, bps_wr=0,
                         iops=iops, iops_rd=0, iops_wr=0)

    def throttle_bucket(self, disk_id: str, baseline_iops: int, burst_iops: int, burst_seconds: int) -> None:
        """A burst bucket on a disk, as a cloud volume's: QEMU's leaky bucket lets `burst_iops` through until
        `burst_iops` x `burst_seconds` I/Os above the baseline have gone, then `baseline_iops`; it refills at the
        baseline rate less what the disk does."""
        qdev = next((b["qdev"] for b in self.qmp.execute("query-block")
                     if b.get("qdev") in (disk_id, f"/machine/peripheral/{disk_id}/virtio-backend")), None)
        if qdev is None:
            raise LabError(f"no block backend for {disk_id}")
        self.qmp.execute("block_set_io_throttle", id=qdev, bps=0, bps_rd=0, bps_wr=0, iops=baseline_iops,
                         iops_rd=0, iops_wr=0, iops_max=burst_iops, iops_max_length=burst_seconds)

    def unplug(self, disk_id: str, timeout: float = 60) -> None:
        self.qmp.execute("device_del", id=disk_id)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(p.get("name") == disk_id for p in self.qmp.execute("qom-list", path="/machine/peripheral")):
                return
            time.sleep(0.5)
        raise LabError(f"{disk_id} was not removed within {timeout}s")

    def plug(self, disk: Disk, **placement) -> None:
        """Attach a disk while the guest runs (placement: e.g. addr= for another PCI slot)."""
        path = self.disk_file(disk)
        node = f"drv-{disk.id}"
        if not any(n.get("node-name") == node for n in self.qmp.execute("query-named-block-nodes") or []):
            self.qmp.execute("blockdev-add", **{"node-name": node, "driver": "raw",
                                                "file": {"driver": "file", "filename": str(path)}})
        args = dict(disk.device_args(), **placement)
        self.qmp.execute("device_add", **{k: v for k, v in args.items() if v != ""})
        self.disks[disk.id] = disk

    def stop(self) -> None:
        if getattr(self, "_share_keeper", None) is not None:
            self._share_stop.set()
            self._share_keeper.join(timeout=10)
        if self.proc.poll() is None:
            # quit, not an ACPI power-down: nothing in the guest is kept (its overlay and disks are removed
            # below), and with logind masked at boot (BOOT_MASKS) nothing in it answers the power button, so a
            # power-down waited its full 30 s at the end of every lab run
            try:
                self.qmp.execute("quit")
                self.proc.wait(timeout=10)
            except Exception:
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for conn in (getattr(getattr(self, "agent", None), "conn", None), getattr(getattr(self, "qmp", None), "conn", None)):
            if conn is not None:
                conn.close()
        self.log.close()
        for sock in ("qmp.sock", "qga.sock"):
            (self.rundir / sock).unlink(missing_ok=True)
        if self.disk_dir != self.rundir:
            shutil.rmtree(self.disk_dir, ignore_errors=True)   # the guest's own RAM directory, by its path


RAM_DIR = Path("/dev/shm")
# Units the lab never uses, masked at boot (systemd's debug generator reads systemd.mask= from the kernel's
# command line, so the cached image stays as it is). Under TCG beside the suite's other workers,
# systemd-update-utmp held sysinit.target, and with it the guest agent, for over a minute; logind, the
# NVMe-over-fabrics autoconnect and e2scrub_reap took the guest's CPUs for minutes while the package installed.
BOOT_MASKS = " ".join(f"systemd.mask={unit}" for unit in (
    "systemd-update-utmp.service", "systemd-update-utmp-runlevel.service", "systemd-logind.service",
    "nvmf-autoconnect.service", "e2scrub_reap.service"))
OVERLAY_ROOM_MIB = 1024   # what the root overlay grows to: the package installed, the journal, the state database


def _disk_dir(rundir: Path, need_mib: int) -> tuple[Path, str]:
    """(where the guest's disk files go, QEMU's cache mode for them): a directory of its own in RAM when the RAM
    filesystem has twice what the disks could hold free (tmpfs takes no O_DIRECT: writeback, which on tmpfs
    is the RAM itself), else the run directory, each write direct to the host's disk."""
    try:
        free = shutil.disk_usage(RAM_DIR).free
    except OSError:
        free = 0
    if free >= 2 * (need_mib << 20):
        return Path(tempfile.mkdtemp(prefix=f"iowarden-lab-{rundir.name}-", dir=RAM_DIR)), "writeback"
    return rundir, "none"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
