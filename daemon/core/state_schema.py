"""The state database's schema, and SQLite's errors told apart: damaged (moved aside for a fresh start) or
only unavailable for now (locked, full, read-only: waited out, never reset). state.py uses both."""
from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS probe_results (
    id INTEGER PRIMARY KEY,
    started_at REAL NOT NULL,
    target TEXT NOT NULL,
    profile TEXT NOT NULL,
    device TEXT,
    identity TEXT,
    ok INTEGER NOT NULL,
    error TEXT,
    contended INTEGER NOT NULL DEFAULT 0,
    read_iops REAL, write_iops REAL, read_bw_bytes REAL, write_bw_bytes REAL,
    clat_p50_seconds REAL, clat_p99_seconds REAL, clat_p999_seconds REAL,
    duration_seconds REAL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS probe_results_key ON probe_results (identity, profile, started_at);
CREATE TABLE IF NOT EXISTS baselines (
    identity TEXT NOT NULL,
    profile TEXT NOT NULL,
    metric TEXT NOT NULL,
    learned_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (identity, profile, metric)
);
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY,
    alert TEXT NOT NULL,
    identity TEXT NOT NULL,
    target TEXT NOT NULL,
    profile TEXT NOT NULL,
    metric TEXT,
    severity TEXT NOT NULL,
    raised_at REAL NOT NULL,
    cleared_at REAL,
    acked_at REAL,
    ack_note TEXT,
    ack_by TEXT,
    evidence TEXT NOT NULL,
    causes TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS baseline_requests (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    action TEXT NOT NULL,
    target TEXT,
    profile TEXT
);
CREATE TABLE IF NOT EXISTS settings_snapshot (
    key TEXT PRIMARY KEY,
    value TEXT
);
CREATE TABLE IF NOT EXISTS target_pins (
    target TEXT PRIMARY KEY,
    identity TEXT NOT NULL,
    pinned_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS marks (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS drift_events (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    device TEXT NOT NULL,
    identity TEXT,
    setting TEXT NOT NULL,
    old_value TEXT,
    new_value TEXT
);
"""


# SQLite's primary result codes (sqlite3.h): the file is damaged ...
SQLITE_CORRUPT, SQLITE_NOTADB = 11, 26
# ... or only unavailable for now: locked, full, read-only, unreadable.
SQLITE_PERM, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN = \
    3, 5, 6, 8, 10, 13, 14
TRANSIENT_CODES = {SQLITE_PERM, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL,
                   SQLITE_CANTOPEN}
DAMAGE_MARK_SUFFIX = ".damaged"     # left by check_integrity(): the next start checks fully and repairs


# Columns added after a table was first shipped: a database of an older version gets them at its open.
ADDED_COLUMNS = (("alerts", "ack_by", "TEXT"),)


def add_missing_columns(db: sqlite3.Connection) -> None:
    for table, column, kind in ADDED_COLUMNS:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


class StateUnavailable(Exception):
    """The database is there and healthy as far as anyone knows, but cannot be opened now."""


class StateDamaged(Exception):
    """The database is corrupt (and this opener may not move it aside)."""


def _code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def is_transient(exc: BaseException) -> bool:
    """A write that may succeed later (full, locked, read-only for now), as opposed to a bad statement."""
    if isinstance(exc, OSError):
        return True
    code = _code(exc)
    if code is not None:
        return code in TRANSIENT_CODES
    # without a code (older Python), the messages SQLite uses for these
    text = str(exc).lower()
    return any(w in text for w in ("locked", "full", "unable to open", "readonly", "disk i/o", "busy"))


def is_corrupt(exc: BaseException) -> bool:
    code = _code(exc)
    if code is not None:
        return code in (SQLITE_CORRUPT, SQLITE_NOTADB)
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


class OffCoreWrite(RuntimeError):
    """A write from a thread that is not the database's one writer (the core, once bound)."""


def quick_check(file: str, timeout_seconds: float) -> str | None:
    """SQLite's quick_check on a read-only connection of its own: None when the file is sound (or cannot be
    read now: locked, unreadable, which is not a finding), else what is wrong."""
    try:
        db = sqlite3.connect(f"file:{file}?mode=ro", uri=True, timeout=timeout_seconds)
        try:
            verdict = db.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            db.close()
    except (sqlite3.Error, OSError) as exc:
        if not is_corrupt(exc):
            return None
        verdict = str(exc)
    return None if verdict == "ok" else str(verdict)
