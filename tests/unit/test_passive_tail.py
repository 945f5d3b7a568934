"""The tail rule (daemon/passive/tail.py): a drive whose p99.9 of real I/O leaves its peers' is named while
its mean stays in line; a single stall, a tail the peers share, and too few I/Os name nothing."""
import random
from collections import Counter
from types import MappingProxyType, SimpleNamespace

from iowarden.daemon.passive.detector import PassiveDetector
from iowarden.daemon.passive.values import Flow, PassiveParams, Window
from iowarden.daemon.passive.part import PassiveWatch
from iowarden.daemon.passive.tail import TailEvidence, TailParams
from iowarden.probes.blocktrace import StageHistogram, bucket_of_ns

IOS = 3000   # per window and member: 200 IOPS over 15 s


def hist(latencies_ms) -> StageHistogram:
    c = Counter(bucket_of_ns(int(ms * 1e6)) for ms in latencies_ms)
    return StageHistogram(tuple(sorted(c.items())))


def healthy(rng, n=IOS):
    return [rng.lognormvariate(0.0, 0.25) for _ in range(n)]   # about 1 ms, a p99.9 near 2 ms


def weak(rng, n=IOS, share=0.003, delay_ms=100.0):
    """A drive with a weak region: `share` of its I/Os delayed by `delay_ms` (what dm-delay on a few sectors does)."""
    return [x + (delay_ms if rng.random() < share else 0.0) for x in healthy(rng, n)]


def feed(ev, group, per_member, windows=1):
    """Each member's latencies of a window, with no request size (diskstats' KiB not known)."""
    return feed_sized(ev, group, {m: (lat, None) for m, lat in per_member.items()}, windows)


def test_a_weak_region_is_named_after_three_blocks_in_a_row_while_its_mean_moves_little():
    rng = random.Random(1)
    ev = TailEvidence(TailParams(block_windows=4))
    group = ("a", "b", "c")
    lat = {"a": lambda: healthy(rng), "b": lambda: healthy(rng), "c": lambda: weak(rng)}
    for block in range(1, 4):
        judged = feed(ev, group, lat, windows=4)
        assert ev.named("c") == (block == 3), block
        assert not ev.named("a") and not ev.named("b")
    c = judged["c"]
    assert c.tail_ms > 50 and c.peers_tail_ms < 5, c
    # the mean is what does not show it: 0.3 % of I/Os at +100 ms is +0.3 ms on about 1 ms, and under 1.5x
    assert c.mean_ratio < 1.5, c.mean_ratio
    assert c.ratio > 10


def test_a_single_stall_of_a_healthy_drive_names_nothing():
    rng = random.Random(2)
    ev = TailEvidence(TailParams(block_windows=4))
    group = ("a", "b", "c")
    calm = {m: (lambda: healthy(rng)) for m in group}
    feed(ev, group, calm, windows=8)
    # one window in which a tenth of b's I/Os took 200 ms (a second-long stall), then calm again
    feed(ev, group, {**calm, "b": lambda: [200.0] * 300 + healthy(rng)}, windows=1)
    feed(ev, group, calm, windows=40)
    assert ev.members["b"].out_streak == 0
    assert not any(ev.named(m) for m in group)


def test_a_tail_the_peers_share_is_not_a_member_s_fault():
    rng = random.Random(3)
    ev = TailEvidence(TailParams(block_windows=2))
    group = ("a", "b")
    feed(ev, group, {"a": lambda: weak(rng), "b": lambda: weak(rng)}, windows=20)
    assert not ev.named("a") and not ev.named("b")


def test_too_few_timed_ios_are_not_judged():
    rng = random.Random(4)
    ev = TailEvidence(TailParams(block_windows=2, min_ios=2000))
    group = ("a", "b")
    # 500 I/Os a block: the p99.9 would be the one slowest I/O
    judged = feed(ev, group, {"a": lambda: healthy(rng, 250), "b": lambda: weak(rng, 250, share=0.02)}, windows=20)
    assert judged["b"].tail_ms is None and judged["b"].unjudged_streak == 10
    assert not ev.named("b")


def feed_sized(ev, group, per_member, windows=1):
    """As feed, with each member's request size: member -> (latencies of a window, KiB per request or None)."""
    out = {}
    for _ in range(windows):
        tails, means = {}, {}
        for m, (lat, kib) in per_member.items():
            xs = lat()
            tails[m] = {"read": hist(xs)}
            means[m] = {"read": (sum(xs) / len(xs), len(xs), None if kib is None else len(xs) * kib)}
        out = ev.add(group, tails, means) or out
    return out


