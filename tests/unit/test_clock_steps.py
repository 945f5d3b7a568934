"""Durations on the monotonic clock: a wall clock stepped
either way deletes nothing and leaves the budget sane. Fake clocks, no root."""
import sqlite3
import time

from iowarden.daemon.core import retention
from iowarden.daemon.core.core import Core
from iowarden.daemon.events import Housekeeping
from iowarden.daemon.core.state import State
from iowarden.daemon.probing.budget import Budget
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.core.effects import StoredHealth, health_from

DAY = 86400.0
KEEP = 90 * DAY


class Clocks:
    def __init__(self, wall: float):
        self.wall_now, self.boot_now = wall, 1000.0

    def wall(self):
        return self.wall_now

    def boot(self):
        return self.boot_now

    def advance(self, seconds: float):
        self.wall_now += seconds
        self.boot_now += seconds


# ---- retention: the policy --------------------------------------------------------------------

def test_a_pass_on_a_clock_stepped_more_than_a_day_does_nothing_and_says_why():
    last = retention.ClockMark(1e9, 1000.0)
    ahead = retention.plan(last, retention.ClockMark(1e9 + 3600 + 91 * DAY, 4600.0), KEEP)
    assert ahead.cutoff_wall_seconds is None and "+91.0 days" in ahead.refusal
    behind = retention.plan(last, retention.ClockMark(1e9 + 3600 - 91 * DAY, 4600.0), KEEP)
    assert behind.cutoff_wall_seconds is None and "-91.0 days" in behind.refusal
    steady = retention.plan(last, retention.ClockMark(1e9 + 3600, 4600.0), KEEP)
    assert steady.refusal is None and steady.cutoff_wall_seconds == 1e9 + 3600 - KEEP
    # a few minutes of NTP slew or a suspend (the boot clock counts it) is no step
    assert retention.plan(last, retention.ClockMark(1e9 + 7200 + 300, 8200.0), KEEP).refusal is None


def test_no_pass_deletes_more_than_a_bounded_share_of_a_table():
    assert retention.rows_per_pass(1_000_000) == 50_000
    assert retention.rows_per_pass(10) == retention.MIN_ROWS_PER_PASS


# ---- retention: the running core, with a time shim -----------------------------------------------

def _results(state: State, n: int, at: float) -> None:
    for i in range(n):
        state.add_probe_result({"started_at": at + i, "target": "db", "profile": "randread-4k", "device": "sdb",
                                "ok": True, "error": None, "contended": False, "read_iops": 100.0, "write_iops": 0.0,
                                "read_bw_bytes": 1.0, "write_bw_bytes": 0.0, "clat_p50_seconds": 0.001,
                                "clat_p99_seconds": 0.002, "clat_p999_seconds": 0.003,
                                "duration_seconds": 5.0}, "wwn:1")


