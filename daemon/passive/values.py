"""The passive detector's values: its parameters, what it is fed (Window), what it says (Transition,
DeviceView), its per-device record, and the sentences its verdicts carry. detector.py holds the rules."""
from __future__ import annotations

import bisect
import statistics
from array import array
from collections import deque
from dataclasses import dataclass, field

from iowarden.daemon.passive.burst import BurstParams
from iowarden.daemon.passive.evidence import EvidenceParams
from iowarden.daemon.snapshot import frozen
from iowarden.daemon.passive.tail import TailParams


DIRECTIONS = ("read", "write")
KINDS = ("self", "peers", "saturation", "contention", "burst")
SUSPECT_WEIGHT = 0.125
ALERT_OF_KIND = {"self": "DeviceSlow", "peers": "SlowMember", "saturation": "VolumeAtLimit",
                 "contention": "VolumeContended", "burst": "BurstCreditsLow", "service": "ServiceContended"}


@dataclass(frozen=True)
class PassiveParams:
    window_seconds: float = 15.0
    min_ios: int = 30               # fewer I/Os in a window is no evidence: an idle disk never alerts
    min_kib: float = 256.0          # the same, where only bytes are known (a trace without r/s)
    floor_ms: float = 0.02          # excess latency below this is noise on fast flash, never evidence
    bin_min_windows: int = 20       # a load bin judges after this many windows (5 min at 15 s)
    self_ratio: float = 2.5         # acute: a window is slow at this many times its normal (and above its p99)
    # a direction at this many times its usual bytes a second floods the device: no direction is judged on its own
    # curve in that window (a database's day moves its load 4-5x around its mean; a backup, 100x and more)
    flood_bytes_ratio: float = 8.0
    self_windows: int = 40          # ... and most of the last 40 judged windows (10 min at 15 s) are
    shift_ratio: float = 1.4        # persistent: the median ratio over the last hour of judged windows
    shift_clear_ratio: float = 1.2
    shift_windows: int = 240
    shift_min_windows: int = 120
    shift_history: int = 96          # hourly medians sampled every shift_sample windows: the device's own
    shift_sample: int = 60           # hour-to-hour variation, which sets how far a median may wander
    shift_margin: float = 1.25
    raise_fraction: float = 0.75
    clear_fraction: float = 0.25
    # ... or once the last 12 judged windows (3 min at 15 s) are all off the slow mark and their median is back
    # near normal: an alert clears within minutes of the fault's end, not when the ring has emptied (7.5 min)
    clear_run_windows: int = 12
    knee_multiple: float = 2.0      # the knee: the load at which the learned await reaches this x the unloaded
    peak_block_windows: int = 120   # the headroom's peak: the max load of the last one or two such blocks
    burst_horizon_seconds: float = 1800.0   # BurstCreditsLow when a bucket's credits last less at the current draw
    service_learn_seconds: float = 300.0    # a service's own windows learned before ServiceContended judges it
    fleet_seconds: float = 300.0            # iowarden_fleet_slowdown_ratio: the median of this many seconds
    peer_ratio: float = 2.0
    peer_clear_ratio: float = 1.5
    peer_windows: int = 480         # two hours of 15 s windows with traffic
    peer_min_windows: int = 40
    severe_ratio: float = 4.0
    severe_windows: int = 12
    severe_group_windows: int = 40  # in a group of three or more: a noisy host's healthy drives reach 4x
                                    # their peers in 8 of 12 windows (Perseus cluster J); 10 minutes, then
    comparable_load: float = 2.0    # a device carrying more than twice its peers' load is not compared
    saturation_windows: int = 6
    saturation_cv: float = 0.05     # "flat": throughput within 5 % across the windows
    # a ceiling is a limit only below what the volume has shown it can do (its characterized saturation, or the
    # most it delivered in a window): a healthy device at full speed (a backup, a compaction) is busy, not limited
    saturation_below_best: float = 0.8
    saturation_util_percent: float = 90.0
    saturation_queue: float = 2.0
    idle_clear_seconds: float = 3600.0   # an alert on a device without traffic for this long clears
    # evidence over time against the peers (passive/evidence.py); tuned by bench/passive_perseus.py
    evidence_block_windows: int = 240    # an hour of 15 s windows
    evidence_allowance: float = 4.0
    evidence_threshold: float = 4.8
    evidence_scale_floor: float = 0.02
    # a drive slow on its tail against its peers' (passive/tail.py; needs the tracer)
    tail_block_seconds: float = 60.0
    tail_block_windows: int = 4          # derived: tail_block_seconds of windows
    tail_ratio: float = 4.0
    tail_floor_ms: float = 20.0
    # fnmatch patterns of loop devices' backing files: the loop devices of one size whose files match one
    # pattern are peers. None by default: a loop device is as fast as its file and the disk under it, so two
    # of one size are not two drives of one model (on most hosts they are snap images)
    loop_peers: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, section) -> "PassiveParams":
        return cls(**{key: getattr(section, key) for key in PASSIVE_KEYS if key != "loop_peers"},
                   loop_peers=tuple(section.loop_peers),
                   # derived: an hour of windows, whatever their length
                   evidence_block_windows=max(4, round(3600.0 / section.window_seconds)),
                   peak_block_windows=max(1, round(1800.0 / section.window_seconds)),   # half an hour
                   tail_block_windows=max(1, round(section.tail_block_seconds / section.window_seconds)))

    def evidence(self) -> EvidenceParams:
        return EvidenceParams(block_windows=self.evidence_block_windows, allowance=self.evidence_allowance,
                              threshold=self.evidence_threshold, scale_floor=self.evidence_scale_floor)

    def tail(self) -> TailParams:
        return TailParams(block_windows=self.tail_block_windows, ratio=self.tail_ratio, floor_ms=self.tail_floor_ms)

    def burst(self) -> BurstParams:
        return BurstParams(horizon_seconds=self.burst_horizon_seconds, flat_windows=self.saturation_windows)


