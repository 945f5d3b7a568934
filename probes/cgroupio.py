"""Who does I/O to which device, and which I/O limits are set, from the cgroup files (v1 and v2).

cgroup v2 (Documentation/admin-guide/cgroup-v2.rst), one file each per cgroup:
  io.stat   8:16 rbytes=1459200 wbytes=314773504 rios=192 wios=353 dbytes=0 dios=0
  io.max    8:16 rbps=2097152 wbps=max riops=max wiops=120
io.stat counts the cgroup and everything below it; the root cgroup has none (the kernel's own counters
are /proc/diskstats).

cgroup v1 blkio (Documentation/admin-guide/cgroup-v1/blkio-controller.rst), per cgroup:
  blkio.throttle.io_service_bytes   8:16 Read 1459200 / 8:16 Write 314773504 / ... / Total N
  blkio.throttle.io_serviced        the same, in I/Os
  blkio.throttle.{read,write}_{bps,iops}_device   8:16 2097152
These count the cgroup's own tasks only (not its children), and only on a device some cgroup has set a
throttle rule on (recent kernels set blk-throttle up on a queue at its first rule; seen on 6.18: nothing
before, every cgroup's I/O after, even once the rule is removed).

Under systemd each service, scope and slice is a cgroup (system.slice/backup.service), so a cgroup's
path names who did the I/O. A pure parse per file beside a thin reader that takes the root paths; the
walk is bounded in cgroups, depth and bytes per file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .common import ParseError, Roots, read_text

MAX_CGROUPS = 4096            # a busy host has hundreds; a walk past this is cut short and says so
MAX_DEPTH = 16
FILE_MAX_BYTES = 1 << 20      # one line per device and cgroup file: 1 MiB is thousands of devices
V1_LIMIT_FILES = {"read_iops_device": "riops", "write_iops_device": "wiops", "read_bps_device": "rbps",
                  "write_bps_device": "wbps"}
V2_KEYS = {"rbytes": "rbytes", "wbytes": "wbytes", "rios": "rios", "wios": "wios"}


@dataclass(frozen=True)
class IoCounts:
    rbytes: int = 0
    wbytes: int = 0
    rios: int = 0
    wios: int = 0

    def minus(self, other: "IoCounts") -> "IoCounts":
        return IoCounts(*(max(0, a - b) for a, b in zip(
            (self.rbytes, self.wbytes, self.rios, self.wios), (other.rbytes, other.wbytes, other.rios, other.wios))))


@dataclass(frozen=True)
class IoLimit:
    """A limit per direction and unit; None: none set (v2 `max`, v1 absent or 0)."""
    riops: int | None = None
    wiops: int | None = None
    rbps: int | None = None
    wbps: int | None = None

    def items(self):
        return [(k, v) for k, v in (("riops", self.riops), ("wiops", self.wiops), ("rbps", self.rbps),
                                    ("wbps", self.wbps)) if v is not None]


@dataclass(frozen=True)
class Cgroup:
    path: str                                            # "/" or "/system.slice/backup.service"
    io: dict = field(default_factory=dict)               # "maj:min" -> IoCounts (its own I/O)
    limits: dict = field(default_factory=dict)           # "maj:min" -> IoLimit


@dataclass(frozen=True)
class CgroupIo:
    version: int                                         # 1 (blkio) or 2 (io)
    groups: tuple[Cgroup, ...]
    cut_short: bool = False                              # more cgroups than MAX_CGROUPS, or deeper than MAX_DEPTH


def _devno(word: str) -> str:
    major, sep, minor = word.partition(":")
    if not sep or not major.isdigit() or not minor.isdigit() or len(word) > 24:
        raise ParseError(f"not a device number: {word[:40]!r}")
    return word


def _count(word: str) -> int:
    if not word.isdigit() or len(word) > 20:
        raise ParseError(f"not a count: {word[:40]!r}")
    return int(word)


def _keyed_lines(text: str, what: str):
    """v2's `MAJ:MIN key=value key=value ...` lines, one (devno, {key: value}) each."""
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        fields = {}
        for p in parts[1:]:
            key, sep, value = p.partition("=")
            if not sep:
                raise ParseError(f"{what} field without '=': {p[:40]!r}")
            fields[key] = value
        yield _devno(parts[0]), fields


def parse_v2_stat(text: str) -> dict[str, IoCounts]:
    return {dev: IoCounts(**{V2_KEYS[k]: _count(v) for k, v in fields.items() if k in V2_KEYS})
            for dev, fields in _keyed_lines(text, "io.stat")}


def parse_v2_max(text: str) -> dict[str, IoLimit]:
    out = {}
    for dev, fields in _keyed_lines(text, "io.max"):
        unknown = set(fields) - {"riops", "wiops", "rbps", "wbps"}
        if unknown:
            raise ParseError(f"io.max field not understood: {sorted(unknown)[0][:40]!r}")
        limit = IoLimit(**{k: None if v == "max" else _count(v) for k, v in fields.items()})
        if limit.items():
            out[dev] = limit
    return out


def parse_v1_stat(bytes_text: str, ios_text: str) -> dict[str, IoCounts]:
    """blkio.throttle.io_service_bytes and io_serviced: `maj:min Read|Write|Sync|Async|Discard|Total N`."""
    acc: dict[str, dict[str, int]] = {}
    for text, unit in ((bytes_text, "bytes"), (ios_text, "ios")):
        for line in text.splitlines():
            parts = line.split()
            if len(parts) != 3:
                continue   # the last line is "Total N", of every device together
            op = parts[1]
            if op in ("Read", "Write"):
                acc.setdefault(_devno(parts[0]), {})[("r" if op == "Read" else "w") + unit] = _count(parts[2])
    return {dev: IoCounts(**v) for dev, v in acc.items()}


