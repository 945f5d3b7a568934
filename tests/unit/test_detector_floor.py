"""A latency barely above its normal is no evidence, whatever the ratio: a RAM-fast volume's probe p50 of 14 µs
read 34 µs while the host's CPUs were busy, 2.5x its normal, and paged critical for 20 µs."""
import math
import random

from iowarden.daemon.verdicts.detect import Detector, DetectorParams


def _feed(det: Detector, values) -> list:
    return [det.update(v) for v in values]


def test_a_fast_volume_a_few_microseconds_slower_for_hours_raises_nothing():
    rng = random.Random(1)
    det = Detector("clat_p50_seconds")
    _feed(det, [14e-6 * math.exp(rng.gauss(0, 0.05)) for _ in range(50)])
    verdicts = _feed(det, [34e-6 * math.exp(rng.gauss(0, 0.05)) for _ in range(60)])   # +20 µs, 2.4x
    assert not any(v.alerting for v in verdicts)


def test_the_same_ratio_above_the_floor_still_raises_and_learning_is_unchanged():
    rng = random.Random(2)
    det = Detector("clat_p50_seconds")
    _feed(det, [80e-6 * math.exp(rng.gauss(0, 0.05)) for _ in range(50)])              # an NVMe drive's p50
    verdicts = _feed(det, [190e-6 * math.exp(rng.gauss(0, 0.05)) for _ in range(10)])  # +110 µs, 2.4x
    assert any(v.changed == "raised" for v in verdicts)
    # await in milliseconds has the same floor in its units; IOPS has none
    assert Detector("await_ms").floor == DetectorParams().latency_floor_seconds * 1e3
    assert Detector("iops").floor == 0.0


def test_a_fast_volume_creeping_by_microseconds_is_no_drift():
    rng = random.Random(3)
    det = Detector("clat_p99_seconds", DetectorParams(window=60))
    _feed(det, [20e-6 * math.exp(rng.gauss(0, 0.05)) for _ in range(80)])
    verdicts = _feed(det, [20e-6 * (1 + i / 100) * math.exp(rng.gauss(0, 0.05)) for i in range(100)])  # to 40 µs
    assert not any(v.alerting for v in verdicts)