def _count(path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT count(*) FROM probe_results").fetchone()[0]


def _core(tmp_path, clocks):
    state = State(str(tmp_path / "state.db"))
    health = health_from(state, DetectorParams())
    core = Core(state, health, "test", retention_seconds=KEEP, wall=clocks.wall, boot_clock=clocks.boot)
    return state, core


def test_the_wall_clock_stepped_91_days_forward_and_back_deletes_nothing(tmp_path):
    """Landed code: every probe result was deleted by the pass made while the clock was 91 days ahead."""
    clocks = Clocks(time.time())
    state, core = _core(tmp_path, clocks)
    _results(state, 300, clocks.wall_now - 10 * DAY)   # ten days of history, all within 90 days
    core._on_housekeeping(Housekeeping("retention"))   # the first pass of the run: nothing is old
    assert _count(tmp_path / "state.db") == 300
    clocks.advance(3600)
    clocks.wall_now += 91 * DAY                        # the step: 12 s at 91 days ahead
    core._on_housekeeping(Housekeeping("retention"))
    assert _count(tmp_path / "state.db") == 300
    clocks.wall_now -= 91 * DAY                        # and back
    clocks.advance(3600)
    core._on_housekeeping(Housekeeping("retention"))
    assert _count(tmp_path / "state.db") == 300
    clocks.advance(3600)
    core._on_housekeeping(Housekeeping("retention"))   # a clock that stayed put: passes go on as before
    assert _count(tmp_path / "state.db") == 300
    state.close()


def test_a_step_the_daemon_could_not_see_costs_a_share_per_pass_not_the_history(tmp_path):
    """The clock moved while the daemon was down (no mark to compare with): the first pass deletes at most
    its share of each table, oldest first."""
    clocks = Clocks(time.time() + 200 * DAY)
    state, core = _core(tmp_path, clocks)
    _results(state, 3000, time.time() - DAY)
    core._on_housekeeping(Housekeeping("retention"))
    assert _count(tmp_path / "state.db") == 3000 - retention.rows_per_pass(3000)
    state.close()


def test_old_results_are_still_deleted_on_a_steady_clock(tmp_path):
    clocks = Clocks(time.time())
    state, core = _core(tmp_path, clocks)
    _results(state, 50, clocks.wall_now - 100 * DAY)
    _results(state, 20, clocks.wall_now - DAY)
    core._on_housekeeping(Housekeeping("retention"))
    assert _count(tmp_path / "state.db") == 20
    state.close()


# ---- the budget ------------------------------------------------------------------------------

class Mono:
    def __init__(self):
        self.now = 5000.0

    def __call__(self):
        return self.now


def test_the_budget_runs_on_the_monotonic_clock_whatever_the_wall_clock_does():
    """Landed code: a one-hour step back held a spent budget for 105 min instead of 61; a day forward reset the
    daily write budget."""
    mono, wall = Mono(), [1e9]
    b = Budget(time_ratio=0.01, window_seconds=3600.0, write_bytes_per_day=1 << 30, clock=mono, wall=lambda: wall[0])
    b.record(("sdb",), mono.now - 36, 36.0, 1 << 30)     # the hour's device time and the day's bytes, spent
    assert b.refuses(("sdb",), 1.0) == "budget_time"
    wall[0] -= 3600                                     # stepped back an hour: nothing the budget reads
    mono.now += 3600 - 60                               # it started 59 min 36 s ago: still in the window
    assert b.status("sdb").device_seconds_used == 36.0
    mono.now += 61
    assert b.status("sdb").device_seconds_used == 0.0   # 60 min 37 s: out, as on a steady clock
    wall[0] += 2 * DAY                                  # a day forward: the bytes stay spent
    assert b.refuses(("sdb",), 1.0) == "budget_bytes"
    mono.now += DAY
    assert b.refuses(("sdb",), 1.0) is None


def test_stored_results_count_at_their_age_and_one_from_the_future_counts_as_now():
    mono, wall = Mono(), [1e9]
    b = Budget(time_ratio=0.01, window_seconds=3600.0, write_bytes_per_day=1 << 30, clock=mono, wall=lambda: wall[0])
    rec = {"device": "sdb", "duration_seconds": 20.0, "write_io_bytes": 0, "layout_bytes": 0}
    b.replay([{**rec, "started_at": 1e9 - 4000}, {**rec, "started_at": 1e9 - 60},
              {**rec, "started_at": 1e9 + 3 * 3600}], {})   # the last: stamped before the clock went back
    assert b.status("sdb").device_seconds_used == 40.0


def test_a_step_while_the_daemon_was_down_is_caught_at_the_next_runs_first_pass(tmp_path):
    """The last pass's clocks are kept in the database with the boot they were taken in: a run started after
    the clock moved 91 days (same boot) deletes nothing at its first pass; after a reboot (another boot id)
    there is nothing to compare with, and the share per pass bounds what a wrong clock can cost."""
    clocks = Clocks(time.time())
    state = State(str(tmp_path / "state.db"))
    _results(state, 300, clocks.wall_now - 10 * DAY)
    core = Core(state, health_from(state, DetectorParams()), "test", retention_seconds=KEEP, wall=clocks.wall,
                boot_clock=clocks.boot, boot_id="boot-1")
    core._on_housekeeping(Housekeeping("retention"))
    state.close()
    clocks.advance(600)
    clocks.wall_now += 91 * DAY                        # stepped while the daemon was down
    state = State(str(tmp_path / "state.db"))
    core = Core(state, health_from(state, DetectorParams()), "test", retention_seconds=KEEP, wall=clocks.wall,
                boot_clock=clocks.boot, boot_id="boot-1")
    core._on_housekeeping(Housekeeping("retention"))
    assert _count(tmp_path / "state.db") == 300
    state.close()
    assert retention.mark_of({"wall_seconds": 1.0, "boot_seconds": 2.0, "boot_id": "boot-1"}, "boot-2") is None
