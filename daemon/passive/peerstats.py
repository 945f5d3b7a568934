"""Statistics of a member against the rest of its group, for every member at once, in O(n log n).

"The median of its peers" for each of n members, computed member by member, is n medians of n - 1
values: 3.7 s a window at 4,000 disks in one group. Sorted once, each member's leave-one-out median is
an index away. Pure."""
from __future__ import annotations

from typing import Hashable, Mapping, TypeVar

K = TypeVar("K", bound=Hashable)


def leave_one_out_medians(values: Mapping[K, float]) -> dict[K, float]:
    """For each key, the median of every other key's value (statistics.median's: the mean of the middle two
    for an even count). Keys with no other value get none."""
    n = len(values)
    if n < 2:
        return {}
    order = sorted(values, key=values.__getitem__)
    s = [values[k] for k in order]
    rest = n - 1

    def at(j: int, skip: int) -> float:   # the j-th smallest of the values without the one at `skip`
        return s[j] if j < skip else s[j + 1]

    out = {}
    for i, k in enumerate(order):
        if rest % 2:
            out[k] = at(rest // 2, i)
        else:
            out[k] = (at(rest // 2 - 1, i) + at(rest // 2, i)) / 2
    return out
