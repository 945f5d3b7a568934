"""Where the time of real I/O goes: a bpftrace program over the block layer's tracepoints, and its output.

Three tracepoints (include/trace/events/block.h, in every kernel since 2.6.x), keyed by (dev, sector):

  block_bio_queue   a bio is submitted to the disk (after a partition's remap, so on the whole disk,
                    and after blk-throttle, whose delay no block tracepoint sees)
  block_rq_issue    the driver takes the request
  block_rq_complete the device has answered

and so three stages per request: `queue` (submission to issue: waiting for a tag when nr_requests is
too shallow, plugging, the I/O scheduler, writeback throttling), `device` (issue to complete) and
`total`. A request is timed from its first bio. Every key is deleted in the kernel: at the request's
completion, or when its bio or request is merged into another (block_bio_backmerge, _frontmerge,
block_rq_merge). Only request-based (blk-mq) disks are traced: a bio-based device
(dm, md) never issues a request of its own, and its members are traced instead. Nothing leaves the kernel per
I/O: each completion adds one to an in-kernel count keyed by device, direction, stage and bucket,
and the program prints those cumulative counts every interval as one JSON line.

Buckets are log-linear: eight per octave of nanoseconds (an upper edge at most 12.5 % above the
lower), so a percentile interpolated in them is within a few per cent of the exact one. Four per
octave were too coarse: a p50 on the lower edge of a 25 % bucket read 11 % high against fio's.

Sampling keeps the cost bounded at high IOPS: a request is timed only when a hash of its sector falls
in the kept share of SAMPLE_SCALE for its device (`skip` below). The same hash at every stage, so a
request is timed at all of them or at none. Nothing clears the start maps from user space: bpftrace 0.17
aborted when it did while the kernel deleted from them. A key left behind (a request in flight when a
device went away) is overwritten by the next request at its sector, and START_MAP_ENTRIES bounds the rest.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from .common import ParseError

SUB_BITS = 3                    # the bits after the leading one that pick a bucket in its octave
SUB_BUCKETS = 1 << SUB_BITS     # per octave: 8
SAMPLE_SCALE = 1024             # the sampling hash's range
STAGES = ("queue", "device", "total")
DIRECTIONS = ("read", "write")
MAX_MAP_ENTRIES = 1 << 16       # BPFTRACE_MAP_KEYS_MAX (START_MAP_ENTRIES) bounds every map of the program; more is not its output
MAX_LINE_BYTES = 4 << 20        # one print of every count; more is not bpftrace's output
START_MAP_ENTRIES = 65536       # requests in flight across all devices that can be timed at once


def bucket_lower_ns(index: int) -> float:
    """The lower edge of bucket `index`: octave index // 8, eighth index % 8 (octaves 0 to 2, below
    8 ns, have one bucket each)."""
    octave, sub = divmod(index, SUB_BUCKETS)
    return float(2 ** octave) * (1 + sub / SUB_BUCKETS) if octave >= SUB_BITS else float(2 ** octave)


def bucket_upper_ns(index: int) -> float:
    octave = index // SUB_BUCKETS
    return bucket_lower_ns(index) + 2 ** octave / SUB_BUCKETS if octave >= SUB_BITS else float(2 ** (octave + 1))


def bucket_of_ns(ns: int) -> int:
    """The same bucketing as the program's, in Python (for tests and fixtures)."""
    if ns < 1:
        return 0
    octave = ns.bit_length() - 1
    sub = (ns >> (octave - SUB_BITS)) & (SUB_BUCKETS - 1) if octave >= SUB_BITS else 0
    return octave * SUB_BUCKETS + sub


def _bucket_code(var: str) -> str:
    """bpftrace statements leaving the bucket of nanoseconds `$var` in $b (a binary search for the
    octave: six comparisons, no loop, which the verifier would refuse)."""
    lines = [f"$v = {var}; $o = (uint64)0;"]
    for shift in (32, 16, 8, 4, 2, 1):
        lines.append(f"if ($v >= (uint64)1 << {shift}) {{ $o = $o + {shift}; $v = $v >> {shift}; }}")
    lines.append(f"$b = $o * {SUB_BUCKETS};")
    lines.append(f"if ($o >= {SUB_BITS}) {{ $b = $b + (({var} >> ($o - {SUB_BITS})) & {SUB_BUCKETS - 1}); }}")
    return " ".join(lines)


HASH = "((args->sector * (uint64)0x9E3779B97F4A7C15) >> 54)"   # a sector's place in SAMPLE_SCALE


REQUIRED_TRACEPOINTS = ("block_bio_queue", "block_rq_issue", "block_rq_complete")   # the three stages' edges
MERGE_TRACEPOINTS = ("block_bio_backmerge", "block_bio_frontmerge", "block_rq_merge")  # keys merged away


