"""Targets found at run time: [[discover]] rules matched against the mount table.

A volume attached while iowarden runs is usually mounted some seconds or minutes
later, and mounting sends no uevent. So the rules are matched against
/proc/self/mounts on a short cadence and on every block-device event; a mount
that matches a rule becomes a target, and one that goes away stops being one.

A discovered target remembers the filesystem (st_dev) it was found on. If that
filesystem is unmounted between a match and a probe, the probe refuses rather
than write into the directory underneath (the root filesystem, usually). The
st_dev itself is taken only when the mount table read after the stat still has
the mount: a volume unmounted between the table's read and the stat answers with
the directory underneath, which must never become what a probe expects.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

from iowarden.probes import mountinfo, pathstat
from iowarden.probes.common import Roots, is_utf8, lines_of
from iowarden.probes.xfs import parse_mounts, read_mounts_text

from iowarden.daemon.config import Config, DiscoveryRule, Target


def match(rules: tuple[DiscoveryRule, ...], mounts: list[tuple[str, str, str, bool]],
          configured: tuple[Target, ...], dev_of, limit: int | None = None) -> list[Target]:
    """Targets for the mounts the rules match (pure, given dev_of(mountpoint) -> st_dev or None).

    mounts: (device, mountpoint, fstype, read_only). A read-only mount is left alone
    (its write probes could only fail), and so is a mountpoint a [[targets]] entry
    already probes; the first rule that matches a mountpoint takes it.
    """
    taken = {os.path.normpath(t.path) for t in configured}
    found: list[Target] = []
    for _dev, mountpoint, fstype, read_only in mounts:
        rule = rule_for(rules, mountpoint, fstype)
        if rule is None or read_only or mountpoint in taken:
            continue
        if limit is not None and len(found) >= limit:
            break   # past the cap: the caller counts what the rules would have taken (over_limit)
        st_dev = dev_of(mountpoint)
        if st_dev is not None:
            found.append(Target(f"{rule.name}:{mountpoint}", mountpoint, rule.profiles, rule.interval_seconds,
                                found_on_dev=st_dev, volume_class=rule.volume_class))
            taken.add(mountpoint)
    return found


def rule_for(rules: tuple[DiscoveryRule, ...], mountpoint: str, fstype: str) -> DiscoveryRule | None:
    """The first rule whose types and patterns take this mount (fnmatch: "*" also matches "/")."""
    return next((r for r in rules if fstype in r.fstypes
                 and any(fnmatch.fnmatchcase(mountpoint, p) for p in r.mountpoints)), None)


def read_only_matches(rules: tuple[DiscoveryRule, ...], mounts: list[tuple[str, str, str, bool]]) -> list[str]:
    """Mount points a rule would take but for being read-only: worth a warning, since under
    systemd's ProtectSystem= it is the sandbox, not the mount, that makes them so."""
    return [mnt for _dev, mnt, fstype, read_only in mounts if read_only and rule_for(rules, mnt, fstype)]


def read_mounts(roots: Roots = Roots()) -> list[tuple[str, str, str, bool]]:
    """(device, mountpoint, fstype, read_only) of what is mounted now; the last mount over a path wins.

    A mount point that is not UTF-8 is left out (see unnameable_mounts): a target's name is
    a label, a tag and a database key, all UTF-8.
    """
    return _mounts(read_mounts_text(roots))[0]


def _mounts(text: str) -> tuple[list[tuple[str, str, str, bool]], list[str]]:
    """The mounts of a mount table's text, and the mount points passed over as not UTF-8."""
    latest: dict[str, tuple[str, str, str, bool]] = {}
    unnameable = []
    for line in lines_of(text):
        fields = line.split(" ")
        parsed = parse_mounts(line)
        if len(fields) < 4 or not parsed:
            continue
        if not is_utf8(parsed[0][1]):
            unnameable.append(parsed[0][1])
            continue
        dev, mountpoint, fstype = parsed[0]
        latest.pop(mountpoint, None)  # re-insert: a mount stacked over another one hides it
        latest[mountpoint] = (dev, mountpoint, fstype, "ro" in fields[3].split(","))
    return list(latest.values()), unnameable


