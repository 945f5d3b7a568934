"""/proc/diskstats counters and the `iostat -x` figures computed from two samples.

Formats (Documentation/admin-guide/iostats.rst): after `major minor name`,
  kernels < 4.18:  11 fields (14 columns)
  4.18 .. 5.4:     15 fields (18 columns, + discards)
  5.5 and later:   17 fields (20 columns, + flushes)
and the 2.6-era partition line with 4 fields (7 columns). Anything else is an
error rather than a guess: a silently misread column would be a wrong %util.

Rates follow sysstat 12.x (rd_stats.c: compute_ext_disk_stats, and the printing
in iostat.c) so that `iowarden iostat` and `iostat -x` agree to the digit.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from .common import KERNEL_FILE_MAX_BYTES, ParseError, Roots, read_bounded

# Counter widths: I/O counts are unsigned long (64-bit on 64-bit kernels, but a
# 32-bit kernel wraps them at 2**32); time fields are printed as unsigned int
# milliseconds and always wrap at 2**32.
WRAP_32 = 1 << 32


class DiskCounters(NamedTuple):
    """One device's line of /proc/diskstats. Sectors are 512 bytes, whatever the device.

    A named tuple, not a dataclass: several samples of every device are held at once (the sampler's last
    two, the passive window's start, a reader's), and a tuple of 22 fields is 232 bytes where an object
    with its __dict__ was 1.2 KiB: 5 MiB of the daemon's heap at 1,024 disks. Immutable all
    the same, and built in one call."""
    major: int
    minor: int
    name: str
    reads: int = 0
    reads_merged: int = 0
    sectors_read: int = 0
    read_ms: int = 0
    writes: int = 0
    writes_merged: int = 0
    sectors_written: int = 0
    write_ms: int = 0
    in_flight: int = 0
    io_ms: int = 0
    weighted_io_ms: int = 0
    discards: int = 0
    discards_merged: int = 0
    sectors_discarded: int = 0
    discard_ms: int = 0
    flushes: int = 0
    flush_ms: int = 0
    has_discards: bool = False
    has_flushes: bool = False


_COUNTER_NAMES = list(DiskCounters._fields[3:20])
# in_flight is a gauge, not a counter: it is taken as-is, never differenced.
_GAUGES = {"in_flight"}
_TUPLE_NEW = tuple.__new__
_PAD = (0,) * len(_COUNTER_NAMES)


def _counters(major: int, minor: int, name: str, values: list[int], has_discards: bool,
              has_flushes: bool) -> DiskCounters:
    """A DiskCounters from the counters in their column order, the ones this kernel lacks zero: one tuple
    built, no keyword parsing (the most of a thousand-line parse, done twice a second)."""
    return _TUPLE_NEW(DiskCounters, (major, minor, name, *values, *_PAD[len(values):], has_discards, has_flushes))


def parse_line(line: str) -> DiskCounters:
    parts = line.split()
    n = len(parts)
    if n not in (7, 14, 18, 20):
        raise ParseError(f"diskstats line has {n} columns (expected 7, 14, 18 or 20): {line.strip()[:120]!r}")
    try:
        major, minor = int(parts[0]), int(parts[1])
        values = [int(v) for v in parts[3:]]
    except ValueError:
        raise ParseError(f"diskstats line has a non-numeric field: {line.strip()[:120]!r}") from None
    if min(values) < 0:
        raise ParseError(f"diskstats line has a negative counter: {line.strip()[:120]!r}")
    name = parts[2]
    if n == 7:
        # 2.6 partition format: reads, sectors read, writes, sectors written
        r, rs, w, ws = values
        return _counters(major, minor, name, [r, 0, rs, 0, w, 0, ws], False, False)
    return _counters(major, minor, name, values, n >= 18, n >= 20)


# The last parse's lines -> their counters, replaced whole by each parse: an idle device's line is the
# same text second after second, and on a host of a thousand mostly idle disks most lines are. A reader on
# another thread (the scrape's) sees one whole table or the other.
_last_lines: dict[str, DiskCounters] = {}


def parse(text: str) -> dict[str, DiskCounters]:
    """All devices in a /proc/diskstats text, by kernel name. Blank lines are ignored, and so is a
    line that is not a diskstats row: one odd line costs that device, never the table."""
    global _last_lines
    last, seen = _last_lines, {}
    out: dict[str, DiskCounters] = {}
    for line in text.split("\n"):
        c = last.get(line)
        if c is None:
            if not line.strip():
                continue
            try:
                c = parse_line(line)
            except ParseError:
                continue
        seen[line] = c
        out[c.name] = c
    _last_lines = seen
    return out


@dataclass(frozen=True)
class DiskSample:
    """Counters of every device at one moment (monotonic seconds)."""
    monotonic_seconds: float
    counters: MappingProxyType[str, DiskCounters]

    def __post_init__(self):
        # the sampler's reading is shared with the core, the passive part and the scrape: read-only for all
        if not isinstance(self.counters, MappingProxyType):
            object.__setattr__(self, "counters", MappingProxyType(dict(self.counters)))


def read(roots: Roots = Roots()) -> DiskSample:
    # bounded, and never a decode error: a name that is not UTF-8 costs its own line (parse() passes it over)
    text = read_bounded(roots.proc / "diskstats", KERNEL_FILE_MAX_BYTES).decode("utf-8", "replace")
    # The timestamp is taken right after the read: the interval is what the
    # rates are divided by, so it must bracket the counters as tightly as possible.
    return DiskSample(time.monotonic(), parse(text))


def counter_delta(prev: int, cur: int, wrap: int = WRAP_32) -> int:
    """Increase of a counter that may have wrapped at `wrap`, or restarted.

    A decrease is a wrap when going around the 32-bit range gives a plausible
    (less than half the range) increase; otherwise the device was reset (removed
    and re-added under the same name) and the counter restarted from zero.
    """
    if cur >= prev:
        return cur - prev
    wrapped = cur + wrap - prev
    if 0 <= wrapped < wrap // 2:
        return wrapped
    return cur


@dataclass(frozen=True)
class DiskRates:
    """`iostat -x` for one device over one interval. Field names carry their units."""
    name: str
    interval_seconds: float
    reads_per_second: float
    writes_per_second: float
    discards_per_second: float
    flushes_per_second: float
    read_kib_per_second: float
    write_kib_per_second: float
    discard_kib_per_second: float
    read_merges_per_second: float
    write_merges_per_second: float
    discard_merges_per_second: float
    read_merges_percent: float
    write_merges_percent: float
    discard_merges_percent: float
    read_await_ms: float
    write_await_ms: float
    discard_await_ms: float
    flush_await_ms: float
    read_request_kib: float
    write_request_kib: float
    discard_request_kib: float
    queue_size: float
    util_percent: float
    in_flight: int

    # sysstat's own JSON keys (iostat -x -o JSON), so output compares 1:1.
    SYSSTAT_KEYS = {
        "r/s": "reads_per_second", "w/s": "writes_per_second", "d/s": "discards_per_second",
        "f/s": "flushes_per_second", "rkB/s": "read_kib_per_second", "wkB/s": "write_kib_per_second",
        "dkB/s": "discard_kib_per_second", "rrqm/s": "read_merges_per_second",
        "wrqm/s": "write_merges_per_second", "drqm/s": "discard_merges_per_second",
        "rrqm": "read_merges_percent", "wrqm": "write_merges_percent", "drqm": "discard_merges_percent",
        "r_await": "read_await_ms", "w_await": "write_await_ms", "d_await": "discard_await_ms",
        "f_await": "flush_await_ms", "rareq-sz": "read_request_kib", "wareq-sz": "write_request_kib",
        "dareq-sz": "discard_request_kib", "aqu-sz": "queue_size", "util": "util_percent",
    }

    def as_sysstat(self) -> dict:
        out: dict = {"disk_device": self.name}
        for key, attr in self.SYSSTAT_KEYS.items():
            out[key] = getattr(self, attr)
        return out


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def _util_percent(io_ms_delta: int, seconds: float) -> float:
    # A device can't be busier than 100 %: sysstat caps it the same way.
    return min(100.0, io_ms_delta / seconds / 10)


def compute_rates(prev: DiskCounters, cur: DiskCounters, interval_seconds: float) -> DiskRates:
    """sysstat's formulas over the interval between two samples of one device."""
    if interval_seconds <= 0:
        raise ValueError(f"interval must be positive, got {interval_seconds}")
    d = {name: counter_delta(getattr(prev, name), getattr(cur, name))
         for name in _COUNTER_NAMES if name not in _GAUGES}
    t = interval_seconds
    return DiskRates(
        name=cur.name,
        interval_seconds=t,
        reads_per_second=d["reads"] / t,
        writes_per_second=d["writes"] / t,
        discards_per_second=d["discards"] / t,
        flushes_per_second=d["flushes"] / t,
        read_kib_per_second=d["sectors_read"] / t / 2,
        write_kib_per_second=d["sectors_written"] / t / 2,
        discard_kib_per_second=d["sectors_discarded"] / t / 2,
        read_merges_per_second=d["reads_merged"] / t,
        write_merges_per_second=d["writes_merged"] / t,
        discard_merges_per_second=d["discards_merged"] / t,
        read_merges_percent=100 * _ratio(d["reads_merged"], d["reads_merged"] + d["reads"]),
        write_merges_percent=100 * _ratio(d["writes_merged"], d["writes_merged"] + d["writes"]),
        discard_merges_percent=100 * _ratio(d["discards_merged"], d["discards_merged"] + d["discards"]),
        read_await_ms=_ratio(d["read_ms"], d["reads"]),
        write_await_ms=_ratio(d["write_ms"], d["writes"]),
        discard_await_ms=_ratio(d["discard_ms"], d["discards"]),
        flush_await_ms=_ratio(d["flush_ms"], d["flushes"]),
        read_request_kib=_ratio(d["sectors_read"], d["reads"]) / 2,
        write_request_kib=_ratio(d["sectors_written"], d["writes"]) / 2,
        discard_request_kib=_ratio(d["sectors_discarded"], d["discards"]) / 2,
        queue_size=d["weighted_io_ms"] / t / 1000,
        util_percent=_util_percent(d["io_ms"], t),
        in_flight=cur.in_flight,
    )


