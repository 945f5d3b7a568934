"""Opening the daemon's state at start: the state directory verified as its own and locked, the database
waited for while it is locked, full or unreadable (never a reason to start on an empty one)."""
from __future__ import annotations

import logging
import threading

from iowarden.daemon.core import statedir
from iowarden.daemon.core.state import State
from iowarden.daemon.core.state_schema import StateUnavailable
from iowarden.daemon.service import notify

log = logging.getLogger("iowarden")
STATE_RETRY_SECONDS = 2.0
EXIT_CONFIG = 78                 # EX_CONFIG, as check-config: the state directory is not the daemon's own


class StopRequested(Exception):
    """SIGTERM arrived before the daemon was running."""


class StartRefused(Exception):
    """The daemon cannot start as configured here (said in one log line); `code` is its exit status."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def own_state_dir(path: str, stop_event: threading.Event) -> statedir.StateDir:
    """The state directory, verified as the daemon's own and locked for this run, or StartRefused. A lock
    file that cannot be made now (a full filesystem, an I/O error) is waited for, as the database is."""
    try:
        d = statedir.open_state_dir(path)
    except statedir.StateDirRefused as exc:
        raise StartRefused(f"refusing to start: {exc}", EXIT_CONFIG) from None
    said = None
    while True:
        try:
            statedir.lock(d)
            return d
        except statedir.StateDirLocked as exc:
            d.close()
            raise StartRefused(f"refusing to start: {exc}", statedir.EXIT_STATE_LOCKED) from None
        except OSError as exc:
            if exc.strerror != said:
                said = exc.strerror
                log.error("the state directory's lock %s/%s cannot be made now (%s); retrying every %g s", path,
                          statedir.LOCK_FILE, exc.strerror, STATE_RETRY_SECONDS)
            notify(f"STATUS=waiting for the state directory {path}: {exc.strerror}")
            if stop_event.wait(STATE_RETRY_SECONDS):
                d.close()
                raise StopRequested from None


def open_state_waiting(path: str, stop_event: threading.Event, opened_at: str | None = None) -> State:
    """The state database, waiting while it is locked, on a full filesystem or unreadable.

    Never a reason to start on an empty database: that would throw away every volume's
    learned normal. One log line per distinct reason, and the systemd status says why.
    """
    said = None
    while True:
        try:
            state = State(path, opened_at=opened_at)
        except StateUnavailable as exc:
            if str(exc) != said:
                said = str(exc)
                log.error("state database %s cannot be opened now (%s); it is left as it is, retrying every %g s",
                          path, exc, STATE_RETRY_SECONDS)
            notify(f"STATUS=waiting for the state database {path}: {exc}")
            if stop_event.wait(STATE_RETRY_SECONDS):
                raise StopRequested from None
            continue
        if said:
            log.warning("state database %s opened", path)
        return state