# The [passive] keys an operator may tune (same names as the fields), each with its range in the schema.
PASSIVE_KEYS = ("window_seconds", "self_ratio", "peer_ratio", "peer_windows", "saturation_windows", "floor_ms",
                "evidence_allowance", "evidence_threshold", "tail_ratio", "tail_floor_ms",
                "tail_block_seconds", "loop_peers", "knee_multiple", "burst_horizon_seconds", "service_learn_seconds",
                "fleet_seconds")
# Derived from a key: evidence_block_windows (an hour of windows). Internal: everything else, tuned on the
# Perseus development hosts and shown leave-one-cluster-out (bench/passive_perseus.py, docs/detector.md);
# a change moves the figures there, so they are not an operator's knob.
PASSIVE_DERIVED = frozenset({"evidence_block_windows", "tail_block_windows"})


@dataclass(frozen=True)
class Flow:
    """One direction of one window. A rate that is not known is None, not zero."""
    iops: float | None
    kib_per_second: float | None
    await_ms: float

    def load(self) -> tuple[str, float]:
        """The load the latency is judged against, with its unit: IOPS where known, else KiB/s."""
        return ("iops", self.iops) if self.iops is not None else ("kib", self.kib_per_second or 0.0)

    def is_evidence(self, seconds: float, p: PassiveParams) -> bool:
        if self.iops is not None:
            return self.iops * seconds >= p.min_ios
        return (self.kib_per_second or 0.0) * seconds >= p.min_kib


@dataclass(frozen=True)
class Window:
    device: str
    end: float                        # Unix seconds
    seconds: float
    flows: dict                       # direction -> Flow (directions with a rate and an await)
    queue_size: float | None = None   # iostat aqu-sz
    util_percent: float | None = None
    tails: dict = field(default_factory=dict)   # direction -> the tracer's StageHistogram of total latency
    own_probe: bool = False           # iowarden's own fio ran on the device during the window

    @classmethod
    def from_rates(cls, device: str, end: float, r, tails: dict | None = None, own_probe: bool = False) -> "Window":
        """From a diskstats.DiskRates over the window (and the tracer's histograms of it, when on)."""
        flows = {"read": Flow(r.reads_per_second, r.read_kib_per_second, r.read_await_ms),
                 "write": Flow(r.writes_per_second, r.write_kib_per_second, r.write_await_ms)}
        return cls(device, end, r.interval_seconds, flows, r.queue_size, r.util_percent, tails or {}, own_probe)


@dataclass(frozen=True)
class Transition:
    kind: str                 # self, peers, saturation, contention, burst, service
    device: str
    state: str                # raised, cleared, updated
    severity: str
    summary: str              # one sentence naming the device and the evidence
    evidence: dict            # read-only: posted to the core in PassiveJudged

    def __post_init__(self):
        object.__setattr__(self, "evidence", frozen(self.evidence))

    @property
    def alert(self) -> str:
        return ALERT_OF_KIND[self.kind]


