"""Other work on a volume: its users waiting many times their usual latency because the device carries far more
than its usual load.

The device's own curve (passive/curve.py) judges latency at the load the device carries, so a device flooded
by a neighbour (a batch job's 4k random writes at queue depth 16) is slow only along its curve, and is
rightly not DeviceSlow: the device is healthy. But the database on it waits 10-30 times as long as it
usually does, and iowarden's probes are deferred as "device busy" for as long as the flood lasts. This rule
says that: per device, the usual load (in IOPS and in bytes) and the usual latency of each direction, each a
slow moving average of its logarithm over the windows that were not contended, and a window is contended
when a direction's latency is at least `ratio` times its usual and the device carries at least `load` times
its usual load. Most of `windows` windows contended raise it; few clear it. Who did the extra I/O is the
cgroup source's to say (core.passive_causes); this rule only says the victim and how badly it is hurt.

A throttle (latency up, load down) and a slow device (latency up at the usual load) are not contention, and
a load that doubles with latency along the curve is not either: only a flood that makes the users wait many
times their usual is. Pure, no clock; the detector feeds it its windows.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from iowarden.daemon.alert_kinds import severity_of
from iowarden.daemon.passive.values import ALERT_OF_KIND, Transition


@dataclass(frozen=True)
class ContentionParams:
    ratio: float = 8.0          # a direction's latency over its usual: what its users feel
    load: float = 2.0           # the device's load (IOPS or bytes) over its usual: someone else's work added
    windows: int = 20           # 5 minutes of 15 s windows
    raise_fraction: float = 0.8
    clear_fraction: float = 0.2
    learn_windows: int = 240    # an hour of windows learned before anything is judged
    memory_windows: float = 1440.0   # the averages' time constant: six hours of 15 s windows

    @classmethod
    def for_windows_of(cls, seconds: float) -> "ContentionParams":
        """The same minutes and hours in windows of this length ([passive] window_seconds)."""
        return cls(windows=max(4, round(300 / seconds)), learn_windows=max(4, round(3600 / seconds)),
                   memory_windows=max(4.0, 21600 / seconds))


@dataclass
class _Usual:
    """A device's usual load and latency, as averages of their logarithms."""
    log_iops: float | None = None
    log_bytes: float | None = None
    log_await: dict = field(default_factory=dict)   # direction -> log ms
    learned: int = 0
    ring: deque = field(default_factory=deque)      # contended or not, the last windows judged


def _mix(old: float | None, new: float, weight: float) -> float:
    return new if old is None else old + (new - old) * weight


class ContentionRule:
    def __init__(self, p: ContentionParams = ContentionParams()):
        self.p = p
        self.usual: dict[str, _Usual] = {}

    def judge(self, device: str, flows: dict, seconds_flows: dict) -> tuple[bool | None, dict]:
        """One window of a device: `flows` are the directions with evidence (direction -> Flow), `seconds_flows`
        every direction of the window. Returns (whether most recent windows were contended, None while it cannot
        say; the window's figures for a summary)."""
        u = self.usual.setdefault(device, _Usual(ring=deque(maxlen=self.p.windows)))
        iops = sum(f.iops or 0.0 for f in seconds_flows.values())
        kib = sum(f.kib_per_second or 0.0 for f in seconds_flows.values())
        if not flows or iops <= 0:
            return self._state(u), {}
        load_ratio = max(_over(iops, u.log_iops), _over(kib, u.log_bytes))
        victims = {d: f.await_ms / math.exp(u.log_await[d]) for d, f in flows.items()
                   if d in u.log_await and f.await_ms > 0}
        worst = max(victims, key=victims.get) if victims else None
        judged = u.learned >= self.p.learn_windows
        contended = judged and worst is not None and victims[worst] >= self.p.ratio and load_ratio >= self.p.load
        if judged:
            u.ring.append(contended)
        # learned from the windows that were not contended (else a flood becomes the usual within hours)
        if not contended:
            weight = 1.0 / min(u.learned + 1, self.p.memory_windows)
            u.log_iops = _mix(u.log_iops, math.log(max(iops, 1e-3)), weight)
            u.log_bytes = _mix(u.log_bytes, math.log(max(kib, 1e-3)), weight)
            for d, f in flows.items():
                u.log_await[d] = _mix(u.log_await.get(d), math.log(max(f.await_ms, 1e-3)), weight)
            u.learned += 1
        figures = {}
        if worst is not None and judged:
            figures = {"direction": worst, "await_ms": round(flows[worst].await_ms, 3),
                       "usual_await_ms": round(math.exp(u.log_await[worst]), 3), "victim_ratio": round(victims[worst], 1),
                       "load_ratio": round(load_ratio, 1), "iops": round(iops, 1),
                       "usual_iops": round(math.exp(u.log_iops), 1)}
        return self._state(u), figures

    def _state(self, u: _Usual) -> bool | None:
        if len(u.ring) < self.p.windows:
            return None
        share = sum(u.ring) / len(u.ring)
        return True if share >= self.p.raise_fraction else False if share <= self.p.clear_fraction else None


def _over(value: float, usual_log: float | None) -> float:
    return value / math.exp(usual_log) if usual_log is not None else 0.0


def summary(device: str, f: dict) -> str:
    """"loop3: reads wait 14x their usual (42 ms vs 3.0 ms) while it carries 6.1x its usual load (1,830 IOPS
    vs 300)"."""
    return (f"{device}: {f['direction']}s wait {f['victim_ratio']:.0f}x their usual ({f['await_ms']:,.1f} ms vs "
            f"{f['usual_await_ms']:,.1f} ms) while it carries {f['load_ratio']:.1f}x its usual load "
            f"({f['iops']:,.0f} IOPS vs {f['usual_iops']:,.0f}): other work floods the device")


def transitions(rule: ContentionRule, w, flows: dict, d) -> list[Transition]:
    """The rule's verdict on one window as the detector's transitions; `d` is the detector's record of the
    device (its kinds raised, its last traffic). A device already slow on its own curve is that alert's."""
    if w.own_probe:   # iowarden's own probe is not someone else's work
        return []
    flagged = d.flagged
    if flows:   # the self rule, set aside while this one is raised, would have noted it
        d.last_traffic = w.end
    state, figures = rule.judge(w.device, flows, w.flows)
    severity = severity_of(ALERT_OF_KIND["contention"])
    if state is True and figures and "contention" not in flagged and "self" not in flagged:
        flagged["contention"] = figures
        return [Transition("contention", w.device, "raised", severity, summary(w.device, figures), figures)]
    if state is False and "contention" in flagged:
        ev = flagged.pop("contention")
        return [Transition("contention", w.device, "cleared", severity,
                           f"{w.device}: its users wait about their usual again", ev)]
    return []
