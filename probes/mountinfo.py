"""/proc/self/mountinfo: which filesystem (its device number) each mount point is, read without touching
any mounted filesystem (a stat of a path on one that stopped answering would hold the reader)."""
from __future__ import annotations

import re

from .common import Roots, lines_of, read_text


def parse(text: str) -> list[tuple[str, str]]:
    """(mount point, "MAJ:MIN" of its filesystem) per line, in the table's order (a later mount over the same
    point hides an earlier one). Octal escapes (\\040) are decoded; a line that does not parse is passed over."""
    out = []
    for line in lines_of(text):
        fields = line.split(" ")
        if len(fields) >= 5 and ":" in fields[2]:
            out.append((re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]), fields[2]))
    return out


def read_devnos(roots: Roots = Roots()) -> list[tuple[str, str]]:
    return parse(read_text(roots.proc / "self" / "mountinfo") or "")


def devno_of(path: str, mounts: list[tuple[str, str]]) -> str | None:
    """The filesystem a path is on, by the longest mount point it lies under (the last such mount wins)."""
    best, devno = -1, None
    for mountpoint, dn in mounts:
        prefix = mountpoint.rstrip("/") + "/"
        if (path == mountpoint or path.startswith(prefix) or mountpoint == "/") and len(mountpoint) >= best:
            best, devno = len(mountpoint), dn
    return devno