def over_limit(rules: tuple[DiscoveryRule, ...], mounts: list[tuple[str, str, str, bool]],
               configured: tuple[Target, ...], found: int) -> int:
    """How many writable mounts the rules would take beyond the `found` targets made (the cap's count)."""
    taken = {os.path.normpath(t.path) for t in configured}
    would = sum(1 for _dev, mnt, fstype, read_only in mounts
                if not read_only and mnt not in taken and rule_for(rules, mnt, fstype) is not None)
    return max(0, would - found)


@dataclass(frozen=True)
class Discovered:
    targets: tuple[Target, ...]
    read_only: list[str]          # mount points a rule would take but for being read-only
    unnameable: list[str]         # mount points that are not UTF-8 (passed over)
    over_limit: int = 0           # mounts the rules would take past [scheduling] max_discovered_targets


def discover(cfg: Config, roots: Roots = Roots(), before: tuple[Target, ...] = (),
             watch: pathstat.PathWatch | None = None) -> Discovered:
    """The targets the config's rules find in the mount table now (at most max_discovered_targets), and what
    they passed over.

    Each candidate mount point is asked by a child with a deadline (pathstat), all at once. A mount that does
    not answer stays the target it was (`before`), so its probes are failures on record that say it is
    hung; one never seen answering is not taken until it answers."""
    if not cfg.discover:
        return Discovered((), [], [])
    mounts, unnameable = _mounts(read_mounts_text(roots))
    limit = cfg.section("scheduling").max_discovered_targets
    taken = {os.path.normpath(t.path) for t in cfg.targets}
    candidates = [m for _d, m, fstype, ro in mounts
                  if not ro and m not in taken and rule_for(cfg.discover, m, fstype) is not None]
    answers = (watch or pathstat.WATCH).check(candidates)
    devnos_after = mountinfo.read_devnos(roots)   # after the stats: what each answer must still be
    known = {t.path: t.found_on_dev for t in before}

    def dev_of(mountpoint: str) -> int | None:
        answer = answers.get(mountpoint)
        if answer is not None and answer.hung:
            return known.get(mountpoint)
        if answer is None or not answer.ok or answer.st_dev is None:
            return None
        return answer.st_dev if still_the_mount(mountpoint, answer.st_dev, devnos_after) else None

    found = tuple(match(cfg.discover, mounts, cfg.targets, dev_of, limit))
    over = over_limit(cfg.discover, mounts, cfg.targets, len(found)) if len(found) >= limit else 0
    return Discovered(found, read_only_matches(cfg.discover, mounts), unnameable, over)


def still_the_mount(mountpoint: str, st_dev: int, devnos: list[tuple[str, str]]) -> bool:
    """Whether a stat's st_dev of `mountpoint` is the filesystem mounted there, by a mount table (mountinfo's
    (mount point, "MAJ:MIN") pairs) read after the stat: the mount is still listed, and the device is its own
    or at least not that of the filesystem beneath it. btrfs gives a subvolume a device number of its own, so a
    mount of one is not listed under the device its files show; the filesystem beneath is what an unmount
    between the mount table's read and the stat would have shown."""
    own = [dn for mnt, dn in devnos if mnt == mountpoint]
    if not own:
        return False       # unmounted since the table was read
    devno = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    if own[-1] == devno:
        return True
    beneath = mountinfo.devno_of(mountpoint, [(mnt, dn) for mnt, dn in devnos if mnt != mountpoint])
    return beneath is not None and beneath != devno


def targets_now(cfg: Config, roots: Roots = Roots()) -> tuple[Target, ...]:
    """The configured targets and those the rules find mounted now (for one-shot commands)."""
    return cfg.targets + discover(cfg, roots).targets
