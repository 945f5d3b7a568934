"""plan(), the scheduling policy, as a pure function: the time and the world passed in, decisions out."""
from iowarden.daemon.probing.plan import (BUDGET_RETRY_SECONDS, DEFER_RETRY_SECONDS, Candidate, Load, Rules, plan)

RULES = Rules(defer_util_percent=50.0, max_deferral_seconds=600.0, jitter_ratio=0.1)
IDLE = Load({}, None, 1e9)


def no_budget_limit(disks, seconds, warming_up=False, confirming=False):
    return None


def c(target, profile="rr", due_at=0.0, disks=("sdb",), **kw):
    return Candidate(target, profile, due_at, disks, kw.pop("mounted", True), 5.0, 300.0, **kw)


def run(now, due, busy=(), budget=no_budget_limit, load=IDLE, rules=RULES, jitter=lambda r: 0.0):
    return {(d.target, d.profile): d for d in plan(now, due, set(busy), budget, load, rules, jitter)}


def test_the_longest_waiting_of_two_on_one_disk_runs_and_the_other_waits_counted_once():
    out = run(100.0, [c("db", "rr", due_at=90.0), c("db", "rw", due_at=50.0)])
    # at its rate: due at 50, it is due again at 350, not an interval after it was let run
    assert out[("db", "rw")].action == "run" and out[("db", "rw")].next_at == 350.0
    held = out[("db", "rr")]
    assert (held.action, held.reason, held.counted, held.waiting, held.next_at) == \
        ("hold", "waiting_for_disk", True, True, None)
    again = run(101.0, [c("db", "rr", due_at=90.0, waiting=True)], busy={"sdb"})[("db", "rr")]
    assert again.reason == "waiting_for_disk" and not again.counted       # the same wait: counted once


def test_disjoint_disks_run_together_and_a_shared_member_does_not():
    out = run(0.0, [c("lv", disks=("sdb", "sdc")), c("mirror", disks=("sdd", "sde")), c("raw", disks=("sdc",))])
    assert [k[0] for k, d in out.items() if d.action == "run"] == ["lv", "mirror"]
    assert out[("raw", "rr")].reason == "waiting_for_disk"


def test_budget_refusal_holds_for_a_minute_with_its_reason():
    out = run(10.0, [c("db")], budget=lambda disks, s, warming_up, confirming: "budget_bytes" if "sdb" in disks else None)
    d = out[("db", "rr")]
    assert (d.action, d.reason, d.counted, d.next_at) == ("hold", "budget_bytes", True, 10.0 + BUDGET_RETRY_SECONDS)


def test_a_busy_disk_defers_until_the_maximum_then_runs_contended():
    busy = Load({"sdb": 80.0}, None, 1e9)
    first = run(0.0, [c("db")], load=busy)[("db", "rr")]
    assert (first.reason, first.deferred_since, first.next_at) == ("busy", 0.0, DEFER_RETRY_SECONDS)
    later = run(599.0, [c("db", deferred_since=0.0)], load=busy)[("db", "rr")]
    assert later.action == "hold" and later.deferred_since == 0.0
    last = run(600.0, [c("db", deferred_since=0.0)], load=busy)[("db", "rr")]
    assert last.action == "run" and last.contended and last.util_percent == 80.0 and last.deferred_since is None


def test_a_probe_of_a_suspected_volume_waits_for_a_busy_disk_one_interval_at_most():
    busy = Load({"sdb": 80.0}, None, 1e9)
    # the interval is 300 s: a routine probe may wait 600 s, one of a volume under suspicion 300 s
    assert run(299.0, [c("db", deferred_since=0.0, suspected=True)], load=busy)[("db", "rr")].action == "hold"
    now = run(300.0, [c("db", deferred_since=0.0, suspected=True)], load=busy)[("db", "rr")]
    assert now.action == "run" and now.contended
    assert run(300.0, [c("db", deferred_since=0.0)], load=busy)[("db", "rr")].action == "hold"
    # and no longer than the warm-up's minute when the rules say so (the scheduler's do)
    minute = Rules(RULES.defer_util_percent, RULES.max_deferral_seconds, RULES.jitter_ratio, 60.0)
    assert run(59.0, [c("db", deferred_since=0.0, suspected=True)], load=busy, rules=minute)[("db", "rr")].action \
        == "hold"
    assert run(60.0, [c("db", deferred_since=0.0, suspected=True)], load=busy, rules=minute)[("db", "rr")].contended


