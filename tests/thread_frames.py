"""Where a thread is, for tests that must know it is blocked before they look: a condition to wait on, not a
fixed sleep that a busy machine outlasts or a fast one wastes."""
from __future__ import annotations

import sys
import threading


def blocked_in(thread: threading.Thread, function: str, below: str | None = None) -> bool:
    """Whether `thread` is now inside `function` (a frame's code name), called from `below` when given."""
    frame = sys._current_frames().get(thread.ident)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    if function not in names:
        return False
    return below is None or below in names[names.index(function):]
