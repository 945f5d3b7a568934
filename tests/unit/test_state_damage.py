"""Damage to the state database costs the damaged part, and is said.

A row whose stored JSON no longer decodes (bit rot that SQLite's quick_check does not see) is set aside,
counted and named once with its table and id; everything else loads. A database SQLite calls corrupt (a
truncated file, a page of garbage) is moved aside with every row that still reads copied into the fresh
one, and the journal and iowarden_state_recovered_rows / _lost_rows say what was kept and lost.

The fuzzers damage a database row by row and page by page and prove the start always succeeds (State,
Health and every read the daemon makes before it serves) and that every undamaged row is kept.
"""
import logging
import os
import random
import shutil
import sqlite3

import pytest

from iowarden.daemon.core.state import State
from iowarden.daemon.verdicts.detect import Detector, DetectorParams
from iowarden.daemon.core.effects import StoredHealth

PAGE = 4096

# table -> the column that holds each row's unique marker
MARKER = {"probe_results": "target", "baselines": "identity", "alerts": "target", "target_pins": "target",
          "settings_snapshot": "key", "drift_events": "device", "marks": "key"}


def _record(i, target):
    return {"started_at": 1e9 + i, "target": target, "profile": "p", "device": "sdb", "ok": True, "error": None,
            "contended": False, "read_iops": 1000.0 + i, "write_iops": 0.0, "read_bw_bytes": 4e6,
            "write_bw_bytes": 0.0, "clat_p50_seconds": 1e-4, "clat_p99_seconds": 2e-4, "clat_p999_seconds": 3e-4,
            "duration_seconds": 1.0, "padding": "x" * 300}


def _baseline_state():
    det = Detector("read_iops", DetectorParams(warmup_probes=3))
    for v in (1000.0, 1010.0, 990.0, 1005.0):
        det.update(v)
    return det.to_state()


def _build(path, results=120, baselines=40, alerts=6, pins=6, drift=30):
    st = State(path)
    for i in range(results):
        st.add_probe_result(_record(i, f"R{i:05d}Q"), f"vol-{i % 5}")
    base = _baseline_state()
    for i in range(baselines):
        st.save_baseline(f"B{i:05d}Q", "randread", "read_iops", 1e9, base)
    for i in range(alerts):
        st.open_alert("VolumeDegraded", f"vol-{i}", f"A{i:05d}Q", "randread", "read_iops", "critical",
                      {"metrics": {"read_iops": {"value": 10.0, "baseline": 1000.0}}, "where": {"devices": ["sdb"]}},
                      ["the device itself"])
    for i in range(pins):
        st.set_pin(f"P{i:05d}Q", f"vol-{i}")
    for i in range(drift):
        st.add_drift(f"D{i:05d}Q", None, "scheduler", "none", "mq-deadline")
    st.save_settings({(f"S{i:05d}Q", "scheduler"): "none" for i in range(10)})
    st.set_mark("M00000Q", {"wall": 1e9})
    st.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    st.close()


def _markers(path) -> set[str]:
    """Every row's marker, read with SQLite directly (what a table holds, whether it decodes or not)."""
    db = sqlite3.connect(path)
    try:
        return {row[0].split("\t")[0] for table, col in MARKER.items() for row in db.execute(f"SELECT {col} FROM {table}")}
    finally:
        db.close()


def _start(path):
    """What the daemon does with its database before it serves; returns what it loaded, by marker."""
    state = State(path)
    health = StoredHealth(state, DetectorParams())
    loaded = {k[0] for k in health.detectors} | {a.target for a in health.open.values()} | set(health.pins)
    loaded |= {r["target"] for r in state.probe_results(limit=5000)}
    loaded |= {k[0] for k in state.load_settings() or {}}
    loaded |= {row[1] for row in state.drift_events(limit=1000)}
    if state.mark("M00000Q") is not None:
        loaded.add("M00000Q")
    return state, loaded


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pristine") / "state.db")
    _build(path)
    return path


def _copy(pristine, tmp_path):
    path = str(tmp_path / "state.db")
    shutil.copyfile(pristine, path)
    return path


def test_a_row_that_does_not_decode_is_set_aside_named_once_and_the_rest_loads(pristine, tmp_path, caplog):
    path = _copy(pristine, tmp_path)
    db = sqlite3.connect(path)
    row_id = db.execute("SELECT id FROM probe_results WHERE target = 'R00007Q'").fetchone()[0]
    # 64 bytes flipped inside the stored record (quick_check still says ok: the page is sound)
    text = db.execute("SELECT record FROM probe_results WHERE id = ?", (row_id,)).fetchone()[0]
    damaged = text[:40] + "".join(chr(ord(c) ^ 0x1F) for c in text[40:104]) + text[104:]
    db.execute("UPDATE probe_results SET record = ? WHERE id = ?", (damaged, row_id))
    db.execute("UPDATE baselines SET state = '{\"values\": [1, 2' WHERE identity = 'B00003Q'")
    db.commit()
    assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    db.close()
    expected = _markers(pristine)
    with caplog.at_level(logging.ERROR, logger="iowarden"):
        state, loaded = _start(path)
        state.probe_results(limit=5000)   # read again: said once
    assert loaded == expected - {"R00007Q", "B00003Q"}
    assert state.stats()["lost_rows"] == {"probe_results": 1, "baselines": 1}
    said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(said) == 2, said
    assert any(f"probe_results row {row_id} cannot be read" in m for m in said)
    assert any("baselines row" in m for m in said)
    state.close()