def test_suspicion_is_an_open_alert_or_a_probe_far_off_its_normal():
    from iowarden.daemon.snapshot import AlertView, BaselineView, ProbeView, Snapshot
    from iowarden.daemon.probing.suspicion import suspected_fault
    probe = ProbeView("db", "rr", "vol", None, None)
    calm = Snapshot(taken_at=0.0, version="t", probes=(probe,),
                    baselines=(BaselineView("vol", "rr", "read_iops", 1000.0, 0.1, 1.2, 20, False),))
    assert not suspected_fault(calm, "db", "rr") and not suspected_fault(None, "db", "rr")
    far = Snapshot(taken_at=0.0, version="t", probes=(probe,),
                   baselines=(BaselineView("vol", "rr", "read_iops", 1000.0, 0.1, 40.0, 20, False),))
    assert suspected_fault(far, "db", "rr") and not suspected_fault(far, "db", "rw")
    alert = Snapshot(taken_at=0.0, version="t", alerts=(AlertView("VolumeDegraded", "vol", "rr", "db", "critical",
                                                                  0.0, 1),))
    assert suspected_fault(alert, "db", "rr") == "probe"
    # a passive verdict open on the probe's volume (or its device): the busy disk is the fault's
    for passive in (AlertView("VolumeAtLimit", "vol", "passive", "sdb", "warning", 0.0, 2),
                    AlertView("DeviceSlow", "other", "passive", "sdx", "critical", 0.0, 3, devices=("vol",))):
        on = Snapshot(taken_at=0.0, version="t", probes=(probe,), alerts=(passive,))
        assert suspected_fault(on, "db", "rr") == "passive" and suspected_fault(on, "logs", "rr") is None
    elsewhere = Snapshot(taken_at=0.0, version="t", probes=(probe,),
                         alerts=(AlertView("VolumeAtLimit", "v2", "passive", "sdc", "warning", 0.0, 2),))
    assert suspected_fault(elsewhere, "db", "rr") is None


def test_a_device_far_slower_than_its_normal_at_its_load_is_busy_because_it_is_slow():
    """A collapse keeps its device at 100 % util with its own users' queue: the passive view, at 8x its normal
    latency for the load or more, makes its probes suspected (deferred a minute at most, then run contended,
    as the evidence), where a device busy along its curve defers them as routine."""
    from types import SimpleNamespace as NS

    from iowarden.daemon.snapshot import ProbeView, Snapshot
    from iowarden.daemon.probing.suspicion import slow_directions, suspected_fault
    probe = ProbeView("db", "rr", "vol", NS(ok=True, device="loop13", space_used_ratio=None), None)
    for ratio, said in ((40.0, "passive"), (8.0, "passive"), (3.0, None), (None, None)):
        view = NS(slowdown_ratio={"read": ratio, "write": 1.0} if ratio else {}, window_ratio=ratio)
        snap = Snapshot(taken_at=0.0, version="t", probes=(probe,), passive=(("loop13", "fs-uuid:1", view),))
        assert suspected_fault(snap, "db", "rr") == said, ratio
        # the direction it is slow in, what brings that direction's profile forward (test_slow_direction.py)
        assert slow_directions(snap, "db") == ({"read"} if said else set()), ratio
        other = Snapshot(taken_at=0.0, version="t", probes=(probe,), passive=(("loop14", "fs-uuid:2", view),))
        assert suspected_fault(other, "db", "rr") is None and slow_directions(other, "db") == set()
    # its last judged window was 40x, but the window since was not judged (a flood, idle): no suspicion now
    stale = NS(slowdown_ratio={"read": 40.0}, window_ratio=None)
    snap = Snapshot(taken_at=0.0, version="t", probes=(probe,), passive=(("loop13", "fs-uuid:1", stale),))
    assert suspected_fault(snap, "db", "rr") is None and slow_directions(snap, "db") == set()


