"""`iowarden replay --passive FILE`: the passive detector offline, over `iowarden iostat --json` lines.

One JSON object per device per interval: `timestamp` (Unix seconds), `disk_device`
and the sysstat keys where known (`r/s`, `w/s`, `rkB/s`, `wkB/s`, `r_await`,
`w_await`, `aqu-sz`, `util`); an optional `model` groups peers (without it, every
device of the file is a peer of every other). A missing key is unknown, not
zero. Intervals of any length: lines of one device are pooled into windows of
at least the detector's window (I/O-weighted, as iostat over the longer interval
would show); a gap longer than `MAX_GAP_WINDOWS` windows starts afresh, so traces
of evening hours only replay as they are.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass

from iowarden.probes.common import ParseError

from iowarden.daemon.passive.detector import PassiveDetector
from iowarden.daemon.passive.values import Flow, PassiveParams, Window

MAX_GAP_WINDOWS = 4
NUMERIC_KEYS = ("r/s", "w/s", "rkB/s", "wkB/s", "r_await", "w_await", "aqu-sz", "util")


@dataclass(frozen=True)
class Line:
    timestamp: float
    device: str
    model: str | None
    values: dict          # sysstat key -> float, known keys only


def parse_lines(path: str, text: str) -> list[Line]:
    """Every line checked: an error names FILE:LINE and the key, nothing is guessed."""
    out, last = [], {}
    for lineno, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ParseError(f"{path}:{lineno}: not a JSON object: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise ParseError(f"{path}:{lineno}: expected a JSON object per line")
        ts, dev = obj.get("timestamp"), obj.get("disk_device")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
            raise ParseError(f"{path}:{lineno}: 'timestamp' must be Unix seconds, got {ts!r}")
        if not isinstance(dev, str) or not dev:
            raise ParseError(f"{path}:{lineno}: 'disk_device' must name the device, got {dev!r}")
        values = {}
        for key in NUMERIC_KEYS:
            v = obj.get(key)
            if v is None:
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ParseError(f"{path}:{lineno}: {key!r} must be a finite number >= 0, got {v!r} "
                                 "(leave an unknown value out)")
            values[key] = float(v)
        if dev in last and ts <= last[dev]:
            raise ParseError(f"{path}:{lineno}: timestamp {ts} of {dev} is not after the one before it: "
                             "lines must be in time order")
        last[dev] = ts
        model = obj.get("model")
        out.append(Line(float(ts), dev, str(model) if model is not None else None, values))
    return out


class _Pool:
    """Lines of one device pooled into one window: rates weighted by time, awaits by I/Os."""

    def __init__(self):
        self.seconds = 0.0
        self.sums: dict = defaultdict(float)
        self.known: set = set()

    def add(self, line: Line, seconds: float) -> None:
        v = line.values
        self.seconds += seconds
        for d, rate, kib, wait in (("r", "r/s", "rkB/s", "r_await"), ("w", "w/s", "wkB/s", "w_await")):
            if wait not in v or (rate not in v and kib not in v):
                continue
            weight = v[rate] * seconds if rate in v else v[kib] * seconds
            self.known.add(d)
            self.sums[d + "weight"] += weight
            self.sums[d + "wait"] += v[wait] * weight
            self.sums[d + "time"] += seconds
            for key in (rate, kib):
                if key in v:
                    self.sums[key] += v[key] * seconds
                    self.known.add(key)
        for key in ("aqu-sz", "util"):
            if key in v:
                self.sums[key] += v[key] * seconds
                self.sums[key + "time"] += seconds

    def window(self, device: str, end: float) -> Window:
        flows = {}
        for d, name, rate, kib in (("r", "read", "r/s", "rkB/s"), ("w", "write", "w/s", "wkB/s")):
            if d not in self.known:
                continue
            t = self.sums[d + "time"]
            await_ms = self.sums[d + "wait"] / self.sums[d + "weight"] if self.sums[d + "weight"] else 0.0
            flows[name] = Flow(self.sums[rate] / t if rate in self.known else None,
                               self.sums[kib] / t if kib in self.known else None, await_ms)
        extra = {k: self.sums[k] / self.sums[k + "time"] if self.sums[k + "time"] else None
                 for k in ("aqu-sz", "util")}
        return Window(device, end, self.seconds, flows, extra["aqu-sz"], extra["util"])


class WindowPooler:
    """Lines pooled into windows as they come, in time order (per device): a window is given out once it holds
    at least `window_seconds`; after a gap of more than MAX_GAP_WINDOWS windows (or typical intervals) a
    device starts afresh. A replay that reads its lines in chunks (a month of history from a server) feeds
    them here chunk by chunk and holds no more than a window of each device."""

    def __init__(self, window_seconds: float, typical_seconds: float | None = None):
        self.window_seconds = window_seconds
        self.typical_seconds = typical_seconds or window_seconds
        self.pools: dict[str, _Pool] = {}
        self.prev: dict[str, float] = {}

    def add(self, line: Line) -> Window | None:
        gap = line.timestamp - self.prev.get(line.device, -math.inf)
        self.prev[line.device] = line.timestamp
        if gap > MAX_GAP_WINDOWS * max(self.window_seconds, self.typical_seconds):
            self.pools.pop(line.device, None)   # after a gap the first line's interval is the usual one
            seconds = self.typical_seconds
        else:
            seconds = gap
        pool = self.pools.setdefault(line.device, _Pool())
        pool.add(line, seconds)
        if pool.seconds >= self.window_seconds * 0.999:
            del self.pools[line.device]
            return pool.window(line.device, line.timestamp)
        return None


def windows_of(lines: list[Line], window_seconds: float) -> list[tuple[float, list[Window]]]:
    """Batches of windows that end together, in time order."""
    pooler = WindowPooler(window_seconds, _typical_interval(lines))
    batches: dict[float, list[Window]] = defaultdict(list)
    for line in sorted(lines, key=lambda x: (x.timestamp, x.device)):
        w = pooler.add(line)
        if w is not None:
            batches[line.timestamp].append(w)
    return sorted(batches.items())


def _typical_interval(lines: list[Line]) -> float | None:
    last: dict[str, float] = {}
    gaps = []
    for line in lines:
        if line.device in last:
            gaps.append(line.timestamp - last[line.device])
        last[line.device] = line.timestamp
    gaps.sort()
    return gaps[len(gaps) // 2] if gaps else None


def trace_peer_groups(lines: list[Line]) -> list[tuple[str, ...]]:
    """A trace's peers: the drives of one model (a trace has no device view; the daemon's groups are
    part.peer_groups, from the arrays and models the device view has)."""
    by_model: dict = defaultdict(set)
    for line in lines:
        by_model[line.model].add(line.device)
    return [tuple(sorted(devs)) for devs in by_model.values() if len(devs) >= 2]


def replay_passive(lines: list[Line], params: PassiveParams = PassiveParams()) -> list[dict]:
    """The alert intervals: {"device", "start", "end", "severity", "kind"} (end None while open)."""
    return replay(lines, params)[0]


def replay(lines: list[Line], params: PassiveParams = PassiveParams(),
           record_blocks: bool = False) -> tuple[list[dict], PassiveDetector]:
    """The alert intervals, and the detector as the replay left it (its views, its evidence; with
    record_blocks, every block of peer evidence it closed, for tuning)."""
    run = PassiveReplay(params, trace_peer_groups(lines), record_blocks)
    for end, batch in windows_of(lines, params.window_seconds):
        run.observe(end, batch)
    return run.intervals, run.detector


class PassiveReplay:
    """One host's detector over its windows, batch by batch in time order, and the alert intervals it
    raised: {"device", "start", "end", "severity", "kind", "summary"} (end None while open)."""

    def __init__(self, params: PassiveParams, groups: list[tuple[str, ...]], record_blocks: bool = False):
        self.detector = PassiveDetector(params, record_blocks=record_blocks)
        self.groups = groups
        self.intervals: list[dict] = []
        self._open: dict = {}

    def feed(self, pooler: WindowPooler, lines: list[Line], on_window=None) -> None:
        """Lines in time order (a chunk of them; the next chunk after it) pooled into windows and judged in
        batches of the windows that end together; on_window sees each window as it is made."""
        batch_end, batch = None, []
        for line in lines:
            if batch and line.timestamp != batch_end:
                self.observe(batch_end, batch)
                batch = []
            w = pooler.add(line)
            if w is not None:
                batch_end = line.timestamp
                batch.append(w)
                if on_window is not None:
                    on_window(w)
        if batch:
            self.observe(batch_end, batch)

    def observe(self, end: float, batch: list[Window]) -> None:
        for t in self.detector.observe(batch, self.groups):
            key = (t.device, t.kind)
            if t.state == "raised":
                self._open[key] = {"device": t.device, "start": end, "end": None, "severity": t.severity,
                                   "kind": t.kind, "summary": t.summary}
                self.intervals.append(self._open[key])
            elif t.state == "cleared" and key in self._open:
                self._open.pop(key)["end"] = end


def explain(detector: PassiveDetector, intervals: list[dict]) -> list[dict]:
    """Per device, the statistics the detector judged, for `replay --passive --explain`: against its peers
    the last block's latency over theirs at comparable load, the host's stray it is measured in, the blocks
    it sat above them, the accumulated evidence (now and at its peak) against the threshold; against itself
    the last window's latency over its normal at that load; and what it was named for."""
    threshold = detector.evidence.p.threshold
    named = defaultdict(set)
    for i in intervals:
        named[i["device"]].add(i["kind"])
    rows = []
    for v in detector.views():
        e = v.evidence
        rows.append({
            "device": v.device,
            "peer_ratio": round(e.ratio, 3) if e and e.ratio is not None else None,
            "stray_percent": round((math.exp(e.scale) - 1) * 100, 1) if e and e.scale is not None else None,
            "blocks_above": e.blocks_above if e else None, "blocks": e.blocks if e else None,
            "evidence": round(e.score, 1) if e else None, "evidence_peak": round(e.peak_score, 1) if e else None,
            "threshold": threshold,
            "self_ratio": round(max(v.slowdown_ratio.values()), 2) if v.slowdown_ratio else None,
            "named": sorted(named[v.device]),
            # the knee of its learned curve as the recording left it, and the headroom of the last hour's peak
            "knee": {d: {"load": round(k.load, 1) if k.load is not None else None, "unit": k.unit,
                         "why_none": k.why_none} for d, k in sorted(v.knee.items())},
            "headroom_ratio": {d: round(r, 2) for d, r in sorted(v.headroom_ratio.items())},
            # the burst bucket it learned from a fall and a recovery, and its balance as the recording ends
            "burst": None if v.burst is None else {
                "burst_iops": round(v.burst.bucket.burst_iops), "baseline_iops": round(v.burst.bucket.baseline_iops),
                "capacity_ios": round(v.burst.bucket.capacity_ios),
                "balance_ratio": None if v.burst.balance_ratio is None else round(v.burst.balance_ratio, 3)},
        })
    return rows
