"""The peer rules at 1,024 members over 100 windows, timed (printed: the bench, not the test, holds the
figure). Pure, no root; in the integration tier for its seconds, which the unit tier's loop should not pay."""
import random
import time


def test_the_peer_rules_over_1024_members_for_100_windows():
    """One group of 1,024 alike disks, one of them 4x slower from the first window: the group rules run every
    window (landed: 180 ms a window at 1,024, 3.7 s at 4,000, from member-by-member peer medians)."""
    from iowarden.daemon.passive.detector import PassiveDetector
    from tests import passive_traces as pt
    members = tuple(f"d{i:04d}" for i in range(1024))
    rng = random.Random(7)
    det = PassiveDetector()
    raised, started = [], time.monotonic()
    for i in range(100):
        load = pt.load_at(i, rng)
        batch = [pt.window(m, i, load, pt.noisy(pt.curve_ms(load), rng) * (4.0 if m == "d0007" else 1.0))
                 for m in members]
        raised += [t for t in det.observe(batch, [members]) if t.state == "raised"]
    took = time.monotonic() - started
    print(f"peer rules, 1,024 members x 100 windows: {took:.2f} s ({took * 10:.1f} ms a window)")
    assert {t.device for t in raised if t.kind == "peers"} <= {"d0007"}
