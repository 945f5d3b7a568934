"""A drive slow on its tail: a few of its I/Os very slow while the rest are not (a weak region read with
retries, a path that stalls now and then), against the tails of its peers.

The mean cannot see it: a few hundred I/Os a minute delayed by 100 ms among tens of thousands move a
drive's await by a few per cent, inside what healthy drives stray. The tail can: the tracer's per-I/O
histograms (sources/tracer.py) give each disk's p99.9 of real I/O, and the drive whose p99.9 leaves its
peers' is slow before its mean is.

1. Each window, every member's histogram of total latency (the tracer's, per direction) is added to the
   current block of its group; a block is `block_windows` windows (a minute at 15 s).
2. When a block closes, each member with `min_ios` timed I/Os in it has its `quantile` (p99.9); a member
   is out of line when its tail is `ratio` times the median of its peers' tails and `floor_ms` above it.
   Like against like: a member is judged in a direction only when its load in the block is at most
   `comparable_load` times the group's median and its mean request size within `request_size_ratio` of
   the group's median (the members with a tail, itself included), and when its device moved no more than
   `comparable_load` times the others' median in both directions together (a flood of reads gives the same
   device's writes a tail of its own making). A backup reading 1 MiB at a deep queue
   beside peers serving 4 KiB has a tail of its own requests' making (each takes a megabyte's transfer,
   and waits behind the ones before it), not of its drive's; a weak region is read at the load and size
   the peers carry and is still judged.
3. A drive out of line in `blocks` blocks in a row is named; one in line in `clear_blocks` in a row clears.

Why blocks in a row and not a rolling tail: a healthy drive's single stall (a second of 200 ms I/Os) puts
the whole of one block's tail out of line, never three blocks' in a row; a drive with a weak region
is out of line in every block it is read in. Why against peers and not its own normal: a tail has no
load curve to judge it by, and the peers carry the same kind of load at the same time.

Not tuned on field data: the Perseus traces have no per-I/O latency. The thresholds are deliberately
far from noise (4x and 20 ms over the peers' p99.9, three blocks in a row) and shown on real devices
(tests/integration/test_tail.py: a loop device whose backing file stalls on a few of its blocks).

Pure: no clock, no I/O; bounded: per member and direction one merged histogram (at most a few hundred
buckets) for the current block, and a few numbers.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from iowarden.probes.blocktrace import StageHistogram

from iowarden.daemon.passive.peerstats import leave_one_out_medians


@dataclass(frozen=True)
class TailParams:
    block_windows: int = 4       # windows per block: a minute at 15 s
    blocks: int = 3              # blocks in a row out of line that name the drive
    clear_blocks: int = 3        # blocks in a row in line that clear it
    unjudged_clear_blocks: int = 10   # blocks in a row with no tail to judge (idle, tracer off) that clear it
    quantile: float = 0.999
    ratio: float = 4.0           # a tail this many times the peers' median tail ...
    floor_ms: float = 20.0       # ... and this far above it: fast flash's tail wanders by milliseconds
    min_ios: int = 2000          # timed I/Os in a block for its p99.9 to rest on two or more of them
    comparable_load: float = 2.0      # a member with more than this times its peers' I/Os is not judged
    request_size_ratio: float = 2.0   # nor one whose mean request is this many times larger or smaller


@dataclass
class MemberTail:
    """One drive's tail against its peers', for the alert, `status` and /metrics."""
    out_streak: int = 0          # blocks in a row out of line
    in_streak: int = 0           # blocks in a row in line
    unjudged_streak: int = 0     # blocks in a row without enough timed I/Os (or peers that had them)
    direction: str | None = None # the direction of the last judgement (the worse one)
    tail_ms: float | None = None
    peers_tail_ms: float | None = None
    mean_ratio: float | None = None   # its mean latency over its peers' median mean, same block
    ios: int = 0

    @property
    def ratio(self) -> float | None:
        if self.tail_ms is None or not self.peers_tail_ms:
            return None
        return self.tail_ms / self.peers_tail_ms


@dataclass
class _Block:
    windows: int = 0
    counts: dict = field(default_factory=dict)   # (member, direction) -> {bucket: count}
    busy_ms: dict = field(default_factory=dict)  # (member, direction) -> [await x I/Os, I/Os, KiB] (diskstats)


def tail_ms(counts: dict[int, int], q: float) -> float | None:
    h = StageHistogram(tuple(sorted(counts.items())))
    s = h.quantile_seconds(q)
    return None if s is None else s * 1000.0


class TailEvidence:
    def __init__(self, params: TailParams = TailParams()):
        self.p = params
        self.blocks: dict[tuple, _Block] = {}
        self.members: dict[str, MemberTail] = {}

    def add(self, group: tuple[str, ...], tails: dict[str, dict[str, StageHistogram]],
            means: dict[str, dict[str, tuple]]) -> dict[str, MemberTail]:
        """One window of a group: per member, direction -> the window's histogram of total latency, and
        direction -> (await ms, I/Os[, KiB]) from diskstats (without the KiB, request sizes are not compared).
        Returns the members judged when a block closed."""
        b = self.blocks.setdefault(group, _Block())
        for m, by_direction in tails.items():
            for direction, h in by_direction.items():
                acc = b.counts.setdefault((m, direction), {})
                for idx, c in h.counts:
                    acc[idx] = acc.get(idx, 0) + c
        for m, by_direction in means.items():
            for direction, (await_ms, ios, *kib) in by_direction.items():
                acc = b.busy_ms.setdefault((m, direction), [0.0, 0.0, 0.0])
                acc[0] += await_ms * ios
                acc[1] += ios
                acc[2] += kib[0] if kib and kib[0] is not None else 0.0
        b.windows += 1
        if b.windows < self.p.block_windows:
            return {}
        self.blocks[group] = _Block()
        return self._close(group, b)

    def _close(self, group: tuple, b: _Block) -> dict[str, MemberTail]:
        judged: dict[str, tuple] = {}   # member -> (out of line?, direction, tail, peers' tail, mean ratio, ios)
        for direction in ("read", "write"):
            tails = {m: (tail_ms(b.counts[(m, direction)], self.p.quantile), sum(b.counts[(m, direction)].values()))
                     for m in group if sum(b.counts.get((m, direction), {}).values()) >= self.p.min_ios}
            means = {m: s / n for (m, d), (s, n, _) in b.busy_ms.items() if d == direction and n > 0}
            like = self._like_the_group(b, direction, tails)
            tails = {m: v for m, v in tails.items() if m in like}
            # each member's peers' median, for all members at once (peerstats: n medians of n - 1 was O(n^2))
            peer_tails = leave_one_out_medians({m: t for m, (t, _) in tails.items() if t is not None})
            judged_means = {m: v for m, v in means.items() if m in tails}
            peer_mean_of = leave_one_out_medians(judged_means)
            for m, (t, ios) in tails.items():
                if t is None or m not in peer_tails:
                    continue
                peer_tail = peer_tails[m]
                peer_mean = peer_mean_of.get(m)   # m has a mean of its own and peers with theirs
                mean_ratio = means[m] / peer_mean if peer_mean else None
                out = t >= self.p.ratio * peer_tail and t - peer_tail >= self.p.floor_ms
                # the worse direction speaks for the drive: out of line beats in line, then the larger ratio
                rank = (out, t / peer_tail if peer_tail > 0 else float("inf"))
                if m not in judged or rank > judged[m][0]:
                    judged[m] = (rank, direction, t, peer_tail, mean_ratio, ios)
        for m in group:
            e = self.members.setdefault(m, MemberTail())
            if m not in judged:
                e.unjudged_streak += 1
                continue
            (out, _), direction, t, peer_tail, mean_ratio, ios = judged[m]
            e.unjudged_streak = 0
            e.out_streak, e.in_streak = (e.out_streak + 1, 0) if out else (0, e.in_streak + 1)
            e.direction, e.tail_ms, e.peers_tail_ms, e.mean_ratio, e.ios = direction, t, peer_tail, mean_ratio, ios
        return {m: self.members[m] for m in group}

    def _like_the_group(self, b: _Block, direction: str, members) -> set:
        """The members that carried, in this block and direction, a load and a request size like the group's:
        within bounds of the median over every member with a tail, each one included (so that of three, one
        backup is set aside and its two quiet peers still judge each other; of two unlike members, neither is
        judged). From diskstats' I/Os and KiB; a member without them is not told apart. One median for all:
        a group of a thousand drives costs a sort, not a thousand."""
        rows = {m: b.busy_ms[(m, direction)] for m in members if b.busy_ms.get((m, direction), (0, 0))[1] > 0}
        if len(rows) < 2:
            return set(members)
        usual_ios = statistics.median(r[1] for r in rows.values())
        sizes = [r[2] / r[1] for r in rows.values() if r[2] > 0]
        usual_size = statistics.median(sizes) if len(sizes) >= 2 else None
        # what each device moved in both directions: a backup reading 2.7 GB/s beside a database's writes gives
        # those writes a tail of its making (they wait behind megabyte reads), however like their peers' they
        # are; judged against the others' median (of two, one flooded is not its quiet peer's yardstick)
        moved = {m: sum(b.busy_ms.get((m, d), (0.0, 0.0, 0.0))[2] for d in ("read", "write")) for m in rows}
        others_moved = leave_one_out_medians(moved)
        like = set(members) - set(rows)
        for m, (_, ios, kib) in rows.items():
            if ios > self.p.comparable_load * usual_ios:
                continue
            if others_moved.get(m, 0.0) > 0 and moved[m] > self.p.comparable_load * others_moved[m]:
                continue
            if usual_size and kib > 0 and not (
                    1 / self.p.request_size_ratio <= kib / ios / usual_size <= self.p.request_size_ratio):
                continue
            like.add(m)
        return like

    def named(self, member: str) -> bool:
        e = self.members.get(member)
        return e is not None and e.out_streak >= self.p.blocks

    def cleared(self, member: str) -> str | None:
        """Why an open tail verdict on `member` ends now, or None."""
        e = self.members.get(member)
        if e is None:
            return None
        if e.in_streak >= self.p.clear_blocks:
            return f"its tail is back in line with its peers' for {e.in_streak} blocks"
        if e.unjudged_streak >= self.p.unjudged_clear_blocks:
            return f"no tail to judge for {e.unjudged_streak} blocks (idle, or the tracer is off)"
        return None

    def forget_groups_but(self, groups) -> None:
        for key in set(self.blocks) - set(groups):
            del self.blocks[key]

    def forget(self, member: str) -> None:
        self.members.pop(member, None)
