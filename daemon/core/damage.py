"""Damage to the state database costs the damaged part, and is said.

A row whose stored JSON does not decode (bit rot that SQLite's quick_check does not see) is set aside:
counted, named once with its table and id, and the rest loads.

What a damaged state database still holds is copied into the fresh one before the damaged file is left aside.

A database SQLite calls corrupt (a truncated file, a page of garbage) usually still reads everywhere but in
its damaged pages: the learned baselines, the target pins and the open alerts are what a fresh start would
cost most (a re-pinned target, a new warm-up without alerting, a page that forgets it was sent). Each table
is read in rowid order; where a read fails, the reader steps over the damaged range (SQLite's b-tree still
seeks past a bad leaf) and goes on. What was kept and what was lost is counted per table.

Lost rows are counted where they can be: in tables keyed by an increasing id (results, alerts, drift), the
ids stepped over; elsewhere one per damaged range (at least one row was there); a table that cannot be read
at all counts its loss as unknown (-1 in the report, "unknown" in the journal).
"""
from __future__ import annotations

import collections
import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field

from .state_schema import quick_check

log = logging.getLogger("iowarden")

# the tables worth a salvage, in the order they matter to a restarted daemon; operator requests
# (baseline_requests) are taken within seconds of being made and are not kept
TABLES = ("baselines", "target_pins", "alerts", "marks", "settings_snapshot", "probe_results", "drift_events")
ID_TABLES = frozenset({"probe_results", "alerts", "drift_events"})   # rowid = an id handed out in order
MAX_STEPS_OVER_DAMAGE = 64       # doublings when looking past a damaged range (2**64 covers every rowid)
MAX_DAMAGED_RANGES = 10_000      # per table: a file of garbage is not read for ever


# What the daemon reads of its database before it serves: read once at the open, so a damaged page under any
# of them moves the file aside (with what still reads salvaged) instead of failing the start. The newest
# results only: a 90-day table is not walked for it.
START_READS = ("SELECT * FROM baselines", "SELECT * FROM alerts WHERE cleared_at IS NULL", "SELECT * FROM target_pins",
               "SELECT * FROM settings_snapshot", "SELECT * FROM marks",
               "SELECT * FROM probe_results ORDER BY id DESC LIMIT 5000", "SELECT max(id) FROM alerts",
               "SELECT * FROM drift_events ORDER BY id DESC LIMIT 1000",
               # the small tables' keys are looked up and written through their indexes: read those whole too
               "SELECT key FROM marks ORDER BY key", "SELECT target FROM target_pins ORDER BY target",
               "SELECT key FROM settings_snapshot ORDER BY key",
               "SELECT identity, profile, metric FROM baselines ORDER BY identity, profile, metric")


def read_what_a_start_reads(db: sqlite3.Connection) -> None:
    for sql in START_READS:
        for _row in db.execute(sql):
            pass


class Damage:
    """What this start lost of the state database and what it kept, per table (for /metrics and the journal)."""

    def __init__(self, path: str):
        self.path = path
        self.recovered_rows: dict[str, int] = {}                      # salvaged from a database moved aside
        self.lost_rows: collections.Counter = collections.Counter()   # known lost, or set aside as unreadable
        self._said: set[tuple[str, object]] = set()

    def salvage(self, damaged_file: str, fresh: sqlite3.Connection) -> "SalvageReport":
        report = salvage(damaged_file, fresh)
        self.recovered_rows.update(report.kept)
        for table, lost in report.lost.items():
            if lost:
                self.lost_rows[table] += max(lost, 1)   # unknown: at least one
        return report

    def move_aside(self, file: str, path: str, reason: str, connect) -> sqlite3.Connection:
        """Only a file that is really corrupt (SQLITE_CORRUPT, SQLITE_NOTADB, a failed integrity check, a page
        a start must read) comes here: a monitor that refuses to run because its history is damaged protects
        nothing. The file is left aside, a fresh one made, and every row that still reads copied into it."""
        stamp = f".corrupt-{int(time.time())}"
        for suffix in ("", "-wal", "-shm"):
            if os.path.lexists(file + suffix):
                os.replace(file + suffix, file + stamp + suffix)
        db = connect()
        report = self.salvage(file + stamp, db)
        log.error("state database %s is damaged (%s); moved aside to %s and started afresh with what still "
                  "read: %s", path, reason, path + stamp, report.says())
        return db

    def check(self, file: str, mark: str, timeout_seconds: float) -> str | None:
        """SQLite's quick_check on a connection of its own, read-only: any thread, while the core writes. None
        when the file is sound; else what is wrong, and the mark that has the next start check and repair it
        (the daemon does not move a database it is writing)."""
        verdict = quick_check(file, timeout_seconds)
        if verdict is None:
            return None
        try:
            os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        except OSError as exc:
            log.error("state database %s: cannot leave the mark for the next start (%s)", self.path, exc)
        return str(verdict)[:300]

    def decoded(self, table: str, row_id, text, kind: type = dict):
        """A stored JSON value, or None when the row is damaged: set aside, counted, said once per row."""
        try:
            value = json.loads(text)
            if isinstance(value, kind):
                return value
            problem = f"holds {type(value).__name__}, not {kind.__name__}"
        except (ValueError, TypeError, RecursionError) as exc:
            problem = str(exc)[:120]
        if (table, row_id) not in self._said:
            self._said.add((table, row_id))
            self.lost_rows[table] += 1
            log.error("state database %s: %s row %s cannot be read (%s); it is set aside and the rest is used",
                      self.path, table, row_id, problem)
        return None


