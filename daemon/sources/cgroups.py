"""Who does the I/O, and which cgroup I/O limits hold a device: a source read from the cgroup files.

Each reading is the I/O each cgroup did to each device since the reading before (rates over that
interval) and every limit set, v1 blkio or v2 io (probes/cgroupio.py). Two questions of an alert's
diagnosis (verdicts/causes.py) are answered from it, as pure functions of one reading:

- `limits_holding`: the limits on the volume's devices that apply to iowarden's own probes (set in its
  own cgroup or an ancestor, the root included): time lost above the block layer, named exactly;
- `who`: the cgroups (systemd units, scopes) that did I/O to those devices in the last interval, each
  with its rate and share: contention, and by whom.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client.core import GaugeMetricFamily

from iowarden.probes import cgroupio
from iowarden.probes.common import Roots

from iowarden.daemon.config_schema import Key
from iowarden.daemon.sources.spec import SourceSpec

CONFIG = {
    "enabled": Key("bool", True, "Read the cgroup I/O counters and limits (v1 blkio or v2 io), to name a limit "
                   "that holds a volume and who is doing the I/O on a busy one."),
    "interval_seconds": Key("float", 5.0, "How often the cgroup tree is read (a few small files per cgroup).",
                            minimum=1.0, maximum=3600.0),
    "max_cgroups": Key("int", cgroupio.MAX_CGROUPS, "At most this many cgroups are read per pass; past it the "
                       "pass is cut short and says so (iowarden_cgroup_io_cut_short).", minimum=1, maximum=65536),
}
LIMIT_WORDS = {"riops": ("read IOPS", "read_iops_device", "rios="), "wiops": ("write IOPS", "write_iops_device", "wios="),
               "rbps": ("read bytes/s", "read_bps_device", "rbps="), "wbps": ("write bytes/s", "write_bps_device", "wbps=")}
WHO_NAMED = 3          # cgroups named in a contention cause; the rest are summed


@dataclass(frozen=True)
class Rate:
    cgroup: str
    devno: str
    read_iops: float
    write_iops: float
    read_bytes_per_second: float
    write_bytes_per_second: float

    @property
    def iops(self) -> float:
        return self.read_iops + self.write_iops

    @property
    def bytes_per_second(self) -> float:
        return self.read_bytes_per_second + self.write_bytes_per_second


@dataclass(frozen=True)
class CgroupIoView:
    unix_time: float
    seconds: float | None                 # the rates' interval; None at the first reading
    version: int
    own_cgroup: str                       # iowarden's (its probes' I/O is in it)
    rates: tuple[Rate, ...]               # cgroups that did I/O in the interval
    limits: tuple[tuple[str, str, cgroupio.IoLimit], ...]    # (cgroup, devno, limit)
    names: MappingProxyType               # devno -> kernel name, for the devnos above
    cut_short: bool = False


def _name_of(roots: Roots, devno: str) -> str | None:
    try:
        return os.path.basename(os.readlink(roots.sys / "dev" / "block" / devno))
    except OSError:
        return None


def rates_between(before: cgroupio.CgroupIo, after: cgroupio.CgroupIo, seconds: float) -> list[Rate]:
    then = {(g.path, dev): c for g in before.groups for dev, c in g.io.items()}
    out = []
    for g in after.groups:
        for dev, c in g.io.items():
            prev = then.get((g.path, dev))
            if prev is None:
                continue   # a cgroup new since the last reading: no interval to divide by yet
            d = c.minus(prev)
            if d.rios or d.wios:
                out.append(Rate(g.path, dev, d.rios / seconds, d.wios / seconds, d.rbytes / seconds,
                                d.wbytes / seconds))
    return out


def start(section: dict, roots: Roots, disk_reading=None):
    last: list = [None, None]   # (CgroupIo, monotonic seconds) of the reading before

    def read() -> CgroupIoView | None:
        now = time.monotonic()
        io = cgroupio.read(roots, section.max_cgroups)
        if io is None:
            return None
        before, at = last
        last[:] = [io, now]
        seconds = now - at if before is not None and now > at else None
        rates = rates_between(before, io, seconds) if seconds else []
        limits = [(g.path, dev, lim) for g in io.groups for dev, lim in g.limits.items()]
        devnos = {r.devno for r in rates} | {dev for _, dev, _ in limits}
        names = {d: n for d in sorted(devnos)[:cgroupio.MAX_CGROUPS] if (n := _name_of(roots, d))}
        return CgroupIoView(time.time(), seconds, io.version, cgroupio.own_cgroup(roots, io.version),
                            tuple(rates), tuple(limits), MappingProxyType(names), io.cut_short)
    return read


def ancestors(path: str) -> list[str]:
    out = [path]
    while path not in ("/", ""):
        path = os.path.dirname(path) or "/"
        out.append(path)
    return out


def _cgroup_words(path: str) -> str:
    return "the root cgroup: every process not in a cgroup of its own" if path == "/" else path


def _limit_value(kind: str, value: int) -> str:
    if kind.endswith("bps"):
        return f"{value / (1 << 20):,.1f} MiB/s" if value >= 1 << 20 else f"{value:,} bytes/s"
    return f"{value:,}"


# a limit of another cgroup explains a device's rate when it is at least this share of what the device does of
# its kind: 100 IOPS on a batch job's cgroup does not hold a device at 4,866
EXPLAINS_SHARE = 0.5
RATE_OF_KIND = {"riops": lambda r: r.read_iops, "wiops": lambda r: r.write_iops,
                "rbps": lambda r: r.read_bytes_per_second, "wbps": lambda r: r.write_bytes_per_second}


def limits_holding(view: CgroupIoView | None, devices: set[str], anyone: bool = False) -> list[str]:
    """The limits set on these devices that apply to iowarden's own I/O (its cgroup and the ones above it),
    or with `anyone` every limit on them that can explain the device's rate (a passive verdict is on the work of
    whoever does the I/O): at least EXPLAINS_SHARE of the device's rate of that kind over the last interval,
    where the interval's rates say one (a VolumeAtLimit at 4,866 IOPS said "a cgroup I/O limit holds loop1 at
    100 read IOPS" of a batch job's cgroup)."""
    if view is None:
        return []
    chain = set(ancestors(view.own_cgroup))
    device_rate: dict[tuple[str, str], float] = {}
    counted = set()   # devices the interval's rates say anything of (v1 counts nothing on a device without a rule)
    if view.seconds:
        for r in view.rates:
            counted.add(r.devno)
            for kind, rate_of in RATE_OF_KIND.items():
                device_rate[(r.devno, kind)] = device_rate.get((r.devno, kind), 0.0) + rate_of(r)
    out = []
    for cgroup, devno, limit in view.limits:
        name = view.names.get(devno)
        if name not in devices or not (anyone or cgroup in chain):
            continue
        # one sentence per cgroup and device, its limits joined: a page's text is bounded (sentence.py), and
        # a read and a write limit said twice over would crowd out who was doing the I/O
        values, wheres = [], []
        for kind, value in limit.items():
            rate = device_rate.get((devno, kind), 0.0)
            if anyone and cgroup not in chain and devno in counted and not (0 < rate <= value / EXPLAINS_SHARE):
                continue
            words, v1_file, v2_key = LIMIT_WORDS[kind]
            values.append(f"{_limit_value(kind, value)} {words}")
            wheres.append(f"blkio.throttle.{v1_file}" if view.version == 1 else f"io.max {v2_key}")
        if values:
            out.append(f"a cgroup I/O limit holds {name} ({devno}) at {' and '.join(values)} "
                       f"({', '.join(wheres)} of {_cgroup_words(cgroup)})")
    return out


