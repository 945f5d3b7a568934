"""What a registered source is (see sources/registry.py for the seam and the list)."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

log = logging.getLogger("iowarden")
STOP_WAIT_SECONDS = 3.0   # a stop waits this long for a read under way (the daemon's whole stop has 5 s)


@dataclass(frozen=True)
class SourceSpec:
    name: str                                              # part name, config section, snapshot key
    config: dict                                           # key -> config_schema.Key
    # (its section, Roots, disk_reading) -> read(); disk_reading() is the sampler's latest reading (the one
    # read of /proc/diskstats a tick, its rates computed for what is asked), None before the first
    start: Callable[..., Callable[[], object]]
    deadline_seconds: Callable[[dict], float]              # how long one read may take before it is stuck
    families: Callable[[object, Any], Iterable]            # (value, Snapshot) -> metric families
    causes: Callable[[object, set], list[str]]             # (value, kernel disks) -> likely causes
    # (value) -> a JSON-able summary the core saves (at most every SUMMARY_SECONDS) for `iowarden status`,
    # a process of its own that reads the database; None: the source shows nothing there
    summary: Callable[[object], dict] | None = None
    # (the saved summary, the table function of `status`) -> the source's lines there; None: none
    status_text: Callable[[dict, Callable], str] | None = None


def stoppable(read: Callable[[], object], stop: Callable[[], None],
              wait_seconds: float = STOP_WAIT_SECONDS) -> Callable[[], object]:
    """A source's read() with a stop() that never runs while a read is under way: the part's thread steps the
    reader, the stopping daemon's main thread stops it, and both touch the same process and pipes (the
    tracer's bpftrace). A read held past wait_seconds is not waited for any longer: the process must not
    outlive the daemon, so it is stopped all the same, and said."""
    lock = threading.Lock()

    def serialized():
        with lock:
            return read()

    def stop_between_reads():
        got = lock.acquire(timeout=wait_seconds)
        if not got:
            log.warning("a source's read is still under way after %g s; stopping it anyway", wait_seconds)
        try:
            stop()
        finally:
            if got:
                lock.release()
    serialized.stop = stop_between_reads
    serialized.state = getattr(read, "__self__", None)   # the reader's own state (tests read what it said)
    return serialized
