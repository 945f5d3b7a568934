"""Durable state in SQLite: probe results, settings drift, baselines, alerts and operator requests.

WAL mode with synchronous=NORMAL: a `kill -9` loses at most the last commit,
never the database. A database that fails its integrity check is moved aside
(logged) and a fresh one is started: a monitor that refuses to run because its
history is damaged protects nothing.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time

log = logging.getLogger("iowarden")

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


class State:
    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o750, exist_ok=True)
        try:
            db = self._connect()
            ok = db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
            if ok:
                return db
            db.close()
            reason = "integrity check failed"
        except sqlite3.DatabaseError as exc:
            reason = str(exc)
        aside = f"{self.path}.corrupt-{int(time.time())}"
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(self.path + suffix):
                os.replace(self.path + suffix, aside + suffix)
        log.error("state database %s is damaged (%s); moved aside to %s, starting fresh", self.path, reason, aside)
        return self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)
        return db

    def add_probe_result(self, record: dict, identity: str | None) -> None:
        with self._lock:
            self.db.execute(
                "INSERT INTO probe_results (started_at, target, profile, device, identity, ok, error, contended,"
                " read_iops, write_iops, read_bw_bytes, write_bw_bytes, clat_p50_seconds, clat_p99_seconds,"
                " clat_p999_seconds, duration_seconds, record) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (record["started_at"], record["target"], record["profile"], record["device"], identity,
                 int(record["ok"]), record["error"], int(record["contended"]), record["read_iops"],
                 record["write_iops"], record["read_bw_bytes"], record["write_bw_bytes"],
                 record["clat_p50_seconds"], record["clat_p99_seconds"], record["clat_p999_seconds"],
                 record["duration_seconds"], json.dumps(record)))

    def add_drift(self, device: str, identity: str | None, setting: str, old, new) -> None:
        with self._lock:
            self.db.execute("INSERT INTO drift_events (at, device, identity, setting, old_value, new_value)"
                            " VALUES (?,?,?,?,?,?)", (time.time(), device, identity, setting, str(old), str(new)))

    def save_baseline(self, identity: str, profile: str, metric: str, learned_at: float, state: dict) -> None:
        with self._lock:
            self.db.execute("INSERT INTO baselines VALUES (?,?,?,?,?,?) ON CONFLICT (identity, profile, metric)"
                            " DO UPDATE SET learned_at=excluded.learned_at, updated_at=excluded.updated_at,"
                            " state=excluded.state",
                            (identity, profile, metric, learned_at, time.time(), json.dumps(state)))

    def load_baselines(self) -> list[tuple[str, str, str, float, dict]]:
        with self._lock:
            rows = self.db.execute("SELECT identity, profile, metric, learned_at, state FROM baselines").fetchall()
        return [(i, p, m, t, json.loads(s)) for i, p, m, t, s in rows]

    def delete_baselines(self, identity: str, profile: str) -> None:
        with self._lock:
            self.db.execute("DELETE FROM baselines WHERE identity = ? AND profile = ?", (identity, profile))

    def open_alert(self, alert: str, identity: str, target: str, profile: str, metric: str | None,
                   severity: str, evidence: dict, causes: list[str]) -> int:
        with self._lock:
            cur = self.db.execute(
                "INSERT INTO alerts (alert, identity, target, profile, metric, severity, raised_at, evidence, causes)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (alert, identity, target, profile, metric, severity, time.time(), json.dumps(evidence),
                 json.dumps(causes)))
            return cur.lastrowid

    def update_alert(self, alert_id: int, severity: str, evidence: dict) -> None:
        with self._lock:
            self.db.execute("UPDATE alerts SET severity = ?, evidence = ? WHERE id = ?",
                            (severity, json.dumps(evidence), alert_id))

    def close_alert(self, alert_id: int) -> None:
        with self._lock:
            self.db.execute("UPDATE alerts SET cleared_at = ? WHERE id = ?", (time.time(), alert_id))

    def alerts(self, open_only: bool = False) -> list[dict]:
        keys = ("id", "alert", "identity", "target", "profile", "metric", "severity", "raised_at", "cleared_at",
                "acked_at", "ack_note")
        sql = f"SELECT {', '.join(keys)}, evidence, causes FROM alerts" \
              + (" WHERE cleared_at IS NULL" if open_only else "") + " ORDER BY id"
        with self._lock:
            rows = self.db.execute(sql).fetchall()
        n = len(keys)
        return [{**dict(zip(keys, r[:n])), "evidence": json.loads(r[n]), "causes": json.loads(r[n + 1])}
                for r in rows]

    def request_baseline(self, action: str, target: str | None, profile: str | None) -> None:
        with self._lock:
            self.db.execute("INSERT INTO baseline_requests (at, action, target, profile) VALUES (?,?,?,?)",
                            (time.time(), action, target, profile))

    def take_baseline_requests(self) -> list[tuple[str, str | None, str | None]]:
        with self._lock:
            rows = self.db.execute("SELECT id, action, target, profile FROM baseline_requests ORDER BY id").fetchall()
            if rows:
                self.db.execute("DELETE FROM baseline_requests WHERE id <= ?", (rows[-1][0],))
        return [(a, t, p) for _, a, t, p in rows]

    def drift_since(self, since: float, devices: set[str]) -> list[tuple]:
        with self._lock:
            rows = self.db.execute("SELECT at, device, setting, old_value, new_value FROM drift_events"
                                   " WHERE at >= ? ORDER BY id", (since,)).fetchall()
        return [r for r in rows if r[1] in devices or r[1] == "host"]

    def recent_results(self, target: str, profile: str, limit: int) -> list[dict]:
        with self._lock:
            rows = self.db.execute("SELECT record FROM probe_results WHERE target = ? AND profile = ?"
                                   " ORDER BY id DESC LIMIT ?", (target, profile, limit)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def save_settings(self, settings: dict[tuple[str, str], object]) -> None:
        """The last settings seen, so drift while the daemon was down is still recorded."""
        with self._lock:
            self.db.execute("DELETE FROM settings_snapshot")
            self.db.executemany("INSERT INTO settings_snapshot VALUES (?, ?)",
                                [(f"{d}\t{k}", json.dumps(v)) for (d, k), v in settings.items()])

    def load_settings(self) -> dict[tuple[str, str], object] | None:
        with self._lock:
            rows = self.db.execute("SELECT key, value FROM settings_snapshot").fetchall()
        return {tuple(k.split("\t", 1)): json.loads(v) for k, v in rows} or None

    def ack_alert(self, alert_id: int, note: str) -> bool:
        with self._lock:
            cur = self.db.execute("UPDATE alerts SET acked_at = ?, ack_note = ? WHERE id = ? AND cleared_at IS NULL",
                                  (time.time(), note, alert_id))
            return cur.rowcount == 1

    def pins(self) -> dict[str, str]:
        with self._lock:
            return dict(self.db.execute("SELECT target, identity FROM target_pins").fetchall())

    def set_pin(self, target: str, identity: str | None) -> None:
        with self._lock:
            if identity is None:
                self.db.execute("DELETE FROM target_pins WHERE target = ?", (target,))
            else:
                self.db.execute("INSERT OR REPLACE INTO target_pins VALUES (?,?,?)", (target, identity, time.time()))

    def prune(self, keep_seconds: float) -> None:
        cutoff = time.time() - keep_seconds
        with self._lock:
            self.db.execute("DELETE FROM probe_results WHERE started_at < ?", (cutoff,))
            self.db.execute("DELETE FROM drift_events WHERE at < ?", (cutoff,))

    def probe_results(self, limit: int = 100) -> list[dict]:
        with self._lock:
            rows = self.db.execute("SELECT record FROM probe_results ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def drift_events(self) -> list[tuple]:
        with self._lock:
            return self.db.execute("SELECT at, device, identity, setting, old_value, new_value FROM drift_events"
                                   " ORDER BY id").fetchall()

    def close(self) -> None:
        with self._lock:
            self.db.close()