def test_a_probe_short_in_total_on_a_busy_device_is_confirmed_soon():
    """A collapse keeps its device busy, so its probes run contended and are judged by the device's total; one
    short is not a page, two in a row are. The second comes a minute after the first (the scheduler confirms a
    suspected probe soon), not an interval later, when a five-minute collapse is over."""
    from types import SimpleNamespace as NS

    from iowarden.daemon.snapshot import ProbeView, Snapshot
    from iowarden.daemon.probing.suspicion import suspected_fault
    fine = NS(ok=True, space_used_ratio=None, device="loop13")
    probes = (ProbeView("db", "qd32", "vol", fine, None), ProbeView("db", "qd1", "vol", fine, None))
    short = Snapshot(taken_at=0.0, version="t", probes=probes, short_on_busy=frozenset({("vol", "qd32")}))
    assert suspected_fault(short, "db", "qd32") == "probe" and suspected_fault(short, "db", "qd1") is None
    assert suspected_fault(Snapshot(taken_at=0.0, version="t", probes=probes), "db", "qd32") is None
    # the volume has one strike: its probes say so, whichever profile struck (the next probe of any is the second)
    from iowarden.daemon.probing.suspicion import struck_on_busy
    assert struck_on_busy(short, "db") and not struck_on_busy(short, "logs")
    assert not struck_on_busy(Snapshot(taken_at=0.0, version="t", probes=probes), "db")


def test_the_second_strike_on_a_busy_device_does_not_wait_for_it_again():
    """A collapse keeps its device busy: the first probe of the suspected volume waits a minute for it, runs and
    comes short with the device agreeing (one strike). The device is busy because the volume is slow, so the
    second probe runs as soon as it is due, not a minute later again: the page comes a minute sooner. A volume
    with no strike, or a probe not under suspicion, waits as before."""
    busy = Load({"sdb": 99.0}, None, 1e9)
    minute = Rules(RULES.defer_util_percent, RULES.max_deferral_seconds, RULES.jitter_ratio, 60.0)
    second = run(0.0, [c("db", suspected=True, struck_on_busy=True)], load=busy, rules=minute)[("db", "rr")]
    assert second.action == "run" and second.contended and second.util_percent == 99.0
    first = run(0.0, [c("db", suspected=True)], load=busy, rules=minute)[("db", "rr")]
    assert (first.action, first.reason) == ("hold", "busy")
    assert run(59.0, [c("db", suspected=True, deferred_since=0.0)], load=busy, rules=minute)[("db", "rr")].action \
        == "hold"
    # a strike on the volume alone hurries nothing: a routine probe of another profile waits as routine
    routine = run(300.0, [c("db", "rw", struck_on_busy=True, deferred_since=0.0)], load=busy, rules=minute)
    assert routine[("db", "rw")].action == "hold"
    # and a quiet device is probed as ever, quiet (not contended)
    quiet = run(0.0, [c("db", suspected=True, struck_on_busy=True)], rules=minute)[("db", "rr")]
    assert quiet.action == "run" and not quiet.contended


