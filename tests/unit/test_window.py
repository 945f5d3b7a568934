"""The detector's rolling window: the same median and MAD as statistics.median over the same values."""
import copy
import pickle
import random
import statistics

import pytest

from iowarden.daemon.verdicts.window import SortedWindow


@pytest.mark.parametrize("seed", range(4))
def test_median_mad_and_extremes_agree_with_statistics_over_generated_windows(seed):
    rng = random.Random(seed)
    for _ in range(300):
        w = SortedWindow(maxlen=rng.choice([1, 2, 3, 12, 50, 288]))
        for _ in range(rng.randint(1, 400)):   # ties, repeats and zeros as well as spread values
            w.append(rng.choice([rng.gauss(0, 1), round(rng.gauss(0, 1), 1), 0.0, -3.5]))
        values = list(w)
        centre = statistics.median(values)
        assert w.median() == centre
        for c in (centre, centre + 0.3, centre - 1.0, max(values) + 1, min(values) - 1):
            assert w.mad(c) == statistics.median(abs(v - c) for v in values)
        assert (w.lowest(), w.highest()) == (min(values), max(values))


def test_it_survives_a_copy_and_a_pickle_and_refuses_what_would_unsort_it():
    w = SortedWindow([3.0, 1.0, 2.0], maxlen=3)
    w.append(0.5)                     # the oldest (3.0) leaves
    assert list(w) == [1.0, 2.0, 0.5] and w.highest() == 2.0
    for other in (copy.deepcopy(w), pickle.loads(pickle.dumps(w))):
        assert list(other) == list(w) and other.maxlen == 3 and other.median() == 1.0
    w.clear()
    with pytest.raises(ValueError):
        w.median()
    with pytest.raises(TypeError):
        w.appendleft(1.0)
