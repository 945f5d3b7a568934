"""`status` and `baseline show` say what they measured, in a person's words (no root; a state database of the
test's own, fed by Health as the daemon feeds it).

Landed code: a 26x drop awaiting its confirming probe read "moved 26x, within the detector's allowance"; a lower
latency "moved 0.66x of normal"; the verdict said "normal" beside "learning 1/12"; `baseline show` said "learning
(1 of 12 probes), learned since ..." and had no --json."""
import json
import random

from iowarden.daemon import config as configmod
from iowarden.daemon.commands.status import baseline_command, baseline_line, verdict_of
from iowarden.daemon.core.state import State
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.core.effects import StoredHealth
from tests.unit.test_alert_invariants import _probe


def _row(metric, last, baseline=100.0, learning=False, alerting=False):
    return {"metric": metric, "last": last, "baseline": None if learning else baseline, "learning": learning,
            "band_lower": None if learning else baseline * 0.8, "band_upper": None if learning else baseline * 1.25,
            "alerting": alerting, "samples": 1 if learning else 30, "warmup": 12, "identity": "v", "profile": "rr",
            "learned_at": 1.7e9}


def test_a_drop_awaiting_its_confirming_probe_says_so():
    said = verdict_of(_row("read_iops", 100.0 / 26), None)
    assert said.startswith("26x lower: outside its band, not yet confirmed"), said
    assert "allowance" not in said


def test_a_better_figure_is_said_as_better_and_a_learning_one_as_learning():
    assert verdict_of(_row("clat_p99_seconds", 66.0), None) == "1.5x lower: better than its normal"
    assert verdict_of(_row("read_iops", 300.0), None) == "3x higher: better than its normal"
    assert verdict_of(_row("read_iops", 50.0, learning=True), None) == "learning"
    assert verdict_of(_row("read_iops", 101.0), None) == "normal"


def test_baseline_show_says_learning_since_and_learned_since_and_has_json(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state = State(str(state_dir / "state.db"))
    h, rng = StoredHealth(state, DetectorParams(warmup_probes=6)), random.Random(1)
    for i in range(8):
        h.on_result(_probe(i, 1.0, rng), "vol-a", lambda since: [])
    h.on_result(_probe(9, 1.0, rng), "vol-b", lambda since: [])
    state.close()
    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text(f'[daemon]\nstate_dir = "{state_dir}"\n[detector]\nwarmup_probes = 6\n')
    cfg = configmod.load(cfg_path)
    text = baseline_command(cfg, "show", None, None)
    assert "learned since" in text and "learning (1 of 6 probes, since " in text, text
    assert not any("learning" in line and "learned since" in line for line in text.splitlines()), text
    rows = json.loads(baseline_command(cfg, "show", None, None, as_json=True))
    assert {r["identity"] for r in rows} == {"vol-a", "vol-b"} and all("learning" in r for r in rows)
    assert baseline_line(rows[0]).startswith(rows[0]["identity"])


def test_an_open_probe_alert_says_what_it_waits_on_and_when_the_next_probe_is_due():
    from iowarden.daemon.commands.status import next_probes, render
    from iowarden.daemon.commands.tables import table
    latest = {("db", "rr"): {"started_at": 1_700_000_000.0}, ("gone", "rr"): {"started_at": 1.0}}
    due = next_probes(latest, {"db": 300.0})
    assert due == {"db/rr": 1_700_000_300.0}
    alert = {"id": 3, "alert": "VolumeDegraded", "severity": "critical", "target": "db", "profile": "rr",
             "identity": "v", "raised_at": 1_700_000_000.0, "causes": [], "evidence": {"metrics": {}}}
    st = {"probes": [], "baselines": [], "alerts": [alert], "drift": [], "budget": {}, "next_probes": due}
    text = render(st, table)
    assert "clears on probes back within the band: the next rr probe of db is due by about" in text, text
