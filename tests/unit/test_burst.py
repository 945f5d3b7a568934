"""The burst bucket (daemon/passive/burst.py) on a simulated bucket volume and a fake clock: learned from a fall and
a recovery, forecast on the next drain, said before the fall; never for a load under the baseline or a fixed cap."""
from __future__ import annotations

import random

import pytest

from iowarden.daemon.passive import burst

WINDOW = 15.0


class BucketVolume:
    """A volume with a token bucket, as a cloud volume's or QEMU's throttle group's: it delivers the demand up
    to its burst rate while it holds credits, its baseline when they are spent; the balance moves by
    (baseline - delivered) x seconds. Busy (a queue at full utilisation) when the demand is more than it
    delivers."""

    def __init__(self, burst_iops=3000.0, baseline_iops=300.0, capacity_ios=2600.0 * 3600, full=True):
        self.burst, self.baseline, self.capacity = burst_iops, baseline_iops, capacity_ios
        self.balance = capacity_ios if full else 0.0

    def window(self, demand: float, seconds: float = WINDOW) -> tuple[float, bool]:
        can = self.burst if self.balance > 0 else self.baseline
        # the window the credits run out in is part burst, part baseline
        if demand > self.baseline and self.balance > 0:
            at_burst = min(seconds, self.balance / (min(demand, can) - self.baseline))
            delivered = (min(demand, can) * at_burst + min(demand, self.baseline) * (seconds - at_burst)) / seconds
        else:
            delivered = min(demand, can)
        self.balance = min(self.capacity, max(0.0, self.balance + (self.baseline - delivered) * seconds))
        return delivered, demand > delivered * 1.05


def _run(t, p, vol, demand, seconds, clock, rng, said, fell_at=None):
    """Windows of `demand` IOPS (3 % noise) for `seconds`; returns the clock after. `said` gets
    (clock, state, sentence, evidence, true seconds left) of every transition."""
    end = clock + seconds
    while clock < end:
        clock += WINDOW
        was = vol.balance
        iops, busy = vol.window(demand * rng.uniform(0.97, 1.03))
        delivered_above = demand - vol.baseline
        truth = was / delivered_above if was > 0 and delivered_above > 0 else None
        for state, sentence, ev in burst.step(t, p, "nvme1n1", clock, WINDOW, iops, busy):
            said.append((clock, state, sentence, ev, truth))
    return clock


def test_a_bucket_learned_from_its_fall_and_recovery_is_forecast_on_the_next_drain_before_the_fall():
    rng = random.Random(7)
    p = burst.BurstParams()
    vol, t, said, clock = BucketVolume(), burst.learning(), [], 1_700_000_000.0
    # the first drain: a full bucket at 2,900 IOPS lasts 2600 x 3600 / 2600 = an hour, then it is held at 300
    clock = _run(t, p, vol, 2900, 3600 + 900, clock, rng, said)
    assert t.bucket is None and t.candidate is not None, "a fall is a candidate until it recovers"
    c = t.candidate
    assert abs(c.baseline_iops - 300) < 15 and abs(c.burst_iops - 2900) < 60, c
    assert abs(c.capacity_ios - vol.capacity) < 0.05 * vol.capacity, (c.capacity_ios, vol.capacity)
    assert said == [], "nothing is forecast from a candidate"
    # a quiet spell: 4 h at 50 IOPS refills 250 x 14,400 = 3.6 M credits, 40 % of the bucket
    clock = _run(t, p, vol, 50, 4 * 3600, clock, rng, said)
    true_balance = vol.balance
    # the load comes back: the volume delivers it again (a bucket, not a cap) and the next drain is forecast
    drain_start = clock
    clock = _run(t, p, vol, 2900, 3600, clock, rng, said)
    assert t.bucket is not None and t.bucket.source == "learned"
    raised = [s for s in said if s[1] == "raised"]
    assert len(raised) == 1, said
    at, _, sentence, ev, truth = raised[0]
    fall = drain_start + true_balance / (2900 - 300)
    assert fall - at >= 600, (fall - at, "said at least ten minutes before the fall")
    assert abs(ev["seconds_left"] - truth) <= 0.25 * truth, (ev["seconds_left"], truth)
    assert "its burst credits run out in about" in sentence and "baseline of 300 IOPS" in sentence, sentence
    # the fall clears it; VolumeAtLimit names it as the bucket's baseline
    cleared = [s for s in said if s[1] == "cleared"]
    assert len(cleared) == 1 and "ran out" in cleared[0][2], said
    assert cleared[0][0] > fall
    clause = burst.fall_clause(t, 300.0)
    assert clause.startswith("at its baseline of 300 IOPS since ") and "burst credits spent" in clause, clause


