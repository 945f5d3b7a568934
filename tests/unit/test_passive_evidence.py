"""Evidence over time against the peers: passive detection that holds on drives it was not tuned on.

Synthetic traces of the cluster C shape, a fake clock (window numbers), no root.
"""
import math

import pytest

from iowarden.daemon.passive.detector import PassiveDetector
from iowarden.daemon.passive.values import PassiveParams
from iowarden.daemon.passive.evidence import EvidenceParams, PeerEvidence
from tests import passive_traces as pt

DAY = pt.DAY_WINDOWS
HOUR = DAY // 24
TWELVE = tuple(f"sd{chr(97 + m)}" for m in range(12))


def _run(batches, det=None):
    det = det or PassiveDetector()
    raised = []
    for i, batch in enumerate(batches):
        for t in det.observe(batch, [TWELVE]):
            if t.state == "raised":
                raised.append((i, t))
    return det, raised


def test_a_drive_of_a_noisy_host_straying_for_an_hour_is_not_named_but_one_slow_for_hours_is():
    """The host's own spread sets the yardstick: blocks of a group whose healthy drives stray +-15 % hour to
    hour; one of them strays 1.35x for an hour (a J-cluster day), another sits at 1.35x every hour."""
    import random
    rng = random.Random(7)
    ev = PeerEvidence(EvidenceParams(block_windows=1))
    group = TWELVE
    named_at = {}
    for block in range(48):
        ratios = {m: rng.gauss(0, 0.15) for m in group}
        if block == 10:
            ratios["sdb"] = math.log(1.35)          # one hour
        ratios["sdc"] = math.log(1.35) + rng.gauss(0, 0.05)   # every hour
        ev.add(group, ratios)
        for m in group:
            if ev.named(m):
                named_at.setdefault(m, block)
    assert set(named_at) <= {"sdc"}, named_at
    # on a quiet host (strays of 2 %), the same 1.35x is named in its first hours
    quiet = PeerEvidence(EvidenceParams(block_windows=1))
    for block in range(6):
        quiet.add(group, {m: rng.gauss(0, 0.02) if m != "sdc" else math.log(1.35) for m in group})
    assert quiet.named("sdc") and not any(quiet.named(m) for m in group if m != "sdc")


def test_the_evidence_survives_a_restart():
    det, raised = _run(pt.peer_trace(6, 6 * HOUR, members=12, slow={0: 1.25}))
    saved = {m: det.evidence.to_state(m) for m in TWELVE}
    assert saved["sda"]["score"] > 0
    again = PassiveDetector()
    for m, st in saved.items():
        again.evidence.load_state(m, st)
    assert again.evidence.members["sda"].score == pytest.approx(saved["sda"]["score"])


