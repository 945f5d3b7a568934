"""A probe on a busy disk judged by the device's total (daemon/verdicts/contended.py), as a pure function."""
from hypothesis import given, strategies as st

from iowarden.daemon.verdicts.contended import (CONTENDED_RECOVERED, CONTENDED_SHORTFALL, DEVICE_AGREES_SLOWDOWN,
                                                SATURATING_QUEUE_DEPTH, SHALLOW_SHORTFALL, STRIKE_SPAN_PROBES, Strikes,
                                                Totals, counted, judge)


def totals(share, depth=32, slowdown=None, own=None, limited=False):
    return Totals(10_000 * share, 40e6 * share, 10_000.0, 40e6, depth, slowdown, None, own, limited)


def test_two_short_probes_in_a_row_raise_and_one_does_not():
    assert judge(totals(0.05), strikes=0, is_open=False, last_deep_held=None).action is None
    v = judge(totals(0.05), strikes=1, is_open=False, last_deep_held=None)
    assert v.action == "raise" and "delivered 500 IOPS in total" in v.said and "gets 10,000" in v.said


@given(share=st.floats(0.0, 3.0), depth=st.integers(1, SATURATING_QUEUE_DEPTH - 1), strikes=st.integers(0, 5))
def test_a_shallow_probe_is_short_only_far_below_what_its_users_ask(share, depth, strikes):
    """At queue depth 1 the probe waits behind the other work: its total is what the users ask, not what the
    device can give; armed healthy volumes' delivered 0.124 of its quiet figure or more in the soaks, capped ones
    0.025 or less: only under a twentieth is short."""
    v = judge(totals(share, depth), strikes, is_open=False, last_deep_held=None)
    assert v.short == (share < SHALLOW_SHORTFALL)
    assert (v.action == "raise") == (share < SHALLOW_SHORTFALL and strikes >= 1)
    assert not v.held   # a shallow probe never says the volume is held (its last deep one does)


@given(share=st.floats(0.0, CONTENDED_SHORTFALL * 0.99), own=st.floats(0.1, 500.0), limited=st.booleans(),
       depth=st.sampled_from([1, 32]))
def test_a_short_total_strikes_only_where_the_device_or_a_limit_agrees(share, own, limited, depth):
    """A starved host's healthy probe delivered 0.006 of its normal with its device at its normal latency: a
    short total counts only where the device's own latency for its load is slowed or a cgroup limit holds it."""
    v = judge(totals(share, depth, own=own, limited=limited), strikes=1, is_open=False, last_deep_held=None)
    agrees = limited or own >= DEVICE_AGREES_SLOWDOWN
    assert v.strike == (v.short and agrees)
    assert (v.action == "raise") == v.strike
    if v.action == "raise":
        assert ("a cgroup limit holds its stack" in v.said) if limited else (f"{own:.1f}x its normal" in v.said)


def test_a_volume_paged_on_one_profile_is_not_paged_again_on_another():
    assert judge(totals(0.05), strikes=3, is_open=False, last_deep_held=None, volume_paged=True).action is None


@given(share=st.floats(0.0, 3.0), slowdown=st.one_of(st.none(), st.floats(0.5, 10.0)),
       held=st.sampled_from([None, True, False]))
def test_it_clears_only_on_a_total_back_near_its_normal_or_the_passive_view_at_its_normal(share, slowdown, held):
    v = judge(totals(share, slowdown=slowdown), strikes=3, is_open=True, last_deep_held=held)
    assert v.action in (None, "clear")
    if v.action == "clear":
        assert share >= CONTENDED_RECOVERED or (slowdown is not None and slowdown <= 1.5 and not v.held)
    if share < CONTENDED_SHORTFALL:
        assert v.short and v.action is None   # a volume still far short stays open


def test_a_disk_busy_with_large_writes_is_not_short_of_what_a_small_block_probe_moves():
    """A volume's own writeback storm: 87 IOPS of 350 KiB writes (29.1 MiB/s) beside a 4k write probe whose normal
    is 1,998 IOPS (7.8 MiB/s), its device at 10.6x its normal latency. Few operations, but the disk is moving
    nearly four times the probe's normal in bytes: busy, not short. A throttled one delivered 313 IOPS, 1.2 MiB/s."""
    def delivered(iops, mib_per_second):
        return Totals(iops, mib_per_second * 2**20, 1998.0, 1998 * 4096.0, 32, None, None, 10.56, False)
    storm = judge(delivered(87, 29.1), strikes=1, is_open=False, last_deep_held=None)
    assert not storm.short and not storm.strike and storm.action is None
    throttled = judge(delivered(313, 1.2), strikes=1, is_open=False, last_deep_held=None)
    assert throttled.short and throttled.action == "raise"


