"""A probe run on a busy disk, judged by what the device delivered in total (pure).

A probe deferred as long as it may for a busy disk runs beside the other work: its own figures say how busy the
disk is, not how fast the volume is, so they are neither learned nor judged. The device's total in those seconds
(the probe's I/O and the other work the sampler counted) is: a healthy busy disk still delivers about what the
probe alone gets on the healthy volume; a volume held at a ceiling delivers a fraction, however busy.
"""
from __future__ import annotations

from dataclasses import dataclass

from iowarden.probes.fio_job import SATURATING_QUEUE_DEPTH

# Short: a busy device delivering under a fifth of the probe's healthy figure in total. Not half: a busy total
# depends on what the other work asks (writes beside reads on flash, fsyncs, a loop device sharing the host's
# CPU and dirty pages); a healthy volume's fell 3.6x below its deep probe's quiet figure in the week lane while
# a neighbour's throttle filled the dirty pages. A limit or a collapse is 10-100x below.
CONTENDED_SHORTFALL = 0.2
# A shallow probe (under SATURATING_QUEUE_DEPTH in flight) waits behind the other work, and the total is what the
# other work asks more than what the device can give. Over twelve kept soak runs (bench/contended_totals.py, IOPS
# and bytes read as here), armed healthy volumes' qd1 probes delivered 0.124 of their quiet figure in total or
# more, volumes capped at a quarter of their load or collapsed to 5 % of it 0.025 or less; chosen by leaving one
# run out, 0.041-0.074 on the folds (each held-out run then struck no healthy qd1 probe and missed no fault one).
SHALLOW_SHORTFALL = 0.05
CONTENDED_HALF = 0.5         # with the passive view at its normal latency, at least this much in total: back
CONTENDED_RECOVERED = 0.75
QUIET_PROBES_TO_CLEAR_CONTENDED = 2   # quiet probes in a row at baseline that clear an alert raised on the totals
# Short contended probes on a volume, of any profile, that raise VolumeDegraded. Of any profile: a volume's four
# profiles are probed in turn, and a collapse to 5 % of its load for 229 s gave a qd1 read, a 1 MiB read and a 4k
# random read one short probe each, in a row; counted per profile, none reached two.
SHORT_PROBES_TO_RAISE = 2
# Not strictly in a row: a fault is short for some profiles only. A volume capped at a quarter of its load's IOPS
# gave its 4k random reads 0.04 of their normal in total, but its 4k writes 0.28, its 1 MiB reads 0.67 in IOPS
# (0.05 in bytes) and its qd1 reads (which wait behind its users) 0.25: each reset the count, the two 4k read
# strikes were never adjacent, and the page came 460 s in from the passive view. So a probe that is neither short
# nor shows the volume whole (a saturating probe at CONTENDED_HALF of its normal or more, in IOPS and in bytes)
# leaves the count as it is, for at most STRIKE_SPAN_PROBES of the volume's probes: one round of the example's four
# profiles between two strikes of one profile. A short total the device does not agree with still resets it (the
# shortfall is then the host's, a starved CPU's, not the volume's). Replayed on four soaks' journals (three of two
# hours of healthy mix, one of 45 minutes and four faults; bench/contended_totals.py), it raised the quarter cap at
# 359 s and nothing on a healthy volume, where strictly in a row it raised nothing.
STRIKE_SPAN_PROBES = 4
# The probe's total counts the device's, so the device's own latency must agree that it is slow at the load it
# carries (the passive view: DEVICE_AGREES_SLOWDOWN its normal or more), or a cgroup limit on the volume's stack
# explain a total the device's latency cannot show (a throttled bio waits above its counters). On a host whose
# CPUs and page cache were starved, a healthy deep probe's total fell to 0.006 of its normal with the device
# serving its load at its normal latency; the collapses and throttles of the soaks had their devices at 1.6-335x.
DEVICE_AGREES_SLOWDOWN = 1.5
# Tasks waiting for a CPU this share of the time or more (/proc/pressure/cpu "some"): the device's latency is then
# partly the CPU's (a loop or virtio device completes its requests on a kernel thread that waits for a CPU too), and
# it must be STARVED_DEVICE_AGREES_SLOWDOWN its normal or more to agree. In a soak on the example configuration (a
# healthy mix, tasks waiting for a CPU 98-99 % of the time) a healthy volume's device read 3.7-4.2x its normal at
# two short contended probes in a row and paged; the collapses of the same day's soaks struck at 9.1-266x, with the
# CPU as starved, and a throttle agrees by its cgroup limit. 8: the passive view's own "busy because it is slow"
# (probing/suspicion.SUSPECT_SLOWDOWN), within the 1.25-10x every held-out soak run allowed.
CPU_STARVED_PERCENT = 50.0
STARVED_DEVICE_AGREES_SLOWDOWN = 8.0
# A contended probe's total (its I/O and the other work's) says what the device can do best when the probe
# alone could fill it: at queue depth 1 the probe waits behind the other work, the other work is what its
# users ask (not what the device can give), and the sum fell 3-5x below the qd1 probe's quiet figure on
# healthy volumes under the week bench's database mix: a shallow probe is short only at SHALLOW_SHORTFALL, and
# says nothing of a volume that is back (the deep ones and the passive view of the same device do). The depth is
# the probes' own fact (a probe that fills the device alone), kept with them: the scheduler reads it too.
PASSIVE_RECOVERED_SLOWDOWN = 1.5   # the passive view's latency over its normal at that load: back within it
# On a starved CPU the device's latency is partly the CPU's (above), so "back" is read at half the bar that agrees
# with a short total there (STARVED_DEVICE_AGREES_SLOWDOWN), as the free CPU's 1.5x is the bar that agrees there. A
# soak's collapse ended while tasks waited for a CPU 99 % of the time: its qd1 probes' totals stayed 2.6-3.9x under
# their quiet figure (what the other work asked, not short) with the device at 1.8-2.2x, its 4k reads delivered
# their normal 54 s after the end, and the alert was held 450 s until the device read 1.28x. Healthy devices beside
# a starved CPU read 0.9-5.8x and collapses 8.7-266x, but quarter throttles' devices read 1.0-3.1x (a limit below
# the volume's device holds its bios where that device's clock does not run): no bar on the device parts a volume
# held at a limit from one that is back, at 1.5x or 4x. The rest of the rule does: the deep probes deliver half
# their normal in total (those throttles' 4k probes delivered 0.19-0.24). A cgroup limit on the stack keeps the
# free CPU's bar.
STARVED_PASSIVE_RECOVERED_SLOWDOWN = STARVED_DEVICE_AGREES_SLOWDOWN / 2


