"""The detector on synthetic traces: what must alert, how fast, and what must never page.

Figures over many seeds are printed by bench/detector_traces.py and recorded in docs/measurements.md.
"""
import json
import random
import statistics
import subprocess
import sys

import pytest

from iowarden.daemon.verdicts.detect import Detector, DetectorParams, replay
from tests import traces

SEEDS = range(100)


def first_raise(vals, metric, params=DetectorParams()):
    d = Detector(metric, params)
    for i, v in enumerate(vals):
        if d.update(v).changed == "raised":
            return i
    return None


def detection_delays(factor, metric, level, worse_is_higher, base=10000.0):
    delays = []
    for seed in SEEDS:
        vals = traces.step(300, 40, factor, level, seed, base=base, worse_is_higher=worse_is_higher)
        i = first_raise(vals, metric)
        assert i is not None and i >= 300, f"seed {seed}: raised at {i} (shift at 300)"
        delays.append(i - 300 + 1)
    delays.sort()
    return statistics.median(delays), delays[int(len(delays) * 0.9) - 1]


def test_iops_halving_is_detected_within_5_probes_median_10_p90():
    median, p90 = detection_delays(0.5, "read_iops", "low", False)
    assert median <= 5 and p90 <= 10


def test_p99_tripling_is_detected_within_5_probes_median_10_p90():
    median, p90 = detection_delays(3.0, "clat_p99_seconds", "low", True, base=0.002)
    assert median <= 5 and p90 <= 10


def test_at_cloud_volume_noise_a_halving_is_caught_within_4_probes_median_6_p90():
    median, p90 = detection_delays(0.5, "read_iops", "high", False)
    assert median <= 4 and p90 <= 6


def test_at_cloud_volume_noise_p99_tripling_is_caught_within_4_probes_median_6_p90():
    median, p90 = detection_delays(3.0, "clat_p99_seconds", "high", True, base=0.002)
    assert median <= 4 and p90 <= 6


def test_at_cloud_volume_noise_a_day_long_drift_is_caught_within_the_day():
    delays = []
    for seed in range(30):
        vals = traces.drift(300, 288, 100, 2.0, "high", seed)
        i = first_raise(vals, "clat_p99_seconds")
        assert i is not None and 300 < i < 300 + 288, (seed, i)
        delays.append(i - 300)
    assert statistics.median(delays) < 220


def test_a_collapse_far_beyond_the_noise_alerts_once_it_repeats():
    # IOPS down 1000x: a spike for four probes, the volume's state from the fifth on
    vals = traces.stable(400, "low", 3, spike_rate=0)
    for i in range(300, 400):
        vals[i] /= 1e3
    assert first_raise(vals, "read_iops") == 304


def test_gradual_drift_to_double_latency_over_a_day_is_detected():
    for seed in range(30):
        vals = traces.drift(300, 288, 100, 2.0, "low", seed)
        i = first_raise(vals, "clat_p99_seconds")
        assert i is not None and 300 < i < 300 + 288 + 20, (seed, i)


def test_burst_credit_exhaustion_alerts_at_the_first_exhaustion():
    for seed in range(30):
        vals, empty = traces.burst_credits(1200, "low", seed)
        i = first_raise(vals, "read_iops")
        assert empty is not None and i is not None and empty <= i <= empty + 6, (seed, empty, i)


def _with_spikes(positions, seed, factor):
    vals = traces.stable(400, "low", seed, spike_rate=0)
    for p in positions:
        vals[p] = vals[p] / factor
    return vals


@pytest.mark.parametrize("shape", ["single", "pair", "four-in-ten"])
def test_spikes_never_alert(shape):
    rng = random.Random(7)
    for seed in SEEDS:
        factor = rng.choice([3, 10, 100, 1e6])
        if shape == "single":
            pos = [300]
        elif shape == "pair":
            pos = [300, 301]
        else:
            pos = sorted(rng.sample(range(300, 310), 4))
        assert first_raise(_with_spikes(pos, seed, factor), "read_iops") is None, (seed, pos, factor)


def test_four_consecutive_spikes_do_not_alert_either():
    for seed in SEEDS:
        assert first_raise(_with_spikes([300, 301, 302, 303], seed, 1e3), "read_iops") is None


@pytest.mark.parametrize("level", ["low", "high"])
@pytest.mark.parametrize("metric,worse_is_higher", [("read_iops", False), ("clat_p99_seconds", True)])
def test_false_alarms_on_stable_traces(level, metric, worse_is_higher):
    probes = alarms = 0
    for seed in range(25):
        vals = traces.stable(2000, level, 5000 + seed, worse_is_higher=worse_is_higher)
        d = Detector(metric)
        for v in vals:
            alarms += d.update(v).changed == "raised"
        probes += len(vals)
    assert alarms / probes * 1000 <= 0.01, f"{alarms} false alarms in {probes} probes"


