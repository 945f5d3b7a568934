"""The lab: one guest per test session with every storage stack the scenarios need.

Disks (sparse files in the run directory, each with the identity a real one has):
  r0a..r0d  virtio, serials      -> md0, RAID0 over four, XFS on /srv/raid0
  m1a, m1b  virtio-scsi, WWNs    -> md1, RAID1, XFS on /srv/mirror
  lva, lvb  virtio, serials      -> VG lab, LV stripe (2 stripes), XFS on /srv/stripe
  nv1       NVMe controller      -> XFS on /srv/nvme
  hp1       virtio-scsi, WWN     -> XFS on /srv/hot (hot-removed and re-added)
  ca, cb    virtio, serials      -> md2, RAID0 over two, XFS on /srv/pair   (characterize --compare
  cc        virtio, serial       -> XFS on /srv/single                       RAID0 of two vs one disk;
                                    a QEMU burst bucket on it for BurstCreditsLow, test_lab_burst.py)
  wsd       virtio, serial       -> XFS on /srv/ws (characterize's working-set sweep, in a small memory cgroup)
iowarden is installed from the .deb packaging/ builds and runs as its systemd service.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import setup_note

from .image import ensure_image
from .vm import Disk, Guest

REPO = Path(__file__).resolve().parents[2]

DISKS = [
    *(Disk(f"r0{c}", "virtio", 256, serial=f"lab-r0{c}") for c in "abcd"),
    Disk("m1a", "scsi", 320, serial="lab-m1a", wwn="0x5000c50000001a01"),
    Disk("m1b", "scsi", 320, serial="lab-m1b", wwn="0x5000c50000001b01"),
    Disk("lva", "virtio", 256, serial="lab-lva"),
    Disk("lvb", "virtio", 256, serial="lab-lvb"),
    Disk("nv1", "nvme", 320, serial="LABNVME1"),
    Disk("hp1", "scsi", 320, serial="lab-hp1", wwn="0x5000c50000002a01"),
    *(Disk(f"c{c}", "virtio", 320, serial=f"lab-c{c}") for c in "abc"),
    Disk("wsd", "virtio", 900, serial="lab-wsd"),
]

STACKS = r"""
set -e
byid() { readlink -f /dev/disk/by-id/$1; }
udevadm settle
mdadm --create /dev/md0 --run --level=0 --chunk=64 --raid-devices=4 \
  $(byid virtio-lab-r0a) $(byid virtio-lab-r0b) $(byid virtio-lab-r0c) $(byid virtio-lab-r0d)
mdadm --create /dev/md2 --run --level=0 --chunk=64 --raid-devices=2 $(byid virtio-lab-ca) $(byid virtio-lab-cb)
mdadm --create /dev/md1 --run --level=1 --raid-devices=2 --bitmap=none --metadata=1.2 \
  $(byid wwn-0x5000c50000001a01) $(byid wwn-0x5000c50000001b01)