def test_a_row_that_decodes_to_something_else_is_set_aside(pristine, tmp_path):
    path = _copy(pristine, tmp_path)
    db = sqlite3.connect(path)
    db.execute("UPDATE alerts SET causes = '{\"not\": \"a list\"}' WHERE target = 'A00002Q'")
    db.execute("UPDATE baselines SET state = '{\"metric\": 7}' WHERE identity = 'B00011Q'")  # a dict, not a baseline
    db.commit()
    db.close()
    state, loaded = _start(path)
    assert loaded == _markers(pristine) - {"A00002Q", "B00011Q"}
    assert state.stats()["lost_rows"]["alerts"] == 1
    state.close()


def test_a_truncated_database_is_moved_aside_with_every_row_that_reads_kept_and_the_loss_said(
        pristine, tmp_path, caplog):
    path = _copy(pristine, tmp_path)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2 // PAGE * PAGE)
    with caplog.at_level(logging.ERROR, logger="iowarden"):
        state, loaded = _start(path)
    aside = [n for n in os.listdir(tmp_path) if ".corrupt-" in n and not n.endswith(("-wal", "-shm"))]
    assert len(aside) == 1
    stats = state.stats()
    assert sum(stats["recovered_rows"].values()) > 0
    assert sum(stats["lost_rows"].values()) > 0
    # what was recovered is what is loaded now, and the journal says both per table
    assert len(loaded) > 0 and loaded <= _markers(pristine)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "started afresh with what still read" in said and "kept" in said and "lost" in said
    assert _markers(path) == loaded
    state.close()


def _pages(path):
    db = sqlite3.connect(path)
    try:
        return {pageno: (name, kind) for name, pageno, kind in
                db.execute("SELECT name, pageno, pagetype FROM dbstat")}
    finally:
        db.close()


def test_fuzz_row_by_row_every_other_row_is_kept(pristine, tmp_path):
    """Each JSON value of each table damaged in turn: the start succeeds and only that row is missing."""
    columns = {"probe_results": ("record", "id"), "baselines": ("state", "rowid"), "alerts": ("evidence", "id"),
               "settings_snapshot": ("value", "rowid")}
    expected = _markers(pristine)
    rng = random.Random(52)
    tried = 0
    for table, (column, key) in columns.items():
        db = sqlite3.connect(pristine)
        rows = db.execute(f"SELECT {key}, {MARKER[table]}, {column} FROM {table}").fetchall()
        db.close()
        for row_id, marker, text in rng.sample(rows, min(len(rows), 6)):
            path = _copy(pristine, tmp_path)
            cut = rng.randrange(1, len(text))
            db = sqlite3.connect(path)
            db.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (text[:cut] + "\x00\x07", row_id))
            db.commit()
            db.close()
            state, loaded = _start(path)
            assert loaded == expected - {marker.split("\t")[0]}, (table, row_id)
            state.close()
            os.unlink(path)
            tried += 1
    assert tried >= 20


def test_fuzz_page_by_page_the_start_succeeds_and_every_row_off_the_damaged_page_is_kept(pristine, tmp_path):
    """Each page of the file overwritten with garbage in turn. The start always succeeds; where the page is
    a table's leaf, every row whose bytes are not on it is kept (read in place, or salvaged when SQLite calls
    the file corrupt); where it is the schema or a b-tree's interior page, the start still succeeds and the
    other tables' rows are kept."""
    pages = _pages(pristine)
    with open(pristine, "rb") as f:
        raw = f.read()
    expected = _markers(pristine)
    rng = random.Random(4)
    for pageno in sorted(pages):
        name, kind = pages[pageno]
        page = raw[(pageno - 1) * PAGE: pageno * PAGE]
        on_page = {m for m in expected if m.encode() in page}
        path = _copy(pristine, tmp_path)
        with open(path, "r+b") as f:
            f.seek((pageno - 1) * PAGE)
            f.write(rng.randbytes(PAGE))
        state, loaded = _start(path)   # never raises
        state.close()
        if kind == "leaf" and name in MARKER:
            missing = expected - on_page - loaded
            assert not missing, (pageno, name, sorted(missing)[:5])
        elif name in MARKER:
            # an interior page: the rows of the other tables all stay
            others = {m for m in expected if not m.startswith(_prefix(name))}
            assert others - loaded == set(), (pageno, name)
        for n in os.listdir(tmp_path):
            os.unlink(tmp_path / n)


def _prefix(table):
    return {"probe_results": "R", "baselines": "B", "alerts": "A", "target_pins": "P", "settings_snapshot": "S",
            "drift_events": "D", "marks": "M"}[table]