def parse_v1_limit(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise ParseError(f"throttle line not understood: {line.strip()[:60]!r}")
        value = _count(parts[1])
        if value:
            out[_devno(parts[0])] = value
    return out


def hierarchy(roots: Roots) -> tuple[int, str] | None:
    """(version, mount) of the hierarchy with the I/O controller: v2 when its root lists `io`, else v1 blkio."""
    base = roots.sys / "fs" / "cgroup"
    for mount in (base, base / "unified"):
        controllers = read_text(mount / "cgroup.controllers", 4096)
        if controllers is not None and "io" in controllers.split():
            return 2, str(mount)
    if (base / "blkio" / "blkio.throttle.io_serviced").exists():
        return 1, str(base / "blkio")
    return None


def _read(path: str) -> str:
    text = read_text(path, FILE_MAX_BYTES)
    return text or ""


def read_group(version: int, directory: str, path: str) -> Cgroup:
    if version == 2:
        return Cgroup(path, parse_v2_stat(_read(os.path.join(directory, "io.stat"))),
                      parse_v2_max(_read(os.path.join(directory, "io.max"))))
    io = parse_v1_stat(_read(os.path.join(directory, "blkio.throttle.io_service_bytes")),
                       _read(os.path.join(directory, "blkio.throttle.io_serviced")))
    limits: dict[str, dict] = {}
    for name, key in V1_LIMIT_FILES.items():
        for dev, value in parse_v1_limit(_read(os.path.join(directory, f"blkio.throttle.{name}"))).items():
            limits.setdefault(dev, {})[key] = value
    return Cgroup(path, io, {dev: IoLimit(**v) for dev, v in limits.items()})


def own_io_v2(groups: list[Cgroup]) -> list[Cgroup]:
    """v2's io.stat counts a cgroup with its children: each cgroup's own share is its count less theirs."""
    by_path = {g.path: g for g in groups}
    children: dict[str, list[Cgroup]] = {}
    for g in groups:
        if g.path != "/":
            children.setdefault(os.path.dirname(g.path) or "/", []).append(g)
    out = []
    for g in groups:
        own = {}
        for dev, counts in g.io.items():
            for c in children.get(g.path, ()):
                if dev in c.io:
                    counts = counts.minus(c.io[dev])
            own[dev] = counts
        out.append(Cgroup(g.path, own, by_path[g.path].limits))
    return out


def walk(mount: str, max_cgroups: int = MAX_CGROUPS):
    """(directory, path under the hierarchy) of every cgroup below `mount`, breadth first, at most max_cgroups of
    them and MAX_DEPTH deep; then, last, (None, "cut") when either bound cut the walk short."""
    queue, seen, cut = [(mount, "/", 0)], 0, False
    while queue:
        directory, path, depth = queue.pop(0)
        if seen >= max_cgroups:
            cut = True
            break
        seen += 1
        yield directory, path
        if depth >= MAX_DEPTH:
            cut = True
            continue
        try:
            with os.scandir(directory) as it:
                subdirs = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        except OSError:
            continue
        queue.extend((os.path.join(directory, n), os.path.join(path, n), depth + 1) for n in subdirs)
    if cut:
        yield None, "cut"


def read(roots: Roots = Roots(), max_cgroups: int = MAX_CGROUPS) -> CgroupIo | None:
    """Every cgroup of the I/O hierarchy, breadth first; None when the host has none."""
    found = hierarchy(roots)
    if found is None:
        return None
    version, mount = found
    groups, cut = [], False
    for directory, path in walk(mount, max_cgroups):
        if directory is None:
            cut = True
            continue
        try:
            groups.append(read_group(version, directory, path))
        except (ParseError, OSError):
            continue   # one cgroup's odd file (or one removed while read) costs that cgroup only
    if version == 2:
        groups = own_io_v2(groups)
    return CgroupIo(version, tuple(groups), cut)


def ids(roots: Roots = Roots(), max_cgroups: int = MAX_CGROUPS) -> tuple[int | None, dict[int, str], bool]:
    """(version, {cgroup id: path}, cut) of the I/O hierarchy. A cgroup's id, which the block layer's blkcg carries
    (cgroup->kn->id), is its directory's inode number in that hierarchy (kernfs gives its nodes' ids as inode
    numbers), so a walk with one stat per directory names every id; (None, {}, False) without a hierarchy."""
    found = hierarchy(roots)
    if found is None:
        return None, {}, False
    version, mount = found
    out, cut = {}, False
    for directory, path in walk(mount, max_cgroups):
        if directory is None:
            cut = True
            continue
        try:
            out[os.stat(directory, follow_symlinks=False).st_ino] = path
        except OSError:
            continue   # removed while walked
    return version, out, cut


def own_cgroup(roots: Roots, version: int, pid: str = "self") -> str:
    """The cgroup a process is in, on the I/O hierarchy: `0::/path` on v2, the blkio line on v1."""
    text = read_text(roots.proc / pid / "cgroup", 65536) or ""
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (version == 2 and hid == "0") or (version == 1 and "blkio" in controllers.split(",")):
            return path or "/"
    return "/"
