"""Durable state in SQLite: probe results, settings drift, baselines, alerts and operator requests.

WAL mode with synchronous=NORMAL: a `kill -9` loses at most the last commit,
never the database.

Damaged and unavailable are told apart by SQLite's own error code: only a file that
is really corrupt is moved aside (damage.py); one that is locked, on a full
filesystem or unreadable for now is healthy: opening it is retried, never reset.

Writes never raise into the daemon. Each is a transaction queued in memory
(bounded) and written in order; while the filesystem is full or the file locked,
they wait there and are retried, one log line says so, and the self-metrics show
it. Alert ids are handed out here, so an alert can be raised while its row waits.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Mapping

from . import retention
from .damage import Damage, read_what_a_start_reads
from .state_schema import (DAMAGE_MARK_SUFFIX, SCHEMA, OffCoreWrite, StateDamaged, StateUnavailable,
                           add_missing_columns, is_corrupt, is_transient)


def _plain(value):
    """What json cannot write by itself: the read-only mappings events and snapshots carry."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _json(value) -> str:
    return json.dumps(value, default=_plain)

log = logging.getLogger("iowarden")

MAX_PENDING_WRITES = 20000          # transactions kept in memory while the database cannot take them
BUSY_TIMEOUT_SECONDS = 2.0          # how long a write waits for another process's lock before it queues


