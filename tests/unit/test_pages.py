"""One fault on one volume is one page (daemon/verdicts/pages.py), as properties over generated alert histories."""
from types import SimpleNamespace

from hypothesis import example, given, settings, strategies as st

from iowarden.daemon.outputs.alert_metrics import alert_families
from iowarden.daemon.snapshot import PASSIVE_PROFILE, AlertView, Snapshot
from iowarden.daemon.verdicts.pages import (RIDER_GRACE_SECONDS, VOLUME_ALERTS, closed_pages, folds, page_units,
                                            sends_at, stack)

# an md array of two members, a partitioned disk, and two loop volumes on one host filesystem
DEVICES = {
    "md0": SimpleNamespace(kind="md", parent=None, slaves=("sda", "sdb")),
    "sda": SimpleNamespace(kind="disk", parent=None, slaves=()),
    "sdb": SimpleNamespace(kind="disk", parent=None, slaves=()),
    "nvme0n1p1": SimpleNamespace(kind="partition", parent="nvme0n1", slaves=()),
    "nvme0n1": SimpleNamespace(kind="disk", parent=None, slaves=()),
    "loop2": SimpleNamespace(kind="loop", parent=None, slaves=()),
    "loop3": SimpleNamespace(kind="loop", parent=None, slaves=()),
}
TARGET_ON = {"db": "md0", "logs": "nvme0n1p1", "vol2": "loop2", "vol3": "loop3"}
PASSIVE_KINDS = sorted(VOLUME_ALERTS - {"VolumeDegraded"})


def probe_alert(i, t, target, profile="randread-4k"):
    return AlertView("VolumeDegraded", f"uuid-{target}", profile, target, "critical", t, i,
                     devices=(TARGET_ON[target],))


def passive_alert(i, t, kind, device):
    return AlertView(kind, f"id-{device}", PASSIVE_PROFILE, device, "warning", t, i)


raised = st.one_of(
    st.tuples(st.just("probe"), st.sampled_from(sorted(TARGET_ON)), st.sampled_from(["randread-4k", "seqread-1m"])),
    st.tuples(st.just("passive"), st.sampled_from(PASSIVE_KINDS), st.sampled_from(sorted(DEVICES))),
    st.tuples(st.just("other"), st.just("ProbeFailing"), st.sampled_from(sorted(TARGET_ON))))
# a history: each step raises an alert or clears one that is open
history = st.lists(st.one_of(raised, st.tuples(st.just("clear"), st.integers(0, 40))), min_size=1, max_size=30)


STEP_SECONDS = 60.0   # one step of a history: a minute, so the rules' holds (5 and 10 minutes) matter


def replay(steps):
    """The open alerts after each step, as the daemon would list them."""
    open_, seen, out = {}, set(), []
    for n, step in enumerate(steps):
        if step[0] == "clear":
            if open_:
                open_.pop(sorted(open_)[step[1] % len(open_)])
        else:
            if step[0] == "probe":
                a = probe_alert(n, n * STEP_SECONDS, step[1], step[2])
            elif step[0] == "passive":
                a = passive_alert(n, n * STEP_SECONDS, step[1], step[2])
            else:
                a = AlertView(step[1], f"uuid-{step[2]}", "randread-4k", step[2], "warning", n * STEP_SECONDS, n)
            key = (a.alert, a.volume, a.profile)
            if key not in seen or key not in {(x.alert, x.volume, x.profile) for x in open_.values()}:
                open_[n] = a
            seen.add(key)
        out.append(tuple(open_.values()))
    return out


def device_of(a):
    return a.target if a.profile == PASSIVE_PROFILE else TARGET_ON[a.target]


def one_volume(a, b) -> bool:
    """By hand: one is on the other's device, on a member of its array, or on the disk of its partition."""
    built_from = {"md0": {"sda", "sdb"}, "nvme0n1p1": {"nvme0n1"}}
    x, y = device_of(a), device_of(b)
    return x == y or y in built_from.get(x, ()) or x in built_from.get(y, ())


