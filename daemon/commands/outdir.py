"""Files a command writes for a person: created, never followed.

The commands run as root, and `--out DIR` is often a directory a user can write (a home, a shared report
directory). A name planted there as a symbolic link (`characterize.txt -> /etc/shadow`) must not make root
overwrite or create a file where the link points. So:

- the directory is opened without following a link at its last component, and must be the caller's own
  (owned by the caller or by root, written only by its owner): a directory another user can write is
  refused, since that user could swap its entries while the command writes;
- every file is written to a temporary name the command creates itself (exclusive create, no-follow) and
  renamed over the final name inside that directory: a link planted under the final name is replaced, never
  followed, and a reader never sees half a file.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat

READ_MAX_BYTES = 16 << 20     # what a command reads back of its own earlier output (characterize.json)


class OutDirRefused(Exception):
    """The directory cannot be written safely; the message says why and what to do."""


def _problem(st: os.stat_result, euid: int) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in (euid, 0):
        return (f"belongs to uid {st.st_uid}, not to the user running this command (uid {euid}), who could have "
                "names in it point elsewhere")
    if st.st_uid != euid and st.st_mode & 0o022:
        return "can be written by other users, who could have names in it point elsewhere"
    if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        return "can be written by every user"
    return None


class OutDir:
    """An output directory, opened and checked once; its files written through its descriptor."""

    def __init__(self, path: str, create: bool = True, euid: int | None = None):
        self.path = path
        euid = os.geteuid() if euid is None else euid
        if create:
            parent = os.path.dirname(os.path.abspath(path))
            os.makedirs(parent, mode=0o755, exist_ok=True)
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                pass
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise OutDirRefused(f"{path} is a symbolic link or not a directory: give the directory itself") from None
            raise OutDirRefused(f"{path}: {exc.strerror}") from None
        problem = _problem(os.fstat(self.fd), euid)
        if problem:
            os.close(self.fd)
            raise OutDirRefused(f"{path} {problem}: give a directory of your own")

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "OutDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    @contextlib.contextmanager
    def open(self, name: str, mode: str = "w"):
        """A file object ("w" text, "wb" bytes) to write `name` with; it takes its final name when the block ends
        without an error."""
        if "/" in name or name in (".", ".."):
            raise ValueError(f"{name!r} is not a file name")
        tmp = f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=self.fd)
        try:
            with os.fdopen(fd, mode) as f:
                yield f
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise

    def read_text(self, name: str) -> str | None:
        """An earlier run's file, read without following a link and within a bound; None when absent."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            data = os.read(fd, READ_MAX_BYTES + 1)
            if len(data) > READ_MAX_BYTES:
                raise OSError(errno.EFBIG, f"larger than {READ_MAX_BYTES} bytes")
            return data.decode("utf-8", "replace")
        finally:
            os.close(fd)