def rates_between(a: DiskSample, b: DiskSample) -> dict[str, DiskRates]:
    """Rates for every device present in both samples (a device that came or went is skipped)."""
    t = b.monotonic_seconds - a.monotonic_seconds
    return {name: compute_rates(a.counters[name], cur, t)
            for name, cur in b.counters.items() if name in a.counters}


class RatesBetween(Mapping):
    """rates_between(a, b) for the devices named, each computed when first asked for: a thousand devices'
    iostat -x every second, for a view that reads a few of them, was an eighth of the daemon's CPU. Read
    only; the cache behind it is filled under the GIL (two readers may compute one device twice)."""

    def __init__(self, a: DiskSample, b: DiskSample, names=None):
        self._a, self._b = a, b
        self._t = b.monotonic_seconds - a.monotonic_seconds
        self._names = tuple(n for n in b.counters if n in a.counters and (names is None or n in names))
        self._set = frozenset(self._names)
        self._done: dict[str, DiskRates] = {}

    def __getitem__(self, name: str) -> DiskRates:
        r = self._done.get(name)
        if r is None:
            if name not in self._set:
                raise KeyError(name)
            r = self._done[name] = compute_rates(self._a.counters[name], self._b.counters[name], self._t)
        return r

    def __contains__(self, name) -> bool:
        return name in self._set

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def util_percent(self, name: str) -> float:
        """iostat's %util alone, without the rest of the device's rates."""
        return _util_percent(counter_delta(self._a.counters[name].io_ms, self._b.counters[name].io_ms), self._t)


def is_partition(name: str, roots: Roots = Roots()) -> bool:
    """sysfs marks partitions with a `partition` file; '/' in names (cciss/c0d0) is '!' there."""
    return (roots.sys / "class" / "block" / name.replace("/", "!") / "partition").exists()


def loop_attached(name: str, roots: Roots = Roots()) -> bool:
    """A loop device has a backing file while attached (sysfs shows loop/backing_file only then)."""
    return (roots.sys / "block" / name / "loop" / "backing_file").exists()