def test_a_load_under_its_baseline_is_never_warned_and_a_fixed_cap_is_never_a_bucket():
    rng = random.Random(3)
    p = burst.BurstParams()
    # under the baseline all day, on a bucket known from the config
    vol, said, clock = BucketVolume(), [], 0.0
    t = burst.configured(3000, 300, 2600 * 3600)
    clock = _run(t, p, vol, 250, 24 * 3600, clock, rng, said)
    assert said == [] and t.forecast.seconds_left is None and t.forecast.balance_ratio == 1.0
    # a fixed cap at 300 IOPS (never a burst): a fall is seen, but the rate never comes back above the cap
    cap, t, said = BucketVolume(burst_iops=300, capacity_ios=0.0, full=False), burst.learning(), []
    clock = _run(t, p, cap, 2900, 3600, clock, rng, said)
    clock = _run(t, p, cap, 50, 3600, clock, rng, said)
    clock = _run(t, p, cap, 2900, 3600, clock, rng, said)
    assert t.bucket is None and said == [], (t.bucket, said)


def test_a_configured_bucket_is_forecast_from_the_start_and_clears_when_the_draw_stops():
    rng = random.Random(5)
    p = burst.BurstParams()
    vol, said, clock = BucketVolume(capacity_ios=2600 * 1200), [], 0.0   # 20 min at 2,900 IOPS
    t = burst.configured(3000, 300, 2600 * 1200)
    clock = _run(t, p, vol, 2900, 300, clock, rng, said)
    raised = [s for s in said if s[1] == "raised"]
    assert len(raised) == 1 and raised[0][0] <= 2 * WINDOW, said
    assert "configured" in raised[0][2], raised[0][2]
    assert abs(raised[0][3]["seconds_left"] - raised[0][4]) <= 0.1 * raised[0][4]
    stopped = clock
    clock = _run(t, p, vol, 100, 600, clock, rng, said)
    # cleared within the windows its draw is averaged over, as the credits outlast the horizon or the draw ends
    assert [s[1] for s in said] == ["raised", "cleared"] and said[-1][0] <= stopped + p.draw_windows * WINDOW, said
    assert t.forecast.seconds_left is None


def test_the_saved_bucket_comes_back_refilled_for_the_time_the_daemon_was_down():
    t = burst.BurstTrack(bucket=burst.Bucket(3000, 300, 1_000_000, "learned", 100.0), balance_ios=100_000)
    st = burst.to_state(t, now=1000.0)
    back = burst.from_state(st, now=1000.0 + 600)
    assert back.bucket == t.bucket
    assert back.balance_ios == 100_000 + 300 * 600
    # a configured bucket keeps the config's shape and takes the saved balance
    conf = burst.from_state(st, now=1000.0, into=burst.configured(2000, 200, 500_000))
    assert conf.bucket.source == "configured" and conf.bucket.capacity_ios == 500_000
    assert conf.balance_ios == 100_000
    assert burst.to_state(burst.learning(), 0.0) is None


def _window(device, end, iops, busy):
    from iowarden.daemon.passive.values import Flow, Window
    flows = {"read": Flow(iops, iops * 4.0, 100.0 if busy else 0.3), "write": Flow(0.0, 0.0, 0.0)}
    return Window(device, end, WINDOW, flows, queue_size=30.0 if busy else 0.5, util_percent=100.0 if busy else 40.0)


def test_the_detector_raises_burst_credits_low_and_names_the_fall_as_the_buckets_baseline():
    """Through the passive detector, as the daemon and replay feed it: BurstCreditsLow on the second drain, and
    VolumeAtLimit, when the fall comes, says the credits are spent."""
    from iowarden.daemon.passive.detector import PassiveDetector
    rng = random.Random(11)
    det, vol, clock, got = PassiveDetector(), BucketVolume(capacity_ios=2600 * 1800), 0.0, []
    for demand, seconds in ((2900, 1800 + 900), (50, 3 * 3600), (2900, 3600)):
        end = clock + seconds
        while clock < end:
            clock += WINDOW
            iops, busy = vol.window(demand * rng.uniform(0.97, 1.03))
            got += [(clock, t) for t in det.observe([_window("vol0", clock, iops, busy)])]
    kinds = [(t.kind, t.state) for _, t in got]
    assert ("burst", "raised") in kinds and ("burst", "cleared") in kinds, kinds
    raised = next(t for _, t in got if t.kind == "burst" and t.state == "raised")
    assert raised.alert == "BurstCreditsLow" and raised.severity == "warning"
    assert "baseline of 300 IOPS" in raised.summary, raised.summary
    limits = [t for _, t in got if t.kind == "saturation" and t.state == "raised"]
    assert limits and "burst credits spent" in limits[-1].summary, [t.summary for t in limits]
    view = next(v for v in det.views() if v.device == "vol0")
    assert view.burst is not None and view.burst.bucket.source == "learned"


