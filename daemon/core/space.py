"""Which volumes are full, from their probes refused for space: a full filesystem is why its device is slow.

A filesystem out of space flushes and retries each write before it fails it (XFS writes back every dirty inode
first), so its device's own I/O, reads too, queues behind work nobody asked for, and so does the disk under a
loop device's file. The probe that was refused for space is the evidence, kept per target with the core's
monotonic clock: said for FULL_SAID_FOR_SECONDS, forgotten at the target's next successful probe.
"""
from __future__ import annotations

from dataclasses import dataclass

from iowarden.probes import blockqueue

from iowarden.daemon.verdicts.causes import FULL_SAID_FOR_SECONDS, full_filesystem


@dataclass(frozen=True)
class Full:
    at: float             # monotonic: when the refusal arrived
    used_ratio: float
    path: str
    device: str


def note(full: dict, result, now: float) -> None:
    """Keep a refusal for space (by target); a probe that ran since says there was room again."""
    used = getattr(result, "space_used_ratio", None)
    if used is not None and result.device:
        full[result.target] = Full(now, used, result.path, result.device)
    elif result.ok:
        full.pop(result.target, None)


def causes(full: dict, devices: set[str], device_view: dict, now: float) -> list[str]:
    """A sentence per full target on these devices, or built on them (a loop file's disk)."""
    out = []
    for target, f in sorted(full.items()):
        if now - f.at > FULL_SAID_FOR_SECONDS:
            continue
        on_it = f.device in devices
        if on_it or devices & set(blockqueue.devices_below(f.device, device_view or {})):
            out.append(full_filesystem(target, f.path, f.used_ratio, now - f.at, ", ".join(sorted(devices)), on_it))
    return out
