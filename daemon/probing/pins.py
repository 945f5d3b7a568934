"""Which volume a probe target belongs to: a target is held to the volume it was first probed on, so a
directory whose filesystem is gone is never probed on the disk beneath it (pure)."""
from __future__ import annotations


def stable_identity(identity: str | None) -> bool:
    """An identity a target can be held to: not `kernel:NAME`, the fallback for a device the view did not
    know yet (a device attached just before the daemon started, probed before its first read of them)."""
    return bool(identity) and not identity.startswith("kernel:")


def pin_refusal(pins, target: str, identity: str | None) -> str | None:
    """Why a probe of `target` on the volume `identity` is refused, or None. `pins`: target -> the volume it was
    first probed on (Health.pins, published in the snapshot for the probe workers)."""
    pinned = pins.get(target)
    if pinned is None or identity == pinned or not stable_identity(pinned):
        return None
    return (f"target {target} is now on {identity or 'no block device'}, but it was first probed on {pinned}: "
            "a different volume (is its filesystem still mounted? was the device name reused?); "
            f"`iowarden baseline reset --target {target}` accepts the new one")
