"""The one place that acts: every write of the state database from the daemon's core goes through
core/effects.py, as a change a verdict or a handler returned, and the outputs are told in the same order."""
import ast
from pathlib import Path
from types import MappingProxyType

from iowarden.daemon.core import effects
from iowarden.daemon.core.state import State
from iowarden.daemon.verdicts.changes import DriftFound, ProbeStored, SettingsSeen
from iowarden.probes.fio_run import ProbeResult

DAEMON = Path(__file__).resolve().parents[2] / "daemon"
# the State methods that write the database on the daemon's behalf (the CLI's requests are its own process's)
WRITES = {"add_probe_result", "add_drift", "save_settings", "save_baseline", "open_alert", "update_alert",
          "close_alert", "set_pin", "delete_baselines"}
ACTS = {DAEMON / "core" / "effects.py", DAEMON / "core" / "state.py"}


def writes_outside_effects(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if path in ACTS or "commands" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.func.attr}")
    return found


def test_no_part_of_the_daemon_writes_the_database_but_the_effects():
    assert writes_outside_effects(DAEMON) == []


def test_the_check_finds_a_write_in_the_wrong_place(tmp_path):
    (tmp_path / "daemon" / "core").mkdir(parents=True)
    (tmp_path / "daemon" / "core" / "knowledge.py").write_text("def f(core):\n    core.state.add_drift(1, 2)\n")
    assert writes_outside_effects(tmp_path / "daemon") == ["daemon/core/knowledge.py:2 add_drift"]


def test_a_stored_result_and_a_drift_are_written_and_told_in_order(tmp_path):
    state = State(str(tmp_path / "state.db"))
    told = []
    record = ProbeResult("db", "/srv/db", "sdb", "rr", False, "fio exited 1", 1.0, 1.5).to_json()
    effects.apply([ProbeStored("wwn-0xaaa", MappingProxyType(record)),
                   DriftFound("sdb", "wwn-0xaaa", "scheduler", "mq-deadline", "none"),
                   SettingsSeen(MappingProxyType({("sdb", "scheduler"): "none"}))],
                  state, lambda what, fields: told.append((what, fields)))
    assert [r["target"] for r in state.probe_results()] == ["db"]
    assert [(d[1], d[3], d[4], d[5]) for d in state.drift_events()] == [("sdb", "scheduler", "mq-deadline", "none")]
    assert state.load_settings() == {("sdb", "scheduler"): "none"}
    assert [w for w, _ in told] == ["probe", "event"]
    assert told[0][1]["identity"] == "wwn-0xaaa" and told[1][1]["kind"] == "drift"
    assert told[1][1]["volume"] == "wwn-0xaaa" and told[1][1]["new"] == "none"
    state.close()
