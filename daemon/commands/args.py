"""What the commands share of their command line: argument types that refuse nonsense, the version line,
help that says each default once."""
from __future__ import annotations

import argparse
import math


def positive_seconds(text: str) -> float:
    """A number of seconds for argparse: finite and above zero (nan, inf and -1 are refused, not looped on)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number of seconds above 0")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(text: str) -> float:
    """Seconds from a duration as Prometheus writes one (15s, 5m, 1h30m, 30d) or a plain number of seconds."""
    import re
    t = text.strip()
    try:
        value = float(t)
    except ValueError:
        parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", t)
        if not parts or "".join(n + u for n, u in parts) != t:
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration (15s, 5m, 1h, 30d)") from None
        value = sum(float(n) * DURATION_UNITS[u] for n, u in parts)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a duration above 0")
    return value


def instant(text: str) -> str:
    """An instant as given (resolved against one `now` later, by instant_seconds): checked here."""
    instant_seconds(text, 0.0)
    return text


def instant_seconds(text: str, now: float) -> float:
    """Unix seconds from `now`, `now-7d` (or `-7d`), Unix seconds, or ISO 8601 (local time unless it says)."""
    from datetime import datetime
    t = text.strip()
    if t == "now":
        return now
    rel = t[4:] if t.startswith("now-") else None
    if t.startswith("-") and not t[1:].replace(".", "", 1).isdigit():
        rel = t[1:]
    if rel is not None:
        return now - duration(rel)
    try:
        value = float(t)
    except ValueError:
        try:
            value = datetime.fromisoformat(t).timestamp()
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an instant: now, now-7d, Unix seconds or ISO 8601 "
                                             "(2026-11-01T00:00)") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: not an instant after 1970")
    return value


def version_text() -> str:
    import importlib.metadata
    import platform
    try:
        version = importlib.metadata.version("iowarden")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    return f"iowarden {version} (Python {platform.python_version()})"


def help_with_default(action: argparse.Action) -> str:
    """An option's help with its default said once, in --help and the man page alike (packaging/manpage.py):
    none for a flag, an option without one, or help that already says it."""
    text = action.help or ""
    if (not action.option_strings or action.default in (None, False, argparse.SUPPRESS)
            or action.default == [] or "default" in text):
        return text
    return f"{text} (default: %(default)s)"


class DefaultsShown(argparse.HelpFormatter):
    def _get_help_string(self, action):
        return help_with_default(action)
