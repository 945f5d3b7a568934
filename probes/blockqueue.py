"""Block devices from sysfs: queue settings, md and dm state, stacking, and a stable identity.

Sources (Documentation/ABI/stable/sysfs-block, Documentation/admin-guide/md.rst):
  /sys/block/X/queue/*            scheduler ("[active]" in brackets), rotational, nr_requests, ...
  /sys/block/X/md/*               level, degraded, array_state, sync_action, dev-*/state
  /sys/block/X/dm/{name,uuid,suspended}
  /sys/block/X/{slaves,holders}/  what X is built on and what is built on X
  /sys/block/X/loop/backing_file
  /run/udev/data/bMAJ:MIN         what udevd learned (E:ID_WWN=..., S:disk/by-id/...), when udevd runs
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from . import mountinfo
from .common import ParseError, Roots, read_int, read_str, read_text
from .fs_uuid import read_fs_uuid
from .vocabulary import QUEUE_INT_SETTINGS

QUEUE_INT_KEYS = QUEUE_INT_SETTINGS


# slots on the records kept per device: a thousand devices, no __dict__ each
@dataclass(frozen=True, slots=True)
class QueueSettings:
    scheduler: str | None
    schedulers_available: tuple[str, ...]
    write_cache: str | None
    rotational: int | None = None
    nr_requests: int | None = None
    read_ahead_kb: int | None = None
    max_sectors_kb: int | None = None
    wbt_lat_usec: int | None = None
    nomerges: int | None = None
    rq_affinity: int | None = None
    logical_block_size: int | None = None
    physical_block_size: int | None = None


@dataclass(frozen=True, slots=True)
class MdMember:
    name: str            # kernel name of the member, e.g. sdb1
    states: tuple[str, ...]  # faulty, in_sync, spare, write_error, ...
    slot: str | None

    @property
    def faulty(self) -> bool:
        return "faulty" in self.states


@dataclass(frozen=True, slots=True)
class MdArray:
    level: str | None
    degraded: int | None
    raid_disks: int | None
    array_state: str | None
    sync_action: str | None
    sync_completed: str | None
    mismatch_cnt: int | None
    members: tuple[MdMember, ...]


@dataclass(frozen=True, slots=True)
class DmInfo:
    name: str | None
    uuid: str | None
    suspended: int | None


@dataclass(frozen=True, slots=True)
class BlockDevice:
    name: str
    major: int
    minor: int
    kind: str  # disk, partition, md, dm, loop
    size_bytes: int | None
    parent: str | None  # the disk a partition belongs to
    slaves: tuple[str, ...]
    holders: tuple[str, ...]
    queue: QueueSettings | None
    md: MdArray | None = None
    dm: DmInfo | None = None
    loop_backing_file: str | None = None
    udev: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    udev_links: tuple[str, ...] = ()
    identity: str = ""
    loop_backing_devno: str | None = None   # "MAJ:MIN" of the filesystem's device that holds the backing file

    def __post_init__(self):
        if not isinstance(self.udev, MappingProxyType):
            object.__setattr__(self, "udev", MappingProxyType(dict(self.udev)))


def parse_scheduler(text: str) -> tuple[str | None, tuple[str, ...]]:
    """'[none] mq-deadline kyber bfq' -> ('none', ('none', 'mq-deadline', 'kyber', 'bfq'))."""
    active, available = None, []
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            word = word[1:-1]
            if active is not None:
                raise ParseError(f"scheduler line names two active schedulers: {text.strip()!r}")
            active = word
        available.append(word)
    if text.strip() and active is None and available != ["none"]:
        raise ParseError(f"scheduler line has no [active] entry: {text.strip()!r}")
    if active is None and available == ["none"]:
        active = "none"  # devices without an elevator (some dm/md) print a bare "none"
    return active, tuple(available)


def parse_udev_db(text: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """udevd's database record: E:KEY=VALUE properties and S:link symlinks (relative to /dev)."""
    props, links = {}, []
    for line in text.splitlines():
        if line.startswith("E:") and "=" in line:
            k, v = line[2:].split("=", 1)
            props[k] = v
        elif line.startswith("S:"):
            links.append(line[2:])
    return props, tuple(links)


