"""The knee of a learned latency-vs-load curve and the headroom against it: pure, on synthetic curves."""
import math
import random

import pytest

from iowarden.daemon.passive.curve import LatencyCurve
from iowarden.daemon.passive.detector import PassiveDetector
from iowarden.daemon.passive.headroom import Knee, PeakLoad, headroom_ratio, knee_of
from tests import passive_traces as pt

CAP_IOPS = 10000.0
SERVICE_MS = 0.2


def queueing_ms(load: float) -> float:
    """A single queue: the await doubles at half the capacity (rho 0.5), the knee is CAP / 2."""
    return SERVICE_MS / (1 - min(load / CAP_IOPS, 0.97))


def _walk(seed: int, windows: int, low: float, high: float):
    """Loads that walk up and down across [low, high] in log steps, each with its await (a little noise)."""
    rng = random.Random(seed)
    for i in range(windows):
        phase = (math.sin(i / 40.0) + 1) / 2
        load = low * (high / low) ** phase * math.exp(rng.gauss(0, 0.05))
        yield load, queueing_ms(load) * math.exp(rng.gauss(0, 0.05))


def _curve(windows) -> LatencyCurve:
    c = LatencyCurve()
    for load, ms in windows:
        c.learn(load, ms)
    return c


def _steps(levels, windows: int = 25) -> LatencyCurve:
    """A walk of load in steps: each (load, ms) held for `windows` windows, more than a bin needs to learn."""
    return _curve((load, ms) for load, ms in levels for _ in range(windows))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_knee_of_a_single_queue_is_where_its_await_doubles(seed):
    k = knee_of(_curve(_walk(seed, 6000, 50.0, 0.9 * CAP_IOPS)), "iops", 20)
    assert k.why_none is None and k.unloaded_ms == pytest.approx(SERVICE_MS, rel=0.1)
    assert k.load == pytest.approx(CAP_IOPS / 2, rel=0.15), k
    # a load at half the knee reads a headroom of about 2
    assert headroom_ratio(k, CAP_IOPS / 4) == pytest.approx(2.0, rel=0.15)


def test_no_figure_where_the_curve_never_reaches_the_knee():
    k = knee_of(_curve(_walk(4, 6000, 50.0, 0.2 * CAP_IOPS)), "iops", 20)
    assert k.load is None and "every load seen" in k.why_none
    assert k.seen_up_to == pytest.approx(0.2 * CAP_IOPS, rel=0.5)   # the knee lies beyond this, at least
    assert headroom_ratio(k, 100.0) is None


def test_no_figure_without_a_light_load_to_call_unloaded():
    k = knee_of(_curve(_walk(5, 6000, 0.35 * CAP_IOPS, 0.9 * CAP_IOPS)), "iops", 20)
    assert k.load is None and k.why_none in ("no load light enough learned to call unloaded",
                                             "under 2x its unloaded latency at every load seen")


def test_no_figure_across_a_gap_in_the_loads_learned():
    light = list(_walk(6, 3000, 50.0, 200.0))
    heavy = list(_walk(7, 3000, 0.85 * CAP_IOPS, 0.9 * CAP_IOPS))
    k = knee_of(_curve(light + heavy), "iops", 20)
    assert k.load is None and k.why_none == "no loads learned near the knee"


def test_too_few_loads_is_no_figure():
    assert knee_of(LatencyCurve(), "iops", 20) == Knee(None, "iops", None, None, "too few loads learned")


def test_the_peak_is_the_last_half_hour_to_hour():
    """Blocks of four windows here (half an hour in the daemon): the peak is the block just ended and the one
    under way, so it covers between one and two blocks (each window's load its own peak here)."""
    p = PeakLoad(block_windows=4, held_windows=1)
    assert p.peak() is None
    for load in (5, 9, 1, 2):        # a whole block: its max kept
        p.add(load)
    assert p.peak() == 9
    for load in (3, 4):              # the next block under way; the one before still counts
        p.add(load)
    assert p.peak() == 9
    for load in (3, 2):              # that block ended: the 9 is more than a block ago
        p.add(load)
    assert p.peak() == 4


def test_the_peak_is_a_load_held_for_three_windows_not_one_windows_burst():
    """A writer at 1,000 IOPS that stalls for a window and catches up in the next: the catch-up's 1,400 is
    not the peak; a load held at 1,400 for three windows is."""
    p = PeakLoad(block_windows=100)
    for load in (1000, 1000):
        p.add(load)
    assert p.peak() is None                      # not yet three windows: no peak to read a headroom against
    for load in (1000, 1000, 600, 1400, 1000, 1000, 1000):
        p.add(load)
    assert p.peak() == 1000
    assert headroom_ratio(Knee(2000.0, "iops", 0.5, 2400.0), p.peak()) == pytest.approx(2.0)
    for load in (1400, 1450, 1400):
        p.add(load)
    assert p.peak() == 1400