def _slow_host_file(tmp_path, hours=8):
    import json
    lines = []
    for batch in pt.peer_trace(9, hours * HOUR, members=12, slow={0: 1.3}):
        for w in batch:
            f = w.flows["read"]
            lines.append(json.dumps({"timestamp": w.end, "disk_device": w.device, "r/s": f.iops,
                                     "rkB/s": f.kib_per_second, "r_await": f.await_ms}))
    path = tmp_path / "host.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_explain_shows_what_each_drive_was_judged_on(tmp_path, capsys):
    import json
    from iowarden.daemon import cli
    path = _slow_host_file(tmp_path)
    assert cli.main(["replay", "--passive", str(path), "--explain", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["device"]: r for r in out["explain"]}
    assert rows["sda"]["named"] == ["peers"] and rows["sda"]["evidence_peak"] >= rows["sda"]["threshold"]
    assert 1.2 <= rows["sda"]["peer_ratio"] <= 1.4 and rows["sda"]["blocks_above"] >= 2
    assert all(r["evidence_peak"] < r["threshold"] and not r["named"] for d, r in rows.items() if d != "sda")
    assert [a["device"] for a in out["alerts"]] == ["sda"]
    assert cli.main(["replay", "--passive", str(path), "--explain"]) == 0
    table = capsys.readouterr().out
    assert "evidence" in table and "threshold" in table and "sda" in table


def test_the_evidence_is_a_gauge_beside_its_threshold():
    from types import SimpleNamespace
    from iowarden.daemon.passive.metrics import passive_families
    det, _ = _run(pt.peer_trace(10, 4 * HOUR, members=12, slow={0: 1.3}))
    snap = SimpleNamespace(passive=[(v.device, f"wwn-{v.device}", v) for v in det.views()])
    fams = {f.name: f for f in passive_families(snap)}
    score = {s.labels["device"]: s.value for s in fams["iowarden_passive_peer_evidence"].samples}
    assert set(score) == set(TWELVE) and score["sda"] > 0 and score["sdb"] == 0
    assert fams["iowarden_passive_peer_evidence_threshold"].samples[0].value == PassiveParams().evidence_threshold


def test_a_third_of_a_group_slow_does_not_drag_the_reference_and_fewer_leave_it_as_it_was():
    """The reference a member is judged against is the healthy drives', however many of a third or
    more are slow; with fewer slow, the plain median and MAD the parameters were tuned with."""
    import random
    import statistics
    from iowarden.daemon.passive.evidence import MAD_TO_SIGMA, center_spread
    rng = random.Random(5)
    healthy = [rng.gauss(0.0, 0.05) for _ in range(8)]
    h_center = statistics.median(healthy)
    h_spread = MAD_TO_SIGMA * statistics.median(abs(v - h_center) for v in healthy)
    four_slow = healthy + [math.log(1.6) + rng.gauss(0, 0.02) for _ in range(4)]
    plain_center, plain_spread = center_spread(four_slow)
    center, spread = center_spread(four_slow, floor=0.02)
    assert plain_spread > 1.3 * h_spread            # what the plain reference does: the slow widen it
    assert center == pytest.approx(h_center) and spread == pytest.approx(h_spread)
    two_slow = healthy[:8] + [math.log(1.6), math.log(1.7)] + [rng.gauss(0.0, 0.05) for _ in range(2)]
    assert center_spread(two_slow, floor=0.02) == center_spread(two_slow)
    # more than half alike is the group's normal: seven of twelve at 1.6x are the reference, not set aside
    many = healthy[:5] + [math.log(1.6)] * 7
    assert center_spread(many, floor=0.02) == center_spread(many)
    assert center_spread(many)[0] == pytest.approx(math.log(1.6))


def test_a_drive_slow_beyond_doubt_is_judged_against_the_rest_and_the_rest_keep_the_plain_reference():
    """Three of twelve at 2x move the plain median up and widen the MAD (on cluster A's host_20 from
    6 % to 11 %); each of them is judged against the nine it cannot drag, and stands further out. A drive at
    1.1x beside a 1.6x one (cluster C's disk3 beside its disk1) keeps the plain reference: it is not measured
    against a spread the 1.6x one no longer widens."""
    import random
    from collections import deque
    from iowarden.daemon.passive.evidence import center_spread, clear_outliers, standardized
    rng = random.Random(7)
    healthy = {f"h{i}": rng.gauss(0.0, 0.06) for i in range(9)}
    slow = {f"s{i}": math.log(2.0) + rng.gauss(0.0, 0.06) for i in range(3)}
    medians = {**healthy, **slow}
    center, spread = center_spread(medians.values(), 0.02)
    clear, clear_center, clear_spread = clear_outliers(medians, center, spread, 0.02)
    assert clear == set(slow)
    assert (clear_center, clear_spread) == center_spread(healthy.values())
    assert spread > clear_spread and center > clear_center
    zs, scales = standardized(medians, deque(maxlen=24), EvidenceParams())
    for m in slow:
        assert zs[m] > (medians[m] - center) / spread and scales[m] == pytest.approx(clear_spread)
    for m in healthy:
        assert zs[m] == pytest.approx((medians[m] - center) / spread)   # the plain reference, as tuned
    # cluster C's shape: disk1 1.6x, disk2 1.2x, disk3 1.1x, nine tight drives: only disk1 is beyond doubt
    c = {f"h{i}": rng.gauss(-0.02, 0.02) for i in range(9)}
    c.update(disk1=math.log(1.6), disk2=math.log(1.2), disk3=math.log(1.1))
    zs, scales = standardized(c, deque(maxlen=24), EvidenceParams())
    center, spread = center_spread(c.values(), 0.02)
    assert zs["disk3"] == pytest.approx((c["disk3"] - center) / max(spread, 0.02))
    assert scales["disk1"] < scales["disk3"]
    # nothing beyond doubt (all within 1.5x): everyone on the plain reference
    mild = {**healthy, "s0": math.log(1.4)}
    assert clear_outliers(mild, *center_spread(mild.values(), 0.02), 0.02)[0] == frozenset()


def test_a_healthy_member_of_a_new_tight_group_slow_for_minutes_is_not_named_one_slow_for_the_hour_is():
    """The week lane: four loop volumes, one of them 2.8x its peers for five minutes of a compaction
    in the group's first block, was named at a threshold of 3 on the open block alone. A median of minutes
    strays further than an hour's: at a twelfth of a block the host's stray is widened 3.5-fold. The same
    2.8x held for the whole first hour is a slow drive, named within it."""
    import random
    rng = random.Random(11)
    p = EvidenceParams(block_windows=720, partial_min=60, partial_every=60, threshold=3.0)
    four = ("loop1", "loop3", "loop5", "loop7")

    def windows(n, slow_for):
        ev, named_at = PeerEvidence(p), None
        for w in range(n):
            ratios = {m: rng.gauss(0, 0.05) for m in four}
            if w < slow_for:
                ratios["loop7"] += math.log(2.8)
            ev.add(four, ratios)
            if named_at is None and any(ev.named(m) for m in four):
                named_at = (w, [m for m in four if ev.named(m)])
        return named_at

    assert windows(180, slow_for=90) is None            # 2.8x for its first 7.5 minutes (of 5 s windows): a burst
    w, who = windows(720, slow_for=720)                 # 2.8x from the first window on: slow
    assert who == ["loop7"] and w < 720, (w, who)


def test_a_small_new_group_whose_others_are_tight_does_not_name_a_member_off_for_half_an_hour():
    """The soak's four loop volumes: three within 1 % of each other in their first half hour, the fourth 2.1x
    them for 28 minutes of it (a neighbour's throttle filling the host). Four hour medians have no spread to
    measure 2.1x against: until the group has closed a few blocks its stray is taken as the noisiest healthy
    cluster's, and a member must stay out for hours, or far further, to be named. After those blocks the
    group's own tight spread is the yardstick, and the same 2.1x held for an hour is named within it."""
    import random
    rng = random.Random(5)
    p = EvidenceParams()                       # an hour of 15 s windows, the daemon's
    four = ("loop1", "loop3", "loop5", "loop7")

    def window(ev, slow: bool):
        ratios = {m: rng.gauss(0, 0.01) for m in four}
        if slow:
            ratios["loop7"] += math.log(2.1)
        ev.add(four, ratios)
        return [m for m in four if ev.named(m)]

    new = PeerEvidence(p)
    named = [window(new, slow=w < 110) for w in range(240)]
    assert not any(named), next(n for n in named if n)
    # the same group, settled (its tight spread learned over three quiet hours), then 2.1x for an hour
    settled = PeerEvidence(p)
    for _ in range(3 * p.block_windows):
        window(settled, slow=False)
    named_at = next((w for w in range(p.block_windows) if window(settled, slow=True)), None)
    assert named_at is not None and named_at < p.block_windows, named_at
    assert settled.members["loop7"].ratio == pytest.approx(2.1, rel=0.05)


def test_a_healthy_member_of_a_noisy_group_an_hour_at_1_6x_is_not_named_at_the_shipped_threshold_a_2x_one_is():
    """A development host of the noisy cluster (J, host_6): its healthy drives stray 8 % hour to hour, and one
    of them sat at 1.63x its peers for one hour (z 6.4), gathering 2.4 strays over the open block and the closed
    one; at the margins the inner folds alone chose (1.4-1.6: a threshold near 2) it was named on every fold that
    held its host out. Here the group strays 9 % and the hour gathers 3.2: named at a threshold of 3, not at the
    shipped one, while a drive at 2x from its fourth hour on is named within its second."""
    import random

    def run(threshold=None):
        rng = random.Random(6)
        p = EvidenceParams() if threshold is None else EvidenceParams(threshold=threshold)
        ev, named_at = PeerEvidence(p), {}
        for block in range(12):
            offsets = {m: rng.gauss(0, 0.09) for m in TWELVE}
            if block == 8:
                offsets["sdb"] = math.log(1.63)        # one hour
            if block >= 3:
                offsets["sdc"] = math.log(2.0)         # from the fourth hour on
            for _ in range(p.block_windows):
                ev.add(TWELVE, {m: o + rng.gauss(0, 0.01) for m, o in offsets.items()})
                for m in TWELVE:
                    if ev.named(m):
                        named_at.setdefault(m, block)
        return ev, named_at

    shipped, named_at = run()
    assert shipped.p.threshold == PassiveParams().evidence_threshold
    assert set(named_at) == {"sdc"} and named_at["sdc"] <= 4, named_at
    assert shipped.members["sdb"].peak_score < shipped.p.threshold
    _, lower = run(threshold=3.0)
    assert "sdb" in lower, lower   # the same hour, named at a threshold of 3