def backup(rng, n=IOS):
    """A backup's 1 MiB reads at a deep queue: each takes a megabyte's transfer and waits behind those before it,
    so its tail is some 40-80 ms of its own requests' making, on a healthy drive."""
    return [rng.uniform(8.0, 30.0) + (rng.uniform(40.0, 80.0) if rng.random() < 0.01 else 0.0) for _ in range(n)]


def test_a_backup_s_large_requests_at_a_deep_queue_are_not_judged_against_peers_serving_small_ones():
    rng = random.Random(11)
    ev = TailEvidence(TailParams(block_windows=4))
    group = ("a", "b", "c")
    lat = {"a": (lambda: healthy(rng), 4.0), "b": (lambda: healthy(rng), 4.0), "c": (lambda: backup(rng), 1024.0)}
    for _ in range(8):
        judged = feed_sized(ev, group, lat, windows=4)
    assert not any(ev.named(m) for m in group)
    assert judged["c"].tail_ms is None and judged["c"].unjudged_streak == 8, judged["c"]
    # the same tail at the peers' request size is out of line: the size is what excused it, not the figures
    other = TailEvidence(TailParams(block_windows=4))
    for _ in range(3):
        feed_sized(other, group, {**lat, "c": (lambda: backup(rng), 4.0)}, windows=4)
    assert other.named("c")


def test_a_weak_region_at_its_peers_load_and_request_size_is_still_named():
    rng = random.Random(12)
    ev = TailEvidence(TailParams(block_windows=4))
    group = ("a", "b", "c")
    lat = {"a": (lambda: healthy(rng), 4.0), "b": (lambda: healthy(rng), 4.0), "c": (lambda: weak(rng), 4.0)}
    for block in range(1, 4):
        feed_sized(ev, group, lat, windows=4)
        assert ev.named("c") == (block == 3), block
    assert not ev.named("a") and not ev.named("b")


def test_beside_a_backup_the_other_two_still_judge_each_other():
    """Of three, the backup is unlike the group and set aside; the quiet two are alike and judged: a weak region
    on one of them is named, whatever the backup's tail."""
    rng = random.Random(14)
    ev = TailEvidence(TailParams(block_windows=4))
    group = ("a", "b", "c")
    lat = {"a": (lambda: backup(rng), 1024.0), "b": (lambda: healthy(rng), 4.0), "c": (lambda: weak(rng), 4.0)}
    for _ in range(3):
        judged = feed_sized(ev, group, lat, windows=4)
    assert ev.named("c") and not ev.named("a") and not ev.named("b")
    assert judged["c"].peers_tail_ms < 5, judged["c"]   # judged against b alone, not the backup's tail
    assert judged["a"].tail_ms is None


def test_a_member_carrying_several_times_its_peers_load_is_not_judged_on_its_tail():
    rng = random.Random(13)
    ev = TailEvidence(TailParams(block_windows=2))
    group = ("a", "b", "c")
    lat = {"a": (lambda: healthy(rng), 4.0), "b": (lambda: healthy(rng), 4.0),
           "c": (lambda: weak(rng, n=3 * IOS), 4.0)}   # three times the I/Os: its queue, not its drive
    judged = feed_sized(ev, group, lat, windows=20)
    assert not ev.named("c") and judged["c"].tail_ms is None


def test_writes_waiting_behind_a_flood_of_reads_on_the_same_device_are_not_judged_on_their_tail():
    """The soak's healthy phase: a backup read 2.7 GB/s from one volume while its database's 4 KiB writes went on;
    those writes, like their peers' in load and size, waited behind megabyte reads (p99.9 101 ms against the
    peers' 11 ms) and the volume was named slow on its tail. The device moved hundreds of times the others' bytes:
    its write tail is the flood's making. The same writes' tail with the reads at the peers' load is named."""
    rng = random.Random(15)
    group = ("a", "b", "c")

    def windows(ev, c_reads_kib):
        for _ in range(4):
            tails, means = {}, {}
            for m in group:
                writes = weak(rng, share=0.01) if m == "c" else healthy(rng)
                reads = healthy(rng)
                tails[m] = {"write": hist(writes)}
                means[m] = {"write": (sum(writes) / len(writes), len(writes), len(writes) * 4.0),
                            "read": (sum(reads) / len(reads), len(reads), len(reads) * (c_reads_kib if m == "c" else 4.0))}
            ev.add(group, tails, means)

    flooded = TailEvidence(TailParams(block_windows=4))
    for _ in range(4):
        windows(flooded, c_reads_kib=1024.0)
    assert not any(flooded.named(m) for m in group), flooded.members["c"]
    assert flooded.members["c"].unjudged_streak == 4
    quiet = TailEvidence(TailParams(block_windows=4))
    for _ in range(3):
        windows(quiet, c_reads_kib=4.0)
    assert quiet.named("c") and not quiet.named("a") and not quiet.named("b")


