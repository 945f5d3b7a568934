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
    window: "ProbeWindow | None" = None           # the probe against what its device did in the same seconds
    cgroup_limits: list = field(default_factory=list)   # limits on the stack that hold iowarden's own I/O
    who: str | None = None                        # the cgroups doing I/O on the stack's devices, with shares
    who_unseen: str | None = None                 # why no cgroup can be named (v1 did not count the devices' I/O)
    foreign_share: float | None = None            # their share of the I/O, iowarden's own probes excepted
    full: list = field(default_factory=list)      # full_filesystem() sentences for filesystems on the stack
    below: tuple = ()                             # what the stack is built on through a file: the disk under a
                                                  # loop device's backing file (its scheduler is the volume's too)


@dataclass(frozen=True)
class ProbeWindow:
    """What the probe waited per I/O, and what its device did in the same seconds (the sampler's view)."""
    device: str
    probe_p50_seconds: float | None
    device_await_ms: float | None
    device_util_percent: float | None


ABOVE_RATIO = 4.0          # the probe waited this many times the device's await, or more: the time is above it
ABOVE_MARGIN_MS = 0.5      # ... and by this much at least (a 40 µs await against 200 µs is noise, not a layer)
SLOW_DEVICE_AWAIT_MS = 5.0  # a device answering this slowly with little other work is itself slow (SSD terms)


def layer_of(ev: Evidence) -> str | None:
    """Where the probe's time went: "above" the block layer (the device answered fast: a limit, pressure,
    the filesystem), "contention" (the device busy with others' work), "device" (the device slow on its own),
    or None when the sampler did not see the device in the probe's seconds."""
    w = ev.window
    if w is None or w.probe_p50_seconds is None or w.device_await_ms is None:
        return None
    probe_ms = w.probe_p50_seconds * 1e3
    if probe_ms > ABOVE_RATIO * w.device_await_ms + ABOVE_MARGIN_MS:
        return "above"
    if ev.contended or (ev.foreign_share or 0) > 0.5 or (ev.foreign_util_percent or 0) > 50:
        return "contention"
    if w.device_await_ms >= SLOW_DEVICE_AWAIT_MS:
        return "device"
    return None


def _ms(v: float) -> str:
    if v <= 0:
        # the kernel keeps I/O time in whole milliseconds: a window's I/Os that took less than one in all
        return "no measurable time"
    if v < 0.1:
        return f"{v * 1000:.0f} µs"
    return f"{v:.2f} ms" if v < 10 else f"{v:,.0f} ms"


FULL_SAID_FOR_SECONDS = 1800.0   # a probe refused for space this recently still says the filesystem is full


def full_filesystem(target: str, path: str, used_ratio: float, ago_seconds: float, device: str,
                    on_it: bool) -> str:
    """A full filesystem as the cause of its device's slowness: a filesystem out of space flushes and retries
    each write before it fails it (XFS writes back every dirty inode first), so the device's own I/O, reads
    too, queues behind work nobody asked for; a device beneath it (a loop file's disk) carries the same."""
    where = "on it" if on_it else "above it"
    return (f"the filesystem {where} is full: {target} ({path}) was {used_ratio:.0%} used when its last probe was "
            f"refused for space {max(0.0, ago_seconds) / 60:.0f} min ago; a filesystem out of space flushes and "
            f"retries its writes before it fails them, and {device}'s I/O waits behind that (free space on it)")


ABOVE_BLOCK_LAYER = "above the block layer"   # how a cause above it begins (the sentence's Also line reads it)
LIMIT_BELOW = "below "                         # how a limit on a device under the target's begins (core/knowledge.py)


def _layer_causes(ev: Evidence, layer: str | None) -> list[str]:
    w, out = ev.window, []
    if layer == "above":
        seen = (f"the probe's I/Os took {_ms(w.probe_p50_seconds * 1e3)} at the median while {w.device} answered in "
                f"{_ms(w.device_await_ms)} at {w.device_util_percent or 0:.0f}% util")
        if ev.cgroup_limits:
            out.extend(f"{ABOVE_BLOCK_LAYER}: {lim}; {seen}" for lim in ev.cgroup_limits)
        else:
            out.append(f"{ABOVE_BLOCK_LAYER}: {seen}; no cgroup I/O limit on it applies to iowarden's I/O "
                       "(look at memory and CPU pressure, the filesystem, a hypervisor's limit)")
    elif ev.cgroup_limits:
        out.extend(ev.cgroup_limits)
    # a limit held on a device below this one (a loop device over a throttled one) is what makes this one's await
    # long: its requests wait in the throttled one. A limit on the device itself throttles before its queue, so
    # a long await there is still the device's (a busy backing disk) and is said beside the limit
    if layer == "device" and not ev.full and not any(lim.startswith(LIMIT_BELOW) for lim in ev.cgroup_limits):
        share = "" if ev.foreign_share is None else f", {ev.foreign_share:.0%} of its I/O from other work"
        out.append(f"the device itself: {w.device} took {_ms(w.device_await_ms)} per I/O at "
                   f"{w.device_util_percent or 0:.0f}% util{share}")
    return out


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
    return out | set(ev.physical_disks) | set(ev.below)


def likely_causes(ev: Evidence) -> list[str]:
    causes: list[str] = list(ev.full)
    stack = _stack(ev)
    for at, device, setting, old, new in ev.drift:
        if device == "host" or device in stack:
            where = "host" if device == "host" else device
            causes.append(f"setting changed since the baseline was learned: {where} {setting} {old} -> {new}")
    layer = layer_of(ev)
    if ev.contended or (ev.foreign_util_percent or 0) > 50 or layer == "contention":
        # first: a probe run on a device busy with others' work says so, and who, before what else held it
        util = f" ({ev.foreign_util_percent:.0f}% util from other I/O)" if ev.foreign_util_percent else ""
        causes.append(f"contention: the device was busy with other work during the probe{util}"
                      + (f"; {ev.who}" if ev.who else f"; {ev.who_unseen}" if ev.who_unseen else ""))
        causes.extend(_layer_causes(ev, layer))
    else:
        causes.extend(_layer_causes(ev, layer))
        if ev.who and layer != "above":
            causes.append(ev.who)
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
