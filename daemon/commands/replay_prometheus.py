"""`iowarden replay --prometheus URL`: what the passive detector would have said on the disk history a fleet
already keeps, node_exporter's `node_disk_*` counters in Prometheus (or Thanos, Mimir, VictoriaMetrics).

Per host (an `instance`), one detector as the daemon on that host would run, over the windows `iowarden
iostat` shows: the server gives the counters' raw samples, and each pair of consecutive scrapes becomes one
line by iostat's own formulas (a counter reset at a reboot or a re-created device counts its new value, as
Prometheus' rate() takes it; scrapes too far apart are a gap, and the next window starts afresh), pooled into
windows as `replay --passive` pools a file's lines. So the same history gives the same verdicts from the
server as from `iostat --json` lines, whatever the server's own rate() extrapolates. A host's disks are peers
by model where `node_disk_info` has one, else by kind of device (sd, nvme, vd, xvd, loop: a host's disks of
one kind are most often of one model); md and dm devices have no peers. Beside it, for the same window, when
node-mixin's NodeDiskIOSaturation (queue above 10 for 30 minutes) would have fired, evaluated by the server.

A month of a fleet is read host by host and chunk by chunk: what is held is one host's detector and one
chunk of its series. Ctrl-C prints what was replayed so far and says where it stopped.
"""
from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field

from iowarden.probes.common import ParseError, printable

from iowarden.daemon.commands.args import instant_seconds
from iowarden.daemon.commands.prometheus_api import PrometheusAPI, TooManyPoints, read_credential
from iowarden.daemon.commands.replay_plots import AwaitTrace
from iowarden.daemon.commands.tables import print_lines as _print, table, when as _when
from iowarden.daemon.passive.replay import Line, PassiveReplay, WindowPooler
from iowarden.daemon.passive.values import PassiveParams

# node_exporter's counters of /proc/diskstats that iostat's columns are made of (by iostat's formulas, over
# each pair of scrapes: Deltas)
COUNTERS = {"reads": "node_disk_reads_completed_total", "writes": "node_disk_writes_completed_total",
            "read_bytes": "node_disk_read_bytes_total", "written_bytes": "node_disk_written_bytes_total",
            "read_seconds": "node_disk_read_time_seconds_total", "write_seconds": "node_disk_write_time_seconds_total",
            "io_seconds": "node_disk_io_time_seconds_total",
            "weighted_seconds": "node_disk_io_time_weighted_seconds_total"}
COUNTER_OF = {v: k for k, v in COUNTERS.items()}
GAP_SCRAPES = 3.0   # two samples further apart than this many scrape intervals span a gap: no window from them
PRESENCE = "node_disk_io_time_seconds_total"

# node-mixin's disk alert as it ships (node_exporter's docs/node-mixin: alerts.libsonnet, config.libsonnet)
NODE_MIXIN_ALERT = "NodeDiskIOSaturation"
NODE_MIXIN_THRESHOLD = 10.0
NODE_MIXIN_FOR_SECONDS = 1800.0
NODE_MIXIN_RATE = "5m"
NODE_MIXIN_DEVICES = "(/dev/)?(mmcblk.p.+|nvme.+|rbd.+|sd.+|vd.+|xvd.+|dm-.+|md.+|dasd.+)"
NODE_MIXIN_STEP_SECONDS = 60.0   # its rule is evaluated every minute or so; firing starts 30 minutes in

PARTITION = re.compile(r"^((sd|vd|xvd|hd)[a-z]+\d+|nvme\d+n\d+p\d+|mmcblk\d+p\d+)$")
KIND = re.compile(r"^(sd|vd|xvd|hd|nvme|loop|mmcblk)")


@dataclass
class HostReplay:
    instance: str
    devices: dict                     # kernel name -> its peer key ("model:X", "kind:sd", or None: no peers)
    replay: PassiveReplay
    until: float | None = None        # the end of the last window replayed
    node_mixin: list = field(default_factory=list)   # {"device", "start", "end"}
    points: int = 0
    trace: AwaitTrace | None = None   # with --plot: the windows' awaits, bucketed


def selector(instance: str, extra: str = "") -> str:
    """A PromQL selector for one instance: its value quoted as a PromQL string (backslash and quote escaped)."""
    quoted = instance.replace("\\", "\\\\").replace('"', '\\"')
    return "{" + f'instance="{quoted}"' + (f", {extra}" if extra else "") + "}"


