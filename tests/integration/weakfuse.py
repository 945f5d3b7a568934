"""A disk with a weak region, for the tail tests: a FUSE filesystem of sparse images, read through
(never cached: every read reaches this process), where each read takes `service_ms` and a read touching
one block in `every` of a `.weak` image takes `delay_ms` more, as a drive re-reading a weak sector does.

A loop device over an image here is a request-based disk (the tracer times it) whose slowness is below
its block layer, where dm-delay on a few sectors in the lab guest would put it above the member disk's
(a dm device is bio-based: its delay is over before its members see the bio).

Run: python weakfuse.py MOUNTPOINT SIZE_BYTES NAME[.weak] ... [--service-ms X --every N --delay-ms D] [--serial]
     [--ms-per-mib M]
(foreground; unmount with `umount MOUNTPOINT` or a signal)
"""
from __future__ import annotations

import argparse
import errno
import os
import stat
import threading
import time
from collections import deque

# mfusepy (fusepy's API) over libfuse 3: libfuse 2 does not offer the kernel's asynchronous direct I/O, so
# the loop device's reads would reach this process one at a time and one delayed read would hold every
# read behind it (the whole disk stalls, not a few of its I/Os)
os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
from mfusepy import FUSE, FuseOSError, Operations  # noqa: E402

BLOCK = 4096


class _FifoLock:
    """One holder at a time, served in the order they asked: a disk's queue. (threading.Lock wakes an arbitrary
    waiter, so a read could pass the reads queued before it, or wait behind ones that came after.)"""

    def __init__(self):
        self._guard = threading.Lock()
        self._waiting: deque[threading.Event] = deque()
        self._busy = False

    def __enter__(self):
        with self._guard:
            if not self._busy:
                self._busy = True
                return self
            turn = threading.Event()
            self._waiting.append(turn)
        turn.wait()        # handed over by the holder before: _busy stays True
        return self

    def __exit__(self, *exc):
        with self._guard:
            if self._waiting:
                self._waiting.popleft().set()
            else:
                self._busy = False


class WeakImages(Operations):
    use_ns = True   # times in nanoseconds (mfusepy's current API)

    def __init__(self, names: list[str], size: int, service_ms: float, every: int, delay_ms: float,
                 serial: bool = False, ms_per_mib: float = 0.0):
        self.names, self.size = {"/" + n for n in names}, size
        self.serial = _FifoLock() if serial else None
        self.service, self.every, self.delay = service_ms / 1000, every, delay_ms / 1000
        self.per_byte = ms_per_mib / 1000 / (1 << 20)
        # (not `lock`: that name is FUSE's file-lock operation, which mfusepy would call)
        self.counting = threading.Lock()
        self.delayed = 0
        self.started = time.time()

    def getattr(self, path, fh=None):
        now = self.started
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_atime": now, "st_mtime": now, "st_ctime": now}
        if path not in self.names:
            raise FuseOSError(errno.ENOENT)
        return {"st_mode": stat.S_IFREG | 0o644, "st_nlink": 1, "st_size": self.size,
                "st_atime": now, "st_mtime": now, "st_ctime": now}

    def readdir(self, path, fh):
        return [".", ".."] + [n[1:] for n in sorted(self.names)]

    def open(self, path, fi):
        if path not in self.names:
            raise FuseOSError(errno.ENOENT)
        fi.direct_io = 1      # no page cache: every read of the loop device reaches read() below
        return 0

    def read(self, path, size, offset, fi):
        pause = self.service + size * self.per_byte
        if path.endswith(".weak"):
            first, last = offset // BLOCK, (offset + max(size, 1) - 1) // BLOCK
            if any(b % self.every == 0 for b in range(first, last + 1)):
                pause += self.delay
                with self.counting:
                    self.delayed += 1
        if self.serial is not None:   # one read at a time, as a disk with one head serves them
            with self.serial:
                time.sleep(pause)
        else:
            time.sleep(pause)
        return bytes(max(0, min(size, self.size - offset)))

    def write(self, path, data, offset, fi):
        raise FuseOSError(errno.EROFS)

    def statfs(self, path):
        return {"f_bsize": BLOCK, "f_frsize": BLOCK, "f_blocks": 1 << 20, "f_bfree": 0, "f_bavail": 0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mountpoint")
    ap.add_argument("size", type=int)
    ap.add_argument("names", nargs="+")
    ap.add_argument("--service-ms", type=float, default=2.0)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--delay-ms", type=float, default=100.0)
    ap.add_argument("--serial", action="store_true", help="serve the reads one at a time: requests queue behind "
                                                          "each other, whoever sent them")
    ap.add_argument("--ms-per-mib", type=float, default=0.0,
                    help="each read takes this much more a MiB it reads: a disk's transfer time, which makes a large "
                         "read hold the head longer than a small one")
    a = ap.parse_args()
    FUSE(WeakImages(a.names, a.size, a.service_ms, a.every, a.delay_ms, a.serial, a.ms_per_mib),
         a.mountpoint,
         foreground=True, raw_fi=True, ro=True, nothreads=False, allow_other=True)


if __name__ == "__main__":
    main()