@dataclass(frozen=True)
class Totals:
    delivered_iops: float
    delivered_bytes_per_second: float
    normal_iops: float               # what the probe alone gets on the healthy volume (its baselines)
    normal_bytes_per_second: float
    queue_depth: int | None          # the probe's; None: unknown, taken as deep enough to fill the device
    passive_slowdown: float | None   # the passive view of the device: its latency over its normal at this load
    delivered_on: str | None = None  # the device the totals were counted on, when it is not the volume's own
    own_slowdown: float | None = None   # the device's latency over its normal at its load in the last window
                                        # (the passive view, flagged or not); None: that window was not judged
    cgroup_limited: bool = False     # a cgroup limit on the volume's stack holds iowarden's own I/O
    cpu_pressure_percent: float | None = None   # /proc/pressure/cpu "some" during the probe
    slowest_member: tuple[str, float] | None = None   # the disk under the volume's device (an array's member) whose
                                                      # latency over its normal at its load was the most in the last
                                                      # window: (its name, that ratio); None: no disk under it judged


@dataclass(frozen=True)
class Judged:
    short: bool           # under its shortfall (CONTENDED_SHORTFALL deep, SHALLOW_SHORTFALL shallow) in total
    strike: bool          # short, and the device's latency or a cgroup limit agrees: counts towards a raise
    saturating: bool      # the probe could fill the device alone: its total speaks for the device
    held: bool            # under CONTENDED_HALF of its normal in total (a saturating probe only)
    whole: bool           # a saturating probe at CONTENDED_HALF of its normal or more in both IOPS and bytes
    action: str | None    # "raise", "clear", or None
    said: str             # the finding that raises, or why it clears


