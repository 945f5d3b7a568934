"""Each service's latency against its own normal, from the tracer's counts per cgroup: a victim and its culprit.

The device's own rule for other work (passive/contention.py) sees a device whose awaits rose with its load, and
cannot tell the database that waits twenty times its usual from the batch job that makes it wait, nor a flood that
hurts no one (a backup alone on its volume at night) from one that does. With the compiled tracer's counts per
cgroup (sources/tracer.py) this rule judges each service, a cgroup with timed requests of its own on a device,
against the latency its own requests usually see at its own rate, and names as culprit the other cgroup doing
most of the device's requests or bytes meanwhile.

A window is a victim's when the service did at least `min_requests` timed requests in a direction (or a few that
took most of the window: a service blocked on its reads), their mean latency is at least `ratio` times its usual
and above `floor_ms`, and one other cgroup did at least `culprit_share` of the device's requests or bytes and held
the device at least as long as the service's own requests (a service that fills the queue itself waits on its own
load); on a host whose other disks are N times their normal together in that window, at `ratio` times N (what the
host's disks share is the host's). A cgroup held to an I/O limit of its own (or by one it is in, below the root)
is not judged: whoever set the limit declared it background work. In soaks of healthy mixes such a batch job's
4 KiB writes, held to a few hundred IOPS on a loop device, waited 14-19x the normal they had learned alone on the
disk under it while the root's large writes flushed at 420 MiB/s, and were paged as a victim. Most of the last
`windows` judged windows of a service raise its device (one alert per device, naming its worst victim); few
clear it, as do `windows` windows in a row without the victim's requests. The usual is learned, per service,
direction and octave of the service's own request rate (its load), from the windows that were not a victim's: a
slow moving average of the logarithm of its mean latency and of its p99, judged after `learn_windows`. A flood
slows a closed-loop service's rate too, so a rate not learned yet is judged against the nearest octave that is.

Pure, no clock: the passive part feeds it the tracer's counts since its last step.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from iowarden.daemon.alert_kinds import severity_of
from iowarden.daemon.passive.values import ALERT_OF_KIND, Transition
from iowarden.daemon.sources.cgroups import ancestors
from iowarden.daemon.wording import human_seconds

NOT_A_SERVICE = ("other", "(no cgroup)", "(removed cgroups)")   # the tracer's sums of many: no one's latency
# The host's other disks at this many times their normal latency together or more: the window measured the host
# as much as the service (the probes' rule, verdicts/health.HOST_SHARED_SLOWDOWN). In a soak on the example
# configuration, a WAL appender in the root cgroup beside a batch job held to 400 IOPS waited 27x its normal
# while buffered backups flushed and every task waited for a CPU 97-99 % of the time, the host's other disks at
# 5.2-18.9x theirs: paged as the batch job's victim. The noisy neighbours the soaks played on a shared disk had
# its neighbours at their normal (24-32x, paged).
HOST_SHARED_SLOWDOWN = 2.0
# what a saved normal may hold (the state database is read back as input): a cgroup's path as the kernel bounds it,
# octaves of a request rate from a request in 17 minutes to 2^40 a second, a mean or p99 within e^-20 to e^20 ms (the
# rule keeps none under 0.1 µs, e^-9.2 ms; e^20 ms is 134 hours)
MAX_SAVED_PATH = 4096
MAX_SAVED_OCTAVES = 64
OCTAVE_RANGE = (-10, 40)
MAX_LOG_MS = 20.0
MAX_LEARNED = 10 ** 9


@dataclass(frozen=True)
class ServiceParams:
    ratio: float = 8.0           # a service's mean latency over its usual: what its users feel
    min_requests: int = 20       # its timed requests in a window before the window is evidence
    # ... or fewer, while its requests took most of the window: a service reading one at a time that a flood holds
    # to a few requests a window is the worst hurt, not the least evidence
    blocked_fraction: float = 0.5
    min_blocked_requests: int = 3
    floor_ms: float = 0.05       # a mean below this is never a victim's (flash at its best)
    culprit_share: float = 0.5   # one other cgroup's share of the device's requests or bytes
    windows: int = 8             # two minutes of 15 s windows
    raise_fraction: float = 0.75
    clear_fraction: float = 0.25
    learn_windows: int = 20      # five minutes of a service's windows before it is judged
    memory_windows: float = 1440.0   # the averages' time constant: six hours of 15 s windows
    max_services: int = 4096     # (device, cgroup, direction) learned at most; the least recently seen go first

    @classmethod
    def for_windows_of(cls, seconds: float, learn_seconds: float = 300.0) -> "ServiceParams":
        """The same minutes and hours in windows of this length ([passive] window_seconds); learn_seconds:
        [passive] service_learn_seconds."""
        return cls(windows=max(4, round(120 / seconds)), learn_windows=max(4, round(learn_seconds / seconds)),
                   memory_windows=max(4.0, 21600 / seconds))


@dataclass(frozen=True)
class ServiceView:
    """A learned service's normal, for /metrics: the usual latency of its requests at its recent rate."""
    cgroup: str
    direction: str
    usual_mean_ms: float
    usual_p99_ms: float
    learned_windows: int


