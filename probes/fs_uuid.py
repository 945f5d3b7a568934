"""A filesystem's UUID from its device's first bytes, as blkid reads it where udev is absent: a pure
parse_fs_uuid() beside the thin reader that opens the device node read-only."""
from __future__ import annotations

import os
import uuid

# Where the filesystem UUID sits in a device's first bytes (what blkid reads when udev is absent):
# XFS: superblock at 0, magic "XFSB", sb_uuid at 32 (after magicnum, blocksize, dblocks, rblocks,
# rextents; fs/xfs/libxfs/xfs_format.h). ext2/3/4: superblock at 1024, s_magic 0xEF53
# little-endian at +0x38, s_uuid at +0x68 (fs/ext4/ext4.h).
FS_HEAD_BYTES = 2048
EXT_SUPER = 1024


def parse_fs_uuid(head: bytes) -> str | None:
    """The UUID of an XFS or ext2/3/4 filesystem from its device's first 2 KiB; None for anything else."""
    raw = None
    if head[:4] == b"XFSB" and len(head) >= 48:
        raw = head[32:48]
    elif len(head) >= EXT_SUPER + 0x78 and head[EXT_SUPER + 0x38:EXT_SUPER + 0x3A] == b"\x53\xef":
        raw = head[EXT_SUPER + 0x68:EXT_SUPER + 0x78]
    if raw is None or raw == bytes(16):
        return None
    return str(uuid.UUID(bytes=raw))


def read_fs_uuid(device_node) -> str | None:
    """Read-only: the first 2 KiB of the device node, for parse_fs_uuid. None when it cannot be read."""
    try:
        fd = os.open(device_node, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return parse_fs_uuid(os.pread(fd, FS_HEAD_BYTES, 0))
    except OSError:
        return None
    finally:
        os.close(fd)