# A volume's warm-up learns under load once its device has been busy for a few probes in a row (the scheduler's
# WARMUP_UNDER_LOAD_AFTER); a collapse in those minutes would be learned as its normal and never paged. The
# warm-up's quiet probes so far are a normal to read a busy probe's total against: at least this many of them.
WARMUP_QUIET_TO_READ = 3


def _below(t: Totals, share: float) -> bool:
    """The device's total under `share` of the probe's normal in both IOPS and bytes (a disk busy with large writes
    moves few operations but many bytes)."""
    return t.delivered_iops < t.normal_iops * share and t.delivered_bytes_per_second < t.normal_bytes_per_second * share


def short_and_agreed(t: Totals) -> tuple[bool, bool]:
    """(short, strike): the device's total under the probe's shortfall, and the device's latency or a cgroup limit
    agreeing."""
    saturating = t.queue_depth is None or t.queue_depth >= SATURATING_QUEUE_DEPTH
    short = _below(t, CONTENDED_SHORTFALL if saturating else SHALLOW_SHORTFALL)
    return short, short and (agreed_on_a_reading(t) or _unread_agrees(t))


def agreed_on_a_reading(t: Totals) -> bool:
    """A cgroup limit on the stack, or the device's (or a member's) latency read at its agreeing slowdown: agreement
    on what was read, not on a window that could not be (a new daemon's curves have learned nothing yet)."""
    return t.cgroup_limited or (t.own_slowdown is not None and t.own_slowdown >= agreeing_slowdown(t)) \
        or _member_agrees(t)


def _starved(t: Totals) -> bool:
    return t.cpu_pressure_percent is not None and t.cpu_pressure_percent >= CPU_STARVED_PERCENT


def _unread_agrees(t: Totals) -> bool:
    """A device whose last window could not be read against its normal (a load its curve has not learned, a
    flood) agrees on a host with CPU to spare: a collapse moves its load where the curve has no bin. On a starved
    CPU it does not: there the bar is STARVED_DEVICE_AGREES_SLOWDOWN, and a figure not read cannot be said to
    meet it (a healthy loop volume's 4k read on such a host delivered 0.08 of its normal in total, its device's
    window unread, and paged)."""
    return t.own_slowdown is None and not _starved(t)


def _member_agrees(t: Totals) -> bool:
    """A disk under the volume's device serving its load far slower than its normal agrees as the device would:
    an array is as slow as its slowest member, and its own latency dilutes the member's with its healthy peers'
    (a RAID0 over four disks, one throttled to 30 IOPS: the member at 27x its normal, the array at 6x, below
    what a starved CPU asks of the array's own)."""
    return t.slowest_member is not None and t.slowest_member[1] >= agreeing_slowdown(t)


def agreeing_slowdown(t: Totals) -> float:
    """The device's latency over its normal that agrees with a short total: more on a host whose CPUs are starved,
    where part of the device's latency is the CPU's."""
    return STARVED_DEVICE_AGREES_SLOWDOWN if _starved(t) else DEVICE_AGREES_SLOWDOWN


def recovered_slowdown(t: Totals) -> float:
    """The device's latency over its normal at its load under which the passive view says a busy volume is back."""
    if _starved(t) and not t.cgroup_limited:
        return STARVED_PASSIVE_RECOVERED_SLOWDOWN
    return PASSIVE_RECOVERED_SLOWDOWN


def agreement_said(t: Totals) -> str:
    """What agreed with a short total, for the page and the journal."""
    if t.cgroup_limited:
        return "a cgroup limit holds its stack"
    if _unread_agrees(t):
        return "the device's latency in its last window could not be read against its normal (a load it has not learned)"
    if (t.own_slowdown is None or t.own_slowdown < agreeing_slowdown(t)) and _member_agrees(t):
        name, ratio = t.slowest_member
        itself = "not read" if t.own_slowdown is None else f"at {t.own_slowdown:.1f}x"
        return f"{name} under it serves its load at {ratio:.1f}x its normal latency (the device itself {itself})"
    return f"the device serves its load at {t.own_slowdown:.1f}x its normal latency"


