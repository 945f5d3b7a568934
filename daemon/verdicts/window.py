"""A rolling window of floats that also keeps them sorted: its median, MAD and extremes without a sort.

A detector asks its window for the median and the MAD on every probe, and the passive detector replays
days of windows at a time; sorting the window each time made a week's replay of one volume cost seconds.
The answers are the same floats `statistics.median` gives on the same values.
"""
from __future__ import annotations

import bisect
from collections import deque


class SortedWindow(deque):
    """A deque (newest last, oldest dropped past maxlen) whose values are also kept in order."""

    def __init__(self, iterable=(), maxlen=None):
        super().__init__(iterable, maxlen)
        self._sorted = sorted(self)

    def append(self, x: float) -> None:
        if self.maxlen is not None and len(self) == self.maxlen:
            if self.maxlen == 0:
                return
            del self._sorted[bisect.bisect_left(self._sorted, self[0])]
        super().append(x)
        bisect.insort(self._sorted, x)

    def extend(self, xs) -> None:
        for x in xs:
            self.append(x)

    def clear(self) -> None:
        super().clear()
        self._sorted.clear()

    def _refuse(self, *a, **kw):
        raise TypeError("a SortedWindow only appends, extends and clears")

    appendleft = extendleft = pop = popleft = remove = rotate = insert = __setitem__ = __delitem__ = _refuse
    __iadd__ = _refuse

    def __reduce__(self):
        return type(self), (list(self), self.maxlen)

    def __copy__(self):
        return type(self)(self, self.maxlen)

    def lowest(self) -> float:
        return self._sorted[0]

    def highest(self) -> float:
        return self._sorted[-1]

    def median(self) -> float:
        s, n = self._sorted, len(self._sorted)
        if n == 0:
            raise ValueError("no median of an empty window")
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

    def mad(self, centre: float) -> float:
        """The median of |v - centre|: the distances below and above the centre are two sorted runs, and the
        middle of both together is found by bisection on how many come from the lower run."""
        s, n = self._sorted, len(self._sorted)
        if n == 0:
            raise ValueError("no MAD of an empty window")
        split = bisect.bisect_left(s, centre)
        below = lambda t: centre - s[split - 1 - t]   # ascending in t   # noqa: E731
        above = lambda t: s[split + t] - centre       # ascending in t   # noqa: E731
        n_below, n_above = split, n - split

        def kth(k: int) -> float:   # the k-th smallest (0-based) of both runs
            lo, hi = max(0, k + 1 - n_above), min(k + 1, n_below)
            while True:
                i = (lo + hi) // 2            # taken from below
                j = k + 1 - i                 # taken from above
                if i < n_below and j > 0 and above(j - 1) > below(i):
                    lo = i + 1
                elif i > 0 and j < n_above and below(i - 1) > above(j):
                    hi = i - 1
                else:
                    return max(below(i - 1) if i > 0 else float("-inf"), above(j - 1) if j > 0 else float("-inf"))

        return kth(n // 2) if n % 2 else (kth(n // 2 - 1) + kth(n // 2)) / 2
