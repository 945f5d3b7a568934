"""What to do about a device that is slow, by what the device is (pure).

"Replace it" is the right word for a physical drive that says it is failing, and the wrong one for almost
everything else a database host runs on: a cloud volume is replaced by its provider or by a new volume, a
loop device is as fast as the file and disk under it, an array is as slow as its members. And a drive whose
only fault is a run of slow hours may be a cable, a firmware's background task or a neighbour's load, so
replacement is advised only with evidence from the device itself: its SMART log (a critical warning, a
failed assessment, new media errors) or a slowness that has lasted for days.

The device kind comes from what the kernel and udev say (the device view, probes/blockqueue.py): the model a
cloud provider's block store or a hypervisor's virtual disk reports, the kind of block device, the virtio
and Xen names. docs/runbook.md says the same per kind.
"""
from __future__ import annotations

# Models (udev ID_MODEL, NVMe or SCSI model strings; spaces as udev writes them, '_') that name a network
# block store: what the provider's console, not the host, knows about.
CLOUD_MODELS = ("amazon elastic block store", "amazon_elastic_block_store", "persistentdisk", "nvme_card-pd",
                "google_persistentdisk", "ibm_vpc_block", "alibaba_cloud_elastic_block_storage",
                "oracle_blockvolume", "bytecloud", "hcloud_volume", "do_volume", "scaleway_block")
# Models and names of a hypervisor's virtual disks: the time goes in the host's storage under them.
VIRTUAL_MODELS = ("qemu", "virtual_disk", "virtual disk", "vmware", "vbox", "msft", "virtio")
VIRTUAL_NAME_PREFIXES = ("vd", "xvd")
# a slowness held this long with nothing from the drive's own log is evidence enough to plan a replacement
PERSISTENT_DAYS = 3.0

KINDS = ("drive", "cloud volume", "virtual disk", "loop device", "array", "unknown")
DEVICE_ALERTS = ("DeviceSlow", "SlowMember")


def device_kind(device, devices: dict) -> str:
    """What a block device is, for advice: one of KINDS. `device` is a BlockDevice (or None); `devices` the
    view it came from, to resolve a partition to its disk."""
    if device is None:
        return "unknown"
    if device.kind == "partition" and device.parent in devices:
        device = devices[device.parent]
    if device.kind == "loop":
        return "loop device"
    if device.kind == "md" or (device.kind == "dm" and device.slaves):
        return "array"
    model = (device.udev or {}).get("ID_MODEL", "").lower()
    if any(m in model for m in CLOUD_MODELS):
        return "cloud volume"
    if any(m in model for m in VIRTUAL_MODELS) or device.name.startswith(VIRTUAL_NAME_PREFIXES):
        return "virtual disk"
    return "drive" if device.kind == "disk" else "unknown"


def device_facts(name: str, devices: dict, drive_says_of) -> dict:
    """What the advice needs of a device, as plain data (kept with the alert: status and the journal say the
    same advice as the page): its kind, what its drive's log says (`drive_says_of(disks)`: sources/smart.py's
    causes of the last reading), and what a loop device's file lies on."""
    dev = devices.get(name)
    disk = dev.parent if dev is not None and dev.kind == "partition" and dev.parent else name
    return {"kind": device_kind(dev, devices), "drive_says": list(drive_says_of({disk})),
            "below": (getattr(dev, "loop_backing_file", None) or "") if dev is not None else ""}


def advice_of(alert: str, device: str, facts: dict, open_days: float) -> str:
    """advice() from device_facts() (or as read back from the state database: what is not of its shape is
    taken as unknown)."""
    kind = facts.get("kind") if facts.get("kind") in KINDS else "unknown"
    says = facts.get("drive_says")
    says = [str(x) for x in says] if isinstance(says, list) else []
    below = facts.get("below") if isinstance(facts.get("below"), str) else ""
    return advice(alert, kind, device, says, open_days, below=below)


def advice(alert: str, kind: str, device: str, drive_says: list[str], open_days: float,
           below: str = "") -> str:
    """The page's "do" line for a device-side alert (DeviceSlow, SlowMember); "" for the others, whose causes
    already say what to do. drive_says: what the drive's own health log says now (sources/smart.py causes);
    open_days: how long the alert has been open; below: what a loop device's file lies on, when known."""
    if alert not in DEVICE_ALERTS:
        return ""
    if kind == "drive":
        if drive_says:
            return (f"The drive says it is failing ({drive_says[0]}): move its data off and replace it "
                    f"(in md: mdadm --fail, --remove, then --add the new one).")
        if open_days >= PERSISTENT_DAYS:
            return (f"Slow for {open_days:.0f} days with nothing in its SMART log: reseat or recable it, then plan "
                    f"its replacement if it stays so.")
        return (f"Read its SMART log (smartctl -x /dev/{device}) and the kernel log for resets and timeouts; "
                f"reseat or recable it. Nothing from the drive itself says it is failing yet: replace it only if "
                f"SMART reports errors or it stays slow for days.")
    if kind == "cloud volume":
        return ("A cloud volume: check its provider's metrics and status for it (IOPS and throughput limits, burst "
                "balance, an event on the backend); if it stays slow, detach and re-attach it or move the data to "
                "a new volume.")
    if kind == "virtual disk":
        return ("A virtual disk: the time goes in the hypervisor's storage under it; look at that host and its "
                "storage, not at this guest.")
    if kind == "loop device":
        return (f"A loop device is as fast as the file and disk under it{f' ({below})' if below else ''}: look "
                f"there (an alert of that disk, its fragmentation, its own load).")
    if kind == "array":
        return ("An array or mapped device: look at its members (a slow member is named when one is) and its "
                "state (a resync, a degraded member).")
    return "Look at what the device is before replacing anything: its SMART log, or its provider's volume status."