def windows_of(rng, per_member, end):
    out = []
    for m, lat in per_member.items():
        xs = lat()
        flows = {"read": Flow(len(xs) / 15.0, len(xs) * 4 / 15.0, sum(xs) / len(xs))}
        out.append(Window(m, end, 15.0, flows, 1.0, 20.0, {"read": hist(xs)}))
    return out


def test_the_detector_raises_slow_member_on_the_tail_as_a_warning_and_clears_it_when_the_tail_is_back():
    rng = random.Random(5)
    det = PassiveDetector(PassiveParams(tail_block_windows=4))
    group = [("a", "b")]
    lat = {"a": lambda: healthy(rng), "b": lambda: weak(rng)}
    raised, t = [], 0.0
    for i in range(24):
        t += 15.0
        raised += [x for x in det.observe(windows_of(rng, lat, t), group) if x.state == "raised"]
    assert [(x.device, x.kind, x.alert, x.severity) for x in raised] == [("b", "peers", "SlowMember", "warning")]
    ev = raised[0].evidence
    assert ev["rule"] == "tail" and ev["peers"] == ("a",) and ev["blocks"] == 3 and ev["tail_ms"] > 50
    assert "slow on its tail" in raised[0].summary and "p99.9 read" in raised[0].summary
    assert "while its mean is" in raised[0].summary
    # the mean-based peer comparison, in line, does not clear what the tail raised
    assert "peers" in det.devices["b"].flagged
    view = next(v for v in det.views() if v.device == "b")
    assert view.tail.ratio > 10 and view.tail.direction == "read"
    # the weak region is remapped: three blocks in line clear it
    lat["b"] = lambda: healthy(rng)
    cleared = []
    for i in range(16):
        t += 15.0
        cleared += [x for x in det.observe(windows_of(rng, lat, t), group) if x.state == "cleared"]
    assert [(x.device, x.kind) for x in cleared] == [("b", "peers")]
    assert "tail is back in line" in cleared[0].summary


def test_without_the_tracer_the_rule_is_silent():
    rng = random.Random(6)
    det = PassiveDetector(PassiveParams(tail_block_windows=1))
    t, out = 0.0, []
    for i in range(12):
        t += 15.0
        ws = [Window(w.device, w.end, w.seconds, w.flows, w.queue_size, w.util_percent)
              for w in windows_of(rng, {"a": lambda: healthy(rng), "b": lambda: weak(rng)}, t)]
        out += det.observe(ws, [("a", "b")])
    assert out == []


class _Reading(SimpleNamespace):
    pass


def test_the_part_hands_the_detector_what_the_tracer_timed_since_its_last_step():
    """The tracer's totals are cumulative: each step's window gets the difference, the first step none."""
    watch = PassiveWatch.__new__(PassiveWatch)
    watch._trace_before = {}

    def reading(counts, up=True):
        return _Reading(up=up, total=MappingProxyType({
            ("vdb", "read", "total"): StageHistogram(tuple(sorted(counts.items()))),
            ("vdb", "read", "device"): StageHistogram(((1, 99),))}))

    assert watch._tails(None) == {}
    assert watch._tails(reading({100: 5, 120: 1})) == {}                    # the start
    cumulative = reading({100: 9, 120: 1, 130: 2})
    assert watch._tails(cumulative) == {"vdb": {"read": StageHistogram(((100, 4), (130, 2)))}}
    assert watch._tails(cumulative) == {}                                   # nothing new since
    # the tracer restarted: its counts start over
    assert watch._tails(reading({100: 1})) == {"vdb": {"read": StageHistogram(((100, 1),))}}
    assert watch._tails(reading({100: 3}, up=False)) == {}


