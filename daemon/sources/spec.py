"""What a registered source is (see sources/registry.py for the seam and the list)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable


@dataclass(frozen=True)
class SourceSpec:
    name: str                                              # part name, config section, snapshot key
    config: dict                                           # key -> config_schema.Key
    start: Callable[[dict, Any], Callable[[], object]]     # (its section, Roots) -> read()
    deadline_seconds: Callable[[dict], float]              # how long one read may take before it is stuck
    families: Callable[[object, Any], Iterable]            # (value, Snapshot) -> metric families
    causes: Callable[[object, set], list[str]]             # (value, kernel disks) -> likely causes
    # (value) -> a JSON-able summary the core saves (at most every SUMMARY_SECONDS) for `iowarden status`,
    # a process of its own that reads the database; None: the source shows nothing there
    summary: Callable[[object], dict] | None = None