class State:
    def __init__(self, path: str, repair: bool = True, opened_at: str | None = None, full_check: bool | None = None):
        """repair: move a corrupt database aside and start fresh (the daemon); else raise StateDamaged (the CLI).
        opened_at: the database's path through the daemon's verified state directory (statedir.StateDir.at),
        which no rename or link can redirect; `path` is then what messages say.

        full_check: run SQLite's quick_check before use (it reads the whole file: 65 s on 9 GB). None: only
        when the last background check (check_integrity) found damage and left its mark. Without it, a
        file that is not a database or has a broken header still fails the open (SQLite says so at once).

        Raises StateUnavailable when the database cannot be opened now (locked, full, unreadable):
        the caller retries; nothing is moved or reset.
        """
        self.path = path
        self._file = opened_at or path
        self._lock = threading.Lock()
        self._pending: collections.deque = collections.deque()   # transactions: [(sql, params), ...]
        self.writable = True
        self.write_errors_total = 0
        self.writes_dropped_total = 0
        self._writer_ident: int | None = None   # once bound: the one thread allowed to write (the core's)
        self._closed = False
        # damage costs the damaged part: a row that does not decode is set aside (counted, said once) and
        # the rest loads; a database moved aside has what still reads copied over first
        self.damage = Damage(path)
        self.damage_mark = self._file + DAMAGE_MARK_SUFFIX
        if full_check is None:
            full_check = os.path.lexists(self.damage_mark)
        self.db = self._open(repair, full_check)
        if full_check and os.path.lexists(self.damage_mark):
            os.unlink(self.damage_mark)   # checked now; repaired if it had to be
        self._next_alert_id = (self.db.execute("SELECT max(id) FROM alerts").fetchone()[0] or 0) + 1

    def _open(self, repair: bool, full_check: bool) -> sqlite3.Connection:
        if self._file == self.path:   # the CLI's own short-lived opening; the daemon's directory is verified
            try:
                os.makedirs(os.path.dirname(self.path) or ".", mode=0o750, exist_ok=True)
            except OSError as exc:
                raise StateUnavailable(f"cannot create {os.path.dirname(self.path)}: {exc.strerror}") from None
        db = None
        try:
            db = self._connect()
            if full_check and db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                reason = "integrity check failed"
            else:
                if repair:
                    read_what_a_start_reads(db)
                return db
        except (sqlite3.Error, OSError) as exc:
            if not is_corrupt(exc):
                raise StateUnavailable(f"{exc}") from None
            reason = str(exc)
        finally:
            if db is not None and "reason" in locals():
                db.close()
        if not repair:
            raise StateDamaged(f"state database {self.path} is damaged ({reason}); `iowarden run` moves it aside")
        try:
            return self.damage.move_aside(self._file, self.path, reason, self._connect)
        except (sqlite3.Error, OSError) as exc:
            raise StateUnavailable(str(exc)) from None

    def check_integrity(self) -> str | None:
        """The whole-file check, run beside the daemon (any thread): None when sound, else what is wrong."""
        return self.damage.check(self._file, self.damage_mark, BUSY_TIMEOUT_SECONDS)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._file, check_same_thread=False, isolation_level=None,
                             timeout=BUSY_TIMEOUT_SECONDS)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(SCHEMA)
            add_missing_columns(db)
        except BaseException:
            db.close()
            raise
        return db

    # ---- writes: queued, in order, never raising ------------------------------------------------

    def bind_writer(self, ident: int | None) -> None:
        """From now on only this thread writes (the daemon binds its core thread; None unbinds). The CLI's
        short-lived processes never bind: `baseline` and `ack` write their own requests."""
        self._writer_ident = ident

    def _check_writer(self) -> None:
        # Raising, not logging: a write off the core is a wiring bug that would race the core's own
        # writes and alerts; the part that made it is counted and restarted, and tests fail on it.
        if self._writer_ident is not None and threading.get_ident() != self._writer_ident:
            raise OffCoreWrite(f"state database written from thread {threading.current_thread().name!r}, "
                               "not the core: post an event instead")

    def _write(self, *statements: tuple[str, tuple]) -> None:
        self._check_writer()
        with self._lock:
            if len(self._pending) >= MAX_PENDING_WRITES:
                self._pending.popleft()
                self.writes_dropped_total += 1
                if self.writes_dropped_total == 1 or self.writes_dropped_total % 1000 == 0:
                    log.error("state database %s: %d writes waiting is the most kept in memory; the oldest are "
                              "dropped (%d so far)", self.path, MAX_PENDING_WRITES, self.writes_dropped_total)
            self._pending.append(statements)
            if self.writable:
                # while it is not, retry_pending() tries (every few seconds): a probe worker must
                # not wait out SQLite's busy timeout on every write
                self._drain_locked()

    def retry_pending(self) -> None:
        """Write what waits (the core calls this every few seconds, so waiting writes go out without new ones)."""
        self._check_writer()
        with self._lock:
            if self._pending:
                self._drain_locked()

    def _drain_locked(self) -> None:
        while self._pending:
            tx = self._pending[0]
            try:
                self.db.execute("BEGIN IMMEDIATE")
                for sql, params in tx:
                    self.db.execute(sql, params)
                self.db.execute("COMMIT")
            except (sqlite3.Error, OSError) as exc:
                try:
                    self.db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                self.write_errors_total += 1
                if is_transient(exc):
                    if self.writable:
                        self.writable = False
                        log.error("state database %s cannot be written now (%s): results are kept in memory and "
                                  "written when it can be (up to %d writes)", self.path, exc, MAX_PENDING_WRITES)
                    return
                self._pending.popleft()   # this statement's own fault: it would fail for ever
                log.error("state database %s refused a write (%s); dropped it: %s", self.path, exc,
                          tx[0][0].split("(")[0])
                continue
            self._pending.popleft()
        if not self.writable:
            self.writable = True
            log.warning("state database %s is writable again: every waiting write is saved", self.path)

    def stats(self) -> dict:
        with self._lock:
            return {"writable": self.writable, "pending_writes": len(self._pending),
                    "write_errors": self.write_errors_total, "writes_dropped": self.writes_dropped_total,
                    "recovered_rows": dict(self.damage.recovered_rows), "lost_rows": dict(self.damage.lost_rows)}

    def add_probe_result(self, record: dict, identity: str | None) -> None:
        self._write((
                "INSERT INTO probe_results (started_at, target, profile, device, identity, ok, error, contended,"
                " read_iops, write_iops, read_bw_bytes, write_bw_bytes, clat_p50_seconds, clat_p99_seconds,"
                " clat_p999_seconds, duration_seconds, record) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (record["started_at"], record["target"], record["profile"], record["device"], identity,
                 int(record["ok"]), record["error"], int(record["contended"]), record["read_iops"],
                 record["write_iops"], record["read_bw_bytes"], record["write_bw_bytes"],
                 record["clat_p50_seconds"], record["clat_p99_seconds"], record["clat_p999_seconds"],
                 record["duration_seconds"], _json(record))))

    def add_drift(self, device: str, identity: str | None, setting: str, old, new) -> None:
        self._write(("INSERT INTO drift_events (at, device, identity, setting, old_value, new_value)"
                     " VALUES (?,?,?,?,?,?)", (time.time(), device, identity, setting, str(old), str(new))))

    def save_baseline(self, identity: str, profile: str, metric: str, learned_at: float, state: dict) -> None:
        self._write(("INSERT INTO baselines VALUES (?,?,?,?,?,?) ON CONFLICT (identity, profile, metric)"
                     " DO UPDATE SET learned_at=excluded.learned_at, updated_at=excluded.updated_at,"
                     " state=excluded.state",
                     (identity, profile, metric, learned_at, time.time(), _json(state))))

    def load_baselines(self) -> list[tuple[str, str, str, float, dict]]:
        with self._lock:
            rows = self.db.execute("SELECT rowid, identity, profile, metric, learned_at, state FROM baselines").fetchall()
        decoded = [(i, p, m, t, self.damage.decoded("baselines", rid, s)) for rid, i, p, m, t, s in rows]
        return [row for row in decoded if row[4] is not None]

    def delete_baselines(self, identity: str, profile: str) -> None:
        self._write(("DELETE FROM baselines WHERE identity = ? AND profile = ?", (identity, profile)))

    def next_alert_id(self) -> int:
        """The id the next alert takes: alert ids are never reused, whatever was raised and cleared before."""
        with self._lock:
            return self._next_alert_id

    def open_alert(self, alert: str, identity: str, target: str, profile: str, metric: str | None,
                   severity: str, evidence: dict, causes: list[str], alert_id: int | None = None,
                   raised_at: float | None = None) -> int:
        """Record a raised alert, under the id its verdict gave it (or the next one)."""
        with self._lock:
            if alert_id is None:
                alert_id = self._next_alert_id
            self._next_alert_id = max(self._next_alert_id, alert_id + 1)
        self._write((
            "INSERT INTO alerts (id, alert, identity, target, profile, metric, severity, raised_at, evidence, causes)"
            " VALUES (?,?,?,?,?,?,?,?,?,?)",
            (alert_id, alert, identity, target, profile, metric, severity,
             time.time() if raised_at is None else raised_at, _json(evidence), _json(causes))))
        return alert_id

    def update_alert(self, alert_id: int, severity: str, evidence: dict, causes: list | None = None) -> None:
        if causes is None:
            self._write(("UPDATE alerts SET severity = ?, evidence = ? WHERE id = ?",
                         (severity, _json(evidence), alert_id)))
        else:
            self._write(("UPDATE alerts SET severity = ?, evidence = ?, causes = ? WHERE id = ?",
                         (severity, _json(evidence), _json(causes), alert_id)))

    def close_alert(self, alert_id: int) -> None:
        self._write(("UPDATE alerts SET cleared_at = ? WHERE id = ?", (time.time(), alert_id)))

    def alerts(self, open_only: bool = False) -> list[dict]:
        keys = ("id", "alert", "identity", "target", "profile", "metric", "severity", "raised_at", "cleared_at",
                "acked_at", "ack_note", "ack_by")
        sql = f"SELECT {', '.join(keys)}, evidence, causes FROM alerts" \
              + (" WHERE cleared_at IS NULL" if open_only else "") + " ORDER BY id"
        with self._lock:
            rows = self.db.execute(sql).fetchall()
        n = len(keys)
        out = []
        for r in rows:
            evidence = self.damage.decoded("alerts", r[0], r[n])
            causes = self.damage.decoded("alerts", r[0], r[n + 1], list) if evidence is not None else None
            if causes is not None:
                out.append({**dict(zip(keys, r[:n])), "evidence": evidence, "causes": causes})
        return out

    def request_baseline(self, action: str, target: str | None, profile: str | None) -> None:
        with self._lock:
            self.db.execute("INSERT INTO baseline_requests (at, action, target, profile) VALUES (?,?,?,?)",
                            (time.time(), action, target, profile))

    def take_baseline_requests(self) -> list[tuple[str, str | None, str | None]]:
        """Operator requests, each taken once: none while they cannot be marked taken (full, locked)."""
        self._check_writer()
        with self._lock:
            try:
                rows = self.db.execute("SELECT id, action, target, profile FROM baseline_requests"
                                       " ORDER BY id").fetchall()
                if rows:
                    self.db.execute("DELETE FROM baseline_requests WHERE id <= ?", (rows[-1][0],))
            except sqlite3.Error as exc:
                if not is_transient(exc):
                    raise
                return []   # taken on a later probe, when the database can record it
        return [(a, t, p) for _, a, t, p in rows]

    def drift_since(self, since: float, devices: set[str]) -> list[tuple]:
        with self._lock:
            rows = self.db.execute("SELECT at, device, setting, old_value, new_value FROM drift_events"
                                   " WHERE at >= ? ORDER BY id", (since,)).fetchall()
        return [r for r in rows if r[1] in devices or r[1] == "host"]

    def recent_results(self, target: str, profile: str, limit: int) -> list[dict]:
        return self._records("SELECT id, record FROM probe_results WHERE target = ? AND profile = ? ORDER BY id DESC"
                             " LIMIT ?", (target, profile, limit))

    def _records(self, sql: str, params: tuple) -> list[dict]:
        with self._lock:
            rows = self.db.execute(sql, params).fetchall()
        return [r for r in (self.damage.decoded("probe_results", i, text) for i, text in rows) if r is not None]

    def save_settings(self, settings: dict[tuple[str, str], object]) -> None:
        """The last settings seen, so drift while the daemon was down is still recorded."""
        self._write(("DELETE FROM settings_snapshot", ()),
                    *[("INSERT INTO settings_snapshot VALUES (?, ?)", (f"{d}\t{k}", _json(v)))
                      for (d, k), v in settings.items()])

    def load_settings(self) -> dict[tuple[str, str], object] | None:
        with self._lock:
            rows = self.db.execute("SELECT key, value FROM settings_snapshot").fetchall()
        out = {}
        for k, v in rows:
            value = self.damage.decoded("settings_snapshot", k, v, object)
            if value is not None or v == "null":
                out[tuple(k.split("\t", 1))] = value
        return out or None

    def ack_alert(self, alert_id: int, note: str, by: str = "unknown") -> bool:
        """Mark an open alert acknowledged (who and why), and queue its id for the running daemon, which
        then serves it as acknowledged (iowarden_alert_acknowledged) so the rules stop paging."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")   # both or neither: an ack the daemon never hears of would page on
            try:
                cur = self.db.execute("UPDATE alerts SET acked_at = ?, ack_note = ?, ack_by = ? WHERE id = ? AND "
                                      "cleared_at IS NULL", (time.time(), note, by, alert_id))
                if cur.rowcount == 1:
                    self.db.execute("INSERT INTO baseline_requests (at, action, target, profile) VALUES (?,?,?,?)",
                                    (time.time(), "ack", str(alert_id), None))
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
            return cur.rowcount == 1

    def alert_ack(self, alert_id: int) -> tuple[str, str] | None:
        """(who, note) of an acknowledged open alert."""
        with self._lock:
            row = self.db.execute("SELECT ack_by, ack_note FROM alerts WHERE id = ? AND acked_at IS NOT NULL",
                                  (alert_id,)).fetchone()
        return None if row is None else (row[0] or "unknown", row[1] or "")

    def target_identities(self) -> dict[str, set[str]]:
        """Each target ever probed -> the volumes (identities) its probes measured."""
        out: dict[str, set[str]] = {}
        with self._lock:
            for target, identity in self.db.execute(
                    "SELECT DISTINCT target, identity FROM probe_results WHERE identity IS NOT NULL"):
                out.setdefault(target, set()).add(identity)
        return out

    def pins(self) -> dict[str, str]:
        with self._lock:
            return dict(self.db.execute("SELECT target, identity FROM target_pins").fetchall())

    def set_pin(self, target: str, identity: str | None) -> None:
        if identity is None:
            self._write(("DELETE FROM target_pins WHERE target = ?", (target,)))
        else:
            self._write(("INSERT OR REPLACE INTO target_pins VALUES (?,?,?)", (target, identity, time.time())))

    def mark(self, key: str) -> dict | None:
        """A small record the daemon keeps across its runs (the last retention pass's clocks)."""
        with self._lock:
            row = self.db.execute("SELECT value FROM marks WHERE key = ?", (key,)).fetchone()
        try:
            return json.loads(row[0]) if row else None
        except ValueError:
            return None

    def set_mark(self, key: str, value: dict) -> None:
        self._write(("INSERT OR REPLACE INTO marks VALUES (?, ?)", (key, _json(value))))

    def prune(self, cutoff_wall_seconds: float) -> None:
        """Delete results and drift older than the cutoff, at most retention.rows_per_pass() of each table
        (the oldest first): a wrong cutoff costs a share of the history, never all of it."""
        def id_range(table):
            with self._lock:   # the table's size from its ids: count(*) would read a 9 GB table
                return self.db.execute(f"SELECT min(id), max(id) FROM {table}").fetchone()
        statements = retention.prune_statements(id_range, cutoff_wall_seconds)
        if statements:
            self._write(*statements)

    def probe_results(self, limit: int = 100) -> list[dict]:
        return self._records("SELECT id, record FROM probe_results ORDER BY id DESC LIMIT ?", (limit,))

    def drift_events(self, limit: int | None = None) -> list[tuple]:
        """Drift, oldest first; with `limit`, only the newest that many (read as such: a 9 GB database's every
        row is not loaded to keep 20)."""
        with self._lock:
            if limit is None:
                return self.db.execute("SELECT at, device, identity, setting, old_value, new_value FROM drift_events"
                                       " ORDER BY id").fetchall()
            rows = self.db.execute("SELECT at, device, identity, setting, old_value, new_value FROM drift_events"
                                   " ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return rows[::-1]

    def close(self) -> None:
        """Write what waits if the database takes it now; say what is lost if it does not. Once: a second
        close (a test's teardown after the core closed it) does nothing."""
        if self._closed:
            return
        self._check_writer()
        self._closed = True
        with self._lock:
            if self._pending:
                self._drain_locked()
            if self._pending:
                log.error("state database %s still cannot be written: %d waiting writes are lost at exit",
                          self.path, len(self._pending))
            self.db.close()
