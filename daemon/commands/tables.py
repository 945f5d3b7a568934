"""Plain-text tables for people: aligned columns, units in the headers, '-' for absent values."""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Mapping
from typing import Any, Iterable, Sequence

from iowarden.probes.common import printable, printable_lines

CELL_MAX_CHARS = 300


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    # Text columns align left, numbers right, the way iostat and fio print them.
    numeric = [all(_is_num(r[i]) for r in cells) and cells for i in range(len(headers))]
    lines = ["  ".join(h.rjust(w) if numeric[i] else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    for r in cells:
        lines.append("  ".join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(line.rstrip() for line in lines)


def human_bytes(n: int) -> str:
    """A size in binary units, as fio and the config write them: 512 B, 256 MiB, 1 GiB, 1.5 TiB."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if value == int(value) else f"{value:.3g} {unit}"


def _is_num(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return s == "-"


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.2f}"
    return printable(v, CELL_MAX_CHARS)   # a name from outside: escaped, and cut short


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, named tuples, tuples and float-keyed dicts as plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_asdict"):   # a named tuple (DiskCounters) keeps its names
        return {k: to_jsonable(v) for k, v in obj._asdict().items()}
    if isinstance(obj, Mapping):   # a dict, or the read-only views the records hold
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(to_jsonable(obj), indent=2, sort_keys=False)


def print_lines(text: str) -> None:
    """Print what a command shows: every line escaped (a device or path name cannot drive the terminal)."""
    sys.stdout.write(printable_lines(text) + "\n")
    sys.stdout.flush()


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
