"""What a registered source is (see sources/registry.py for the seam and the list)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable


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
