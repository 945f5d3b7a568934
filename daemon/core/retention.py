"""Retention on a clock that may lie: when a pass may delete, and how much.

Records are stamped with the wall clock (they are read by people and other systems), so the
cutoff of a retention pass is a wall-clock time. The wall clock can be stepped (a bad NTP
server, an operator, a VM restored from a snapshot): 91 days forward for 12 s, and a pass in
those 12 s would delete every result. So a pass compares how far the wall clock moved since the
last pass with how far the boot clock moved (CLOCK_BOOTTIME: monotonic, and it counts a
suspend, which is no step): past MAX_CLOCK_STEP_SECONDS apart, the pass does nothing and says
why. The next pass, an hour later on a clock that stayed put, acts: a clock that was wrong
and is now right is believed after one pass. And no pass deletes more than a bounded share of
a table, so even a step this cannot see (one while the daemon was down) costs a little history
per pass, not all of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MAX_CLOCK_STEP_SECONDS = 86400.0     # a wall clock that moved more than a day against the boot clock is not trusted
MAX_SHARE_PER_PASS = 0.05            # of a table's rows; a steady 90-day retention deletes ~0.05 % per hourly pass
MIN_ROWS_PER_PASS = 100              # a small table still catches up


@dataclass(frozen=True)
class ClockMark:
    wall_seconds: float
    boot_seconds: float


@dataclass(frozen=True)
class RetentionPass:
    cutoff_wall_seconds: float | None    # delete what is older; None: do nothing this pass
    refusal: str | None                  # why not, for the log


def mark_record(mark: ClockMark, boot_id: str | None) -> dict:
    """What is kept of a pass's clocks for the next run."""
    return {"wall_seconds": mark.wall_seconds, "boot_seconds": mark.boot_seconds, "boot_id": boot_id}


def mark_of(record: dict | None, boot_id: str | None) -> ClockMark | None:
    """The last run's mark if it is of this boot (the boot clock starts again at a reboot), else None."""
    if not record or boot_id is None or record.get("boot_id") != boot_id:
        return None
    try:
        return ClockMark(float(record["wall_seconds"]), float(record["boot_seconds"]))
    except (KeyError, TypeError, ValueError):
        return None


def plan(last: ClockMark | None, now: ClockMark, keep_seconds: float) -> RetentionPass:
    """The pass to make now, given the clocks at the last pass (None: the first of this run)."""
    if last is not None:
        step = (now.wall_seconds - last.wall_seconds) - (now.boot_seconds - last.boot_seconds)
        if abs(step) > MAX_CLOCK_STEP_SECONDS:
            return RetentionPass(None, f"the wall clock moved {step / 86400:+.1f} days against the boot clock since "
                                       "the last retention pass; nothing is deleted until it stays put for a pass")
    return RetentionPass(now.wall_seconds - keep_seconds, None)


def rows_per_pass(rows_in_table: int) -> int:
    """The most rows one pass deletes from a table of this size."""
    return max(MIN_ROWS_PER_PASS, math.ceil(rows_in_table * MAX_SHARE_PER_PASS))


def prune_statements(id_range, cutoff_wall_seconds: float) -> list[tuple[str, tuple]]:
    """The deletes of one pass: results and drift older than the cutoff, at most rows_per_pass() of each table,
    the oldest first. id_range(table) -> (min id, max id), or (None, None) for an empty table."""
    statements = []
    for table, column in (("probe_results", "started_at"), ("drift_events", "at")):
        low, high = id_range(table)
        if low is None:
            continue
        statements.append((f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE {column} < ?"
                           f" ORDER BY id LIMIT ?)", (cutoff_wall_seconds, rows_per_pass(high - low + 1))))
    return statements