def stable_identity(name: str, udev: dict[str, str], links: tuple[str, ...], wwid: str | None,
                    serial: str | None, dm: DmInfo | None, loop_backing_file: str | None,
                    fs_uuid: str | None = None) -> str:
    """The most stable name a device has, as 'scheme:value'.

    Order: hardware names (WWN, serial, by-id), then names that follow the data
    (dm/md UUIDs, filesystem UUID), then the loop backing file; the kernel name
    is the last resort and says so ('kernel:sdb'), because sdb can be a
    different disk after a reboot.
    """
    if udev.get("ID_WWN_WITH_EXTENSION") or udev.get("ID_WWN"):
        return "wwn:" + (udev.get("ID_WWN_WITH_EXTENSION") or udev["ID_WWN"])
    if wwid:
        return "wwn:" + wwid
    if udev.get("ID_SERIAL"):
        return "serial:" + udev["ID_SERIAL"]
    if serial:
        return "serial:" + serial
    by_id = sorted(link for link in links if link.startswith("disk/by-id/"))
    if by_id:
        return "by-id:" + by_id[0].rsplit("/", 1)[1]
    if dm and dm.uuid:
        return "dm-uuid:" + dm.uuid
    if udev.get("MD_UUID"):
        return "md-uuid:" + udev["MD_UUID"]
    if udev.get("ID_FS_UUID"):
        return "fs-uuid:" + udev["ID_FS_UUID"]
    by_uuid = sorted(link for link in links if link.startswith("disk/by-uuid/"))
    if by_uuid:
        return "fs-uuid:" + by_uuid[0].rsplit("/", 1)[1]
    if fs_uuid:
        return "fs-uuid:" + fs_uuid
    if loop_backing_file:
        return "loop-file:" + loop_backing_file
    return "kernel:" + name


def _queue(qdir) -> QueueSettings | None:
    if not qdir.is_dir():
        return None
    sched_text = read_str(qdir / "scheduler")
    active, available = parse_scheduler(sched_text) if sched_text else (None, ())
    ints = {k: read_int(qdir / k) for k in QUEUE_INT_KEYS}
    return QueueSettings(active, available, read_str(qdir / "write_cache"), **ints)


def _md(mddir) -> MdArray | None:
    if not mddir.is_dir():
        return None
    members = []
    for entry in sorted(mddir.iterdir()):
        if entry.name.startswith("dev-"):
            state = read_str(entry / "state") or ""
            members.append(MdMember(entry.name[4:], tuple(s for s in state.split(",") if s),
                                    read_str(entry / "slot")))
    return MdArray(read_str(mddir / "level"), read_int(mddir / "degraded"), read_int(mddir / "raid_disks"),
                   read_str(mddir / "array_state"), read_str(mddir / "sync_action"),
                   read_str(mddir / "sync_completed"), read_int(mddir / "mismatch_cnt"), tuple(members))


def _dm(dmdir) -> DmInfo | None:
    if not dmdir.is_dir():
        return None
    return DmInfo(read_str(dmdir / "name"), read_str(dmdir / "uuid"), read_int(dmdir / "suspended"))


def _listdir(path) -> tuple[str, ...]:
    try:
        return tuple(sorted(os.listdir(path)))
    except OSError:
        return ()