def test_a_probe_refused_for_space_is_retried_soon_and_a_failure_otherwise_is_not():
    """A full filesystem's refusal costs the device nothing: the next probe comes a minute later and finds the
    room again, so ProbeFailing clears a minute after the space is freed. Any other failure waits its interval
    (a failing fio costs device time, and a misconfigured profile would fail every minute)."""
    from types import SimpleNamespace as NS

    from iowarden.daemon.snapshot import ProbeView, Snapshot
    from iowarden.daemon.probing.suspicion import suspected_fault
    full = NS(ok=False, space_used_ratio=0.97, error="refused: the volume is full, not slow")
    broken = NS(ok=False, space_used_ratio=None, error="fio exited 1")
    fine = NS(ok=True, space_used_ratio=None, error=None)
    for result, said in ((full, "probe"), (broken, None), (fine, None)):
        snap = Snapshot(taken_at=0.0, version="t", probes=(ProbeView("db", "rr", "vol", result, None),
                                                           ProbeView("db", "rw", "vol", fine, None)))
        assert suspected_fault(snap, "db", "rr") == said, result
        assert suspected_fault(snap, "db", "rw") is None


def test_io_pressure_defers_only_when_it_is_not_our_own():
    stalled = Load({}, 40.0, 60.0)
    assert run(0.0, [c("db")], load=stalled)[("db", "rr")].reason == "io_pressure"
    # a probe of ours is running (on another disk): the pressure may be ours
    assert run(0.0, [c("db")], busy={"sdz"}, load=stalled)[("db", "rr")].action == "run"
    # ours ended 5 s ago: PSI's 10 s average still holds it
    assert run(0.0, [c("db")], load=Load({}, 40.0, 5.0))[("db", "rr")].action == "run"


def test_host_wide_pressure_holds_a_routine_probe_a_minute_and_it_is_then_no_contended_measurement():
    """The first half hour beside a busy suite: PSI (the host's) held an armed volume's probes for the whole
    max_deferral_seconds (600 s) each interval, and the probe of a volume throttled at minute 20 ran at minute
    31. Its own disk is quiet: the stall is waited out a minute, and its result is a measurement, not contended."""
    stalled = Load({"sdb": 5.0}, 40.0, 60.0)
    assert run(59.0, [c("db", deferred_since=0.0)], load=stalled)[("db", "rr")].reason == "io_pressure"
    d = run(60.0, [c("db", deferred_since=0.0)], load=stalled)[("db", "rr")]
    assert (d.action, d.contended) == ("run", False)
    # its own disk busy too: the routine wait for a busy disk, and contended when it runs
    both = Load({"sdb": 80.0}, 40.0, 60.0)
    assert run(60.0, [c("db", deferred_since=0.0)], load=both)[("db", "rr")].reason == "busy"
    assert run(600.0, [c("db", deferred_since=0.0)], load=both)[("db", "rr")].contended


def test_host_wide_pressure_does_not_hold_a_volume_still_learning_or_under_suspicion():
    """On a host whose other disks stall all day, twelve warm-up probes each held max_deferral_seconds
    left a new volume unarmed for two hours. Its own disk's util still holds it."""
    stalled = Load({}, 40.0, 60.0)
    assert run(0.0, [c("db")], load=stalled)[("db", "rr")].reason == "io_pressure"   # routine: waits
    for kind in ({"warming_up": True}, {"suspected": True}):
        d = run(0.0, [c("db", **kind)], load=stalled)[("db", "rr")]
        assert (d.action, d.contended) == ("run", False), kind   # not contended: its own disk is quiet
        busy = run(0.0, [c("db", **kind)], load=Load({"sdb": 90.0}, 40.0, 60.0))[("db", "rr")]
        assert busy.reason == "busy", kind


def test_an_unmounted_target_is_held_and_counted():
    d = run(7.0, [c("disk:/srv/a", mounted=False)])[("disk:/srv/a", "rr")]
    assert (d.action, d.reason, d.next_at) == ("hold", "unmounted", 8.0)


def test_jitter_spreads_the_next_run_within_its_ratio():
    d = run(0.0, [c("db")], jitter=lambda ratio: ratio)[("db", "rr")]
    assert d.next_at == 300.0 * 1.1