def test_a_page_raised_with_the_devices_latency_unread_says_so_and_names_no_limit():
    """A last window the passive view could not judge (a collapse's load, never learned) agrees by default; the
    page must then not say a cgroup limit holds the volume when none does."""
    v = judge(totals(0.05, own=None, limited=False), strikes=1, is_open=False, last_deep_held=None)
    assert v.action == "raise" and "cgroup" not in v.said and "could not be read against its normal" in v.said


def test_on_a_starved_cpu_the_device_agrees_only_far_off_its_normal():
    """A soak's healthy volume (tasks waiting for a CPU 98-99 % of the time): two deep probes on its busy device came
    short in total (1,087 and 703 IOPS against the probe's 7,160) with the device at 4.2x and 3.7x its normal
    latency for its load, part of which was the CPU's, and paged. The collapses of the same day's soaks struck with
    their devices at 9.1-266x, the CPU as starved; a throttle agrees by its cgroup limit whatever the CPU."""
    from iowarden.daemon.verdicts.contended import (CPU_STARVED_PERCENT, STARVED_DEVICE_AGREES_SLOWDOWN,
                                                    short_and_agreed)

    def totals(own, cpu, limited=False, delivered=703.0):
        return Totals(delivered, delivered * 4096, 7160.0, 7160.0 * 4096, 32, None, None, own, limited, cpu)
    assert short_and_agreed(totals(3.67, 99.0)) == (True, False)          # the soak's healthy page: no strike
    assert short_and_agreed(totals(3.67, 20.0)) == (True, True)           # the same device on a free CPU agrees
    assert short_and_agreed(totals(3.67, None)) == (True, True)           # pressure unknown: as before
    assert short_and_agreed(totals(242.3, 99.0)) == (True, True)          # the collapse, CPU as starved
    assert short_and_agreed(totals(1.0, 99.0, limited=True)) == (True, True)   # a throttle
    assert short_and_agreed(totals(STARVED_DEVICE_AGREES_SLOWDOWN, CPU_STARVED_PERCENT)) == (True, True)
    assert short_and_agreed(totals(242.3, 99.0, delivered=7000.0)) == (False, False)   # not short: nothing


@given(slowdown=st.floats(0.5, 20.0), cpu=st.one_of(st.none(), st.floats(0.0, 100.0)), limited=st.booleans(),
       last_deep_held=st.sampled_from([None, True, False]))
def test_on_a_starved_cpu_a_shallow_probe_clears_once_its_device_no_longer_reads_as_a_faults(
        slowdown, cpu, limited, last_deep_held):
    """A soak's collapse ended while tasks waited for a CPU 99 % of the time: its qd1 probe's totals stayed 473-712
    IOPS against a quiet 1,852 (what the other work asked, not short), the device at 1.8-2.2x its normal latency
    for its load (partly the CPU's), its 4k reads back at their normal, and the alert was held 450 s until the
    device read 1.28x. On a starved CPU the passive view says the volume is back under half the bar that agrees
    with a short total there; on a free CPU, or with a cgroup limit on the stack, at 1.5x as ever. A volume whose
    last deep probe was held is not cleared by a shallow one."""
    from iowarden.daemon.verdicts.contended import (CPU_STARVED_PERCENT, PASSIVE_RECOVERED_SLOWDOWN,
                                                    STARVED_DEVICE_AGREES_SLOWDOWN)

    t = Totals(600.0, 600.0 * 4096, 1852.0, 1852.0 * 4096, 1, slowdown, None, slowdown, limited, cpu)
    v = judge(t, strikes=0, is_open=True, last_deep_held=last_deep_held)
    starved = cpu is not None and cpu >= CPU_STARVED_PERCENT and not limited
    bar = STARVED_DEVICE_AGREES_SLOWDOWN / 2 if starved else PASSIVE_RECOVERED_SLOWDOWN
    assert (v.action == "clear") == (slowdown <= bar and last_deep_held is False)
    if v.action == "clear" and slowdown > PASSIVE_RECOVERED_SLOWDOWN:
        assert f"tasks waited for a CPU {cpu:.0f} % of the time" in v.said, v.said
    assert judge(t, strikes=0, is_open=False, last_deep_held=last_deep_held).action is None   # never raises