# The fleet's signal per volume (iowarden_fleet_slowdown_ratio) is the median of the last [passive] fleet_seconds
# (five minutes) of windows of latency over the volume's own normal at its load, so a rule evaluated every minute
# across hosts under different loads compares like with like, and one odd window is not a deviation.
# The fleet's second signal per volume (iowarden_fleet_normal_latency_seconds): its own normal, the median latency
# it learned in each of the octaves of load it carries most, once an octave holds FLEET_NORMAL_MIN_SECONDS of
# windows: its class's volumes at the same loads say whether that normal is slow (a volume slow from its first day
# is normal to itself). A few octaves (the most learned) keep it to a few series a volume.
FLEET_OCTAVES = 3
FLEET_NORMAL_MIN_SECONDS = 1200.0


@dataclass(frozen=True)
class FleetNormal:
    """A device's learned median latency over one octave of its load (2^octave to 2^(octave+1) load_unit)."""
    direction: str
    load_unit: str        # "iops", or "kib" (KiB/s) where the I/O count is not known
    octave: int
    median_ms: float
    windows: int


@dataclass(frozen=True)
class DeviceView:
    """The passive verdict of one device, for /metrics and `status`."""
    device: str
    slowdown_ratio: dict           # direction -> observed / normal at that load (judged directions)
    expected_await_ms: dict        # direction -> the curve's normal at that load
    learned_windows: dict          # direction -> windows in the curve
    peer_ratio: float | None       # median latency over peers' median, recent windows
    ceiling: str | None            # "2,000 IOPS" while at its limit
    flagged: tuple[str, ...]       # kinds raised
    capability: tuple = (None, None)   # (IOPS, bytes/s) from `iowarden characterize`, when run
    load_ratio: dict = field(default_factory=dict)   # "iops"/"bandwidth" -> last window's load over capability
    evidence: object = None        # passive_evidence.MemberEvidence (a copy) in a group of three or more
    evidence_threshold: float | None = None
    self_ratio: float | None = None   # the configured ratio a window is slow at ([passive] self_ratio)
    tail: object = None            # passive_tail.MemberTail (a copy): its p99.9 against its peers', last block
    neighbours_ratio: float | None = None   # the host's other disks' median slowdown at their loads (host.py)
    knee: dict = field(default_factory=dict)        # direction -> headroom.Knee of its learned curve
    headroom_ratio: dict = field(default_factory=dict)   # direction -> the knee over the recent peak load
    burst: object = None           # burst.Forecast: its bucket's balance and time left, where a bucket is known
    fleet_ratio: float | None = None   # the median of the last fleet_seconds of window ratios: the fleet's signal
    services: tuple = ()           # service.ServiceView: each learned service's normal on this device
    fleet_normal: tuple = ()       # FleetNormal: its own normal in the octaves of load it carries most
    # the last window's worst latency over its normal at that load; None when that window was not judged (idle,
    # a flood, a load its curve has not learned): slowdown_ratio keeps the last judged window's, however old
    window_ratio: float | None = None

    def __post_init__(self):
        # a view is posted in PassiveJudged and published in snapshots: its mappings read-only
        for name in ("slowdown_ratio", "expected_await_ms", "learned_windows", "load_ratio", "knee", "headroom_ratio"):
            object.__setattr__(self, name, frozen(getattr(self, name)))


@dataclass(slots=True)   # a thousand of them: no __dict__ each
class DeviceTrack:
    """What the passive detector keeps of one device between windows: its curves, rings and flags."""
    curves: dict = field(default_factory=dict)            # (direction, unit) -> LatencyCurve
    self_ring: deque = field(default_factory=deque)       # bools: judged windows, slow or not
    self_log: RollingMedian | None = None                 # log(latency / normal at that load), recent windows
    recent_log: deque = field(default_factory=deque)      # the same, the last clear_run_windows only
    peaks: dict = field(default_factory=dict)             # (direction, unit) -> headroom.PeakLoad
    shift_seen: deque = field(default_factory=deque)      # past hourly medians of self_log (unflagged)
    self_count: int = 0
    peer_log: RollingMedian | None = None                 # log(latency / peers' median), recent windows
    peer_excess: RollingMedian | None = None              # latency - peers' median, ms
    peer_recent: PairRing | None = None                   # (log ratio, excess ms), the last severe windows
    window_ratio: float | None = None                     # this window's worst latency over its normal
    sat_ring: deque = field(default_factory=deque)        # (iops, kib/s, queue, util, await) or None
    flagged: dict = field(default_factory=dict)           # kind -> evidence while raised
    last_traffic: float | None = None
    last_total: tuple = (0.0, 0.0)                        # the last window's IOPS and bytes/s, both directions
    best: dict = field(default_factory=dict)  # (direction, request-size bucket) -> (IOPS, bytes/s) at full util, its best
    usual_log_kib: dict = field(default_factory=dict)     # direction -> (slow mean of log KiB/s, windows): its usual
    usual_log_size: dict = field(default_factory=dict)    # direction -> (slow mean of log KiB a request, windows)
    last_ratio: dict = field(default_factory=dict)
    last_expected: dict = field(default_factory=dict)
    ceiling: str | None = None
    burst: object = None                                  # burst.BurstTrack: its bucket, learned or configured
    fleet_ring: deque = field(default_factory=deque)      # log of each judged window's worst ratio, fleet_seconds


