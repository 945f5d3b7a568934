"""The host as a layer: a slowdown most of a host's disks share is the host's, not one device's.

When the whole host slows (its CPUs starved, its memory reclaiming, one store under every volume, other work
everywhere), every disk's latency rises off its own normal at once, and whichever crossed DeviceSlow's bar first
was paged as a failing device. So a device is judged slow on its own only by what its neighbours do not share:
its latency over its normal is taken over the median of its neighbours' (the host's other judged disks, less
those stacked with it: an array and its members slow together by construction), as a group's members are
judged over their group's. With fewer than MIN_NEIGHBOURS neighbours judged there is no host to speak of: one
neighbour's bad minute would hide a real fault.
"""
from __future__ import annotations

import statistics

MIN_NEIGHBOURS = 2


def related_by_stack(stacks: dict[str, tuple[str, ...]]) -> dict[str, set[str]]:
    """device -> the devices stacked with it (an md array or striped dm device, its members, and theirs)."""
    out: dict[str, set[str]] = {}
    for parent, members in stacks.items():
        family = {parent, *members}
        for device in family:
            out.setdefault(device, set()).update(family - {device})
    return out


def neighbours_median(values: dict[str, float], related: dict[str, set[str]], devices=None) -> dict[str, float]:
    """device (of `devices`, by default those with a value) -> the median of the other devices' values, less
    those related to it, where at least MIN_NEIGHBOURS remain (a device absent from the result has no host
    layer to be judged against). A quiet device has no value of its own and still has neighbours: a probe on
    it is measured on the host they share."""
    out = {}
    for device in (values if devices is None else devices):
        others = [v for k, v in values.items() if k != device and k not in related.get(device, ())]
        if len(others) >= MIN_NEIGHBOURS:
            out[device] = statistics.median(others)
    return out


def host_slowdown(ratios: dict[str, float]) -> float | None:
    """The host's shared slowdown: the median of its judged disks' latency over their normals (None with fewer
    than MIN_NEIGHBOURS + 1 judged)."""
    return statistics.median(ratios.values()) if len(ratios) > MIN_NEIGHBOURS else None