def test_the_detector_says_the_knee_and_the_headroom_of_what_it_learned():
    """A day of the synthetic device with an afternoon surge to three times its load: its curve reaches
    twice its unloaded await; the view carries the knee, and the headroom of the last hour's peak."""
    det = PassiveDetector()
    for w in pt.device_trace(9, pt.DAY_WINDOWS, surge=(2000, 3000)):
        det.observe([w])
    view = det.views()[0]
    knee = view.knee["read"]
    # the trace's curve: 0.5 ms * (1 + 4 (load / 5000) ^ 1.5) doubles its 200-IOPS await near 2,070 IOPS
    assert knee.load == pytest.approx(2070, rel=0.25), knee
    assert view.headroom_ratio["read"] > 0


def test_a_ceiling_at_the_top_of_its_bin_is_read_at_its_own_load_not_the_bins_centre():
    """A volume held at a provisioned 2,400 IOPS: flat at 0.1 ms below it, 0.8 ms at it. Its windows at the
    ceiling fill the bin of 2,048-2,896 (centre 2,435) and the steps below sit at 1,800 (bin 1,448-2,048,
    centre 1,722). Read at the bins' own loads the knee lies within a quarter of the ceiling (a
    fifth under: a step read as a slope between two loads a third apart), nearer than at the centres, and the
    figure survives the state database."""
    c = _steps(((150, 0.1), (300, 0.1), (600, 0.1), (1200, 0.1), (1800, 0.11), (2400, 0.8)))
    k = knee_of(c, "iops", 20)
    assert 0.78 * 2400 <= k.load <= 2400, k
    assert k.seen_up_to == pytest.approx(2400, rel=1e-6)
    again = LatencyCurve.from_state(c.to_state())
    assert knee_of(again, "iops", 20).load == pytest.approx(k.load, rel=1e-4)
    # a curve saved before the bins' loads were kept reads their centres, as it did
    old = c.to_state()
    del old["loads"]
    centred = knee_of(LatencyCurve.from_state(old), "iops", 20)
    assert centred.load < k.load, (centred, k)
    # a load saved outside its own bin is damage, not a figure: that bin reads its centre
    bad = c.to_state()
    bad["loads"] = {b: (v + 5.0 if int(b) == max(c.bins) else v) for b, v in bad["loads"].items()}
    assert LatencyCurve.from_state(bad).bin_load(max(c.bins)) == pytest.approx(2 ** ((max(c.bins) + 0.5) / 2))


def test_halving_a_full_bin_keeps_where_its_load_lies():
    c = LatencyCurve(cap=40)
    for i in range(200):
        c.learn(2400 if i % 2 else 2100, 0.5)
    assert c.totals[22] <= 40
    assert math.sqrt(2400 * 2100) * 0.98 <= c.bin_load(22) <= math.sqrt(2400 * 2100) * 1.02


def test_an_await_that_doubles_with_no_queue_is_not_the_knee():
    """A stacked loop volume under a ceiling of 2,400 IOPS, read one request at a time below it: its await is
    the CPU's, tens of microseconds, and doubled at 1,800 IOPS with a tenth of a request in the device (no
    request waits behind another); its queue forms at the ceiling, four requests at 1.7 ms. The knee is the
    ceiling's, not 1,800's."""
    c = _steps(((150, 0.022), (300, 0.02), (600, 0.021), (1200, 0.023), (1800, 0.055), (2400, 1.67)))
    k = knee_of(c, "iops", 20)
    assert 0.8 * 2400 <= k.load <= 2400, k
    # read on the await alone (a bytes curve has no request count) the same bins cross at 1,800's
    assert knee_of(c, "kib", 20).load < 0.8 * 2400
    # short of the ceiling the await doubled and no queue formed: no figure, and that is the reason said
    short = _steps(((150, 0.022), (300, 0.02), (600, 0.021), (1200, 0.023), (1800, 0.055)))
    k = knee_of(short, "iops", 20)
    assert k.load is None and k.why_none.startswith("no queue where its latency reached 2x"), k


@pytest.mark.parametrize("multiple", [1.5, 2.0, 3.0])
def test_a_single_queue_fed_at_random_reaches_the_multiple_with_that_many_requests_less_one_in_it(multiple):
    """M/M/1: the await is S / (1 - rho) and the requests in it rho / (1 - rho): at m times S, m - 1 of them.
    The queue's floor and the await's multiple cross together, so the knee is the queue's own: where its
    await reaches the multiple."""
    service_ms, cap = 0.5, 2000.0     # one request at a time, 0.5 ms each

    def mm1(load):
        return service_ms / (1 - min(load / cap, 0.97))
    c = _curve((load, mm1(load)) for load in (cap * 0.9 * (0.01 / 0.9) ** (i / 2000) for i in range(2001))
               for _ in range(3))
    k = knee_of(c, "iops", 20, multiple)
    rho = 1 - 1 / multiple
    assert k.load == pytest.approx(rho * cap, rel=0.12), (k, rho * cap)
