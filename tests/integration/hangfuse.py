"""A filesystem that stops answering, as a dead hard-mounted NFS or CIFS server does: a FUSE process serving
an empty, read-only directory whose every request blocks while a control file exists (and is answered again
once it is gone). Requests it has taken keep their callers in the kernel, uninterruptibly, until then.

Run: python hangfuse.py MOUNTPOINT CONTROL_FILE   (foreground; unmount with `umount MOUNTPOINT`)
"""
from __future__ import annotations

import errno
import os
import stat
import sys
import time

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
from mfusepy import FUSE, FuseOSError, Operations  # noqa: E402


class Hanging(Operations):
    use_ns = True

    def __init__(self, control: str):
        self.control = control
        self.started = time.time_ns()

    def _wait(self):
        while os.path.exists(self.control):
            time.sleep(0.05)

    def getattr(self, path, fh=None):
        self._wait()
        if path != "/":
            raise FuseOSError(errno.ENOENT)
        now = self.started
        return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_atime": now, "st_mtime": now, "st_ctime": now}

    def readdir(self, path, fh):
        self._wait()
        return [".", ".."]

    def statfs(self, path):
        self._wait()
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 20, "f_bfree": 1 << 19, "f_bavail": 1 << 19}

    def mkdir(self, path, mode):
        self._wait()
        raise FuseOSError(errno.EROFS)


if __name__ == "__main__":
    FUSE(Hanging(sys.argv[2]), sys.argv[1], foreground=True, nothreads=False, allow_other=True)
