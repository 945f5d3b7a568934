"""The state directory is the daemon's own: verified before use, reached
through its open directory, locked. No root: directories this user makes; another owner is in
tests/integration/test_state_dir_and_clock.py."""
import os
import sqlite3

import pytest

from iowarden.daemon.core import statedir
from iowarden.daemon.core.state import State


def test_a_missing_directory_is_created_private_and_every_file_is_reached_through_it(tmp_path):
    d = statedir.open_state_dir(str(tmp_path / "a" / "state"))
    try:
        st = os.stat(tmp_path / "a" / "state")
        assert st.st_mode & 0o027 == 0   # 0750 at most: no one else writes, others do not even read
        state = State(str(tmp_path / "a" / "state" / "state.db"), opened_at=d.at("state.db"))
        state.close()
        assert (tmp_path / "a" / "state" / "state.db").is_file()
        spool = d.subdir("influx-spool")
        assert os.path.samefile(spool, tmp_path / "a" / "state" / "influx-spool")
    finally:
        d.close()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757])
def test_a_directory_others_can_write_is_refused_naming_it(tmp_path, mode):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)
    with pytest.raises(statedir.StateDirRefused, match=f"{state} is writable by .*mode {mode:04o}"):
        statedir.open_state_dir(str(state))
    assert "writable by" in statedir.state_dir_problem(str(state))


def test_a_symlink_anywhere_in_the_path_is_refused_not_followed(tmp_path):
    real = tmp_path / "real"
    (real / "state").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(statedir.StateDirRefused, match="link is a symbolic link"):
        statedir.open_state_dir(str(tmp_path / "link" / "state"))
    (tmp_path / "state").symlink_to(real / "state")
    with pytest.raises(statedir.StateDirRefused, match="state is a symbolic link"):
        statedir.open_state_dir(str(tmp_path / "state"))
    assert os.listdir(real / "state") == []


@pytest.mark.parametrize("name", ["state.db", "state.db-wal", "influx-spool", "lock"])
def test_a_link_in_the_directory_where_iowarden_keeps_a_file_is_refused(tmp_path, name):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (state / name).symlink_to(elsewhere / name)
    with pytest.raises(statedir.StateDirRefused, match=f"{name} is a symbolic link"):
        statedir.open_state_dir(str(state))
    assert os.listdir(elsewhere) == []


def test_a_second_holder_is_told_who_holds_the_lock_and_the_lock_goes_with_the_first(tmp_path):
    first = statedir.open_state_dir(str(tmp_path / "state"))
    statedir.lock(first)
    second = statedir.open_state_dir(str(tmp_path / "state"))
    with pytest.raises(statedir.StateDirLocked, match=f"in use by another iowarden \\(pid {os.getpid()}\\)"):
        statedir.lock(second)
    first.close()
    statedir.lock(second)   # the first's lock ended with its descriptor (with its process, kill -9 included)
    second.close()


def test_check_config_says_nothing_of_a_directory_that_does_not_exist_yet(tmp_path):
    assert statedir.state_dir_problem(str(tmp_path / "not" / "yet")) is None
    assert not (tmp_path / "not").exists()


def test_the_open_reads_no_more_than_the_header_and_damage_found_later_is_repaired_at_the_next_start(tmp_path):
    """Landed code: PRAGMA quick_check at every open (65 s on a 9 GB database, past systemd's start timeout).
    Now the whole-file check runs beside the daemon (check_integrity); damage it finds leaves a mark, and the
    next start checks fully and moves the file aside."""
    path = tmp_path / "state.db"
    st = State(str(path))
    for i in range(2000):
        st.add_drift(f"sd{i}", None, "scheduler", "none", "bfq")
    st.close()
    # damage a leaf among the drift table's oldest rows (no start reads them), leaving the header whole
    db = sqlite3.connect(str(path))
    pageno = db.execute("SELECT min(pageno) FROM dbstat WHERE name = 'drift_events' AND pagetype = 'leaf'").fetchone()[0]
    db.close()
    data = bytearray(path.read_bytes())
    page = 4096
    for off in range(page * (pageno - 1), page * (pageno - 1) + 200):
        data[off] = 0xFF
    path.write_bytes(bytes(data))
    opened = State(str(path))                      # the header is sound: opens at once, nothing moved
    assert not list(tmp_path.glob("state.db.corrupt-*"))
    problem = opened.check_integrity()
    assert problem and (tmp_path / "state.db.damaged").exists()
    opened.close()
    again = State(str(path))                       # the next start: the mark asks for the full check
    assert list(tmp_path.glob("state.db.corrupt-*")) and not (tmp_path / "state.db.damaged").exists()
    # what still read was kept: every drift event but those of the damaged leaf
    assert 1800 < len(again.drift_events()) < 2000
    assert again.stats()["lost_rows"]["drift_events"] >= 1
    again.close()


def test_recent_drift_is_read_newest_first_with_a_limit(tmp_path):
    st = State(str(tmp_path / "state.db"))
    for i in range(50):
        st.add_drift(f"sd{i}", None, "scheduler", "none", "bfq")
    assert [r[1] for r in st.drift_events(limit=3)] == ["sd47", "sd48", "sd49"]
    st.close()
