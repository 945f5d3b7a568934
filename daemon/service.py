"""Talking to systemd: sd_notify (READY, WATCHDOG, STATUS, RELOADING, STOPPING), never blocking."""
from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("iowarden")


def notify(message: str) -> None:
    """sd_notify, never blocking; a no-op outside systemd (no NOTIFY_SOCKET).

    Written out rather than systemd.daemon.notify(): that call holds the GIL while
    it blocks, and a notify socket whose reader falls behind would freeze every
    thread, the sampler and the probes included (seen in tests). A message that
    cannot be queued at once is dropped; the next one a second later carries on.
    """
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(message.encode(), socket.MSG_DONTWAIT, addr)
    except OSError as exc:   # queue full, no listener, or no socket to be had (out of file descriptors)
        log.debug("sd_notify dropped (%s): %s", exc.__class__.__name__, message.split("\n")[0])