def _device(devdir, parent: str | None, roots: Roots, links_to: "_Links | None" = None) -> BlockDevice | None:
    name = devdir.name
    dev = read_str(devdir / "dev")
    if not dev or ":" not in dev:
        return None
    major, minor = (int(x) for x in dev.split(":"))
    sectors = read_int(devdir / "size")
    md, dm = _md(devdir / "md"), _dm(devdir / "dm")
    backing = read_str(devdir / "loop" / "backing_file")
    if parent:
        kind = "partition"
    elif md:
        kind = "md"
    elif dm:
        kind = "dm"
    elif backing is not None or name.startswith("loop"):
        kind = "loop"
    else:
        kind = "disk"
    udev_text = read_text(roots.run / "udev" / "data" / f"b{major}:{minor}")
    udev, links = parse_udev_db(udev_text) if udev_text else ({}, ())
    if not links:
        links = (links_to or _Links(roots)).to(name)
    # Partitions share the disk's queue; their queue dir is absent, so read the parent's.
    queue = _queue(devdir / "queue") if not parent else _queue(devdir.parent / "queue")
    wwid = read_str(devdir / "device" / "wwid") or read_str(devdir / "wwid")
    serial = read_str(devdir / "device" / "serial")
    ident = stable_identity(name, udev, links, wwid, serial, dm, backing)
    if ident.startswith(("loop-file:", "kernel:")) and not parent and sectors:
        # no udev to have read the filesystem's UUID: read it ourselves, as udev would have
        # (a partition first takes its disk's name, in read())
        ident = stable_identity(name, udev, links, wwid, serial, dm, backing, read_fs_uuid(roots.dev / name))
    return BlockDevice(name, major, minor, kind, sectors * 512 if sectors is not None else None, parent,
                       _listdir(devdir / "slaves"), _listdir(devdir / "holders"), queue, md, dm, backing,
                       udev, links, ident,
                       (links_to or _Links(roots)).mount_devno(backing.removesuffix(" (deleted)")) if backing else None)


def devices_below(name: str, devices: dict[str, "BlockDevice"]) -> tuple[str, ...]:
    """Every device a device is built on, nearest first: a partition's disk, an md/dm device's members,
    the device holding a loop device's backing file, and theirs in turn (not the device itself)."""
    by_devno = {f"{d.major}:{d.minor}": n for n, d in devices.items()}
    out: list[str] = []
    stack = [name]
    while stack:
        dev = devices.get(stack.pop(0))
        if dev is None:
            continue
        below = ([dev.parent] if dev.parent else list(dev.slaves)) + \
            ([by_devno[dev.loop_backing_devno]] if dev.loop_backing_devno in by_devno else [])
        for b in below:
            if b != name and b not in out:
                out.append(b)
                stack.append(b)
    return tuple(out)


def _links_by_target(roots: Roots) -> dict[str, tuple[str, ...]]:
    """disk/by-id and disk/by-uuid links (udevd makes them when it runs) by the kernel name they point at: read
    once a pass. Listed again for every device without udev data, a thousand loop devices with a filesystem
    each read a thousand links a thousand times."""
    out: dict[str, list[str]] = {}
    for sub in ("by-id", "by-uuid"):
        d = roots.dev / "disk" / sub
        for link in _listdir(d):
            try:
                out.setdefault(os.path.basename(os.readlink(d / link)), []).append(f"disk/{sub}/{link}")
            except OSError:
                continue
    return {name: tuple(links) for name, links in out.items()}


class _Links:
    """What one read of the devices looks up once, when a device first needs it: _links_by_target (most hosts
    run udevd, whose data name the links) and the mount table."""

    def __init__(self, roots: Roots):
        self.roots, self._by_target, self._mounts = roots, None, None

    def to(self, name: str) -> tuple[str, ...]:
        if self._by_target is None:
            self._by_target = _links_by_target(self.roots)
        return self._by_target.get(name, ())

    def mount_devno(self, path: str) -> str | None:
        """The filesystem (its st_dev) a loop device's backing file is on, what a limit below the loop device
        sits on: from the mount table (read once per read of the devices), never by a stat of the file, which
        on a filesystem that stopped answering (an image on NFS, or FUSE) would hold the settings poller."""
        if self._mounts is None:
            self._mounts = mountinfo.read_devnos(self.roots)
        return mountinfo.devno_of(path, self._mounts)