def test_improvements_never_alert():
    vals = traces.step(300, 100, 3.0, "low", 1)           # IOPS triple: good news
    assert first_raise(vals, "read_iops") is None


def test_degradation_is_not_learned_and_the_alert_clears_when_it_ends():
    vals = traces.stable(300, "low", 3) + [4000.0] * 200 + traces.stable(50, "low", 4)
    d = Detector("read_iops")
    verdicts = [d.update(v) for v in vals]
    raised = [i for i, v in enumerate(verdicts) if v.changed == "raised"]
    cleared = [i for i, v in enumerate(verdicts) if v.changed == "cleared"]
    assert raised and 300 <= raised[0] < 306
    assert all(v.alerting for v in verdicts[raised[0]:500]), "200 degraded probes must not become normal"
    assert cleared and 500 <= cleared[0] <= 504
    assert verdicts[400].baseline == pytest.approx(10000, rel=0.1)
    assert verdicts[400].severity == "critical"


def _halve_then(level: str, seed: int, back_to: float) -> list:
    """The transitions over a trace halved at 300 and back at `back_to` from 360."""
    det = Detector("read_iops")
    return [det.update(v).changed for v in traces.halve_then_recover(level, seed, back_to, n_after=60)]


@pytest.mark.parametrize("level", ["low", "high"])
def test_a_full_recovery_clears_within_a_few_probes_and_is_not_raised_again(level):
    for seed in range(100):
        changes = _halve_then(level, seed, 1.0)
        assert changes.count("raised") == 1, f"seed {seed}"
        cleared = [i for i, c in enumerate(changes) if c == "cleared"]
        assert cleared and 360 + 2 <= cleared[0] < 360 + 10, f"seed {seed}: cleared at {cleared}"


def test_a_partial_recovery_that_is_still_a_clear_loss_stays_open():
    for seed in range(100):
        changes = _halve_then("low", seed, 0.75)     # 25 % below normal at 5 % noise
        assert "raised" in changes and "cleared" not in changes, f"seed {seed}"


def test_auto_accept_after_a_stable_new_level():
    params = DetectorParams(auto_accept_probes=50)
    d = Detector("read_iops", params)
    changes = [d.update(v).changed for v in traces.stable(300, "low", 3) + [5000.0] * 100]
    assert "raised" in changes and "accepted" in changes
    assert changes.index("accepted") - changes.index("raised") < 60
    assert not d.alerting


def test_warm_up_never_alerts():
    d = Detector("read_iops")
    for v in [10000, 100, 10000, 100, 1, 10000, 100, 5, 10000, 3, 3]:
        assert not d.update(v).alerting


def test_state_round_trip():
    d = Detector("clat_p99_seconds")
    for v in traces.stable(100, "low", 9, base=0.002, worse_is_higher=True):
        d.update(v)
    e = Detector.from_state(json.loads(json.dumps(d.to_state())))
    for v in (0.002, 0.01, 0.01):
        assert d.update(v) == e.update(v)


def test_replay_command_prints_alert_intervals(tmp_path):
    vals = traces.step(300, 40, 0.5, "low", 11) + traces.stable(30, "low", 12)
    csv = tmp_path / "iops.csv"
    csv.write_text("timestamp,value\n" + "".join(f"{1700000000 + 300 * i},{v}\n" for i, v in enumerate(vals)))
    out = subprocess.run([sys.executable, "-m", "iowarden.daemon.cli", "replay", "--metric", "iops",
                          str(csv), "--json"], capture_output=True, text=True, check=True).stdout
    intervals = json.loads(out)
    assert len(intervals) == 1 and intervals[0]["severity"] in ("warning", "critical")
    assert 1700000000 + 300 * 300 <= intervals[0]["start"] <= 1700000000 + 300 * 305
    assert intervals[0]["end"] is not None
    assert replay([(i, v) for i, v in enumerate(vals)], "read_iops") == [
        {"start": iv["start"] // 300 - 1700000000 // 300, "end": iv["end"] // 300 - 1700000000 // 300,
         "severity": iv["severity"]} for iv in intervals]


def test_replay_rejects_a_bad_csv(tmp_path):
    csv = tmp_path / "bad.csv"
    csv.write_text("timestamp,value\n1,2\nx,3\n")
    r = subprocess.run([sys.executable, "-m", "iowarden.daemon.cli", "replay", str(csv)], capture_output=True,
                       text=True)
    assert r.returncode == 2 and f"{csv}:3:" in r.stderr
    missing = tmp_path / "missing.csv"
    r = subprocess.run([sys.executable, "-m", "iowarden.daemon.cli", "replay", str(missing)], capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr == f"iowarden: {missing}: cannot read: No such file or directory\n"