def program(skip_by_dev: dict[int, int], interval_seconds: float,
            tracepoints: "tuple[str, ...] | frozenset[str]" = REQUIRED_TRACEPOINTS + MERGE_TRACEPOINTS) -> str:
    """The bpftrace program. skip_by_dev: the disks to trace, kernel dev_t (major << 20 | minor) -> how
    many of SAMPLE_SCALE hash values to skip (0: time every request). A disk not named is not traced.
    tracepoints: the block tracepoints this kernel has (the reader looks in tracefs before compiling:
    bpftrace refuses a whole program that names one the kernel lacks); a merge tracepoint it lacks is
    left out (a key merged away then waits for its sector's next request).

    The disks are a map the program fills at its start (@sk: dev_t -> skip + 1, 0 for a disk not traced),
    looked up once per event: the program is the same size and each request costs the same one lookup
    for 1 disk or 4,000. A chain of comparisons, one per disk, grew with the disks: the verifier refused
    it from about ten disks, and above some 700 its text no longer fitted one argument."""
    disks = sorted(skip_by_dev.items())
    fill = " ".join(f"@sk[(uint64){int(dev)}] = {int(skip) + 1};" for dev, skip in disks)
    lookup = "$k = (uint64)@sk[(uint64)args->dev];"
    sampled = f"$k > 0 && {HASH} + 1 >= $k"   # the sector's hash at or above the disk's skip
    ms = max(100, int(interval_seconds * 1000))
    # rwbs: R read, W write, FW a write with a preflush; D, F, N (discard, flush, other) are not timed
    direction = ('$d = strncmp(args->rwbs, "R", 1) == 0 ? 0 : (strncmp(args->rwbs, "W", 1) == 0 || '
                 'strncmp(args->rwbs, "FW", 2) == 0) ? 1 : 2;')
    # A start time is deleted in the kernel when its request completes or is merged away: a map cleared
    # from user space while the kernel deletes from it made bpftrace 0.17 abort ("failed to look up
    # elem: -2") under load. A bio merged at the back of a request, or a request merged into the one
    # before it, leaves its key; one merged at the front takes over the request's key and its older time.
    merge_probes = {
        "block_bio_backmerge": f"""
tracepoint:block:block_bio_backmerge {{ {lookup} if ($k > 0) {{ delete(@start[args->dev, args->sector]); }} }}""",
        "block_bio_frontmerge": f"""
tracepoint:block:block_bio_frontmerge {{ {lookup}
  if ($k > 0) {{
    $o = @start[args->dev, args->sector + args->nr_sector]; delete(@start[args->dev, args->sector + args->nr_sector]);
    if ($o > 0 && {HASH} + 1 >= $k) {{ @start[args->dev, args->sector] = $o; }}
  }}
}}""",
        "block_rq_merge": f"""
tracepoint:block:block_rq_merge {{ {lookup}
  if ($k > 0) {{ delete(@start[args->dev, args->sector]); delete(@issue[args->dev, args->sector]); }}
}}"""}
    merges = "".join(text for tp, text in merge_probes.items() if tp in tracepoints)
    return f"""
BEGIN {{ {fill} }}
tracepoint:block:block_bio_queue {{ {lookup} if ({sampled}) {{ @start[args->dev, args->sector] = nsecs; }} }}
tracepoint:block:block_rq_issue {{ {lookup} if ({sampled}) {{ @issue[args->dev, args->sector] = nsecs; }} }}
tracepoint:block:block_rq_complete {{ {lookup}
  if ({sampled}) {{
    $now = nsecs; {direction}
    $s = @start[args->dev, args->sector]; $i = @issue[args->dev, args->sector];
    if ($d < 2 && $i > 0) {{
      {_bucket_code("($now - $i)")} @lat[args->dev, $d, 1, $b] = count(); @ns[args->dev, $d, 1] = sum($now - $i);
      if ($s > 0 && $s <= $i) {{
        {_bucket_code("($i - $s)")} @lat[args->dev, $d, 0, $b] = count(); @ns[args->dev, $d, 0] = sum($i - $s);
        {_bucket_code("($now - $s)")} @lat[args->dev, $d, 2, $b] = count(); @ns[args->dev, $d, 2] = sum($now - $s);
      }}
    }}
    delete(@start[args->dev, args->sector]); delete(@issue[args->dev, args->sector]);
  }}
}}{merges}
interval:ms:{ms} {{ print(@lat); print(@ns); }}
END {{ clear(@start); clear(@issue); clear(@lat); clear(@ns); clear(@sk); }}
"""


