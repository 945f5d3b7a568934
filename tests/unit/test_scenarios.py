"""The seeded generator of mixes and faults (tests/integration/scenarios.py): pure, no root."""
from tests.integration.scenarios import FAULT_KINDS, HEALTHY_KINDS, faults, healthy


def test_a_seed_is_one_scenario_and_another_seed_another():
    assert healthy(7, 4, 7200) == healthy(7, 4, 7200)
    assert healthy(7, 4, 7200) != healthy(8, 4, 7200)
    assert faults(7, 4) == faults(7, 4) and faults(7, 4) != faults(8, 4)


def test_two_hours_hold_every_healthy_ingredient_on_volumes_and_times_within_the_run():
    for seed in range(8):
        s = healthy(seed, 4, 7200)
        assert {e.kind for e in s.events} == set(HEALTHY_KINDS), (seed, {e.kind for e in s.events})
        assert all(0 <= e.at_s < 7200 and e.at_s + e.seconds <= 7200 + 1e-6 for e in s.events)
        assert all(e.volume is None if e.kind in ("cpu-pressure", "io-pressure-elsewhere")
                   else 0 <= e.volume < 4 for e in s.events)
        assert [e.at_s for e in s.events] == sorted(e.at_s for e in s.events)
        assert len(s.databases) == 4 and len(s.said()) == 1 + 4 + len(s.events)


def test_every_fault_kind_once_each_followed_by_time_to_clear():
    f = faults(3, 4)
    assert sorted(e.kind for e in f) == sorted(FAULT_KINDS)
    for a, b in zip(f, f[1:]):
        assert b.at_s >= a.at_s + a.seconds + 600
    throttle = next(e for e in f if e.kind == "throttle")
    assert 0.25 <= throttle.params["of_load"] <= 1.3
    assert next(e for e in f if e.kind == "host-contention").volume is None


def test_a_session_ends_with_every_process_in_it():
    import os
    import subprocess
    from tests.integration.scenarios import end_sessions
    p = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    child = int(p.stdout.readline())
    end_sessions([p])
    assert p.poll() is not None

    def alive():
        try:
            return open(f"/proc/{child}/stat").read().split()[2] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False
    # signalled with the session: gone once the busy machine runs it (a deadline, not a pace); left running,
    # it would sleep its 300 s
    import time
    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(), "the session's child outlived it"