def test_the_soaks_collapse_clears_at_its_first_shallow_probe_after_its_end_and_not_while_it_lasts():
    """The soak's figures: after the end (no limit, the device at 2.0x, the CPU at 99 %) it clears; while the
    collapse lasted (its limit on the stack, or the device at 9.1x, the least of the soaks' collapses) it does
    not."""
    def t(slowdown, limited=False):
        return Totals(600.0, 600.0 * 4096, 1852.0, 1852.0 * 4096, 1, slowdown, None, slowdown, limited, 99.0)
    v = judge(t(2.0), strikes=0, is_open=True, last_deep_held=False)
    assert v.action == "clear" and "(2.00x of its normal at this load, passive; tasks waited for a CPU 99 %" in v.said
    assert judge(t(2.0, limited=True), strikes=0, is_open=True, last_deep_held=False).action is None
    assert judge(t(9.1), strikes=0, is_open=True, last_deep_held=False).action is None


def test_on_a_starved_cpu_a_device_whose_window_was_not_read_does_not_agree():
    """A soak's healthy loop volume beside a host whose tasks waited for a CPU 96-98 % of the time: its busy device
    delivered 3,941 IOPS in total against the 4k read probe's 47,653 (0.08), its last window unread against its
    normal (a load its curve had not learned), and the unread window agreed and paged. On a free CPU an unread
    window still agrees (a collapse moves the load where the curve has no bin); on a starved one the bar is
    STARVED_DEVICE_AGREES_SLOWDOWN, which a figure not read cannot be said to meet. A cgroup limit or a slow
    member still agrees, and the page says which."""
    from iowarden.daemon.verdicts.contended import agreement_said, short_and_agreed

    def totals(cpu, limited=False, member=None):
        return Totals(3941.0, 3941.0 * 4096, 47653.0, 47653.0 * 4096, 32, None, "loop5", None, limited, cpu, member)
    assert short_and_agreed(totals(97.0)) == (True, False)                 # the soak's page: no strike
    assert judge(totals(97.0), strikes=1, is_open=False, last_deep_held=None).action is None
    assert short_and_agreed(totals(20.0)) == (True, True)                  # a free CPU: as before
    assert short_and_agreed(totals(None)) == (True, True)                  # pressure unknown: as before
    assert short_and_agreed(totals(97.0, limited=True)) == (True, True)
    assert short_and_agreed(totals(97.0, member=("vdd", 27.2))) == (True, True)
    said = agreement_said(totals(97.0, member=("vdd", 27.2)))
    assert "vdd under it serves its load at 27.2x" in said and "the device itself not read" in said, said


def test_an_arrays_slow_member_agrees_with_its_short_total_where_the_arrays_own_latency_is_diluted():
    """A RAID0 of four disks, one throttled to 30 IOPS: the array's deep probe delivered 145 IOPS in total against
    its 1,207 with the array at 6.0x its normal latency (the member's wait averaged with three healthy peers') and
    the member at 27x. On a starved CPU the array's own 6x does not agree; the member's 27x does, and is named."""
    from iowarden.daemon.verdicts.contended import STARVED_DEVICE_AGREES_SLOWDOWN, agreement_said, short_and_agreed

    def totals(own, member, cpu=99.0, delivered=145.0):
        return Totals(delivered, delivered * 4096, 1207.0, 1207.0 * 4096, 32, None, "md0", own, False, cpu, member)
    assert short_and_agreed(totals(6.0, None)) == (True, False)               # the array's own alone: the CPU's
    assert short_and_agreed(totals(6.0, ("vdd", 27.2))) == (True, True)       # its slow member agrees
    assert "vdd under it serves its load at 27.2x" in agreement_said(totals(6.0, ("vdd", 27.2)))
    assert short_and_agreed(totals(6.0, ("vdd", 3.0))) == (True, False)       # a member a starved CPU explains
    assert short_and_agreed(totals(6.0, ("vdd", STARVED_DEVICE_AGREES_SLOWDOWN))) == (True, True)
    assert short_and_agreed(totals(1.0, ("vdd", 1.6), cpu=10.0)) == (True, True)   # free CPU: the same 1.5x
    assert short_and_agreed(totals(1.0, ("vdd", 1.2), cpu=10.0)) == (True, False)
    assert short_and_agreed(totals(6.0, ("vdd", 27.2), delivered=1000.0)) == (False, False)   # not short
    assert agreement_said(totals(9.0, ("vdd", 27.2))).startswith("the device serves its load at 9.0x")