def peer_key(device: str, model: str | None) -> str | None:
    """Whom a disk is compared with on its host: disks of its model, or of its kind where no model is known;
    an md array or a dm device with nobody (its members are the disks)."""
    if device.startswith(("md", "dm-")):
        return None
    if model:
        return f"model:{model}"
    m = KIND.match(device)
    return f"kind:{m.group(1)}" if m else None


def peer_groups(devices: dict) -> list[tuple[str, ...]]:
    by_key: dict = {}
    for name, key in devices.items():
        if key is not None:
            by_key.setdefault(key, []).append(name)
    return [tuple(sorted(v)) for v in by_key.values() if len(v) >= 2]


class Deltas:
    """Raw counter samples, chunk by chunk in time order, into iostat's lines: for each device and each pair of
    consecutive scrapes, the counters' increases over the time between them (iostat -x's formulas). A counter
    that went down was reset (a reboot, a re-created device) and its increase is its new value, as Prometheus'
    rate() takes it; two scrapes further apart than GAP_SCRAPES intervals span a gap and give no line (the
    window after it starts afresh, as a restarted iostat's would)."""

    def __init__(self, devices: dict, gap_seconds: float):
        self.devices, self.gap_seconds = devices, gap_seconds
        self.last: dict = {}    # device -> (t, {counter: value}) of its last whole scrape

    def lines(self, series: list[tuple[dict, list]]) -> list[Line]:
        scrapes: dict = {}
        for labels, points in series:
            dev, counter = labels.get("device"), COUNTER_OF.get(labels.get("__name__"))
            if dev not in self.devices or counter is None:
                continue
            for t, v in points:
                scrapes.setdefault(dev, {}).setdefault(t, {})[counter] = v
        out = []
        for dev, by_time in scrapes.items():
            for t in sorted(by_time):
                now = by_time[t]
                prev = self.last.get(dev)
                if prev is not None and t <= prev[0]:
                    continue        # a sample the last chunk already had (a range's closed left edge)
                if len(now) < len(COUNTERS):
                    continue        # a scrape that lost some of its series: the pair after it waits for a whole one
                self.last[dev] = (t, now)
                if prev is None or t - prev[0] > self.gap_seconds:
                    continue
                out.append(Line(t, dev, self.devices[dev], iostat_values(prev[1], now, t - prev[0])))
        out.sort(key=lambda x: (x.timestamp, x.device))
        return out


def iostat_values(before: dict, after: dict, seconds: float) -> dict:
    """iostat -x's columns from two scrapes of the counters `seconds` apart (a reset counts its new value)."""
    d = {k: (after[k] - before[k]) if after[k] >= before[k] else after[k] for k in COUNTERS}
    out = {"r/s": d["reads"] / seconds, "w/s": d["writes"] / seconds,
           "rkB/s": d["read_bytes"] / 1024 / seconds, "wkB/s": d["written_bytes"] / 1024 / seconds,
           "aqu-sz": d["weighted_seconds"] / seconds, "util": min(100.0, 100 * d["io_seconds"] / seconds)}
    # as iostat: 0 where no request completed (a flow without requests is no evidence either way)
    out["r_await"] = 1000 * d["read_seconds"] / d["reads"] if d["reads"] else 0.0
    out["w_await"] = 1000 * d["write_seconds"] / d["writes"] if d["writes"] else 0.0
    return out


def firing_intervals(points: list[tuple[float, float]], step: float, threshold: float = NODE_MIXIN_THRESHOLD,
                     for_seconds: float = NODE_MIXIN_FOR_SECONDS) -> list[tuple[float, float]]:
    """When a rule `value > threshold` with `for: for_seconds` fires, evaluated at these points: from the
    first point the condition has held for `for_seconds` to the last point it holds (a missing point ends a
    run, as a rule's pending state ends when its series is absent)."""
    out, run_start, last = [], None, None
    for t, v in points:
        if v > threshold and run_start is not None and t - last <= step * 1.5:
            last = t
        elif v > threshold:
            if run_start is not None and last - run_start >= for_seconds:
                out.append((run_start + for_seconds, last))
            run_start = last = t
        else:
            if run_start is not None and last - run_start >= for_seconds:
                out.append((run_start + for_seconds, last))
            run_start = last = None
    if run_start is not None and last - run_start >= for_seconds:
        out.append((run_start + for_seconds, last))
    return out


