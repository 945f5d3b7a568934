"""The state directory: iowarden's own, verified before anything in it is opened, and locked.

A root daemon that writes where another user can place a symlink writes for that user: a
`state.db` linked into /root/.ssh, a spool linked into /etc. So the directory is opened from /
one component at a time without following a link (a symlink anywhere in the path is refused,
not resolved), must be owned by the daemon's user and not writable by group or others, and
everything in it is reached through that open directory (`/proc/self/fd/N/...`), never by
spelling the path again. What iowarden finds there already (the database and its WAL, the
spool) must be a regular file or directory of its own, never a link.

One daemon per state directory: a second one on the same directory would end the first's fio as
a leftover and overwrite its baselines. The lock is flock() on `lock` in the directory, held for
the daemon's life (the kernel drops it when the process dies, kill -9 included); the file names
the holder's pid so the second can say who it is.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from dataclasses import dataclass

LOCK_FILE = "lock"
EXIT_STATE_LOCKED = 75    # EX_TEMPFAIL: another daemon holds the state directory; try later
# what iowarden keeps in the directory; anything of these names must be a real file or directory of its own
OWN_FILES = ("state.db", "state.db-wal", "state.db-shm", "state.db-journal", LOCK_FILE)
OWN_DIRS = ("influx-spool",)
LOCK_PID_MAX_BYTES = 32


class StateDirRefused(Exception):
    """The state directory is not iowarden's own: the message names the path and what is wrong."""


class StateDirLocked(Exception):
    """Another iowarden holds the state directory."""


@dataclass
class StateDir:
    path: str           # as configured, for messages
    fd: int             # the directory as opened and verified
    lock_fd: int | None = None

    def at(self, name: str) -> str:
        """A path to `name` in the verified directory that no rename of its path can redirect."""
        return f"/proc/self/fd/{self.fd}/{name}"

    def subdir(self, name: str) -> str:
        """`name` inside, created 0700 if absent and verified as the directory itself is; its stable path."""
        try:
            os.mkdir(name, 0o700, dir_fd=self.fd)
        except FileExistsError:
            pass
        sub = _open_dir(name, self.fd, os.path.join(self.path, name))
        problem = ownership_problem(os.fstat(sub))
        if problem:
            os.close(sub)
            raise StateDirRefused(f"{os.path.join(self.path, name)}: {problem}")
        return f"/proc/self/fd/{sub}"   # held open for the daemon's life, like the directory

    def close(self) -> None:
        for fd in (self.lock_fd, self.fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.lock_fd = None


def ownership_problem(st: os.stat_result, uid: int | None = None) -> str | None:
    """Why a directory is not the daemon's own: another owner, or writable by group or others."""
    uid = os.geteuid() if uid is None else uid
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by the daemon's user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by {'group' if st.st_mode & stat.S_IWGRP else 'others'} " \
               f"(mode {stat.S_IMODE(st.st_mode):04o}); it must be writable by its owner only"
    return None


def _open_dir(name: str, dir_fd: int, shown: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StateDirRefused(f"{shown} is a symbolic link or not a directory; iowarden keeps its state only "
                                  "in a real directory of its own") from None
        raise StateDirRefused(f"{shown}: {exc.strerror}") from None


def open_state_dir(path: str, create: bool = True) -> StateDir:
    """Open (creating what is missing, 0750) and verify the state directory; StateDirRefused saying why not."""
    if not path.startswith("/"):
        raise StateDirRefused(f"{path}: the state directory must be an absolute path")
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    walked = ""
    try:
        for part in [p for p in path.split("/") if p]:
            walked += "/" + part
            if part == "..":
                raise StateDirRefused(f"{path}: '..' in the state directory's path")
            if create:
                try:
                    os.mkdir(part, 0o750, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise StateDirRefused(f"cannot create {walked}: {exc.strerror}") from None
            nxt = _open_dir(part, fd, walked)
            os.close(fd)
            fd = nxt
        problem = ownership_problem(os.fstat(fd))
        if problem:
            raise StateDirRefused(f"state directory {path} {problem}")
        for name in OWN_FILES + OWN_DIRS:
            problem = _entry_problem(fd, name, want_dir=name in OWN_DIRS)
            if problem:
                raise StateDirRefused(f"{os.path.join(path, name)} {problem}")
        return StateDir(path, fd)
    except BaseException:
        os.close(fd)
        raise


def _entry_problem(dir_fd: int, name: str, want_dir: bool) -> str | None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link; iowarden never writes through a link"
    if want_dir != stat.S_ISDIR(st.st_mode) or not (want_dir or stat.S_ISREG(st.st_mode)):
        return f"is not a {'directory' if want_dir else 'regular file'}"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by the daemon's user (uid {os.geteuid()})"
    return None


def state_dir_problem(path: str) -> str | None:
    """check-config's view: what would make `iowarden run` refuse this state directory (None: fine, or
    absent and creatable). Creates nothing."""
    try:
        d = open_state_dir(path, create=False)
    except StateDirRefused as exc:
        text = str(exc)
        return None if "No such file or directory" in text else text
    d.close()
    return None


def lock(d: StateDir) -> None:
    """Take the directory's lock for this process's life; StateDirLocked naming the holder if taken."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d.fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, LOCK_PID_MAX_BYTES, 0).decode("ascii", "replace").strip()
        os.close(fd)
        who = f"pid {holder}" if holder.isdigit() else "another process"
        raise StateDirLocked(f"state directory {d.path} is in use by another iowarden ({who}); one daemon per "
                             "state directory (give this one its own [daemon] state_dir)") from None
    try:   # who holds it, for a second daemon's message: best effort (a full filesystem takes no byte)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    d.lock_fd = fd
