"""One fault on one volume is one page: which open alerts page, and which ride on another's page.

A throttled volume is seen by its probes (VolumeDegraded on the mount) and, a few windows later, by the
passive view of the device under it (SlowMember, DeviceSlow, VolumeAtLimit or VolumeContended on the same
device). Each is right, and each alone would be a page: two notifications for one fault. So the alerts of one
volume are one page, the one the rules send first; the others are said in its "Also" ("SlowMember #6 on this volume
(loop3): ...") and exported as folded (`iowarden_alert_folded`), which the shipped rules page `unless`.

Why the first and not the worst: a page that is already out stays the page while it is open. Were a later
critical verdict to take over from an earlier warning, Alertmanager would resolve one and fire the other, two
notifications again; the page's own severity is its kind's (alert_kinds.py) and the folded verdict's figures
are on it.

One volume is the device a probe's target lives on and what the kernel builds it from: a partition's disk, the
members of an md array or a device-mapper volume, the device under a loop device's file. Two volumes built on
one disk (two partitions, two loop files) stay two pages: neither is within the other. An alert of the disk
under both rides on the page of the first of them, and says so there.

Pure: the open alerts, the block devices and the last decision's pages in, the decision out. The core decides
when it publishes a snapshot (Snapshot.folds); the outputs say it.
"""
from __future__ import annotations

from dataclasses import dataclass

from iowarden.daemon.alert_kinds import hold_of
from iowarden.daemon.snapshot import PASSIVE_PROFILE

# the alerts that speak for a volume's I/O; the others (a probe failing, a drifted setting, a source's
# part) say something else and page on their own
VOLUME_ALERTS = frozenset({"VolumeDegraded", "SlowMember", "DeviceSlow", "VolumeAtLimit", "VolumeContended"})
MAX_DEPTH = 8   # a stack deeper than this is not one the kernel builds; bounds a cycle in damaged sysfs readings


# A verdict that rode on a page outlives it by minutes as the fault ends (the passive view drains its windows
# after the probes are back: 2-3 minutes in the week lane); paged then, it would be a page for a fault already
# over. It pages on its own only if it is still open this long after its page closed: then it is a fault of its own.
# So does a verdict first raised on the volume within that time after its page closed: on a loaded host the week
# lane's throttled volume, its DeviceSlow page closed, raised VolumeDegraded on a write probe's p99 (1.7x) while
# the writes the throttle had held drained, and paged a second time for the one fault.
RIDER_GRACE_SECONDS = 600.0


@dataclass(frozen=True)
class Fold:
    id: int                 # the folded alert
    into: int               # the alert whose page says it
    into_alert: str = ""    # that alert's kind
    page_closed_at: float | None = None   # when that page closed (unix time), if it has


@dataclass(frozen=True)
class ClosedPage:
    """A page that was sent and has closed: a verdict raised on its volume soon after rides on it."""
    id: int
    alert: str
    own: frozenset          # its alerts' devices
    built_from: frozenset   # and what they are built from (stack())
    closed_at: float        # unix time


def closed_pages(last_alerts, last_folds: dict, last_taken_at: float, open_alerts, before: tuple, devices: dict,
                 target_device: dict | None, now: float) -> tuple[ClosedPage, ...]:
    """The pages closed in the last RIDER_GRACE_SECONDS: those `before` still within it, and the pages of the last
    decision (`last_alerts` not in `last_folds`, sent by `last_taken_at`) of which nothing is open now
    (`open_alerts`: a page is an alert kind on a volume, open while any of its profiles is), closed `now`."""
    kept = [c for c in before if now - c.closed_at < RIDER_GRACE_SECONDS]
    still = {(a.alert, a.volume) for a in open_alerts}
    units: dict[tuple[str, str], list] = {}
    for a in sorted(last_alerts, key=lambda a: (a.raised_at, a.id)):
        if a.alert in VOLUME_ALERTS and a.id not in last_folds and (a.alert, a.volume) not in still:
            units.setdefault((a.alert, a.volume), []).append(a)
    by_devno = devno_index(devices) if units else {}
    for members in units.values():
        if min(sends_at(a) for a in members) > last_taken_at or any(c.id == members[0].id for c in kept):
            continue   # never sent: no page to ride on
        own = frozenset(d for a in members for d in devices_of(a, target_device))
        kept.append(ClosedPage(members[0].id, members[0].alert, own,
                               frozenset().union(*(stack(d, devices, by_devno) for d in own)) if own else frozenset(),
                               now))
    return tuple(kept)


def devices_of(alert, target_device: dict | None = None) -> tuple[str, ...]:
    """The devices an alert is on: a passive verdict's device; a probe's devices where it was raised, else the
    device its target's last probe ran on (`target_device`)."""
    if alert.profile == PASSIVE_PROFILE:
        return (alert.target,) if alert.target else ()
    own = tuple(d for d in alert.devices if d)
    if not own and target_device and target_device.get(alert.target):
        own = (target_device[alert.target],)
    return own