@settings(max_examples=300, deadline=None)
@given(history)
# one profile of a page closing while another stays open is not the page closing: a profile raised again then
# joins the page that is out, it does not ride on a closed one
@example(steps=[("probe", "logs", "randread-4k"), ("probe", "logs", "seqread-1m"), ("clear", 1),
                ("probe", "logs", "seqread-1m"), ("clear", 0)])
def test_each_volume_pages_once_and_a_page_once_out_stays_out_while_open(steps):
    paging, last, closed, before = frozenset(), {}, (), ()
    for n, alerts in enumerate(replay(steps)):
        ids = {a.id for a in alerts}
        closed = closed_pages(before, last, (n - 1) * STEP_SECONDS, alerts, closed, DEVICES, None, n * STEP_SECONDS)
        fold_of = folds(alerts, DEVICES, paging=paging, last=last, now=n * STEP_SECONDS, closed=closed)
        last, before = fold_of, alerts
        pages = {a.id for a in alerts if a.id not in fold_of}
        for f in fold_of.values():
            if f.page_closed_at is None:
                assert f.into in ids and f.into not in fold_of, "folded into an alert that is not an open page"
            else:   # its page closed: it rides on it for the grace only
                assert f.into not in ids and n * STEP_SECONDS - f.page_closed_at < RIDER_GRACE_SECONDS
        # what the rules fire on (an alert kind on a volume): a page that was out and is still open is still a
        # page, whatever joined it or ended beside it: it is never resolved and sent again for that
        sent = page_units(alerts, fold_of, n * STEP_SECONDS)
        still_open = {(a.alert, a.volume) for a in alerts}
        assert paging & still_open <= sent, (paging & still_open) - sent
        paging = sent
        # nothing that pages at once waits behind a page its rule still holds: the page of a volume is the
        # one its rules send first
        for a in alerts:
            if a.id in fold_of and fold_of[a.id].page_closed_at is None:
                into = next(x for x in alerts if x.id == fold_of[a.id].into)
                assert (into.alert, into.volume) in paging or sends_at(into) <= sends_at(a), (a, into)
        # no two pages of one volume: neither's devices within what the other is built from (a VolumeDegraded's
        # profiles are one page already: the rule groups them by volume)
        shown = [a for a in alerts if a.alert in VOLUME_ALERTS and a.id in pages]
        for a in shown:
            for b in shown:
                if (a.alert, a.volume) != (b.alert, b.volume):
                    assert not one_volume(a, b), (a, b)
        # folds only within a volume, and never of what is not a volume's I/O
        for a in alerts:
            if a.id in fold_of and fold_of[a.id].page_closed_at is None:
                into = next(x for x in alerts if x.id == fold_of[a.id].into)
                assert a.alert in VOLUME_ALERTS and one_volume(a, into)


def test_the_member_of_an_array_rides_on_the_arrays_page_and_a_neighbour_loop_does_not():
    page = probe_alert(1, 100.0, "db")
    member = passive_alert(2, 160.0, "SlowMember", "sdb")
    neighbour = passive_alert(3, 170.0, "DeviceSlow", "loop2")
    fold_of = folds((member, page, neighbour), DEVICES)
    assert set(fold_of) == {2} and fold_of[2].into == 1
    assert stack("nvme0n1p1", DEVICES) == {"nvme0n1p1", "nvme0n1"}


def test_the_page_says_what_rides_on_it_and_the_rider_is_exported_as_folded():
    page = probe_alert(7, 100.0, "vol3")
    rider = AlertView("SlowMember", "id-loop3", PASSIVE_PROFILE, "loop3", "warning", 160.0, 9,
                      causes=("loop3 reads 3.1x slower than its peers (loop2) at comparable load",))
    s = Snapshot(taken_at=200.0, version="t", alerts=(page, rider), devices=DEVICES,
                 folds=folds((page, rider), DEVICES))
    active, _, info, _, folded = alert_families(s)
    assert len(active.samples) == 2   # both stay visible on /metrics and in status
    assert [(x.labels["alert"], x.labels["into_id"]) for x in folded.samples] == [("SlowMember", "7")]
    said = {x.labels["alert"]: x.labels["more_causes"] for x in info.samples}
    assert said["VolumeDegraded"].startswith("SlowMember #9 on this volume (loop3): loop3 reads 3.1x slower")
    assert "on this volume" not in said["SlowMember"]