def test_a_services_counts_are_judged_when_they_arrive_over_the_time_they_cover():
    """The tracer reads its counts every 15 s on a clock of its own, the passive part steps every 15 s on the
    sampler's: as the two drift, a step sees no new reading, the next two. Each service's rate is its counts
    over the time they cover (100 requests a second here, whichever step sees them), never 0 then 200: a
    normal learned in two octaves at half the pace each left ServiceContended blind for twice
    service_learn_seconds after a start."""
    from iowarden.daemon.passive.part import NO_NEW_COUNTS
    from iowarden.probes.blocktrace import CgroupCounts

    watch = PassiveWatch.__new__(PassiveWatch)
    watch._cgroups_before, watch._cgroups_requests, watch._cgroups_seen_at = {}, None, None
    ident = {"vdb": "wwn-1"}

    def reading(t, up=True, read_at=None):   # the counts printed at t (100 requests a second since 0), read later
        n = int(100 * t)
        return _Reading(up=up, unix_time=1.7e9 + (read_at or t), window_seconds=15.0, cgroups=MappingProxyType({
            ("vdb", "/db", "read"): (CgroupCounts(n, 4096 * n, 1_000_000 * n, StageHistogram(((100, n),))), None)}))

    made = [5.0 + 15 * i for i in range(40)]             # when the tracer's program printed its counts
    rates, silent = [], 0
    for j in range(1, 40):
        step = 15.0 * j + 5.0 + (0.4 if j % 3 else -0.4)   # the part's steps, a little either side
        latest = max(t for t in made if t <= step)
        # read again just before the step: a new reading (a new time), the counts of the last print
        counts, seconds = watch._services(reading(latest, read_at=step - 0.1), ident, step, 15.0)
        if counts is NO_NEW_COUNTS:
            silent += 1
            continue
        if counts:
            rates.append(counts["wwn-1"][("/db", "read")].requests / seconds)
    assert silent >= 5, silent                              # the drift did leave steps without a new reading
    assert rates and all(90 <= r <= 110 for r in rates), rates
    # nothing new for three windows: an idle window, judged (a raised service clears in time)
    quiet = reading(latest, read_at=step + 1.0)
    assert watch._services(quiet, ident, step + 1.0, 15.0)[0] is NO_NEW_COUNTS
    counts, seconds = watch._services(quiet, ident, step + 50.0, 15.0)
    assert counts["wwn-1"][("/db", "read")].requests == 0 and seconds > 45
    # the tracer off: the counts start over, and every step judges (an open verdict clears in time)
    assert watch._services(reading(700.0, up=False), ident, 700.0, 15.0) == (None, 15.0)
    assert watch._services(None, ident, 715.0, 15.0) == (None, 15.0)


def test_a_services_counts_cover_the_time_between_the_loaders_two_reads_of_its_map():
    """The loader says when it read its map (monotonic): counts drained late, or two prints at once, still cover
    exactly the time between its reads. The source reads every 15 s, the part steps every 15 s, each drifting
    against the loader's print: the rate is the service's, 100 a second, to the percent."""
    from iowarden.daemon.passive.part import NO_NEW_COUNTS
    from iowarden.probes.blocktrace import CgroupCounts

    watch = PassiveWatch.__new__(PassiveWatch)
    watch._cgroups_before, watch._cgroups_at = {}, None
    watch._cgroups_requests, watch._cgroups_seen_at = None, None
    ident = {"vdb": "wwn-1"}
    printed = [3.0 + 15.0 * i + (0.7 if i % 4 == 1 else 0.0) for i in range(60)]   # a late print now and then
    rates, silent = [], 0
    reads = [15.0 * k + 9.0 - 0.11 * k for k in range(70)]   # the source's reads drift one way
    for j in range(1, 60):
        step = 15.0 * j + 2.9 + 0.2 * j                      # the part's the other
        read = max(x for x in reads if x <= step)
        seen = [t for t in printed if t <= read]
        if not seen:
            continue
        t = seen[-1]
        n = int(100 * t)
        r = _Reading(up=True, unix_time=1.7e9 + read, window_seconds=15.0, cgroups_at=t, cgroups=MappingProxyType({
            ("vdb", "/db", "read"): (CgroupCounts(n, 4096 * n, 10 ** 6 * n, StageHistogram(((100, n),))), None)}))
        counts, seconds = watch._services(r, ident, step, 15.0)
        if counts is NO_NEW_COUNTS:
            silent += 1
        elif counts:
            rates.append(counts["wwn-1"][("/db", "read")].requests / seconds)
    assert silent >= 3, silent
    assert rates and all(99 <= r <= 101 for r in rates), [round(r) for r in rates]
