"""A volume's class across the fleet: what it should be compared with on other hosts.

On a host with one or two volumes the passive detector has no peers; the volume's peers are the volumes of its class
on the fleet's other hosts, compared by the shipped fleet rules (packaging/prometheus/iowarden.fleet.rules.yml)
through `iowarden_volume_class_info`. The class is derived where the machine says it, and the config can say it
instead (`class = "..."` on a target or a discover rule), which wins:

- a disk: its model, firmware and size ("Amazon Elastic Block Store/1.0/500GiB", "SAMSUNG MZ7LH960/HXT7404Q/894GiB"):
  a cloud provider's block store names itself in the NVMe model, and its size is its volume type's rate on most
  providers; a drive's firmware is part of its behaviour (a roll-out is a class of its own until it is everywhere).
- a partition: its disk's class, "/part".
- an md array: its level and its members' class ("md:raid0:4x<member class>"); a device-mapper volume over several
  disks (an LVM stripe) the same with "dm"; over one, its disk's class.
- a loop device: "loop/<size>" (as fast as its file and the disk under it: rarely a fleet's class).
- a drive with no medium (a floppy or card reader without its disk, which says a size of a few sectors or none):
  no class, so the fleet rules do not count it as a volume of any.

Pure: the device view (probes/blockqueue.BlockDevice by kernel name) in, (class, how it was found) out. A label
value: printable, at most MAX_CLASS_CHARS.
"""
from __future__ import annotations

from iowarden.probes.common import printable

MAX_CLASS_CHARS = 160
GIB = 1 << 30
NO_MEDIUM_BELOW_BYTES = 1 << 20   # no volume anyone keeps data on is smaller; an empty drive says 0 or a few sectors


def _size(size_bytes: int | None) -> str:
    if not size_bytes:
        return "?"
    return f"{round(size_bytes / GIB)}GiB" if size_bytes >= GIB else f"{round(size_bytes / (1 << 20))}MiB"


def _clean(text: str) -> str:
    return printable(" ".join(text.split()))[:MAX_CLASS_CHARS]


def _members(name: str, devices: dict, members: list[str], depth: int) -> str:
    """The members' class, or "mixed" where they differ (an array of two kinds of drive)."""
    found = {volume_class(m, devices, depth=depth + 1)[0] for m in members if m in devices}
    return found.pop() if len(found) == 1 else "mixed"


def volume_class(name: str, devices: dict, configured: str | None = None, depth: int = 0) -> tuple[str, str]:
    """(class, source): source is config, model, layout, size or unknown; ("", "no medium") for a drive with none."""
    if configured:
        return _clean(configured), "config"
    d = devices.get(name)
    if d is None or depth > 8:
        return "unknown", "unknown"
    if d.kind == "partition" and d.parent in devices:
        parent, source = volume_class(d.parent, devices, depth=depth + 1)
        return _clean(parent + "/part"), source
    if d.md is not None:
        members = [m.name for m in d.md.members]
        return _clean(f"md:{d.md.level or '?'}:{len(members)}x{_members(name, devices, members, depth)}"), "layout"
    if d.kind == "dm" and d.slaves:
        if len(d.slaves) == 1:
            return volume_class(d.slaves[0], devices, depth=depth + 1)
        return _clean(f"dm:{len(d.slaves)}x{_members(name, devices, list(d.slaves), depth)}"), "layout"
    if d.kind in ("disk", "loop") and d.size_bytes is not None and d.size_bytes < NO_MEDIUM_BELOW_BYTES:
        return "", "no medium"
    if d.kind == "loop":
        return f"loop/{_size(d.size_bytes)}", "size"
    model = (d.udev.get("ID_MODEL") or "").replace("_", " ").strip()
    firmware = (d.udev.get("ID_REVISION") or "").strip()
    if not model:
        return _clean(f"{d.kind}/{_size(d.size_bytes)}"), "size"
    return _clean(f"{model}/{firmware or '?'}/{_size(d.size_bytes)}"), "model"