def test_the_forecast_is_exported_with_its_bucket_and_nothing_where_none_is_known():
    import types
    from iowarden.daemon.passive.metrics import passive_families
    from iowarden.daemon.passive.values import DeviceView
    t = burst.configured(3000, 300, 2600 * 1200)
    burst.step(t, burst.BurstParams(), "nvme1n1", 15.0, WINDOW, 2900.0, False)
    with_bucket = DeviceView("nvme1n1", {}, {}, {}, None, None, (), burst=t.forecast)
    without = DeviceView("sda", {}, {}, {}, None, None, ())
    snap = types.SimpleNamespace(passive=(("nvme1n1", "serial:vol0abc", with_bucket), ("sda", "kernel:sda", without)),
                                 passive_host_ratio=None)
    got = {f.name: f.samples for f in passive_families(snap)}
    left = got["iowarden_volume_burst_left_seconds"]
    assert [s.labels for s in left] == [{"device": "nvme1n1", "volume": "serial:vol0abc", "bucket": "configured"}]
    assert abs(left[0].value - (2600 * 1200 - 2600 * 15) / 2600) < 1, left[0].value
    assert [s.value for s in got["iowarden_volume_burst_baseline_iops"]] == [300.0]
    assert 0.98 < got["iowarden_volume_burst_balance_ratio"][0].value < 1.0


def test_replay_of_a_recorded_day_shows_the_warning_and_the_learned_bucket(tmp_path, capsys):
    """`replay --passive --explain` over a recording (iowarden iostat --json lines) of a bucket volume: the
    BurstCreditsLow interval before the second fall, and the bucket it learned."""
    import json
    from iowarden.daemon import cli
    rng = random.Random(13)
    vol, clock, lines = BucketVolume(capacity_ios=2600 * 1800), 1_700_000_000.0, []
    for demand, seconds in ((2900, 1800 + 900), (50, 3 * 3600), (2900, 3600)):
        end = clock + seconds
        while clock < end:
            clock += WINDOW
            iops, busy = vol.window(demand * rng.uniform(0.97, 1.03))
            lines.append(json.dumps({"timestamp": clock, "disk_device": "nvme1n1", "r/s": iops, "rkB/s": iops * 4,
                                     "r_await": 100.0 if busy else 0.3, "w/s": 0.0, "wkB/s": 0.0, "w_await": 0.0,
                                     "aqu-sz": 30.0 if busy else 0.5, "util": 100.0 if busy else 40.0}))
    path = tmp_path / "bucket.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert cli.main(["replay", "--passive", str(path), "--explain", "--json", "--window", "15"]) == 0
    out = json.loads(capsys.readouterr().out)
    kinds = [a["kind"] for a in out["alerts"]]
    assert "burst" in kinds and "saturation" in kinds, out["alerts"]
    row = next(r for r in out["explain"] if r["device"] == "nvme1n1")
    assert row["burst"]["baseline_iops"] == pytest.approx(300, rel=0.05), row["burst"]
    assert cli.main(["replay", "--passive", str(path), "--explain", "--window", "15"]) == 0
    assert "300 -> 2," in capsys.readouterr().out


def test_a_fall_that_steps_down_over_a_few_windows_is_still_a_fall():
    """On a loaded machine the rate can take three windows to fall (150, 110, 70, then 50): still one fall (after
    70 s at the burst rate: a bucket's burst, not a job's spurt)."""
    p, t = burst.BurstParams(), burst.learning()
    clock = 0.0
    for iops, busy in [(150.0, False)] * 35 + [(110.0, True), (90.0, True), (70.0, True)] + [(50.0, True)] * 6:
        clock += 2.0
        burst.step(t, p, "vdj", clock, 2.0, iops, busy)
    assert t.candidate is not None and abs(t.candidate.baseline_iops - 50) < 1, t.candidate
    assert abs(t.candidate.burst_iops - 150) < 15   # the 110 of the step is above 1.5x the baseline: counted


def test_a_spurt_of_seconds_before_a_cap_is_no_burst_bucket():
    """An application run unthrottled for a few seconds, then held at a cap: a limit, not a bucket's credits."""
    p, t = burst.BurstParams(), burst.learning()
    clock = 0.0
    for iops, busy in [(27_000.0, True)] * 6 + [(1_400.0, True)] * 10:
        clock += 5.0
        burst.step(t, p, "loop1", clock, 5.0, iops, busy)
    assert t.candidate is None and t.bucket is None
    assert burst.fall_clause(t, 1_400.0) is None


