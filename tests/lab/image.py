"""The lab's guest image: Debian bookworm with its own kernel, built once per machine.

debootstrap makes a root (about 3 minutes), the root becomes an ext4 image labelled
`labroot` (the root disk is not always /dev/vda once other disks are added), and its
/boot gives QEMU the kernel and initrd. Each run boots a qcow2 overlay of that image,
so nothing a scenario does survives the run. iowarden itself is not in the image: each
run installs the .deb that packaging/ builds, the way a user installs it.

The cache lives under /var/cache/iowarden-tests/lab; its marker names the recipe, so a
changed package list or guest setup rebuilds it.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

CACHE = Path("/var/cache/iowarden-tests/lab")
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("systemd,systemd-sysv,udev,dbus,linux-image-amd64,kmod,mdadm,lvm2,fio,xfsprogs,nvme-cli,"
            "qemu-guest-agent,python3,util-linux,procps,libsystemd0,iproute2,sg3-utils,smartmontools,"
            # what the package suggests: characterize draws its plots with the distro's matplotlib
            "python3-matplotlib,"
            # what the package recommends: the tracer's engines (where the time goes, on virtio and NVMe), the
            # compiled one through libbpf, bpftrace where it cannot run
            "libbpf1,bpftrace")
IMAGE_SIZE = "3G"

# Guest setup, run in the root before it becomes an image. Why each line:
# - no password, no getty on the console: the host talks to the guest through its agent only;
# - networkd brings up the user-mode NIC so the host can scrape the guest's /metrics;
# - mdadm must not assemble or monitor arrays at boot the scenarios did not make, nor mail;
# - timers that would run apt or fstrim at random would disturb latency judgements.
GUEST_SETUP = r"""
set -e
echo lab > /etc/hostname
printf '[Match]\nName=en* eth*\n[Network]\nDHCP=yes\n' > /etc/systemd/network/10-lab.network
systemctl enable systemd-networkd.service >/dev/null 2>&1
systemctl mask serial-getty@ttyS0.service getty@tty1.service >/dev/null 2>&1
systemctl mask apt-daily.timer apt-daily-upgrade.timer fstrim.timer e2scrub_all.timer >/dev/null 2>&1 || true
systemctl mask mdmonitor.service mdcheck_start.timer mdcheck_continue.timer mdmonitor-oneshot.timer >/dev/null 2>&1 || true
sed -i 's/^#\?MAILADDR.*/MAILADDR root/' /etc/mdadm/mdadm.conf
echo 'AUTO -all' >> /etc/mdadm/mdadm.conf
update-initramfs -u >/dev/null 2>&1
"""


def recipe_id() -> str:
    return hashlib.sha256((PACKAGES + GUEST_SETUP + IMAGE_SIZE).encode()).hexdigest()[:16]


class Image:
    def __init__(self, root: Path):
        self.dir = root
        self.disk = root / "root.img"
        self.kernel = root / "vmlinuz"
        self.initrd = root / "initrd.img"


def _missing_tools() -> list[str]:
    return [t for t in ("debootstrap", "mkfs.ext4", "qemu-system-x86_64", "qemu-img") if shutil.which(t) is None]


def ensure_image() -> Image:
    """The cached image, building it first if this machine has none for this recipe."""
    missing = _missing_tools()
    if missing:
        # a failure, not a skip: the lab is part of the product's proof (scripts/setup.sh --test installs these)
        raise RuntimeError(f"the lab needs {', '.join(missing)}: run `sudo bash scripts/setup.sh --test`")
    done = CACHE / recipe_id()
    image = Image(done)
    if (done / "complete").exists():
        return image
    work = CACHE / (recipe_id() + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    root = work / "root"
    root.mkdir(parents=True)
    run = lambda *argv: subprocess.run(list(argv), check=True, capture_output=True, text=True)  # noqa: E731
    try:
        run("debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm", str(root), MIRROR)
        run("chroot", str(root), "sh", "-c", GUEST_SETUP)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"building the lab image failed: {e.cmd[:3]}: {e.stderr[-2000:]}") from e
    boot = root / "boot"
    kernels = sorted(boot.glob("vmlinuz-*"))
    initrds = sorted(boot.glob("initrd.img-*"))
    if not kernels or not initrds:
        raise RuntimeError(f"the lab root has no kernel or initrd in {boot}: linux-image-amd64 did not install")
    shutil.copy(kernels[-1], work / "vmlinuz")
    shutil.copy(initrds[-1], work / "initrd.img")
    run("mkfs.ext4", "-q", "-L", "labroot", "-d", str(root), str(work / "root.img"), IMAGE_SIZE)
    shutil.rmtree(root)
    (work / "complete").write_text(recipe_id() + "\n")
    # older recipes are dead weight: only this one is kept
    for old in CACHE.iterdir():
        if old.name not in (work.name,) and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    work.rename(done)
    return image
