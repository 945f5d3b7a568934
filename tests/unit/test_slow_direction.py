"""A device the passive view finds far slower than its normal in one direction is met by a probe of that
direction within a minute or two, whichever profile was next due, one a minute at most, from the reserve.
Fake clock, no root, no fio."""
from iowarden.daemon import config
from iowarden.daemon.probing.scheduler import profile_directions
from iowarden.probes.common import Roots

from tests.unit.test_policy import Clock, FakeRun, Sampler

PROFILES = {"rr": "randread", "ww": "randwrite", "seq": "read", "q1": "randread"}
DEPTHS = {"q1": 1}   # the others at the default 32


def _scheduler(clock, slow: dict, util: float = 0.0, struck=None) -> FakeRun:
    cfg = config.parse("""
[budget]
device_time_ratio = 1.0
[scheduling]
jitter_ratio = 0.0
max_deferral_seconds = 600.0
defer_util_percent = 50.0
warmup_interval_seconds = 60.0
[detector]
warmup_probes = 3
""" + "".join(f'[profiles.{p}]\nrw = "{rw}"\niodepth = {DEPTHS.get(p, 32)}\nruntime_seconds = 1.0\n'
              f'ramp_time_seconds = 0.0\n' for p, rw in PROFILES.items()) + """
[[targets]]
name = "db"
path = "/srv/db"
profiles = ["rr", "ww", "seq", "q1"]
interval_seconds = 300.0
""")
    learned = [{"target": "db", "profile": p, "ok": True, "contended": False, "device": None,
                "started_at": 0.0, "duration_seconds": 1.0} for p in PROFILES for _ in range(3)]
    return FakeRun(cfg, Roots(), Sampler(util), clock=clock, history=learned,
                   suspected=lambda target, profile: "passive" if slow["on"] else None,
                   slow=lambda target: slow["on"], struck=struck)


def _ran(s: FakeRun, clock: Clock, seconds: int) -> list[tuple[float, str]]:
    before = len(s.ran)
    for _ in range(seconds):
        s.tick()
    return [(t, p) for (t, _, _), p in zip(s.ran[before:], s.ran_profiles[before:])]


def test_a_volume_slow_in_its_writes_meets_a_write_probe_in_two_minutes_whichever_profile_was_due():
    clock = Clock()
    slow = {"on": frozenset()}
    s = _scheduler(clock, slow)
    _ran(s, clock, 1500)   # routine: each profile once an interval on a quiet disk
    ww = [d for d in s.due if d.profile == "ww"][0]
    for _ in range(300):   # a write probe not due for the next 200 s
        if ww.next_at >= clock() + 200:
            break
        _ran(s, clock, 1)
    # the collapse: the disk busy with its own users' queue, its writes at 8x their normal latency or more
    s.load.util, slow["on"] = 100.0, frozenset({"write"})
    began = clock()
    ran = _ran(s, clock, 600)
    writes = [t - began for t, p in ran if p == "ww"]
    assert writes and writes[0] <= 125, ran   # brought forward at once, then deferred a minute on the busy disk
    # a write probe every minute or two while it lasts, and about a probe a minute of the volume in all (the others
    # are its routine ones, run after a minute's deferral on the busy disk as a suspected volume's are)
    assert all(60 <= b - a <= 180 for a, b in zip(writes, writes[1:])) and len(writes) >= 4, ran
    assert len(ran) <= 600 / 60 + 1, ran
    slow["on"] = frozenset()
    after = _ran(s, clock, 1200)
    assert len(after) <= 4 * 1200 / 300 + 1, after   # the routine schedule again


def test_a_volume_slow_in_its_reads_meets_the_deep_read_profile_probed_longest_ago():
    """Of the read profiles, the deep ones (rr, seq at 32 in flight): a qd1 read waits behind the volume's own users
    and its total cannot show the volume held short, so it is not the one brought forward, however long ago it ran."""
    for q1_oldest in (False, True):
        clock = Clock()
        slow = {"on": frozenset()}
        s = _scheduler(clock, slow)
        _ran(s, clock, 900)
        _ran(s, clock, 10)   # nothing running: each profile's last probe has ended
        # the volume's probes as a schedule stretched by its budget might have left them: none started within the
        # last two minutes, none due within the next three, and the qd1 read the one probed longest ago, or the newest
        now, by_profile = clock(), {d.profile: d for d in s.due}
        ages = {"q1": 290, "rr": 250, "seq": 170} if q1_oldest else {"rr": 290, "seq": 250, "q1": 170}
        for profile, age in {**ages, "ww": 130}.items():
            by_profile[profile].started_at, by_profile[profile].next_at = now - age, now + 180 + age / 10
        oldest = max(("rr", "seq"), key=ages.get)
        slow["on"] = frozenset({"read"})
        ran = _ran(s, clock, 70)   # brought forward at once: no probe of the volume has started within the minute
        assert [p for _, p in ran if p != "ww"][:1] == [oldest], (ran, ages)


def test_no_slow_direction_brings_nothing_forward():
    clock = Clock()
    s = _scheduler(clock, {"on": frozenset()}, util=100.0)
    ran = _ran(s, clock, 3000)
    assert len(ran) <= 4 * 3000 / 300 + 4, ran


def test_a_profile_says_its_directions_as_the_passive_view_names_them():
    assert profile_directions("randread") == profile_directions("read") == {"read"}
    assert profile_directions("randwrite") == profile_directions("write") == {"write"}
    assert profile_directions("randrw") == profile_directions("rw") == profile_directions("readwrite") \
        == {"read", "write"}


def test_once_a_probe_on_the_busy_device_has_struck_the_next_is_not_deferred_for_it():
    """The collapse of the test above, with its first write probe short in total and the device agreeing (one
    strike, which the core publishes as it ends): each later probe of the volume runs when it falls due, within
    a minute of the one before, not after another minute's wait for the device its own slowness keeps busy. The
    second strike, and the page, come a minute sooner."""
    clock = Clock()
    slow, struck = {"on": frozenset()}, {"on": False}
    s = _scheduler(clock, slow, struck=lambda target: struck["on"])
    _ran(s, clock, 1500)
    s.load.util, slow["on"] = 100.0, frozenset({"write"})
    began = clock()
    first = []
    while not any(p == "ww" for _, p in first) and clock() - began < 300:
        first += _ran(s, clock, 1)
    # waited its minute, as before: the volume's last probe may have started just before the collapse (a minute
    # in which nothing is brought forward), the write profile then due within the next minute (not brought
    # forward either), and a suspected volume's probe waits a minute for its busy device: three minutes at most,
    # and a tick. The profiles' first starts are spread at random, so each run meets another of these phases.
    assert first and first[-1][1] == "ww" and first[-1][0] - began <= 3 * 60 + 2, first
    struck["on"] = True
    ran = _ran(s, clock, 400)
    starts = [first[-1][0]] + [t for t, _ in ran]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # a probe of the volume within a minute of the last, whichever profile (a strike of any counts), none held
    # for the device; without the strike the same collapse spaced them up to three minutes apart. No more than
    # the slow direction's probe a minute and each profile's routine ones (four in an interval of 300 s)
    assert ran and max(gaps) <= 65 and len(ran) <= 400 / 60 + 4 * 400 / 300 + 1, (gaps, ran)