def test_a_cycle_in_damaged_sysfs_readings_ends():
    loopy = {"a": SimpleNamespace(kind="dm", parent=None, slaves=("b",)),
             "b": SimpleNamespace(kind="dm", parent=None, slaves=("a",))}
    assert stack("a", loopy) == {"a", "b"}


def test_an_acknowledged_page_carries_what_joined_before_the_ack_and_not_what_came_after():
    """`iowarden ack` says the operator knows of this fault (a planned throttle), not of the next one: a drive
    that fails under it afterwards must still page."""
    page = AlertView("VolumeDegraded", "uuid-db", "randread-4k", "db", "critical", 100.0, 1, devices=("md0",),
                     acked_by="alice", acked_at=200.0)
    before = passive_alert(2, 150.0, "SlowMember", "sda")
    after = passive_alert(3, 250.0, "DeviceSlow", "sdb")
    fold_of = folds((page, before, after), DEVICES)
    assert set(fold_of) == {2} and fold_of[2].into == 1


def test_a_loop_volume_is_one_with_the_device_under_its_file_and_two_loop_files_stay_two():
    """The lanes' and the soak's volumes: an XFS on loop3, whose file is on loop2's XFS (the device a throttle
    holds). Two loop files on one host disk are two volumes."""
    devices = {
        "loop2": SimpleNamespace(kind="loop", parent=None, slaves=(), major=7, minor=2, loop_backing_devno="254:0"),
        "loop3": SimpleNamespace(kind="loop", parent=None, slaves=(), major=7, minor=3, loop_backing_devno="7:2"),
        "loop5": SimpleNamespace(kind="loop", parent=None, slaves=(), major=7, minor=5, loop_backing_devno="254:0"),
        "vda": SimpleNamespace(kind="disk", parent=None, slaves=(), major=254, minor=0),
    }
    assert stack("loop3", devices, {"7:2": "loop2", "254:0": "vda"}) == {"loop3", "loop2", "vda"}
    page = AlertView("VolumeDegraded", "uuid-vol0", "randread-4k", "vol0", "critical", 100.0, 1, devices=("loop3",))
    below = passive_alert(2, 130.0, "VolumeAtLimit", "loop2")
    other = AlertView("VolumeDegraded", "uuid-vol1", "randread-4k", "vol1", "critical", 140.0, 3, devices=("loop5",))
    fold_of = folds((page, below, other), devices)
    assert set(fold_of) == {2} and fold_of[2].into == 1


def test_a_verdict_that_pages_at_once_is_not_held_behind_one_its_rule_still_holds():
    """The week lane: VolumeAtLimit on the throttled volume's device (its rule waits ten minutes: a backup ends
    sooner) and, 90 s later, the probes' VolumeDegraded. The critical page goes out at once; the ceiling rides
    on it; and once a page is out, it stays the page."""
    at_limit = passive_alert(1, 1000.0, "VolumeAtLimit", "loop3")
    degraded = AlertView("VolumeDegraded", "uuid-vol3", "randread-4k", "vol3", "critical", 1090.0, 2,
                         devices=("loop3",))
    alone = folds((at_limit,), DEVICES)
    assert alone == {} and page_units((at_limit,), alone, 1050.0) == frozenset()   # pending: not yet sent
    fold_of = folds((at_limit, degraded), DEVICES, paging=page_units((at_limit,), alone, 1050.0))
    assert set(fold_of) == {1} and fold_of[1].into == 2
    # once out, it keeps the page against a later alert that would page at once
    sent = page_units((at_limit,), alone, 1700.0)
    assert sent == {("VolumeAtLimit", "id-loop3")}
    assert set(folds((at_limit, degraded), DEVICES, paging=sent)) == {2}