@dataclass
class _Usual:
    log_mean_ms: float
    log_p99_ms: float
    learned: int = 1


@dataclass
class _Service:
    bins: dict = field(default_factory=dict)        # octave of its request rate -> _Usual
    ring: deque = field(default_factory=deque)      # victim's window or not, the last judged
    idle: int = 0                                   # windows in a row without its requests
    slow_since: float | None = None                 # unix time of the first victim's window of this run
    last_seen: int = 0
    octave: int = 0                                 # of its request rate, its last window with requests


def _mix(old: float, new: float, weight: float) -> float:
    return old + (new - old) * weight


def _octave(rate: float) -> int:
    return int(math.floor(math.log2(max(rate, 1e-3))))


def _held_by_a_limit(cgroup: str, limited: frozenset[str]) -> bool:
    """The cgroup, or one it is in below the root, holds an I/O limit of its own."""
    return bool(limited) and any(a in limited for a in ancestors(cgroup) if a != "/")


def _nearest(bins: dict, octave: int, learned: int) -> _Usual | None:
    ready = [b for b, u in bins.items() if u.learned >= learned]
    if not ready:
        return None
    return bins[min(ready, key=lambda b: (abs(b - octave), -b))]


class ServiceRule:
    def __init__(self, p: ServiceParams = ServiceParams()):
        self.p = p
        self.services: dict[tuple, _Service] = {}      # (device, cgroup, direction)
        # device -> its keys in `services`: a window of one device touches its own services only (a host of a
        # thousand disks judges a thousand devices a window)
        self.of_device: dict[str, set] = {}
        self.flagged: dict[str, dict] = {}             # device -> the figures it was raised with
        self.step = 0

    def judge(self, device: str, counts: dict, seconds: float, unix_time: float,
              words=lambda path: path, host_slowdown: float | None = None,
              limited: frozenset[str] = frozenset()) -> list[Transition]:
        """One window of a device: counts {(cgroup, direction): CgroupCounts since the last window}, over
        `seconds`. words: how a cgroup is said (its systemd unit, v1's root). host_slowdown: the median of the
        host's other disks' latency over their normals in the same window (passive/host.py; None: no host to
        speak of). limited: the cgroups below the root with an I/O limit of their own, on this device or another
        (sources/cgroups.limited_below_root); they and the cgroups in them are not judged, and may still be the
        culprit. Returns the device's transition."""
        self.step += 1
        p = self.p
        # What the host's disks share is the host's (its CPUs starved, its page cache flushing): a service waits
        # on a victim's scale only beyond it, and a window of a slowed host teaches no service its normal.
        shared = max(1.0, host_slowdown or 1.0)
        total_requests = sum(c.requests for c in counts.values())
        total_bytes = sum(c.bytes for c in counts.values())
        worst = None
        for (cgroup, direction), c in counts.items():
            if cgroup in NOT_A_SERVICE or not self._evidence(c, seconds) or _held_by_a_limit(cgroup, limited):
                continue
            key = (device, cgroup, direction)
            s = self.services.get(key)
            if s is None:
                s = self.services[key] = _Service(ring=deque(maxlen=p.windows))
                self.of_device.setdefault(device, set()).add(key)
            s.last_seen, s.idle = self.step, 0
            mean_ms = c.ns / c.requests / 1e6
            p99 = c.hist.quantile_seconds(0.99)
            p99_ms = p99 * 1e3 if p99 else mean_ms
            octave = s.octave = _octave(c.requests / max(seconds, 1e-3))
            usual = _nearest(s.bins, octave, p.learn_windows)
            victim = culprit = None
            if usual is not None:
                usual_mean = math.exp(usual.log_mean_ms)
                culprit = self._culprit(counts, cgroup, total_requests, total_bytes)
                ratio = mean_ms / usual_mean
                victim = ratio >= p.ratio * shared and mean_ms >= p.floor_ms and culprit is not None
                s.ring.append(victim)
                if victim and s.slow_since is None:
                    s.slow_since = unix_time
                if victim and (worst is None or ratio > worst["victim_ratio"]):
                    worst = {"victim": cgroup, "victim_words": words(cgroup), "direction": direction,
                             "victim_ratio": round(ratio, 1), "mean_ms": round(mean_ms, 3),
                             "usual_mean_ms": round(usual_mean, 3), "p99_ms": round(p99_ms, 3),
                             "usual_p99_ms": round(math.exp(usual.log_p99_ms), 3), "requests": c.requests,
                             "since_unix": s.slow_since, "window_seconds": seconds, **culprit,
                             "culprit_words": words(culprit["culprit"]), "host_slowdown": round(shared, 2)}
            if not victim and shared < HOST_SHARED_SLOWDOWN:
                b = s.bins.get(octave)
                if b is None:
                    s.bins[octave] = _Usual(math.log(max(mean_ms, 1e-4)), math.log(max(p99_ms, 1e-4)))
                else:
                    weight = 1.0 / min(b.learned + 1, p.memory_windows)
                    b.log_mean_ms = _mix(b.log_mean_ms, math.log(max(mean_ms, 1e-4)), weight)
                    b.log_p99_ms = _mix(b.log_p99_ms, math.log(max(p99_ms, 1e-4)), weight)
                    b.learned += 1
        for key in self.of_device.get(device, ()):   # the device's services that did nothing this window
            s = self.services[key]
            if s.last_seen != self.step:
                s.idle += 1
        self._bound()
        return self._transitions(device, worst)

    def _evidence(self, c, seconds: float) -> bool:
        p = self.p
        return c.requests >= p.min_requests or (
            c.requests >= p.min_blocked_requests and c.ns / 1e9 >= p.blocked_fraction * seconds)

    def views(self, device: str) -> tuple[ServiceView, ...]:
        """The device's services whose normal is learned (at the octave nearest their last rate), by cgroup."""
        out = []
        for key in sorted(self.of_device.get(device, ())):
            s = self.services[key]
            usual = _nearest(s.bins, s.octave, self.p.learn_windows)
            if usual is not None:
                out.append(ServiceView(key[1], key[2], math.exp(usual.log_mean_ms), math.exp(usual.log_p99_ms),
                                       usual.learned))
        return tuple(out)

    def _culprit(self, counts: dict, victim: str, total_requests: int, total_bytes: int) -> dict | None:
        """The other cgroup doing most of the device's requests or bytes in the window, if it does at least
        culprit_share of either and holds the device at least as long as the victim's own requests do.

        A request's time from submission to completion summed over a window is how many of that cgroup's
        requests were in the device on average (Little's law). A flood that makes a service wait holds the
        device's queue: its requests are the ones in it. A service whose own requests fill the queue waits on
        its own load, whoever does more, smaller requests beside it: in a soak, the root cgroup's writes (a WAL
        appender and the page-cache writeback of a buffered backup) waited over 100x their normal while a batch
        job held to 400 IOPS did 64 % of the device's requests, 4 KiB each. Played again, the batch job's
        requests were 0.3-0.9 in the device on average, the root's 14-45."""
        by_cgroup: dict = {}
        victim_ns = 0
        for (cgroup, direction), c in counts.items():
            if cgroup == victim:
                victim_ns += c.ns
                continue
            a = by_cgroup.setdefault(cgroup, {"requests": 0, "bytes": 0, "ns": 0, "dirs": {}})
            a["requests"] += c.requests
            a["bytes"] += c.bytes
            a["ns"] += c.ns
            a["dirs"][direction] = a["dirs"].get(direction, 0) + c.requests
        best, share = None, 0.0
        for cgroup, a in by_cgroup.items():
            s = max(a["requests"] / total_requests if total_requests else 0.0,
                    a["bytes"] / total_bytes if total_bytes else 0.0)
            if s > share:
                best, share = cgroup, s
        if best is None or share < self.p.culprit_share or by_cgroup[best]["ns"] < victim_ns:
            return None
        a = by_cgroup[best]
        return {"culprit": best, "culprit_share": round(share, 3),
                "culprit_request_share": round(a["requests"] / total_requests, 3) if total_requests else 0.0,
                "culprit_direction": max(a["dirs"], key=a["dirs"].get),
                "culprit_bytes_per_request": round(a["bytes"] / a["requests"]) if a["requests"] else 0,
                "culprit_bytes": a["bytes"]}

    def _state(self, device: str) -> bool | None:
        """Raised while a service of the device has most of its last windows a victim's; cleared when none has
        more than a few (or has been idle a whole ring)."""
        p, raised, undecided = self.p, False, False
        for key in self.of_device.get(device, ()):
            s = self.services[key]
            if s.idle >= p.windows:
                continue
            if len(s.ring) >= p.windows:
                share = sum(s.ring) / len(s.ring)
                if share >= p.raise_fraction:
                    raised = True
                elif share > p.clear_fraction:
                    undecided = True
            elif any(s.ring):
                undecided = True
        return True if raised else None if undecided else False

    def _transitions(self, device: str, worst: dict | None) -> list[Transition]:
        state, severity = self._state(device), severity_of(ALERT_OF_KIND["service"])
        if state is True and worst is not None and device not in self.flagged:
            self.flagged[device] = worst
            return [Transition("service", device, "raised", severity, summary(device, worst), worst)]
        if state is False and device in self.flagged:
            ev = self.flagged.pop(device)
            for key in self.of_device.get(device, ()):
                self.services[key].slow_since = None
            return [Transition("service", device, "cleared", severity,
                               f"{device}: {ev['victim_words']}'s {ev['direction']}s wait about their normal again", ev)]
        if state is False:
            for key in self.of_device.get(device, ()):
                if not any(self.services[key].ring):
                    self.services[key].slow_since = None
        return []

    def _bound(self) -> None:
        over = len(self.services) - self.p.max_services
        if over > 0:
            for key in sorted(self.services, key=lambda k: self.services[k].last_seen)[:over]:
                del self.services[key]
                self.of_device[key[0]].discard(key)

    def to_state(self, device: str) -> dict | None:
        """The device's learned normals, JSON-able, for the state database (not its windows in flight: a restart
        judges afresh). Kept so that a daemon restarted while a flood is under way judges the flood against the
        service's normal instead of learning the flood as its normal."""
        out = []
        for key in sorted(self.of_device.get(device, ())):
            s = self.services[key]
            if s.bins:
                out.append({"cgroup": key[1], "direction": key[2],
                            "bins": [[o, u.log_mean_ms, u.log_p99_ms, u.learned] for o, u in sorted(s.bins.items())]})
        return {"services": out} if out else None

    def load_state(self, device: str, st: dict) -> int:
        """A device's services as to_state saved them; returns how many were loaded. Raises ValueError on a
        damaged or out-of-range entry, having loaded nothing of the device (the caller: learned again)."""
        loaded: dict[tuple, _Service] = {}
        entries = st["services"]
        if not isinstance(entries, list) or len(entries) > self.p.max_services:
            raise ValueError(f"{device}: saved services: not a list of at most {self.p.max_services}")
        for e in entries:
            cgroup, direction, bins = e["cgroup"], e["direction"], e["bins"]
            if not (isinstance(cgroup, str) and 0 < len(cgroup) <= MAX_SAVED_PATH and isinstance(direction, str)
                    and len(direction) <= 16 and isinstance(bins, list) and 0 < len(bins) <= MAX_SAVED_OCTAVES):
                raise ValueError(f"{device}: a saved service is damaged")
            usual = {}
            for octave, log_mean, log_p99, learned in bins:
                if not (isinstance(octave, int) and OCTAVE_RANGE[0] <= octave <= OCTAVE_RANGE[1]
                        and all(isinstance(v, (int, float)) and math.isfinite(v) and abs(v) <= MAX_LOG_MS
                                for v in (log_mean, log_p99))
                        and isinstance(learned, int) and 1 <= learned <= MAX_LEARNED):
                    raise ValueError(f"{device}: {cgroup}'s saved normal is out of range")
                usual[octave] = _Usual(float(log_mean), float(log_p99), learned)
            loaded[(device, cgroup, direction)] = _Service(bins=usual, ring=deque(maxlen=self.p.windows))
        for key, svc in loaded.items():
            self.services[key] = svc
            self.of_device.setdefault(device, set()).add(key)
        self._bound()
        return len(loaded)

    def forget(self, device: str) -> list[Transition]:
        """A device gone: its services forgotten, its alert cleared."""
        for key in self.of_device.pop(device, set()):
            del self.services[key]
        if device in self.flagged:
            ev = self.flagged.pop(device)
            return [Transition("service", device, "cleared", severity_of(ALERT_OF_KIND["service"]),
                               f"{device}: gone", ev)]
        return []


