"""Likely causes of a slow volume, computed from evidence the daemon already holds, never guessed.

Each finding is a sentence an SRE can act on, naming the setting, device or
number behind it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Evidence:
    """What the daemon knew when the alert was raised."""
    physical_disks: tuple[str, ...]
    device: str | None
    devices: dict                                 # kernel name -> blockqueue.BlockDevice
    drift: list[tuple]                            # (at, device, setting, old, new) since the baseline was learned
    contended: bool
    foreign_util_percent: float | None
    disk_await_ms: dict[str, float] = field(default_factory=dict)   # sampler: recent await per device
    xfs_now: object | None = None                 # XfsReport of the target's filesystem
    xfs_then: object | None = None                # the first report seen for it
    budget_exhausted: bool = False
    passive: list = field(default_factory=list)   # open passive verdicts on the stack's devices (sentences)
    sources: list = field(default_factory=list)   # what registered sources say of its disks (SMART: drive health)


def _stack(ev: Evidence) -> set[str]:
    """The target's device and everything between it and its disks (dm, md, partitions)."""
    out, stack = set(), [ev.device] if ev.device else []
    while stack:
        n = stack.pop()
        if n in out or n is None:
            continue
        out.add(n)
        d = ev.devices.get(n)
        if d is not None:
            stack.extend(d.slaves)
            if d.parent:
                stack.append(d.parent)
    return out | set(ev.physical_disks)


def likely_causes(ev: Evidence) -> list[str]:
    causes: list[str] = []
    stack = _stack(ev)
    for at, device, setting, old, new in ev.drift:
        if device == "host" or device in stack:
            where = "host" if device == "host" else device
            causes.append(f"setting changed since the baseline was learned: {where} {setting} {old} -> {new}")
    if ev.contended or (ev.foreign_util_percent or 0) > 50:
        util = f" ({ev.foreign_util_percent:.0f}% util from other I/O)" if ev.foreign_util_percent else ""
        causes.append(f"contention: the device was busy with other work during the probe{util}")
    for name in sorted(stack):
        d = ev.devices.get(name)
        if d is not None and d.md is not None:
            faulty = [m.name for m in d.md.members if m.faulty]
            if d.md.degraded or faulty:
                causes.append(f"md array {name} ({d.md.level}) is degraded"
                              + (f": faulty member {', '.join(faulty)}" if faulty else f" ({d.md.degraded} missing)"))
            elif d.md.sync_action and d.md.sync_action not in ("idle", "frozen"):
                causes.append(f"md array {name} is running {d.md.sync_action}")
            members = [m.name for m in d.md.members]
            waits = {m: ev.disk_await_ms[m] for m in members if m in ev.disk_await_ms}
            if len(waits) >= 2:
                med = statistics.median(waits.values())
                for m, w in waits.items():
                    others = [v for k, v in waits.items() if k != m]
                    if w > 3 * max(statistics.median(others), 0.1) and w > med:
                        causes.append(f"md member {m} of {name} is slow: await {w:.1f} ms vs its peers' "
                                      f"{statistics.median(others):.1f} ms")
    now, then = ev.xfs_now, ev.xfs_then
    if now is not None and then is not None and now.frag and then.frag and then.frag.extents_per_file:
        growth = now.frag.extents_per_file / then.frag.extents_per_file
        if growth >= 1.5 and now.frag.extents_per_file >= 2:
            causes.append(f"XFS fragmentation grew on {now.mountpoint}: {then.frag.extents_per_file:.1f} -> "
                          f"{now.frag.extents_per_file:.1f} extents per file (xfs_fsr defragments)")
    causes.extend(ev.sources)
    causes.extend(f"passive: {p}" for p in ev.passive)
    if ev.budget_exhausted:
        causes.append("iowarden's own probe budget is spent on this device: probes are sparse")
    return causes
