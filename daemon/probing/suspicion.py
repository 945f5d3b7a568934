"""Where a fault is suspected, read from the core's published snapshot: a probe there is the evidence, so the
scheduler does not defer it long for a busy device, and confirms a far-off probe soon. Pure: a snapshot in,
an answer out (the sets are computed once per snapshot)."""
from __future__ import annotations

SUSPECT_DEVIATION = 10.0   # spreads off its normal (the detector's extreme_z): the next probe is the evidence
# The passive view's latency over its normal at the load its device carries: a device this far off is busy because
# it is slow, not slow because it is busy. A volume capped at 5 % of its load (a collapse) kept its device at 100 %
# util with its own users' queue, and its probes waited 4 minutes as "device busy" before one ran: the collapse
# was over before it was confirmed.
SUSPECT_SLOWDOWN = 8.0


BY_PROBE, BY_PASSIVE = "probe", "passive"


def suspected_fault(snapshot, target: str, profile: str) -> str | None:
    """Why a fault is suspected on this target's profile, or None. BY_PROBE: an open VolumeDegraded there, its
    last probe far off the volume's normal (the next probe confirms it, soon), its last probe run on a busy device
    that delivered under a fifth of the probe's normal in total (verdicts/contended.py: the second in a row
    pages, so it comes a minute later, within the collapse, not an interval later) or fell to a collapse's share of
    its normal on a starved CPU and was set aside (verdicts/health.py), or its last probe refused for
    space (the next one, soon, says when there is room again: a refusal costs the device nothing, and the
    ProbeFailing it raised clears a minute after the space is freed, not an interval). BY_PASSIVE: a passive
    verdict open on its volume or its device (at its limit, slower than its normal), or its device serving its
    load at SUSPECT_SLOWDOWN times its normal latency or more now: a probe is not deferred long for the busy
    device that verdict is about, but is not hurried either (a volume may sit at its provisioned limit all
    week)."""
    if snapshot is None:
        return None
    by_probe, by_passive, _, _ = _suspected_sets(snapshot)
    return BY_PROBE if (target, profile) in by_probe else BY_PASSIVE if (target, profile) in by_passive else None


def slow_directions(snapshot, target: str) -> frozenset:
    """The directions ("read", "write") in which the passive view finds the target's device serving its load at
    SUSPECT_SLOWDOWN times its normal latency or more now. A collapse shows in the direction its users wait in (a
    soak's volume capped at 5 % of its load: its reads at 23-24x their normal for three and a half minutes, its
    writes at 1.6-3.6x): a probe of that direction is the evidence, whichever profile was next due."""
    if snapshot is None:
        return frozenset()
    return _suspected_sets(snapshot)[2].get(target, frozenset())


def struck_on_busy(snapshot, target: str) -> bool:
    """Whether a probe of the target's volume (any of its profiles, the last of that profile) ran on a busy device
    and came short in total with the device agreeing (verdicts/contended.py): one strike of the two in a row that
    page. Its next probe is the second: the device is busy because of what that probe found, so it waits for it no
    longer (plan.py)."""
    if snapshot is None:
        return False
    return target in _suspected_sets(snapshot)[3]


# (the snapshot they were computed for, (the two sets, target -> its slow directions, the targets struck once)): one
# tuple, replaced whole, so a reader on another thread sees one snapshot's answers or the other's, never a mix
_SUSPECTED: tuple = (None, (frozenset(), frozenset(), {}, frozenset()))


def _suspected_sets(snapshot) -> tuple[frozenset, frozenset, dict, frozenset]:
    global _SUSPECTED
    cached = _SUSPECTED
    if cached[0] is not snapshot:
        far = {(b.volume, b.profile) for b in snapshot.baselines if (b.deviation_score or 0.0) > SUSPECT_DEVIATION}
        by_probe = {(a.target, a.profile) for a in snapshot.alerts if a.alert == "VolumeDegraded"}
        short = getattr(snapshot, "short_on_busy", frozenset())
        by_probe |= {(p.target, p.profile) for p in snapshot.probes if (p.volume, p.profile) in far
                     or (p.volume, p.profile) in short or getattr(p.result, "space_used_ratio", None) is not None}
        passive = [a for a in snapshot.alerts if a.alert in ("DeviceSlow", "VolumeAtLimit")]
        places = {a.volume for a in passive} | {a.target for a in passive} | {d for a in passive for d in a.devices}
        # now: the last window judged and that far off (a view's slowdown_ratio keeps its last judged window's
        # however old, and an hour of a backup's floods after one slow window is not a suspicion for the hour)
        slow = {name: frozenset(direction for direction, r in (v.slowdown_ratio or {}).items()
                                if r is not None and r >= SUSPECT_SLOWDOWN)
                for name, _, v in getattr(snapshot, "passive", ())
                if (getattr(v, "window_ratio", None) or 0.0) >= SUSPECT_SLOWDOWN}
        places |= {name for name, directions in slow.items() if directions}
        by_passive = {(p.target, p.profile) for p in snapshot.probes
                      if p.volume in places or getattr(p.result, "device", None) in places}
        directions: dict = {}
        for p in snapshot.probes:
            found = slow.get(getattr(p.result, "device", None), frozenset()) | slow.get(p.volume, frozenset())
            if found:
                directions[p.target] = directions.get(p.target, frozenset()) | found
        struck = frozenset(p.target for p in snapshot.probes if (p.volume, p.profile) in short)
        cached = _SUSPECTED = (snapshot, (frozenset(by_probe), frozenset(by_passive), directions, struck))
    return cached[1]
