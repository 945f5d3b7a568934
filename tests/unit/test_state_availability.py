"""The state database: damaged is moved aside, unavailable is waited for, and writes wait in memory.

No root: another connection holding SQLite's
exclusive lock is a real "database is locked"; the filled-filesystem cases run in
tests/integration/test_state_full_filesystem.py on a real loop filesystem.
"""
import sqlite3

import pytest

from iowarden.daemon.core.state import State
from iowarden.daemon.core.state_schema import StateDamaged, StateUnavailable


def _record(i):
    return {"started_at": 1e9 + i, "target": "t", "profile": "p", "device": "sdb", "ok": True, "error": None,
            "contended": False, "read_iops": 1000.0 + i, "write_iops": 0.0, "read_bw_bytes": 4e6,
            "write_bw_bytes": 0.0, "clat_p50_seconds": 1e-4, "clat_p99_seconds": 2e-4, "clat_p999_seconds": 3e-4,
            "duration_seconds": 1.0}


def _holder(path):
    """Another process's connection holding the database exclusively (as a stuck backup tool might)."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA locking_mode=EXCLUSIVE")
    con.execute("BEGIN EXCLUSIVE")
    con.execute("INSERT INTO drift_events (at, device, setting) VALUES (0, 'x', 'y')")
    return con


def _writer(path):
    """Another process in the middle of a long write transaction (the daemon's connection stays open)."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("BEGIN IMMEDIATE")
    con.execute("INSERT INTO drift_events (at, device, setting) VALUES (0, 'x', 'y')")
    return con


def _count(path, table="probe_results"):
    con = sqlite3.connect(path)
    try:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        con.close()


def test_a_locked_database_is_unavailable_not_damaged(tmp_path):
    path = str(tmp_path / "state.db")
    st = State(path)
    for i in range(22):
        st.add_probe_result(_record(i), "vol")
    st.close()
    holder = _holder(path)
    try:
        with pytest.raises(StateUnavailable, match="locked"):
            State(path)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not list(tmp_path.glob("state.db.corrupt-*"))     # on main: "damaged (database is locked); moved aside"
    assert _count(path) == 22


def test_a_file_that_is_not_a_database_is_moved_aside(tmp_path):
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateDamaged):
        State(str(path), repair=False)          # the CLI never moves it
    assert path.read_bytes().startswith(b"this is not")
    st = State(str(path))                       # the daemon does, and starts fresh
    assert list(tmp_path.glob("state.db.corrupt-*"))
    st.close()


def test_an_unreadable_directory_is_unavailable(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(StateUnavailable):
        State(str(tmp_path / "f" / "state.db"))   # a file where the directory should be: ENOTDIR


def test_writes_wait_in_memory_while_locked_and_are_written_in_order_after(tmp_path):
    path = str(tmp_path / "state.db")
    st = State(path)
    st.add_probe_result(_record(0), "vol")
    holder = _writer(path)
    try:
        for i in range(1, 8):
            st.add_probe_result(_record(i), "vol")          # must not raise
        aid = st.open_alert("VolumeDegraded", "vol", "t", "p", "read_iops", "warning", {}, ["x"])
        st.close_alert(aid)
        stats = st.stats()
        assert not stats["writable"] and stats["pending_writes"] == 9 and stats["write_errors"] >= 1
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    st.retry_pending()
    assert st.stats() == {"writable": True, "pending_writes": 0, "write_errors": st.stats()["write_errors"],
                          "writes_dropped": 0, "recovered_rows": {}, "lost_rows": {}}
    assert _count(path) == 8
    assert [r["read_iops"] for r in reversed(st.probe_results())] == [1000.0 + i for i in range(8)]
    alerts = st.alerts()
    assert [(a["id"], a["cleared_at"] is not None) for a in alerts] == [(aid, True)]
    st.close()


def test_a_statement_that_can_never_succeed_does_not_block_the_rest(tmp_path):
    st = State(str(tmp_path / "state.db"))
    st._write(("INSERT INTO no_such_table VALUES (1)", ()))
    st.add_probe_result(_record(1), "vol")
    assert st.stats()["pending_writes"] == 0 and _count(st.path) == 1
    st.close()
