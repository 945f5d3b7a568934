"""The daemon's log: to the journal (with its fields) or stderr, every message printable and bounded, and a
line said once, then how often it repeated: no message more than once a minute per subject.

A probe held by a busy device is looked at again every 5 s; logged each time, one busy afternoon wrote
184 "deferred: device busy" lines in 35 minutes. The filter keys a record by its logger, level,
message template and its text arguments (the target, the profile: the subject), not its numbers (the
util of the moment), so "probe db/rr deferred: device busy (71% util)" and "(93% util)" are one message.
The first is logged; the same message within `window_seconds` is counted, not logged; the next one after
the window is logged with "(N more like this in the last S s)". Only a message that states a condition
that persists is held back, and says so at its call: `extra={"REPEATS": True}` (a deferral, a failing
part). An event is never held back, however close the next: a target discovered, a device added, an
alert raised or cleared.

The clock is monotonic and passed in (tests use a fake one). The table of keys is bounded: past
MAX_KEYS the oldest quiet keys are forgotten (a flood of distinct subjects costs memory, not silence).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Callable

from iowarden.probes.common import printable

REPEAT_WINDOW_SECONDS = 60.0
LOG_MESSAGE_MAX_CHARS = 2000
MAX_KEYS = 4096


class RepeatFilter(logging.Filter):
    def __init__(self, window_seconds: float = REPEAT_WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.window_seconds = window_seconds
        self.clock = clock
        self._seen: dict[tuple, list] = {}   # key -> [last logged at, repeats held back since]

    @staticmethod
    def key(record: logging.LogRecord) -> tuple:
        args = record.args if isinstance(record.args, tuple) else ()
        words = tuple(a for a in args if isinstance(a, str))
        return record.name, record.levelno, str(record.msg), words

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "REPEATS", False):
            return True
        now = self.clock()
        k = self.key(record)
        seen = self._seen.get(k)
        if seen is not None and now - seen[0] < self.window_seconds:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            record.msg = f"{record.getMessage()} ({seen[1]} more like this in the last {now - seen[0]:.0f} s)"
            record.args = None
        self._seen.pop(k, None)
        self._seen[k] = [now, 0]   # re-inserted: the dict's order is the keys' age
        if len(self._seen) > MAX_KEYS:
            for old in list(self._seen)[:len(self._seen) - MAX_KEYS]:
                del self._seen[old]
        return True


def setup_logging(level: str) -> None:
    root = logging.getLogger("iowarden")
    root.handlers.clear()
    root.setLevel(level.upper())
    handler: logging.Handler
    if os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"):
        try:
            from systemd.journal import JournalHandler
            # extra={"DEVICE": ...} fields become journal fields (DEVICE=, TARGET=, PROBE=)
            handler = JournalHandler(SYSLOG_IDENTIFIER="iowarden")
        except ImportError:
            handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.addFilter(RepeatFilter())      # first: it keys a message by its template and text arguments
    handler.addFilter(PrintableFilter())
    root.addHandler(handler)


class PrintableFilter(logging.Filter):
    """Every log message escaped before a handler sees it: a name with a line feed cannot forge a log line,
    an ESC cannot drive the reader's terminal, and no message runs past LOG_MESSAGE_MAX_CHARS (a traceback,
    added by the handler after this, keeps its lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = printable(record.getMessage(), LOG_MESSAGE_MAX_CHARS)
        record.args = None
        return True