def read_sysfs_and_superblocks(roots: Roots = Roots(), previous: Mapping[str, BlockDevice] | None = None,
                               changed: Collection[str] | None = None) -> dict[str, BlockDevice]:
    """Every block device and partition in /sys/block, by kernel name. Besides sysfs it opens device nodes
    read-only, for a filesystem UUID from the superblock where udev gave no identity (read_fs_uuid).

    With `previous` (the last view) and `changed` (the names a burst of uevents carried), only those disks,
    their partitions and the members under them are read again; every other device is the previous view's.
    A burst of N hot-added disks on a host of M cost N x M reads (960 loop devices attached, 9.7
    CPU-s, 4.9x node_exporter's), now N. A name the previous view does not place (a new partition) is a full
    read. The settings poll reads everything, so what no event said is seen within a poll."""
    names = _listdir(roots.sys / "block")
    redo = _names_to_read(previous, changed, set(names)) if previous is not None and changed is not None else None
    partitions: dict[str, list[str]] = {}
    if redo is not None:
        for n, d in previous.items():
            if d.parent:
                partitions.setdefault(d.parent, []).append(n)
    links = _Links(roots)
    out: dict[str, BlockDevice] = {}
    read_now: list[str] = []
    for name in names:
        if redo is not None and name not in redo and name in previous:
            out[name] = previous[name]
            out.update((p, previous[p]) for p in partitions.get(name, ()))
            continue
        _read_disk(roots, name, out, links)
        read_now.append(name)
    if redo is not None:
        # a new array's or mapping's members (disks or their partitions) now have a holder: read them again too
        for disk in {_disk_of(m, out) for n in read_now if n in out for m in out[n].slaves} - set(read_now):
            if disk in out:
                for p in partitions.get(disk, ()):
                    out.pop(p, None)
                _read_disk(roots, disk, out, links)
    return out


def _disk_of(name: str, view: Mapping[str, BlockDevice]) -> str:
    dev = view.get(name)
    return dev.parent if dev is not None and dev.parent else name


def _names_to_read(previous: Mapping[str, BlockDevice], changed: Collection[str], present: set[str]) -> set[str] | None:
    """The whole devices to read again for these uevents' names, or None for a full read."""
    redo: set[str] = set()
    for name in changed:
        old = previous.get(name)
        if name in present:
            redo.add(name)
        elif old is not None and old.parent:
            redo.add(old.parent)           # a partition's table is its disk's
        elif old is None:
            return None                    # not a disk, and not known: a new partition
        if old is not None:
            redo.update(_disk_of(m, previous) for m in old.slaves)   # members that lose (or keep) this holder
    return redo


def _read_disk(roots: Roots, name: str, out: dict, links: _Links) -> None:
    devdir = roots.sys / "block" / name
    dev = _device(devdir, None, roots, links)
    if dev is None:
        out.pop(name, None)
        return
    out[name] = dev
    for child in _listdir(devdir):
        if (devdir / child / "partition").exists():
            part = _device(devdir / child, name, roots, links)
            if part and part.identity.startswith("kernel:") and not dev.identity.startswith("kernel:"):
                # A partition without a name of its own is "its disk, partition N", as by-id names it.
                number = read_int(devdir / child / "partition")
                part = dataclasses.replace(part, identity=f"{dev.identity}-part{number}")
            elif part and part.identity.startswith("kernel:") and part.size_bytes:
                fs_uuid = read_fs_uuid(roots.dev / child)
                if fs_uuid:
                    part = dataclasses.replace(part, identity="fs-uuid:" + fs_uuid)
            if part:
                out[child] = part


def physical_devices(name: str, devices: dict[str, BlockDevice]) -> tuple[str, ...]:
    """The whole disks under a device: a partition's disk, an md/dm device's members, recursively.

    Two targets share a physical device when these sets meet; probes on them
    must not run at the same time.
    """
    seen, leaves = set(), set()
    stack = [name]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        dev = devices.get(n)
        if dev is None:
            leaves.add(n)
            continue
        if dev.parent:
            stack.append(dev.parent)
        elif dev.slaves:
            stack.extend(dev.slaves)
        else:
            leaves.add(n)
    return tuple(sorted(leaves))


def identity_of(name: str, devices: dict[str, BlockDevice]) -> str:
    """A device's stable identity from the device view, or `kernel:NAME` for one the view does not know
    yet (newer than the last read, or gone): the one place that fallback is written."""
    dev = devices.get(name)
    return dev.identity if dev is not None and dev.identity else f"kernel:{name}"