# --- the count of short busy probes: not strictly in a row --------------------------------------------------

def _judged(kind):
    """A contended probe's judgement of one kind: "strike" (short, agreed), "whole" (a saturating probe at half its
    normal or more in IOPS and bytes), "unagreed" (short, nothing agreeing), "between" (neither)."""
    share, own = {"strike": (0.04, 12.5), "whole": (0.9, 1.0), "unagreed": (0.04, 1.0), "between": (0.28, 12.5)}[kind]
    return judge(totals(share, own=own), strikes=0, is_open=False, last_deep_held=None)


@given(st.lists(st.sampled_from(["strike", "whole", "unagreed", "between", "quiet"]), max_size=40))
def test_the_count_raises_only_on_two_strikes_no_more_than_a_span_apart_with_nothing_whole_between(kinds):
    """Over generated histories of a volume's probes: the count reaches SHORT_PROBES_TO_RAISE exactly when the
    last two strikes are at most STRIKE_SPAN_PROBES probes apart (counting the probes between) and nothing between
    them showed the volume whole or was short with nothing agreeing."""
    s = Strikes()
    for i, kind in enumerate(kinds):
        s = counted(s, None if kind == "quiet" else _judged(kind))
        strikes = [j for j, k in enumerate(kinds[:i + 1]) if k == "strike"]
        expected = 0
        if strikes:
            # the run ending at the last strike: strikes with only neutral probes (fewer than the span) between
            run = [strikes[-1]]
            for a in reversed(strikes[:-1]):
                between = kinds[a + 1:run[0]]
                if len(between) > STRIKE_SPAN_PROBES or {"whole", "unagreed"} & set(between):
                    break
                run.insert(0, a)
            after = kinds[strikes[-1] + 1:i + 1]
            if len(after) <= STRIKE_SPAN_PROBES and not {"whole", "unagreed"} & set(after):
                expected = len(run)
        assert s.count == expected, (kinds[:i + 1], s)


def test_a_quarter_cap_short_only_for_its_4k_reads_still_counts_them_across_the_other_profiles():
    """Seed 654's soak: vol1 capped at a quarter of its load. Its busy probes' totals against their normals: 4k
    random reads 401 of 9,424 IOPS (strikes), 4k writes 554 of 1,986 (0.28: neither short nor whole), 1 MiB reads
    400 of 596 IOPS but 29 of 604 MiB/s (neither), qd1 reads 412 of 1,678 (a shallow probe, not short). Counted
    strictly in a row the two 4k read strikes were never adjacent; counted here, the second raises."""
    def probe(iops, mib, normal_iops, normal_mib, depth):
        return judge(Totals(iops, mib * 2**20, normal_iops, normal_mib * 2**20, depth, None, None, 12.5, True, 98.0),
                     strikes=s.count, is_open=False, last_deep_held=None)
    s = Strikes()
    seen = []
    for args in [(412, 1.6, 1678, 6.55, 1), (400, 29.4, 596, 604, 8), (401, 1.6, 9424, 36.9, 32),
                 (554, 2.2, 1986, 7.8, 32), (396, 1.5, 9424, 36.9, 32)]:
        v = probe(*args)
        seen.append(v.action)
        s = counted(s, v)
    assert seen == [None, None, None, None, "raise"]
    # and a healthy busy volume whose 4k read came short once, its 1 MiB read then whole, does not
    s = Strikes()
    for args, expected in [((401, 1.6, 9424, 36.9, 32), None), ((450, 480.0, 596, 604, 8), None),
                           ((396, 1.5, 9424, 36.9, 32), None)]:
        v = probe(*args)
        assert v.action == expected
        s = counted(s, v)
    assert s.count == 1