def judge(t: Totals, strikes: int, is_open: bool, last_deep_held: bool | None, volume_paged: bool = False,
          learning: bool = False) -> Judged:
    """`strikes`: the volume's strikes in a row before this probe (of any profile); `is_open`: VolumeDegraded is
    open on the volume's profile; `last_deep_held`: whether the volume's last saturating contended probe was held
    below half (None: none yet); `volume_paged`: VolumeDegraded is open on another profile of the volume (one
    fault, one page: counted, not raised again); `learning`: the profile is still in its warm-up, its normal the
    median of the quiet probes it has learned so far (said so in the page). The caller keeps those and counts this
    one (Judged.strike, .held)."""
    saturating = t.queue_depth is None or t.queue_depth >= SATURATING_QUEUE_DEPTH
    short, strike = short_and_agreed(t)
    held = saturating and _below(t, CONTENDED_HALF)
    whole = saturating and t.delivered_iops >= t.normal_iops * CONTENDED_HALF \
        and t.delivered_bytes_per_second >= t.normal_bytes_per_second * CONTENDED_HALF
    if strike and strikes + 1 >= SHORT_PROBES_TO_RAISE and not is_open and not volume_paged:
        on = f" ({t.delivered_on})" if t.delivered_on else ""
        why = agreement_said(t)
        return Judged(short, strike, saturating, held, whole, "raise",
                      f"on a busy disk the device{on} delivered {t.delivered_iops:,.0f} IOPS in total (this probe "
                      f"and the other work together) where "
                      + (f"its first quiet probes got {t.normal_iops:,.0f} (the volume is still learning its normal)"
                         if learning else f"the probe alone gets {t.normal_iops:,.0f} on the healthy volume")
                      + f", and {why}: it is slower than its normal even counting the other work")
    # whatever raised it: while probes can only run contended (a backup), the device delivering its normal in
    # total is the evidence the volume is back (else busy probes would hold it open for the whole backup)
    if is_open and saturating and t.delivered_iops >= t.normal_iops * CONTENDED_RECOVERED:
        return Judged(short, strike, saturating, held, whole, "clear",
                      f"the busy device delivers its normal again ({t.delivered_iops:,.0f} IOPS in total, probe and "
                      f"other work, against the probe's normal {t.normal_iops:,.0f})")
    # a probe of 32 in flight beside a database's own cannot show its quiet figure, yet the fault is gone: the
    # device serves its load at its normal latency (passive) and delivers at least half the probe's normal in
    # total (a limit above the block layer, unseen by the passive view, holds it far below); a shallow probe
    # cannot say held: the volume's last deep contended probe says it
    if is_open and t.passive_slowdown is not None and t.passive_slowdown <= recovered_slowdown(t) \
            and not held and not (short and not saturating) and (saturating or last_deep_held is False):
        cpu = (f"; tasks waited for a CPU {t.cpu_pressure_percent:.0f} % of the time, and a starved CPU's device "
               f"reads up to {STARVED_PASSIVE_RECOVERED_SLOWDOWN:g}x" if t.passive_slowdown > PASSIVE_RECOVERED_SLOWDOWN
               else "")
        return Judged(short, strike, saturating, held, whole, "clear",
                      f"the busy device serves its load at its normal latency again ({t.passive_slowdown:.2f}x of "
                      f"its normal at this load, passive{cpu}), {t.delivered_iops:,.0f} IOPS in total")
    return Judged(short, strike, saturating, held, whole, None, "")


@dataclass(frozen=True)
class Strikes:
    """A volume's short contended probes counted towards a raise, and its probes since the last of them."""
    count: int = 0
    probes_since: int = 0


def counted(before: Strikes, judged: Judged | None) -> Strikes:
    """The count after one more probe of the volume: `judged` is a contended probe's judgement, None a quiet probe
    (which speaks for its own profile, not for the one a fault made short: it only ages the count). A strike adds
    one; a probe showing the volume whole, or short with nothing agreeing, ends the run; anything else leaves it,
    for at most STRIKE_SPAN_PROBES probes after the last strike."""
    if judged is not None and judged.strike:
        return Strikes(before.count + 1, 0)
    if judged is not None and (judged.whole or judged.short):
        return Strikes()
    if before.count == 0 or before.probes_since + 1 > STRIKE_SPAN_PROBES:
        return Strikes()
    return Strikes(before.count, before.probes_since + 1)