def stack(name: str, devices: dict, by_devno: dict | None = None) -> frozenset[str]:
    """`name` and what it is built from, down to the disks: partition -> disk, md/dm -> members, a loop device ->
    the device of the filesystem its file is on (`by_devno`: "MAJ:MIN" -> name, from devno_index())."""
    seen, todo = set(), [(name, 0)]
    while todo:
        dev, depth = todo.pop()
        if dev in seen or depth > MAX_DEPTH:
            continue
        seen.add(dev)
        bd = devices.get(dev)
        if bd is None:
            continue
        below = list(getattr(bd, "slaves", ()) or ())
        if getattr(bd, "kind", "") == "partition" and getattr(bd, "parent", None):
            below.append(bd.parent)
        if by_devno and getattr(bd, "loop_backing_devno", None) in by_devno:
            below.append(by_devno[bd.loop_backing_devno])
        todo += [(b, depth + 1) for b in below]
    return frozenset(seen)


def devno_index(devices: dict) -> dict[str, str]:
    """"MAJ:MIN" -> kernel name, of the devices that say their numbers."""
    return {f"{d.major}:{d.minor}": name for name, d in devices.items()
            if isinstance(getattr(d, "major", None), int) and isinstance(getattr(d, "minor", None), int)}


def sends_at(a) -> float:
    """When the shipped rules send this alert: raised, plus its rule's hold (alert_kinds.HOLD_SECONDS)."""
    return a.raised_at + hold_of(a.alert)


def page_units(alerts, fold_of: dict[int, "Fold"], now: float) -> frozenset[tuple[str, str]]:
    """The (alert, volume) of each page among `alerts` that has been sent by `now` (unix time): carried to the
    next decision, which keeps them the pages while they are open."""
    return frozenset((a.alert, a.volume) for a in alerts
                     if a.alert in VOLUME_ALERTS and a.id not in fold_of and sends_at(a) <= now)


def folds(alerts, devices: dict, target_device: dict | None = None, paging: frozenset = frozenset(),
          last: dict | None = None, now: float = 0.0, closed: tuple = ()) -> dict[int, Fold]:
    """alert id -> its Fold, for each open volume alert said on another's page.

    Alerts are of one volume when one's devices are within the other's stack (a SlowMember on an array's
    member and the array's VolumeDegraded; a DeviceSlow on the mount's own device). A page is an alert kind on
    a volume (the rule groups a VolumeDegraded's profiles into one). Of the pages of one volume, the one already
    sent (`paging`, page_units()) stays the page while any of its alerts is open; else the one the rules send
    first: raised plus its rule's hold, so a critical VolumeDegraded is not kept waiting behind a VolumeAtLimit
    its rule holds ten minutes. A later verdict never takes a sent page over: a page once sent is not resolved
    and sent again because another verdict joined it or one of its profiles ended. An alert folded at the last
    decision (`last`) whose page has since closed stays folded for RIDER_GRACE_SECONDS after that (`now`), and so
    does one first raised on a volume whose page closed (`closed`, closed_pages()) within that time before it.
    """
    units: dict[tuple[str, str], list] = {}
    for a in sorted((a for a in alerts if a.alert in VOLUME_ALERTS), key=lambda a: (a.raised_at, a.id)):
        units.setdefault((a.alert, a.volume), []).append(a)
    order = sorted(units, key=lambda u: (u not in paging, min(sends_at(a) for a in units[u]), units[u][0].id))
    by_devno = devno_index(devices) if units else {}
    open_ids = {a.id for a in alerts}
    pages: list = []           # (first alert, its devices, their stacks)
    out: dict[int, Fold] = {}
    for unit in order:
        own = frozenset(d for a in units[unit] for d in devices_of(a, target_device))
        mine = frozenset().union(*(stack(d, devices, by_devno) for d in own)) if own else frozenset()
        # an acknowledged page takes no verdict raised after the ack: the operator said they know of this
        # fault, not of the next one (a drive failing under a planned throttle must still page)
        joins = units[unit][0].raised_at
        into = next((first for first, theirs_own, theirs in pages
                     if own and (own & theirs or theirs_own & mine)
                     and (first.acked_at is None or joins < first.acked_at)), None)
        if into is None:
            rode = [last[a.id] for a in units[unit] if last and a.id in last and last[a.id].into not in open_ids]
            if rode and now - (rode[0].page_closed_at or now) < RIDER_GRACE_SECONDS:
                closed_at = rode[0].page_closed_at or now
                out.update({a.id: Fold(a.id, rode[0].into, rode[0].into_alert, closed_at) for a in units[unit]})
                continue
            # a page already sent stays a page; a verdict raised since a page of its volume closed rides on that one
            after = None if unit in paging else next(
                (c for c in closed if own and (own & c.built_from or c.own & mine)
                 and c.closed_at <= joins and now - c.closed_at < RIDER_GRACE_SECONDS), None)
            if after is not None:
                out.update({a.id: Fold(a.id, after.id, after.alert, after.closed_at) for a in units[unit]})
                continue
            pages.append((units[unit][0], own, mine))
        else:
            out.update({a.id: Fold(a.id, into.id, into.alert) for a in units[unit]})
    return out