def median_of(xs):
    return statistics.median(xs) if xs else None


class RollingMedian:
    """The median of the last `size` values, kept sorted: O(log n) to find, one memmove to update.

    statistics.median over a 480-value ring every window was 80 % of a replay's time. Kept as arrays of
    single-precision floats, not lists of float objects: 8 bytes a value where a list, a deque and the float
    they share held 48 (two 480-value rings per member were 43 KiB of a busy device's 67, and 15 KiB
    as doubles). What is kept is log ratios and milliseconds, judged against thresholds of a few per cent: seven
    significant digits are more than they carry. A value is rounded once, as it is stored, so the ring and the
    sorted copy hold the same number and the one leaving the ring is found exactly.
    """
    __slots__ = ("size", "_ring", "_next", "_sorted")

    def __init__(self, size: int):
        self.size = size
        self._ring = array("f")      # in arrival order from _next once full: a circular buffer
        self._next = 0
        self._sorted = array("f")

    def add(self, x: float) -> None:
        if len(self._ring) == self.size:
            old, self._ring[self._next] = self._ring[self._next], x
            x = self._ring[self._next]     # as stored: rounded to single precision
            self._next = (self._next + 1) % self.size
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        else:
            self._ring.append(x)
            x = self._ring[-1]
        bisect.insort(self._sorted, x)

    def median(self) -> float:
        s, n = self._sorted, len(self._sorted)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

    def __len__(self) -> int:
        return len(self._ring)

    def clear(self) -> None:
        self._ring, self._sorted, self._next = array("f"), array("f"), 0


class PairRing:
    """The last `maxlen` (log ratio, excess ms) pairs, oldest first, as two arrays of single floats: 8 bytes a
    pair where a deque of tuples of two float objects held about 100 (4.6 KiB of a busy device's 28).
    A deque's interface as far as the detector uses it: append, len, iteration, clear."""
    __slots__ = ("maxlen", "_ratio", "_excess")

    def __init__(self, maxlen: int):
        self.maxlen = maxlen
        self._ratio, self._excess = array("f"), array("f")

    def append(self, pair: tuple[float, float]) -> None:
        if len(self._ratio) >= self.maxlen:
            del self._ratio[0], self._excess[0]
        self._ratio.append(pair[0])
        self._excess.append(pair[1])

    def __len__(self) -> int:
        return len(self._ratio)

    def __iter__(self):
        return zip(self._ratio, self._excess)

    def clear(self) -> None:
        del self._ratio[:], self._excess[:]


def evidence_summary(device: str, ev: dict, block_seconds: float) -> str:
    hours = block_seconds / 3600
    peers, total = ev["peers"], ev.get("peers_total", len(ev["peers"]))
    named = ", ".join(peers) if total <= 3 else f"{total} peers ({', '.join(peers[:2])}, ...)"
    so_far = ev.get("open_minutes")
    when = (f"above them in {ev['blocks_above']} of {ev['blocks']} blocks of {hours:g} h"
            + (f" and the {so_far:.0f} minutes since" if so_far else ""))
    return (f"{device} has been {ev['ratio']:.2f}x as slow as its {named} at comparable "
            f"load: {when}, evidence "
            f"{ev['score']:.1f} past the threshold {ev['threshold']:g} (in strays of healthy drives here, "
            f"{(ev['stray_ratio'] - 1) * 100:.1f} %)")


def self_summary(device: str, ev: dict) -> str:
    how = (f"{ev['slow_windows']} of the last {ev['of_windows']} windows slow" if ev["rule"] == "acute"
           else f"the median of the last {ev['of_windows']} windows")
    return (f"{device} {ev['direction']}s are {ev['ratio']:.1f}x slower than its own normal at this load: "
            f"await {ev['await_ms']:g} ms where {ev['expected_ms']:g} ms is normal at "
            f"{ev['load']:,.0f} {ev['load_unit']} ({how})")