@dataclass(frozen=True)
class StageHistogram:
    """Cumulative counts per bucket index, since the program started."""
    counts: tuple[tuple[int, int], ...]    # (bucket index, count), ascending

    @property
    def total(self) -> int:
        return sum(c for _, c in self.counts)

    def quantile_seconds(self, q: float) -> float | None:
        """The q-quantile, interpolated inside its bucket (as histogram_quantile does)."""
        n = self.total
        if not n:
            return None
        rank, seen = q * n, 0
        for idx, c in self.counts:
            if seen + c >= rank:
                lo, hi = bucket_lower_ns(idx), bucket_upper_ns(idx)
                return (lo + (hi - lo) * (rank - seen) / c) / 1e9
            seen += c
        return bucket_upper_ns(self.counts[-1][0]) / 1e9

    def minus(self, earlier: "StageHistogram | None") -> "StageHistogram":
        """The counts added since `earlier` (a window); a count that went down means a restart: all new."""
        if earlier is None:
            return self
        before = dict(earlier.counts)
        if any(c < before.get(i, 0) for i, c in self.counts) or len(before.keys() - dict(self.counts).keys()):
            return self
        return StageHistogram(tuple((i, c - before.get(i, 0)) for i, c in self.counts if c - before.get(i, 0)))


@dataclass(frozen=True)
class CgroupCounts:
    """One cgroup's timed requests on one disk in one direction (the compiled engine's `cgroups` map): how many, their
    bytes, their total time summed, and its histogram (total stage)."""
    requests: int
    bytes: int
    ns: int
    hist: StageHistogram

    def plus(self, other: "CgroupCounts | None") -> "CgroupCounts":
        if other is None:
            return self
        merged = dict(self.hist.counts)
        for i, c in other.hist.counts:
            merged[i] = merged.get(i, 0) + c
        return CgroupCounts(self.requests + other.requests, self.bytes + other.bytes, self.ns + other.ns,
                            StageHistogram(tuple(sorted(merged.items()))))

    def minus(self, earlier: "CgroupCounts | None") -> "CgroupCounts":
        """Added since `earlier`; fewer requests than it had means new counts (a restarted program): all new."""
        if earlier is None or self.requests < earlier.requests:
            return self
        return CgroupCounts(self.requests - earlier.requests, max(0, self.bytes - earlier.bytes),
                            max(0, self.ns - earlier.ns), self.hist.minus(earlier.hist))


NO_COUNTS = CgroupCounts(0, 0, 0, StageHistogram(()))


Key = tuple[int, str, str]   # (dev_t, direction, stage)


def parse_message(line: str) -> tuple[str, dict] | None:
    """One line of `bpftrace -f json` output. ("counts", {(dev, direction, stage): StageHistogram}) for
    @lat, ("sums", {(dev, direction, stage): seconds}) for @ns, None for any other message
    (attached_probes, a warning). A line that is not what the program prints is a ParseError."""
    try:
        msg = json.loads(line)
    except ValueError:
        raise ParseError(f"bpftrace printed a line that is not JSON: {line[:80]!r}") from None
    if not isinstance(msg, dict) or msg.get("type") != "map" or not isinstance(msg.get("data"), dict):
        return None
    data = msg["data"]
    if "@lat" in data:
        counts: dict[Key, dict[int, int]] = {}
        for (dev, d, stage, bucket), count in _entries(data["@lat"], 4):
            if not 0 <= bucket < 64 * SUB_BUCKETS:
                raise ParseError(f"@lat bucket out of range: {bucket}")
            counts.setdefault((dev, DIRECTIONS[d], STAGES[stage]), {})[bucket] = count
        return "counts", {k: StageHistogram(tuple(sorted(v.items()))) for k, v in counts.items()}
    if "@ns" in data:
        return "sums", {(dev, DIRECTIONS[d], STAGES[stage]): ns / 1e9 for (dev, d, stage), ns in _entries(data["@ns"], 3)}
    return None


def _entries(table, arity: int):
    """The map's "k1,k2,...": value entries as (int tuple, int), checked."""
    if not isinstance(table, dict):
        raise ParseError("a bpftrace map that is not an object")
    if len(table) > MAX_MAP_ENTRIES:
        raise ParseError(f"a bpftrace map of {len(table)} entries, over the {MAX_MAP_ENTRIES} the program can print")
    for key, value in table.items():
        try:
            fields = tuple(int(x) for x in str(key).split(","))
            count = int(value) if not isinstance(value, bool) else -1
        except (TypeError, ValueError, OverflowError):
            raise ParseError(f"unexpected map entry {str(key)[:40]!r}: {str(value)[:20]!r}") from None
        if len(fields) != arity or not (0 <= fields[1] < len(DIRECTIONS) and 0 <= fields[2] < len(STAGES)) \
                or not 0 <= count < 1 << 64:
            raise ParseError(f"map entry out of range: {str(key)[:40]!r}")
        yield fields, count


def dev_t(major: int, minor: int) -> int:
    """The kernel's internal dev_t, as the tracepoints give it (MINORBITS = 20)."""
    return (major << 20) | minor