@dataclass
class SalvageReport:
    kept: dict[str, int] = field(default_factory=dict)     # table -> rows copied into the fresh database
    lost: dict[str, int] = field(default_factory=dict)     # table -> rows known lost (-1: unknown, unreadable)

    def says(self) -> str:
        parts = []
        for table in TABLES:
            kept, lost = self.kept.get(table, 0), self.lost.get(table, 0)
            if kept or lost:
                parts.append(f"{table} {kept} kept, {'an unknown number' if lost < 0 else lost} lost")
        return "; ".join(parts) or "nothing to keep"


def salvage(damaged_file: str, fresh: sqlite3.Connection) -> SalvageReport:
    """Copy every row of `damaged_file` that still reads into `fresh` (a database with the current schema)."""
    report = SalvageReport()
    try:
        src = sqlite3.connect(f"file:{damaged_file}?mode=ro", uri=True, timeout=2.0)
        # a truncated file's header counts pages it no longer has, which SQLite refuses to open as corrupt
        # unless the schema may be damaged (this connection only): then it reads the pages that are there
        src.execute("PRAGMA writable_schema=ON")
    except (sqlite3.Error, OSError):
        return report
    try:
        for table in TABLES:
            kept, lost = _copy_table(src, fresh, table)
            report.kept[table], report.lost[table] = kept, lost
    finally:
        src.close()
    return report


def _columns(db: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in db.execute(f"PRAGMA table_info({table})")]


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> tuple[int, int]:
    try:
        have = set(_columns(src, table))
    except sqlite3.DatabaseError:
        return 0, -1
    if not have:
        return 0, 0    # an older database without this table
    cols = [c for c in _columns(dst, table) if c in have]
    if not cols:
        return 0, 0
    names = ", ".join(cols)
    insert = f"INSERT OR REPLACE INTO {table} ({names}) VALUES ({', '.join('?' * len(cols))})"
    kept = lost = 0
    after = None    # the last rowid read
    ranges = 0
    dst.execute("BEGIN")
    try:
        while ranges <= MAX_DAMAGED_RANGES:
            try:
                # `>= after + 1`, not `> after`: the seek must start past the damage, not step out of it
                cur = src.execute(f"SELECT rowid, {names} FROM {table}"
                                  + ("" if after is None else " WHERE rowid >= ?") + " ORDER BY rowid",
                                  () if after is None else (after + 1,))
                for row in cur:
                    try:
                        dst.execute(insert, row[1:])
                        kept += 1
                    except sqlite3.Error:
                        lost += 1     # a row whose values break a constraint: garbage that happened to read
                    after = row[0]
                break
            except sqlite3.DatabaseError:
                # SQLite steps one row ahead of the row handed over, so the failure may be a row early:
                # from here the next sound row is found by seeking, and read on its own
                ranges += 1
                nxt = _next_readable(src, table, after)
                if nxt is None:   # damaged to its end: at least one row was there, or none read at all
                    lost = -1 if kept == 0 and after is None else lost + 1
                    break
                gap = nxt - (1 if after is None else after + 1)
                if gap > 0:
                    lost += gap if table in ID_TABLES and after is not None else 1
                try:
                    row = src.execute(f"SELECT rowid, {names} FROM {table} WHERE rowid = ?", (nxt,)).fetchone()
                    dst.execute(insert, row[1:])
                    kept += 1
                except sqlite3.Error:
                    lost += 1
                after = nxt
    finally:
        dst.execute("COMMIT")
    return kept, lost


def _next_readable(src: sqlite3.Connection, table: str, after: int | None) -> int | None:
    """The first rowid past a damaged range whose row reads, or None when there is none to be found.

    A seek to a rowid inside the damaged leaf fails and one past it lands on the next sound leaf, so the
    first seek that works is found by doubling the step, then halving back between the last seek that
    failed and the first that worked: no sound row between the two is stepped over."""
    base = 0 if after is None else after    # rowids the daemon's tables hand out start at 1

    def seek(probe: int):
        """(True, rowid or None) where the seek works, (False, None) inside the damage."""
        try:
            row = src.execute(f"SELECT rowid FROM {table} WHERE rowid >= ? ORDER BY rowid LIMIT 1",
                              (probe,)).fetchone()
            if row is not None:   # the b-tree seeks there; the row itself must read too
                src.execute(f"SELECT * FROM {table} WHERE rowid = ?", (row[0],)).fetchone()
            return True, None if row is None else row[0]
        except sqlite3.DatabaseError:
            return False, None

    failed, step = base, 1
    for _ in range(MAX_STEPS_OVER_DAMAGE):
        if base + step >= (1 << 63) - 1:
            return None
        ok, found = seek(base + step)
        if ok:
            break
        failed, step = base + step, step * 2
    else:
        return None
    worked, answer = base + step, found
    while worked - failed > 1:     # the first seek past the damage, so no sound row is missed
        mid = (failed + worked) // 2
        ok, found = seek(mid)
        if ok:
            worked, answer = mid, found
        else:
            failed = mid
    return answer