def test_a_rider_that_outlives_its_page_by_minutes_is_the_same_fault_ending_and_pages_only_after_the_grace():
    """The week lane: the probes' page closed 40 s after the throttle's removal, the passive DeviceSlow riding
    on it two minutes later. Paged in between, it was a page for a fault already over."""
    from iowarden.daemon.verdicts.pages import RIDER_GRACE_SECONDS
    page = AlertView("VolumeDegraded", "uuid-vol3", "randread-4k", "vol3", "critical", 1000.0, 1, devices=("loop3",))
    rider = passive_alert(2, 1020.0, "DeviceSlow", "loop3")
    before = folds((page, rider), DEVICES, now=1100.0)
    assert before[2].into == 1 and before[2].into_alert == "VolumeDegraded" and before[2].page_closed_at is None
    after = folds((rider,), DEVICES, last=before, now=1200.0)         # the page closed
    assert after[2].into == 1 and after[2].page_closed_at == 1200.0
    still = folds((rider,), DEVICES, last=after, now=1200.0 + RIDER_GRACE_SECONDS - 1)
    assert 2 in still and still[2].page_closed_at == 1200.0
    assert folds((rider,), DEVICES, last=still, now=1200.0 + RIDER_GRACE_SECONDS) == {}   # a fault of its own
    s = Snapshot(taken_at=1300.0, version="t", alerts=(rider,), devices=DEVICES, folds=after)
    folded = alert_families(s)[4]
    assert [(x.labels["alert"], x.labels["into_alert"], x.labels["into_id"]) for x in folded.samples] == \
        [("DeviceSlow", "VolumeDegraded", "1")]


def test_a_verdict_first_raised_soon_after_its_volumes_page_closed_rides_on_it_and_pages_only_after_the_grace():
    """The week lane on a loaded host: the throttled volume's DeviceSlow page closed after the throttle's removal,
    then its write probe's p99 (1.7x, the writes the throttle held draining) raised VolumeDegraded: a second page
    for one fault. Raised within the grace after its volume's page closed, it rides on that page; still open after
    the grace, it is a fault of its own. A page never sent (closed within its rule's hold) carries nothing, and a
    verdict on another volume is its own."""
    page = passive_alert(1, 1000.0, "DeviceSlow", "loop3")
    sent_at = sends_at(page)
    at_page = folds((page,), DEVICES, now=sent_at + 10)
    closed = closed_pages((page,), at_page, sent_at + 10, (), (), DEVICES, None, now=sent_at + 20)
    assert [(c.id, c.alert, c.closed_at) for c in closed] == [(1, "DeviceSlow", sent_at + 20)]
    late = probe_alert(2, sent_at + 100, "vol3")
    other = probe_alert(3, sent_at + 100, "vol2")
    now = sent_at + 110
    f = folds((late, other), DEVICES, now=now, closed=closed)
    assert f[2].into == 1 and f[2].page_closed_at == sent_at + 20 and 3 not in f
    # kept folded by the ordinary rider's rule until the grace after the page's close, then its own page
    still = folds((late,), DEVICES, last=f, now=sent_at + 20 + RIDER_GRACE_SECONDS - 1,
                  closed=closed_pages((late,), f, now, (late,), closed, DEVICES, None, sent_at + 20 + RIDER_GRACE_SECONDS - 1))
    assert 2 in still
    assert folds((late,), DEVICES, last=still, now=sent_at + 20 + RIDER_GRACE_SECONDS) == {}
    # the grace is counted from the close: one raised after it pages
    assert folds((probe_alert(4, sent_at + 20 + RIDER_GRACE_SECONDS, "vol3"),), DEVICES,
                 now=sent_at + 30 + RIDER_GRACE_SECONDS, closed=closed) == {}
    # a page closed before its rule sent it (a VolumeAtLimit within its ten minutes) was no page
    held = passive_alert(5, 1000.0, "VolumeAtLimit", "loop3")
    early = folds((held,), DEVICES, now=1100.0)
    assert 5 not in early and sends_at(held) > 1100.0
    assert closed_pages((held,), early, 1100.0, (), (), DEVICES, None, now=1110.0) == ()
