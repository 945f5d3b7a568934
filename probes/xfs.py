"""XFS fragmentation, free-space histogram and geometry for each mounted XFS filesystem.

Tools and their output (xfsprogs 6.x man pages):
  xfs_db -r -c frag DEV        "actual A, ideal I, fragmentation factor F%" and
                               "Files on this filesystem average X extents per file"
  xfs_spaceman -c 'freesp -s' MOUNT   rows "from to extents blocks pct", then totals
  xfs_db -r -c 'freesp -s' DEV        the same table, read from the raw device
  xfs_spaceman -c info MOUNT  geometry: bsize, agcount, sunit/swidth, ... (xfs_info's own, without its lookup)
xfs_db reads the device beneath a mounted filesystem without its log, so its
numbers can be stale; xfs_spaceman asks the kernel (GETFSMAP) and is live. The
report says which source each part came from.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import struct
from dataclasses import dataclass

from .common import lines_of, ParseError, Roots, read_text, run_tool


@dataclass(frozen=True)
class FragReport:
    actual_extents: int
    ideal_extents: int
    fragmentation_ratio: float   # (actual - ideal) / actual, 0..1
    extents_per_file: float      # actual / ideal


@dataclass(frozen=True)
class FreeSpaceBucket:
    from_blocks: int
    to_blocks: int
    extents: int
    blocks: int
    percent: float


@dataclass(frozen=True)
class FreeSpace:
    buckets: tuple[FreeSpaceBucket, ...]
    total_free_extents: int
    total_free_blocks: int
    average_free_extent_blocks: float


@dataclass(frozen=True)
class XfsGeometry:
    block_size_bytes: int
    data_blocks: int
    ag_count: int
    ag_size_blocks: int
    sunit_blocks: int
    swidth_blocks: int
    inode_size_bytes: int
    reflink: bool | None


@dataclass(frozen=True)
class XfsReport:
    mountpoint: str
    device: str
    frag: FragReport | None
    free_space: FreeSpace | None
    free_space_source: str | None    # "xfs_spaceman" (live) or "xfs_db" (may be stale)
    geometry: XfsGeometry | None
    errors: tuple[str, ...]
    kernel_name: str = ""            # the device's kernel name (dm-3 for /dev/mapper/vg-lv): the label elsewhere


_FRAG_RE = re.compile(r"actual\s+(\d+),\s*ideal\s+(\d+),\s*fragmentation factor\s+([\d.]+)%")
_PER_FILE_RE = re.compile(r"average\s+([\d.]+)\s+extents per file")


def parse_frag(text: str) -> FragReport:
    m = _FRAG_RE.search(text)
    if not m:
        raise ParseError(f"xfs_db frag output has no 'actual N, ideal N' line: {text.strip()[:200]!r}")
    actual, ideal = int(m.group(1)), int(m.group(2))
    # Computed from the counts: the percentage xfs_db prints is rounded to 2 places.
    ratio = (actual - ideal) / actual if actual else 0.0
    per_file = actual / ideal if ideal else 0.0
    m2 = _PER_FILE_RE.search(text)
    if m2 and ideal and abs(float(m2.group(1)) - per_file) > 0.01 + 0.005 * per_file:
        raise ParseError(f"xfs_db frag output is inconsistent: {m2.group(1)} extents per file vs {actual}/{ideal}")
    return FragReport(actual, ideal, ratio, per_file)


def parse_freesp(text: str) -> FreeSpace:
    buckets, totals = [], {}
    header_seen = False
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.split()[:2] == ["from", "to"]:
            header_seen = True
            continue
        total = next((k for prefix, k in (("total free extents", "extents"), ("total free blocks", "blocks"),
                                           ("average free extent size", "average")) if s.startswith(prefix)), None)
        if total:
            try:
                totals[total] = float(s.split()[-1]) if total == "average" else int(s.split()[-1])
            except ValueError:
                raise ParseError(f"freesp total without a number: {s[:120]!r}") from None
        else:
            parts = s.split()
            if len(parts) != 5 or not header_seen:
                raise ParseError(f"unexpected line in freesp output: {s[:120]!r}")
            try:
                buckets.append(FreeSpaceBucket(int(parts[0]), int(parts[1]), int(parts[2]),
                                               int(parts[3]), float(parts[4])))
            except ValueError:
                raise ParseError(f"non-numeric freesp row: {s[:120]!r}") from None
    if "extents" not in totals or "blocks" not in totals:
        raise ParseError("freesp output has no 'total free extents/blocks' lines")
    if sum(b.blocks for b in buckets) != totals["blocks"]:
        raise ParseError("freesp rows do not add up to 'total free blocks'")
    return FreeSpace(tuple(buckets), totals["extents"], totals["blocks"], totals.get("average", 0.0))


def _kv(text: str) -> dict[tuple[str, str], str]:
    """xfs_info's 'section =... key=value' layout, keyed by (section, key)."""
    out, section = {}, ""
    for line in text.splitlines():
        head, _, rest = line.partition("=")
        if head.strip():
            section = head.strip()
        for m in re.finditer(r"([a-z0-9_-]+)=(\S+?),?(?=\s|$)", rest):
            out.setdefault((section, m.group(1)), m.group(2).rstrip(","))
    return out


def parse_xfs_info(text: str) -> XfsGeometry:
    kv = _kv(text)
    try:
        return XfsGeometry(
            block_size_bytes=int(kv[("data", "bsize")]), data_blocks=int(kv[("data", "blocks")]),
            ag_count=int(kv[("meta-data", "agcount")]), ag_size_blocks=int(kv[("meta-data", "agsize")]),
            sunit_blocks=int(kv.get(("data", "sunit"), "0")), swidth_blocks=int(kv.get(("data", "swidth"), "0")),
            inode_size_bytes=int(kv[("meta-data", "isize")]),
            reflink=(kv[("meta-data", "reflink")] == "1") if ("meta-data", "reflink") in kv else None)
    except (KeyError, ValueError) as exc:
        raise ParseError(f"xfs_info output lacks or garbles {exc}") from None


