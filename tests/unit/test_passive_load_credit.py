"""Like against like in the peer comparison: a member carrying more load than its peers (within the comparable
range) is compared with what its peers' latency would be at its load, read off its own learned curve; a drive
slow at its peers' load is still named. Synthetic traces of the passive_traces shape, a fake clock (window
numbers), no root."""
import math
import random

from iowarden.daemon.passive.curve import LatencyCurve
from iowarden.daemon.passive.detector import PassiveDetector
from tests import passive_traces as pt

HOUR = pt.DAY_WINDOWS // 24
SIX = tuple(f"sd{chr(97 + m)}" for m in range(6))


def trace(seed: int, hours: float, load_of: dict, slow_of: dict, start_hour: float):
    """Six drives on one daily cycle; from start_hour, member -> its load times load_of[m] (its latency moving
    along the shared curve with it), and its latency times slow_of[m] (a slow drive)."""
    rng = random.Random(seed)
    for i in range(int(hours * HOUR)):
        load = pt.load_at(i, rng)
        batch = []
        for m, name in enumerate(SIX):
            on = i >= start_hour * HOUR
            mine = load * (load_of.get(m, 1.0) if on else 1.0)
            ms = pt.noisy(pt.curve_ms(mine), rng) * (slow_of.get(m, 1.0) if on else 1.0)
            batch.append(pt.window(name, i, mine * math.exp(rng.gauss(0, 0.05)), ms))
        yield batch


def named(batches) -> dict[str, float]:
    det, first = PassiveDetector(), {}
    for i, batch in enumerate(batches):
        for t in det.observe(batch, [SIX]):
            if t.state == "raised" and t.kind == "peers":
                first.setdefault(t.device, round(i / HOUR, 2))
    return first


def test_the_curve_reads_between_its_bins():
    c = LatencyCurve()
    for _ in range(40):
        c.learn(1000.0, 1.0)     # a bin centred on 861 IOPS
        c.learn(1300.0, 2.0)     # the next, half an octave up, centred on 1,218
    low, mid, high = (c.median_along(x, 20) for x in (870.0, 1024.0, 1200.0))
    assert 0.9 < low < 1.1 and 1.3 < mid < 1.6 and 1.8 < high < 2.2, (low, mid, high)
    assert c.median_along(2000.0, 20) is None   # a load it has not learned both sides of says nothing


def test_a_drive_carrying_a_third_more_than_its_peers_is_not_named_for_the_latency_that_load_costs():
    # from the sixth hour sdb carries 1.35x its peers' load, on the same curve: 8-12 % more latency at the day's
    # loads, which the plain comparison named within the hour as "slow at comparable load"
    assert named(trace(1, 9.0, {1: 1.35}, {}, 5.0)) == {}


def test_a_drive_slow_at_its_peers_load_is_still_named():
    first = named(trace(2, 9.0, {}, {1: 1.3}, 5.0))
    assert set(first) == {"sdb"} and first["sdb"] <= 7.0, first


def test_a_drive_both_busier_and_slower_is_named_on_what_its_load_does_not_explain():
    first = named(trace(3, 9.0, {1: 1.35}, {1: 1.4}, 5.0))
    assert set(first) == {"sdb"}, first


def test_a_third_of_the_group_taking_more_load_together_names_nobody():
    # a shared load shift: two of six drives take 1.35x the others' load from the fifth hour (a rebalance, a
    # hot shard). They stand out together, a third of the group, which the reference sets aside as slow.
    assert named(trace(4, 9.0, {0: 1.35, 3: 1.35}, {}, 5.0)) == {}