def _size(nbytes: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.0f} {unit}"
    return f"{nbytes:.0f} B"


def summary(device: str, f: dict) -> str:
    """"loop3: postgresql.service's reads wait 23x their normal (p99 14 ms vs 0.6 ms, mean 5.1 ms vs 0.22 ms)
    since 03:12; /batch.scope is doing 91 % of the device's requests (4 KiB writes, 310 MiB/s)"."""
    since = time.strftime("%H:%M", time.localtime(f["since_unix"])) if f.get("since_unix") else "now"
    rate = f["culprit_bytes"] / max(f["window_seconds"], 1e-3) / (1 << 20)
    shared = f.get("host_slowdown") or 1.0
    host = f", where the host's other disks are at {shared:.1f}x theirs" if shared >= 1.5 else ""
    return (f"{device}: {f['victim_words']}'s {f['direction']}s wait {f['victim_ratio']:.0f}x their normal "
            f"(p99 {human_seconds(f['p99_ms'] / 1e3)} vs {human_seconds(f['usual_p99_ms'] / 1e3)}, mean "
            f"{human_seconds(f['mean_ms'] / 1e3)} vs {human_seconds(f['usual_mean_ms'] / 1e3)}){host} since {since}; "
            f"{f['culprit_words']} is doing {f['culprit_request_share']:.0%} of the device's requests "
            f"({_size(f['culprit_bytes_per_request'])} {f['culprit_direction']}s, {rate:,.1f} MiB/s)")
