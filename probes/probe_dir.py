"""Where a probe may write, checked on the directory actually opened: never a system tree, never through a
symlink, only `<target>/.iowarden/`, a root-owned 0700 directory (fio_run.py's rules, the directory part)."""
from __future__ import annotations

import errno
import os
import stat

from .common import Roots

PROBE_DIR_NAME = ".iowarden"


class ProbeRefused(Exception):
    """A safety rule forbids this probe; the message says which."""


class VolumeFull(ProbeRefused):
    """The probe's file would leave less free space than its floor: the volume is full, not slow. Its used share
    travels with the result, because a full filesystem is also why its device can be slow for everyone."""

    def __init__(self, message: str, used_ratio: float):
        super().__init__(message)
        self.used_ratio = used_ratio


def device_name_for(st_dev_or_rdev: int, roots: Roots) -> str | None:
    """Kernel name (sda, loop0, dm-1) of the block device with this dev_t."""
    major, minor = os.major(st_dev_or_rdev), os.minor(st_dev_or_rdev)
    link = roots.sys / "dev" / "block" / f"{major}:{minor}"
    try:
        return os.path.basename(os.readlink(link))
    except OSError:
        return None


# Trees of the operating system itself: never a probe directory, whatever the config says.
SYSTEM_TREES = ("/etc", "/proc", "/sys", "/dev", "/boot", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
                "/libx32", "/run")


def normalized(path: str) -> str:
    """The path without '.', '..' or repeated slashes, leading ones included: POSIX lets '//usr'
    mean something else than '/usr', so normpath keeps a leading '//'; Linux does not, and
    neither does this."""
    return "/" + os.path.normpath(path).lstrip("/")


def directory_name_problem(path: str) -> str | None:
    """Why the name `path` may never be a probe directory (relative, /, a system tree), or None."""
    if not path.startswith("/"):
        return f"{path!r} is not an absolute path"
    norm = normalized(path)
    if norm == "/" or any(norm == t or norm.startswith(t + "/") for t in SYSTEM_TREES):
        return (f"{path} is {'the root directory' if norm == '/' else 'in a system tree'}: iowarden never "
                f"writes probe files there (not in /, {', '.join(SYSTEM_TREES)}); name a directory on the "
                "volume to probe, such as its mount point")
    return None


def directory_target_problem(path: str) -> str | None:
    """Why `path` may not be a probe directory, or None: its name, and the path as it is now.

    For check-config, which says which component is a link and where it points. A probe
    relies on open_target_dir's walk instead, which cannot be raced.
    """
    problem = directory_name_problem(path)
    if problem:
        return problem
    norm = normalized(path)
    walked = "/"
    for part in norm.strip("/").split("/"):
        walked = os.path.join(walked, part)
        try:
            st = os.lstat(walked)
        except FileNotFoundError:
            return None       # not there yet (mounted later): checked again when probed
        except OSError as exc:
            return f"{walked}: {exc.strerror}"
        if stat.S_ISLNK(st.st_mode):
            return (f"{walked} is a symlink (to {os.readlink(walked)}): iowarden never probes through a link, "
                    f"which could be pointed elsewhere; name the real directory ({os.path.realpath(path)})")
        if walked != norm and not stat.S_ISDIR(st.st_mode):
            return f"{walked} is not a directory"
    if not stat.S_ISDIR(st.st_mode):
        return None
    try:   # the directory itself, as a probe would open it (a bind mount of /etc looks harmless by name)
        os.close(open_target_dir(path))
    except ProbeRefused as exc:
        return str(exc)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    return None


def _open_real_dir(name: str, dir_fd: int, refusal: str) -> int:
    """Open directory `name` under dir_fd without following a link; ProbeRefused(refusal) if it is one."""
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ProbeRefused(refusal) from None
        raise


def open_target_dir(target_dir: str) -> int:
    """Open a directory target walking from / one component at a time, never following a link.

    Each component is opened relative to the one before it with O_NOFOLLOW, so no
    symlink, placed before the walk or swapped in during it, can lead the walk
    elsewhere (a check of the path followed by an open of it would race).
    """
    problem = directory_name_problem(target_dir)
    if problem:
        raise ProbeRefused(problem)
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in normalized(target_dir).strip("/").split("/"):
            if not part:
                continue
            nxt = _open_real_dir(part, fd, f"{target_dir}: {part} is a symlink or not a directory; iowarden "
                                           "never probes through a link")
            os.close(fd)
            fd = nxt
        problem = opened_dir_problem(fd)
        if problem:
            raise ProbeRefused(f"{target_dir}: {problem}")
        return fd
    except BaseException:
        os.close(fd)
        raise


def opened_dir_problem(fd: int) -> str | None:
    """Why the directory open at fd may not hold probe files, judged on the directory itself and not on
    the spelling of a path: the kernel's path of it (a system tree, or /), and its device and inode
    against / and each system tree's (a bind mount of /etc elsewhere is still /etc)."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "its real path cannot be read (/proc/self/fd)"
    problem = directory_name_problem(real) if real.startswith("/") else f"it is not reachable from / ({real})"
    if problem:
        return f"it is {real}: {problem}"
    st = os.fstat(fd)
    for tree in ("/",) + SYSTEM_TREES:
        try:
            tst = os.stat(tree)
        except OSError:
            continue
        if (tst.st_dev, tst.st_ino) == (st.st_dev, st.st_ino):
            return f"it is the directory {tree} (mounted or linked at {real}): iowarden never writes probe files there"
    return None


def open_probe_dir(target_dir: str, expect_dev: int | None = None) -> int:
    """Create (if needed) and open `<target_dir>/.iowarden` safely; returns a directory fd.

    expect_dev: the filesystem target_dir must be on. Checked on the open directory,
    which keeps that filesystem from being unmounted until the probe is done.
    Nothing is created before the target has passed every check.
    """
    parent = open_target_dir(target_dir)
    try:
        if expect_dev is not None and os.fstat(parent).st_dev != expect_dev:
            raise ProbeRefused(f"{target_dir} is no longer on the filesystem it was found on (unmounted?)")
        try:
            os.mkdir(PROBE_DIR_NAME, 0o700, dir_fd=parent)
        except FileExistsError:
            pass
        except OSError as exc:   # read-only, full, not permitted: say where
            raise OSError(exc.errno, f"cannot make {os.path.join(target_dir, PROBE_DIR_NAME)}: "
                                     f"{exc.strerror}") from None
        fd = _open_real_dir(PROBE_DIR_NAME, parent, f"{os.path.join(target_dir, PROBE_DIR_NAME)} is a symlink or "
                                                    "not a directory; iowarden probes only in a real directory of its own")
    finally:
        os.close(parent)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise ProbeRefused(f"{os.path.join(target_dir, PROBE_DIR_NAME)} is owned by uid {st.st_uid}, "
                           f"not by iowarden (uid {os.geteuid()})")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.fchmod(fd, 0o700)
    return fd