pvcreate -q $(byid virtio-lab-lva) $(byid virtio-lab-lvb)
vgcreate -q lab $(byid virtio-lab-lva) $(byid virtio-lab-lvb)
lvcreate -q -y -i 2 -I 64k -l 100%FREE -n stripe lab
udevadm settle
for v in raid0:/dev/md0 mirror:/dev/md1 stripe:/dev/lab/stripe nvme:$(byid nvme-QEMU_NVMe_Ctrl_LABNVME1) hot:$(byid wwn-0x5000c50000002a01) \
         pair:/dev/md2 single:$(byid virtio-lab-cc) ws:$(byid virtio-lab-wsd); do
  name=${v%%:*}; dev=${v#*:}
  mkfs.xfs -q -f $dev
  mkdir -p /srv/$name
  mount $dev /srv/$name
done
mdadm --wait /dev/md1 || true
mkdir -p /etc/systemd/system/iowarden.service.d
printf '[Service]\nReadWritePaths=/srv\n' > /etc/systemd/system/iowarden.service.d/lab.conf
"""

CONFIG = """
[daemon]
state_dir = "/var/lib/iowarden"
log_level = "debug"
[prometheus]
listen_address = ":29110"
[limits]
min_free_bytes = "1MiB"
min_free_ratio = 0.0
timeout_margin_seconds = 10.0
[budget]
device_time_ratio = 1.0
[settings]
interval_seconds = 2.0
[smart]
interval_seconds = 60.0
[tracer]
# bpftrace compiles for a minute or more under TCG at each restart (longer the more disks it filters):
# only the tracer's own scenario runs it, on the disks it names
enabled = {tracer}
devices = {tracer_devices}
# under TCG the kernel runs the BPF program emulated: its measured time per request is many times a real
# machine's, more so while the host is busy, and the default budget pauses the tracer at a few thousand I/O a
# second; the pause itself is held by tests/integration/test_tracer.py on a real CPU
max_cpu_cores = 1.0
[passive]
window_seconds = 2.0
# the lab's burst bucket drains in three minutes where a cloud volume's takes an hour: its horizon scaled alike
burst_horizon_seconds = 120.0
[scheduling]
max_deferral_seconds = 30.0
[detector]
warmup_probes = 4
[profiles.rr]
rw = "randread"
size = "16MiB"
iodepth = 4
runtime_seconds = 1.0
ramp_time_seconds = 0.0
[profiles.long]
rw = "randread"
size = "16MiB"
iodepth = 4
runtime_seconds = 6.0
ramp_time_seconds = 0.0
# as deep as the shipped randread-4k's queue (32) is not needed on the lab's small disks: 16 fills an array of
# four; a contended probe is judged on what the busy device delivered only when it can fill it by itself
# (verdicts/contended.py SATURATING_QUEUE_DEPTH)
[profiles.deep]
rw = "randread"
size = "16MiB"
iodepth = 16
runtime_seconds = 1.0
ramp_time_seconds = 0.0
{targets}
"""

TARGET = """
[[targets]]
name = "{name}"
path = "{path}"
profiles = ["{profile}"]
interval_seconds = {interval}
"""


class Lab:
    def __init__(self, guest: Guest):
        self.guest = guest

    def configure(self, targets: dict[str, float], paths: dict[str, str] | None = None,
                  profiles: dict[str, str] | None = None, traced: tuple[str, ...] = ()) -> None:
        """Write the daemon's configuration (target -> probe interval in seconds; its path is
        /srv/TARGET unless paths names another, its profile rr unless profiles does; the tracer on the
        disks `traced` names, off without) and restart it."""
        paths, profiles = paths or {}, profiles or {}
        text = CONFIG.format(tracer=str(bool(traced)).lower(), tracer_devices=json.dumps(list(traced)), targets="".join(
            TARGET.format(name=n, interval=i, path=paths.get(n, f"/srv/{n}"), profile=profiles.get(n, "rr"))
            for n, i in targets.items()))
        self.guest.write("/etc/iowarden/config.toml", text)
        self.guest.run(["systemctl", "daemon-reload"])
        self.guest.run(["systemctl", "restart", "iowarden"], timeout=180)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.guest.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=20) as r:
            return r.read().decode()

    def journal(self, since: str = "") -> str:
        argv = ["journalctl", "-u", "iowarden", "-o", "cat", "--no-pager"]
        if since:
            argv += ["--since", since]
        return self.guest.run(argv, timeout=60)

    def sql(self, query: str, *params) -> list[list]:
        """Rows from the daemon's state database, read in the guest (read-only, as `status` does)."""
        script = ("import json, sqlite3, sys; db = sqlite3.connect('file:/var/lib/iowarden/state.db?mode=ro', uri=True,"
                  " timeout=30); print(json.dumps(db.execute(sys.argv[1], sys.argv[2:]).fetchall()))")
        return json.loads(self.guest.run(["python3", "-c", script, query, *map(str, params)], timeout=60))

    def guest_clock(self) -> float:
        return float(self.guest.run(["date", "+%s.%N"]).strip())

    def guest_now(self) -> str:
        return self.guest.run(["date", "+%Y-%m-%d %H:%M:%S"]).strip()

    def dev(self, by_id: str) -> str:
        """The kernel's name (sdb, vdc, nvme0n1) for a /dev/disk/by-id name, as the guest sees it now."""
        return self.guest.run(["readlink", "-f", f"/dev/disk/by-id/{by_id}"]).strip().rsplit("/", 1)[-1]


def _build_deb(out: Path) -> Path:
    done = subprocess.run(["bash", str(REPO / "packaging/deb/build.sh"), str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the .deb failed: {done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="package")
def lab_deb(tmp_path_factory):
    """The .deb packaging/ builds, in a directory the guests mount read-only (9p)."""
    share = tmp_path_factory.mktemp("lab-share")
    share.chmod(0o755)
    started = time.monotonic()
    deb = _build_deb(share)
    setup_note(f"== lab: the .deb built in {time.monotonic() - started:.0f} s")
    yield deb
    shutil.rmtree(share, ignore_errors=True)


@pytest.fixture(scope="package")
def lab(tmp_path_factory, lab_deb):
    image = ensure_image()
    rundir = tmp_path_factory.mktemp("lab-run")
    started = time.monotonic()
    guest = Guest(image, rundir, DISKS, share=lab_deb.parent)
    try:
        booted = time.monotonic() - started
        # The kernel's BPF statistics on for the guest's life. The compiled tracer measures its own cost once a
        # minute with BPF_ENABLE_STATS, and the first holder flips a static key: kernel text patched at every
        # BPF program's call site, the seccomp filters' among them. Under TCG with a vCPU per thread the guest
        # hung there: both vCPUs stuck at a patched jump in __seccomp_filter ("soft lockup - CPU#0 stuck for
        # 48s"), the guest's agent and /metrics silent for good (read from the console; QEMU's side not traced).
        # Held on from boot, the loader's enable only counts: no text is patched, and the test passed under load.
        guest.run(["sysctl", "-q", "-w", "kernel.bpf_stats_enabled=1"])
        guest.install(lab_deb)
        installed = time.monotonic() - started - booted
        guest.sh(STACKS, timeout=600)
        guest.add_vcpus()
        guest.at_equal_share()
        guest.share_cpu()
        # how long each part of the lab's setup took: the lab is the suite's longest lane, its setup first
        stacks = time.monotonic() - started - booted - installed
        setup_note(f"== lab: booted in {booted:.0f} s, the .deb installed in {installed:.0f} s, "
                   f"the stacks made in {stacks:.0f} s")
        lab = Lab(guest)
        lab.boot_seconds = booted
        yield lab
    finally:
        guest.stop()
