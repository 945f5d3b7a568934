"""A probe run on a busy disk, judged by what the device delivered in total (pure).

A probe deferred as long as it may for a busy disk runs beside the other work: its own figures say how busy the
disk is, not how fast the volume is, so they are neither learned nor judged. The device's total in those seconds
(the probe's I/O and the other work the sampler counted) is: a healthy busy disk still delivers about what the
probe alone gets on the healthy volume; a volume held at a ceiling delivers a fraction, however busy.
"""
from __future__ import annotations

from dataclasses import dataclass

# Short: a busy device delivering under a fifth of the probe's healthy figure in total. Not half: a busy total
# depends on what the other work asks (writes beside reads on flash, fsyncs, a loop device sharing the host's
# CPU and dirty pages); a healthy volume's fell 3.6x below its deep probe's quiet figure in the week lane while
# a neighbour's throttle filled the dirty pages. A limit or a collapse is 10-100x below.
CONTENDED_SHORTFALL = 0.2
CONTENDED_HALF = 0.5         # with the passive view at its normal latency, at least this much in total: back
CONTENDED_RECOVERED = 0.75
QUIET_PROBES_TO_CLEAR_CONTENDED = 2   # quiet probes in a row at baseline that clear an alert raised on the totals
SHORT_PROBES_TO_RAISE = 2             # short contended probes in a row that raise VolumeDegraded
# A contended probe's total (its I/O and the other work's) says what the device can do only when the probe
# alone could fill it: at queue depth 1 the probe waits behind the other work, the other work is what its
# users ask (not what the device can give), and the sum fell 3-5x below the qd1 probe's quiet figure on
# healthy volumes under the week bench's database mix. Shallower probes are neither learned nor judged when
# contended; the deep ones and the passive view of the same device speak for the volume.
SATURATING_QUEUE_DEPTH = 8
PASSIVE_RECOVERED_SLOWDOWN = 1.5   # the passive view's latency over its normal at that load: back within it


@dataclass(frozen=True)
class Totals:
    delivered_iops: float
    delivered_bytes_per_second: float
    normal_iops: float               # what the probe alone gets on the healthy volume (its baselines)
    normal_bytes_per_second: float
    queue_depth: int | None          # the probe's; None: unknown, taken as deep enough to fill the device
    passive_slowdown: float | None   # the passive view of the device: its latency over its normal at this load
    delivered_on: str | None = None  # the device the totals were counted on, when it is not the volume's own


@dataclass(frozen=True)
class Judged:
    short: bool           # under CONTENDED_SHORTFALL of its normal in total
    saturating: bool      # the probe could fill the device alone: its total speaks for the device
    held: bool            # under CONTENDED_HALF of its normal in total (a saturating probe only)
    action: str | None    # "raise", "clear", or None
    said: str             # the finding that raises, or why it clears


def judge(t: Totals, strikes: int, is_open: bool, last_deep_held: bool | None) -> Judged:
    """`strikes`: short contended probes in a row before this one; `is_open`: VolumeDegraded is open on the
    volume's profile; `last_deep_held`: whether the volume's last saturating contended probe was held below
    half (None: none yet). The caller keeps those and counts this one (Judged.short, .held)."""
    saturating = t.queue_depth is None or t.queue_depth >= SATURATING_QUEUE_DEPTH

    def below(share: float) -> bool:
        return saturating and t.delivered_iops < t.normal_iops * share and \
            t.delivered_bytes_per_second < t.normal_bytes_per_second * share
    short, held = below(CONTENDED_SHORTFALL), below(CONTENDED_HALF)
    if short and strikes + 1 >= SHORT_PROBES_TO_RAISE and not is_open:
        on = f" ({t.delivered_on})" if t.delivered_on else ""
        return Judged(short, saturating, held, "raise",
                      f"on a busy disk the device{on} delivered {t.delivered_iops:,.0f} IOPS in total (this probe "
                      f"and the other work together) where the probe alone gets {t.normal_iops:,.0f} on the healthy "
                      "volume: it is slower than its normal even counting the other work")
    # whatever raised it: while probes can only run contended (a backup), the device delivering its normal in
    # total is the evidence the volume is back (else busy probes would hold it open for the whole backup)
    if is_open and saturating and t.delivered_iops >= t.normal_iops * CONTENDED_RECOVERED:
        return Judged(short, saturating, held, "clear",
                      f"the busy device delivers its normal again ({t.delivered_iops:,.0f} IOPS in total, probe and "
                      f"other work, against the probe's normal {t.normal_iops:,.0f})")
    # a probe of 32 in flight beside a database's own cannot show its quiet figure, yet the fault is gone: the
    # device serves its load at its normal latency (passive) and delivers at least half the probe's normal in
    # total (a limit above the block layer, unseen by the passive view, holds it far below); a shallow probe
    # cannot say held: the volume's last deep contended probe says it
    if is_open and t.passive_slowdown is not None and t.passive_slowdown <= PASSIVE_RECOVERED_SLOWDOWN \
            and not held and (saturating or last_deep_held is False):
        return Judged(short, saturating, held, "clear",
                      f"the busy device serves its load at its normal latency again ({t.passive_slowdown:.2f}x of "
                      f"its normal at this load, passive), {t.delivered_iops:,.0f} IOPS in total")
    return Judged(short, saturating, held, None, "")