def limited_below_root(view: CgroupIoView | None) -> frozenset[str]:
    """The cgroups below the root with an I/O limit of their own, on any device. Whoever set it declared that
    cgroup's I/O background work held to a rate (a batch job, a backup unit with IOReadBandwidthMax): its waits
    are not a service's to be paged for (passive/service.py), on that device or on those its I/O lands on. A
    loop device charges the I/O it does to its backing file to the cgroup that issued it, and md and dm pass a
    request's cgroup on to their members: a batch job held on a loop device waited on the disk under it, where
    it has no limit. A limit on the root holds every process and declares nothing of any one of them."""
    return frozenset(cgroup for cgroup, _, _ in (view.limits if view is not None else ()) if cgroup != "/")


def who(view: CgroupIoView | None, devices: set[str]) -> str | None:
    """The cgroups that did I/O to these devices in the last interval, the busiest first, with their shares."""
    if view is None or not view.seconds:
        return None
    per: dict[str, list[float]] = {}
    for r in view.rates:
        if view.names.get(r.devno) in devices:
            acc = per.setdefault(r.cgroup, [0.0, 0.0])
            acc[0] += r.iops
            acc[1] += r.bytes_per_second
    total = sum(v[0] for v in per.values())
    if not total:
        return None
    ranked = sorted(per.items(), key=lambda kv: -kv[1][0])
    parts = []
    for cgroup, (iops, bps) in ranked[:WHO_NAMED]:
        # iowarden's own cgroup holds its probes; the root one (a daemon run outside systemd) holds others too
        me = "" if cgroup != view.own_cgroup else " (iowarden's own probes)" if cgroup != "/" else \
            " (iowarden's probes and every process not in a cgroup of its own)"
        parts.append(f"{cgroup}{me} {iops:,.0f} IOPS {bps / (1 << 20):,.1f} MiB/s ({iops / total:.0%})")
    if len(ranked) > WHO_NAMED:
        rest = sum(v[0] for _, v in ranked[WHO_NAMED:])
        parts.append(f"{len(ranked) - WHO_NAMED} more cgroups {rest:,.0f} IOPS ({rest / total:.0%})")
    return f"I/O on {','.join(sorted(devices & set(view.names.values())))} in the last {view.seconds:.0f} s by cgroup: " \
        + ", ".join(parts)