def test_a_drain_shorter_than_the_horizon_is_said_at_its_own_rate_not_with_the_quiet_before_it():
    # a bucket of 15 minutes at the burst rate, all of its drain under the 30-minute horizon: the warning comes
    # in the drain's second window, when half of the last minute was the quiet spell before it
    rng = random.Random(11)
    p = burst.BurstParams()
    vol = BucketVolume(burst_iops=2000.0, baseline_iops=200.0, capacity_ios=1800.0 * 900)
    t, said, clock = burst.learning(), [], 1_700_000_000.0
    clock = _run(t, p, vol, 1900, 900 + 300, clock, rng, said)          # the first drain and its fall
    clock = _run(t, p, vol, 40, 1800, clock, rng, said)                 # quiet: refills 160 x 1,800 = 288,000
    true_balance = vol.balance
    drain_start = clock
    _run(t, p, vol, 1900, 600, clock, rng, said)
    raised = [s for s in said if s[1] == "raised"]
    assert len(raised) == 1, said
    at, _, _, ev, _ = raised[0]
    assert at <= drain_start + 3 * WINDOW, "warned as soon as two windows of the drain said so"
    truth = drain_start + true_balance / (1900 - 200) - at
    # late is the side that costs: the quiet windows in the draw's mean halved it and doubled the time said
    assert abs(ev["seconds_left"] - truth) <= 0.25 * truth, (ev["seconds_left"], truth)


def test_a_busy_demand_that_wanders_at_a_lower_rate_is_no_fall():
    # a job steps down from 2,000 IOPS to about 600 with its queue full, wandering 5 % either side from window to
    # window (a volume held at a limit delivers it flat), then rests and comes back: no bucket is learned from it
    p = burst.BurstParams()
    t, said, clock = burst.learning(), [], 1_700_000_000.0
    rng = random.Random(5)
    for i in range(40):
        clock += WINDOW
        said += burst.step(t, p, "sdb", clock, WINDOW, 2000 * rng.uniform(0.97, 1.03), False)
    for i in range(12):
        clock += WINDOW
        said += burst.step(t, p, "sdb", clock, WINDOW, 570.0 if i % 2 else 630.0, True)
    assert t.candidate is None and t.bucket is None, t.candidate
    for i in range(40):
        clock += WINDOW
        said += burst.step(t, p, "sdb", clock, WINDOW, 100.0, False)
    for i in range(40):
        clock += WINDOW
        said += burst.step(t, p, "sdb", clock, WINDOW, 2000.0, False)
    assert t.bucket is None and said == [], said
    # held at 600 to within a few requests a window, the same steps are a fall (a candidate, until it recovers)
    t = burst.learning()
    for i in range(40):
        clock += WINDOW
        burst.step(t, p, "sdb", clock, WINDOW, 2000 * rng.uniform(0.97, 1.03), False)
    for i in range(6):
        clock += WINDOW
        burst.step(t, p, "sdb", clock, WINDOW, 600 * rng.uniform(0.99, 1.01), True)
    assert t.candidate is not None and abs(t.candidate.baseline_iops - 600) < 10, t.candidate


def test_a_drain_that_began_inside_a_window_is_said_at_the_rate_of_its_whole_windows():
    """A load starts when it starts, not at a window's edge: the drain's first window is part quiet. Said at
    the mean with it (the lab bucket: 133 IOPS of 150), the credits read 103 s where they lasted 84 s."""
    p = burst.BurstParams()
    vol = BucketVolume(burst_iops=200.0, baseline_iops=50.0, capacity_ios=18_000.0)
    t, said, clock = burst.learning(), [], 1_700_000_000.0
    seconds = 2.0

    def window(demand, part=1.0):
        nonlocal clock
        delivered, busy = vol.window(demand * part, seconds)
        clock += seconds
        said.extend(burst.step(t, p, "vdj", clock, seconds, delivered, busy))
        return delivered
    for _ in range(100):                     # the first drain (150 IOPS: 100 above the baseline, 180 s)
        window(150.0)
    for _ in range(20):                      # its fall, held busy at the baseline
        window(150.0)
    for _ in range(90):                      # quiet: refilled by 50 x 180 = 9,000
        window(0.0)
    window(150.0, part=0.4)                  # the load began 0.8 s before this window's end
    while not [s for s in said if s[0] == "raised"] and vol.balance > 0:
        window(150.0)                        # recovered past the baseline: a bucket; warned two windows on
    (raised,) = [s for s in said if s[0] == "raised"]
    truth = vol.balance / (150.0 - 50.0)
    assert abs(raised[2]["draw_iops"] - 150.0) <= 3.0, raised
    assert abs(raised[2]["seconds_left"] - truth) <= 0.1 * truth + seconds, (raised[2]["seconds_left"], truth)