class Progress:
    """One line on a terminal's stderr, rewritten: off when stderr is not a terminal (a pipe, a log)."""

    def __init__(self, enabled: bool):
        self.enabled, self.shown = enabled, False

    def say(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write("\r" + text[:100].ljust(100))
            sys.stderr.flush()
            self.shown = True

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


def _devices(api: PrometheusAPI, instance: str, start: float, end: float) -> dict:
    found = api.series(PRESENCE + selector(instance), start, end)
    names = sorted({s.get("device") for s in found if isinstance(s.get("device"), str)})
    names = [n for n in names if not PARTITION.match(n)]
    models = {}
    for s in api.series("node_disk_info" + selector(instance), start, end):
        if s.get("device") in names and s.get("model"):
            models[s["device"]] = s["model"]
    return {n: peer_key(n, models.get(n)) for n in names}


def _range_query(api: PrometheusAPI, expr: str, start: float, end: float, step: float, progress, said: str):
    """One expression over the whole window, chunk by chunk, yielded per chunk: fewer points per query
    while the server says they are too many."""
    t = start
    while t <= end:
        chunk = api.chunks(t, end, step)[0]
        try:
            yield chunk, api.query_range(expr, chunk[0], chunk[1], step)
        except TooManyPoints:
            if not api.fewer_points():
                raise
            continue
        progress.say(f"{said}: {_when(chunk[1])}")
        t = chunk[1] + step


def replay_host(api: PrometheusAPI, instance: str, start: float, end: float, scrape: float,
                params: PassiveParams, progress: Progress, out: list, plot: bool = False) -> HostReplay:
    """The host's detector over its window, chunk by chunk; the HostReplay is appended to `out` before it
    starts, so an interrupted replay still has what was judged."""
    devices = _devices(api, instance, start, end)
    host = HostReplay(instance, devices, PassiveReplay(params, peer_groups(devices)),
                      trace=AwaitTrace(start, end) if plot else None)
    out.append(host)
    if not devices:
        return host
    names = "|".join(sorted(COUNTERS.values()))
    sel = selector(instance, f'__name__=~"{names}"')
    deltas = Deltas(devices, GAP_SCRAPES * scrape)
    pooler = WindowPooler(params.window_seconds, scrape)
    # the scrape before the window's start: the first line ends at the first scrape in the window
    t = start - 2 * scrape
    while t < end:
        chunk = api.chunks(t, end, scrape, series=len(COUNTERS) * len(devices))[0]
        try:
            series = api.raw_samples(sel, chunk[0], chunk[1])
        except TooManyPoints:
            if not api.fewer_points():
                raise
            continue
        lines = deltas.lines(series)
        host.points += len(lines)
        host.replay.feed(pooler, lines, host.trace.add if host.trace is not None else None)
        host.until = chunk[1]
        progress.say(f"{instance}: {_when(chunk[1])}")
        t = chunk[1]
    mixin = 'rate(node_disk_io_time_weighted_seconds_total{sel}[{r}])'.replace(
        "{sel}", selector(instance, f'device=~"{NODE_MIXIN_DEVICES}"')).replace("{r}", NODE_MIXIN_RATE)
    runs: dict = {}
    for _, series in _range_query(api, mixin, start, end, NODE_MIXIN_STEP_SECONDS, progress,
                                  f"{instance} node-mixin"):
        for labels, points in series:
            runs.setdefault(labels.get("device", "?"), []).extend(points)
    for dev, points in sorted(runs.items()):
        for a, b in firing_intervals(sorted(points), NODE_MIXIN_STEP_SECONDS):
            host.node_mixin.append({"device": dev, "start": a, "end": b})
    return host


def cmd_replay_prometheus(args) -> int:
    token = read_credential(args.bearer_token_file, "--bearer-token-file") if args.bearer_token_file else None
    basic = None
    if args.basic_auth_user:
        if not args.password_file:
            raise ParseError("--basic-auth-user needs --password-file FILE (a password is never taken on the "
                             "command line, where `ps` shows it)")
        basic = (args.basic_auth_user, read_credential(args.password_file, "--password-file"))
    api = PrometheusAPI(args.prometheus, timeout_seconds=args.timeout, retries=args.retries, bearer_token=token,
                        basic_auth=basic, max_points=args.max_points)
    now = time.time()
    start, end = instant_seconds(args.start, now), instant_seconds(args.end, now)
    if end <= start:
        raise ParseError(f"--from {args.start} is not before --to {args.end}")
    params = PassiveParams(window_seconds=args.window) if args.window else PassiveParams()
    instances = args.instance or api.label_values("instance", PRESENCE, start, end)
    if not instances:
        raise ParseError(f"no node_exporter disk series ({PRESENCE}) at {api.shown} from {_when(start)} to "
                         f"{_when(end)}: is the window right, and node_exporter's diskstats collector on?")
    out_dir = None
    if args.plot:
        from iowarden.daemon.commands.characterize_plots import available
        from iowarden.daemon.commands.outdir import OutDir, OutDirRefused
        if not available():
            raise ParseError("--plot needs matplotlib (for the .deb or .rpm, the distro's python3-matplotlib; for a "
                             "pip install, pip install 'iowarden[plots]')")
        try:
            out_dir = OutDir(args.plot)
        except OutDirRefused as exc:
            raise ParseError(f"--plot {exc}") from None
    progress = Progress(sys.stderr.isatty() and not args.json)
    hosts: list[HostReplay] = []
    interrupted = False
    try:
        for i, instance in enumerate(instances, 1):
            progress.say(f"{instance} ({i} of {len(instances)})")
            replay_host(api, instance, start, end, args.scrape_interval, params, progress, hosts,
                        plot=out_dir is not None)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.done()
    empty = [h.instance for h in hosts if not h.points]
    if not interrupted and len(empty) == len(hosts):
        raise ParseError(f"no disk counters for {', '.join(printable(x, 80) for x in empty[:5])}"
                         f"{' and more' if len(empty) > 5 else ''} at {api.shown} from {_when(start)} to "
                         f"{_when(end)}: nothing to replay (is the instance's name as Prometheus labels it?)")
    plots = []
    if out_dir is not None:
        from iowarden.daemon.commands import replay_plots
        with out_dir:
            for h in hosts:
                plots += replay_plots.write_plots(out_dir, h.instance, h.trace, h.replay.groups, h.replay.intervals)
    if args.json:
        _print(json.dumps({"from": start, "to": end, "window_seconds": params.window_seconds, "interrupted": interrupted,
                           "hosts": [_host_json(h) for h in hosts], "plots": plots}))
    else:
        _print(_report(hosts, start, end, interrupted))
        if plots:
            _print("plots: " + ", ".join(plots))
    return 130 if interrupted else 0


def _host_json(h: HostReplay) -> dict:
    return {"instance": h.instance, "devices": sorted(h.devices), "until": h.until,
            "peers": [list(g) for g in h.replay.groups],
            "alerts": [{k: i[k] for k in ("device", "kind", "start", "end", "severity", "summary")}
                       for i in h.replay.intervals],
            "node_mixin": {"alert": NODE_MIXIN_ALERT, "firings": h.node_mixin}}


def _report(hosts: list[HostReplay], start: float, end: float, interrupted: bool) -> str:
    out = []
    for h in hosts:
        named = sorted({i["device"] for i in h.replay.intervals})
        out.append(f"{printable(h.instance, 120)}: {len(h.devices)} disks, "
                   f"{_when(start)} to {_when(h.until) if h.until else _when(start)}"
                   + ("" if h.points else ": no disk counters in the window"))
        if h.replay.intervals:
            out.append(table(["device", "kind", "start", "end", "severity", "evidence"],
                             [[i["device"], i["kind"], _when(i["start"]), _when(i["end"]) if i["end"] else "open",
                               i["severity"], i["summary"]] for i in h.replay.intervals]))
        mixin_disks = sorted({f["device"] for f in h.node_mixin})
        out.append(f"  node-mixin {NODE_MIXIN_ALERT}: {len(h.node_mixin)} firings on {len(mixin_disks)} disks"
                   f"{' (' + ', '.join(mixin_disks[:8]) + ')' if mixin_disks else ''}; iowarden: "
                   f"{len(h.replay.intervals)} alerts on {len(named)} disks"
                   f"{' (' + ', '.join(named[:8]) + ')' if named else ''}")
    firings = sum(len(h.node_mixin) for h in hosts)
    alerts = sum(len(h.replay.intervals) for h in hosts)
    out.append(f"{len(hosts)} hosts: node-mixin {firings} firings, iowarden {alerts} alerts")
    if interrupted:
        last = hosts[-1] if hosts else None
        out.append("interrupted: " + (f"{printable(last.instance, 120)} was replayed up to "
                                      f"{_when(last.until)}" if last and last.until else "nothing replayed")
                   + "; the hosts after it were not read")
    return "\n".join(out)