def counted(view: CgroupIoView | None, devices: set[str]) -> bool:
    """Whether the reading holds any cgroup's I/O on these devices."""
    return view is not None and any(view.names.get(r.devno) in devices for r in view.rates)


def level_counted(view: CgroupIoView | None, devices: set[str], below: set[str]) -> set[str]:
    """The devices whose cgroups `who` names: these; where none of their I/O was counted, those below. Cgroup v1
    counts a device's I/O per cgroup only once a blkio throttle rule has been set on it (blk-throttle is
    set up on a queue by its first rule on recent kernels; seen on 6.18): a loop device stacked on another
    that carries the limit, or a dm volume over throttled disks, shows its cgroups only below, where the
    loop driver and dm charge the I/O to the cgroup that asked for it. One level is named, never both: the
    same requests counted at two levels would be said twice over."""
    return devices if counted(view, devices) or not counted(view, below) else below


def not_counted(view: CgroupIoView | None, devices: set[str]) -> str | None:
    """On cgroup v1, why no cgroup is named for a busy device: its I/O is not counted per cgroup."""
    if view is None or view.version != 1 or not view.seconds or counted(view, devices) or not devices:
        return None
    return (f"who did it is not known: cgroup v1 counts I/O per cgroup on {', '.join(sorted(devices))} only once "
            "a blkio throttle rule has been set on it (none has been)")


def foreign_share(view: CgroupIoView | None, devices: set[str]) -> float | None:
    """The share of the devices' I/O (by IOPS) done by cgroups other than iowarden's own, last interval."""
    if view is None or not view.seconds:
        return None
    mine = other = 0.0
    for r in view.rates:
        if view.names.get(r.devno) in devices:
            if r.cgroup == view.own_cgroup:
                mine += r.iops
            else:
                other += r.iops
    return other / (mine + other) if mine + other else None


def families(view: CgroupIoView | None, snap):
    if view is None:
        return
    labels = ["cgroup", "device", "direction"]
    iops = GaugeMetricFamily("iowarden_cgroup_io_limit_iops", "A cgroup I/O limit set on a device, in I/O operations "
                             "per second", labels=labels)
    bps = GaugeMetricFamily("iowarden_cgroup_io_limit_bytes_per_second", "A cgroup I/O limit set on a device, in "
                            "bytes per second", labels=labels)
    for cgroup, devno, limit in view.limits:
        for kind, value in limit.items():
            (iops if kind.endswith("iops") else bps).add_metric(
                [cgroup[:200], view.names.get(devno, devno), "read" if kind[0] == "r" else "write"], value)
    cut = GaugeMetricFamily("iowarden_cgroup_io_cut_short", "1 if the last pass met [cgroups] max_cgroups")
    cut.add_metric([], 1 if view.cut_short else 0)
    yield from (iops, bps, cut)


SPEC = SourceSpec("cgroups", CONFIG, start, deadline_seconds=lambda c: 30.0, families=families,
                  causes=lambda view, disks: [])   # said in the diagnosis's layers (verdicts/causes.py), in order
