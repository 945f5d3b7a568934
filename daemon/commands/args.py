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