def parse_mounts(text: str) -> list[tuple[str, str, str]]:
    """(device, mountpoint, fstype) from /proc/self/mounts, octal escapes (\\040) decoded.

    The kernel escapes space, tab, line feed and backslash in a path and nothing else, so a
    line is split on line feeds and its fields on spaces only: a CR, a form feed or a byte that
    is not UTF-8 (read as a surrogate escape) stays in the name it belongs to. A short or odd
    line is passed over; the rest of the table is read.
    """
    out = []
    for line in lines_of(text):
        parts = line.split(" ")
        if len(parts) < 3 or not all(parts[:3]):
            continue
        dec = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), p) for p in parts[:3]]
        out.append((dec[0], dec[1], dec[2]))
    return out


def read_mounts_text(roots: Roots = Roots()) -> str:
    """The mount table, undecodable bytes kept as surrogate escapes (a path must be opened again)."""
    return read_text(roots.proc / "self" / "mounts", errors="surrogateescape") or ""


def xfs_mounts(roots: Roots = Roots()) -> list[tuple[str, str]]:
    """(device, mountpoint) of each mounted XFS filesystem; a name that is not UTF-8 is kept as surrogate
    escapes (see common.is_utf8 and common.printable)."""
    text = read_mounts_text(roots)
    seen, out = set(), []
    for dev, mnt, fstype in parse_mounts(text):
        if fstype == "xfs" and mnt not in seen:
            seen.add(mnt)
            out.append((dev, mnt))
    return out


def drop_cached_pages(device: str) -> None:
    """Forget what the page cache holds of the device itself before xfs_db reads it. The filesystem writes its
    metadata past that cache, so pages read earlier through the device (blkid's probe when it was attached, a
    superblock read) are stale, and xfs_db, which reads through it, counted a filesystem of 60 extents as 0
    (xfs_db flushes the cache itself, but only as it exits). Clean pages only, read-only: nothing is written."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return   # xfs_db will say what is wrong with the device
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def read(mountpoint: str, device: str, timeout_seconds: float = 120.0) -> XfsReport:
    """Run the tools for one mounted XFS filesystem, each at idle I/O priority with a timeout."""
    errors: list[str] = []

    def tool(argv: list[str], parser):
        run = run_tool(argv, timeout_seconds, idle_io=True)
        if run.cut_short or (run.error and not run.stdout.strip()):
            errors.append(run.error)
            return None
        try:
            return parser(run.stdout)
        except (ValueError, OverflowError) as exc:   # ParseError, or a figure no filesystem has (5,000 digits)
            errors.append(f"{argv[0]}: {str(exc)[:300]}")
            return None

    drop_cached_pages(device)
    frag = tool(["xfs_db", "-r", "-c", "frag", device], parse_frag)
    free, source = None, None
    if shutil.which("xfs_spaceman"):
        free = tool(["xfs_spaceman", "-c", "freesp -s", mountpoint], parse_freesp)
        source = "xfs_spaceman" if free else None
    if free is None:
        free = tool(["xfs_db", "-r", "-c", "freesp -s", device], parse_freesp)
        source = "xfs_db" if free else None
    # xfs_info is a script that looks the path up again with findmnt, which prints a mount point's space,
    # backslash or line feed escaped (\040, \134, \012): the path it then hands xfs_spaceman does not exist.
    # For a mounted filesystem it runs `xfs_spaceman -c info` on the mount point, which is asked here directly.
    if shutil.which("xfs_spaceman"):
        geometry = tool(["xfs_spaceman", "-c", "info", mountpoint], parse_xfs_info)
    else:
        geometry = tool(["xfs_info", mountpoint], parse_xfs_info)
    # /dev/mapper/vg-lv and /dev/disk/by-uuid/... are links to the kernel's node, named as in /proc/diskstats
    kernel_name = os.path.basename(os.path.realpath(device)) if device.startswith("/dev/") else ""
    return XfsReport(mountpoint, device, frag, free, source, geometry, tuple(errors), kernel_name)


def report_for(path: str, roots: Roots = Roots(), timeout_seconds: float = 120.0) -> XfsReport:
    """The report for a mount point, refusing anything that is not a mounted XFS filesystem."""
    for dev, mnt in xfs_mounts(roots):
        if mnt == path.rstrip("/") or (path == "/" and mnt == "/"):
            return read(mnt, dev, timeout_seconds)
    raise ParseError(f"{path} is not the mount point of an XFS filesystem")


# FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap); struct fiemap's fixed part is
# u64 start, u64 length, u32 flags, u32 mapped_extents, u32 extent_count, u32 reserved.
_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_HEAD = struct.Struct("=QQIIII")
_FIEMAP_FLAG_SYNC = 0x1


def file_extent_count(path: str) -> int:
    """Extents of one file, from the kernel (FIEMAP with extent_count 0 only counts them).

    Independent of xfs_bmap, so the two can check each other; works on any
    filesystem with FIEMAP. The file is synced first so delayed allocations count.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        buf = bytearray(_FIEMAP_HEAD.pack(0, 0xFFFFFFFFFFFFFFFF, _FIEMAP_FLAG_SYNC, 0, 0, 0))
        fcntl.ioctl(fd, _FS_IOC_FIEMAP, buf)
        return _FIEMAP_HEAD.unpack(buf)[3]
    finally:
        os.close(fd)