def test_a_deferred_probe_keeps_its_rate_but_never_runs_twice_within_half_an_interval():
    busy = Load({"sdb": 80.0}, None, 1e9)
    # due at 0, let run at 600 (the maximum wait): due again at 900 (its rate would say 300: already past)
    d = run(600.0, [c("db", deferred_since=0.0)], load=busy)[("db", "rr")]
    assert d.next_at == 600.0 + 300.0
    # due at 0, run at 200: its rate says 300, but not within half an interval of this run: 350
    d = run(200.0, [c("db", deferred_since=0.0)], load=busy, rules=Rules(50.0, 200.0, 0.1))[("db", "rr")]
    assert (d.action, d.next_at) == ("run", 350.0)
    d = run(100.0, [c("db", deferred_since=0.0)], load=busy, rules=Rules(50.0, 100.0, 0.1))[("db", "rr")]
    assert (d.action, d.next_at) == ("run", 300.0)


def test_a_busy_volume_is_still_measured_once_an_interval_by_whichever_profile_falls_due():
    busy = Load({"sdb": 80.0}, None, 1e9)
    # probed 100 s ago: a routine probe waits for the busy disk as before
    early = run(100.0, [c("db", deferred_since=50.0, volume_unprobed_seconds=100.0)], load=busy)[("db", "rr")]
    assert early.action == "hold" and early.reason == "busy"
    # one more retry would leave the volume unmeasured past its 300 s interval (5 s of probe, 5 s to the retry)
    edge = 300.0 - 5.0 - DEFER_RETRY_SECONDS
    held = run(200.0, [c("db", deferred_since=50.0, volume_unprobed_seconds=edge - 0.1)], load=busy)[("db", "rr")]
    assert held.action == "hold"
    now = run(200.0, [c("db", "rr", due_at=10.0, deferred_since=50.0, volume_unprobed_seconds=edge),
                      c("db", "rw", due_at=20.0, deferred_since=50.0, volume_unprobed_seconds=edge)], load=busy)
    # one probe measures the volume, contended; its other profile keeps waiting for the disk
    assert now[("db", "rr")].action == "run" and now[("db", "rr")].contended
    assert now[("db", "rw")].action == "hold" and now[("db", "rw")].reason == "waiting_for_disk"
    # host-wide pressure on a quiet disk is not this rule's: it holds a minute at most, as before
    stalled = Load({}, 90.0, 1e9)
    assert run(200.0, [c("db", deferred_since=190.0, volume_unprobed_seconds=edge)],
               load=stalled)[("db", "rr")].reason == "io_pressure"


def test_a_volume_whose_profiles_the_budget_spaced_out_is_still_measured_once_its_own_interval():
    """The budget's fit stretched each profile to 408 s (its probes cost twice their usual device time on a
    starved host); the volume's own interval is still 300 s, and on a busy disk whichever profile is due runs
    once the volume would go longer unmeasured than that, not 408 s."""
    busy = Load({"sdb": 80.0}, None, 1e9)

    def spaced(unprobed):
        return Candidate("db", "rr", 0.0, ("sdb",), True, 5.0, 408.0, deferred_since=50.0,
                         volume_unprobed_seconds=unprobed, volume_interval_seconds=300.0)
    edge = 300.0 - 5.0 - DEFER_RETRY_SECONDS
    assert run(200.0, [spaced(edge - 0.1)], load=busy)[("db", "rr")].action == "hold"
    ran = run(200.0, [spaced(edge)], load=busy)[("db", "rr")]
    assert ran.action == "run" and ran.contended
    # spaced to its own interval by nothing, the profile's interval is the volume's
    same = Candidate("db", "rr", 0.0, ("sdb",), True, 5.0, 300.0, deferred_since=50.0, volume_unprobed_seconds=edge)
    assert run(200.0, [same], load=busy)[("db", "rr")].action == "run"
