"""`iowarden replay`: the detectors run over recorded series (probe results as CSV, diskstats traces)."""
from __future__ import annotations


import json
import math


from iowarden.probes.common import ParseError, read_bounded


from iowarden.daemon.commands.tables import table

from iowarden.daemon.commands.tables import print_lines as _print, when as _when


# What replay reads of a recording: a regular file (a FIFO would block it for ever, /dev/zero never end), at
# most this many bytes, checked as it is read. A week of `iostat --json 15` over 10 disks is about 160 MB.
REPLAY_MAX_BYTES = 512 << 20


def read_recording(path: str) -> str:
    try:
        return read_bounded(path, REPLAY_MAX_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParseError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None


REPLAY_METRICS = {"iops": "read_iops", "bandwidth": "read_bw_bytes", "latency": "clat_p99_seconds"}


def read_series_csv(path: str) -> list[tuple[float, float]]:
    """`timestamp,value` rows (a header line is allowed); timestamps as Unix seconds or ISO 8601.

    Every value must be a finite number and timestamps must increase: a NaN, an
    infinity or a row out of order is an error naming its line, never a silent 0,
    an alert, or a different result.
    """
    from datetime import datetime
    out = []
    lines = read_recording(path).splitlines()
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if lineno == 1 and parts[0].lower() in ("timestamp", "time", "ts"):
            continue
        try:
            if len(parts) != 2:
                raise ValueError("expected two columns: timestamp,value")
            try:
                ts = float(parts[0])
            except ValueError:
                ts = datetime.fromisoformat(parts[0]).timestamp()
            value = float(parts[1])
            if not (math.isfinite(ts) and math.isfinite(value)):
                raise ValueError(f"{parts[1] if math.isfinite(ts) else parts[0]!r} is not a finite number "
                                 "(leave a missing probe out rather than writing NaN)")
            if out and ts <= out[-1][0]:
                raise ValueError(f"timestamp {parts[0]} is not after the one before it: rows must be in time order")
            out.append((ts, value))
        except ValueError as exc:
            raise ParseError(f"{path}:{lineno}: {exc}") from None
    return out


def cmd_replay(args) -> int:
    if args.passive and getattr(args, "prometheus", None):
        raise ParseError("replay reads --passive FILE or --prometheus URL, not both")
    if getattr(args, "prometheus", None):
        from iowarden.daemon.commands.replay_prometheus import cmd_replay_prometheus
        return cmd_replay_prometheus(args)
    if args.passive:
        return _replay_passive(args)
    if not args.csv:
        raise ParseError("replay needs a CSV of probe values, --passive FILE of `iowarden iostat --json` lines, "
                         "or --prometheus URL of a server keeping node_exporter's disk counters")
    from iowarden.daemon.verdicts.detect import DetectorParams, replay
    series = read_series_csv(args.csv)
    params = DetectorParams(warmup_probes=args.warmup) if args.warmup else DetectorParams()
    intervals = replay(series, REPLAY_METRICS[args.metric], params)
    if args.json:
        _print(json.dumps(intervals))
    else:
        _print(table(["start", "end", "severity"], [[_when(i["start"]), _when(i["end"]) if i["end"] is not None
                                                      else "open", i["severity"]] for i in intervals]) if intervals
               else f"no alerts in {len(series)} values")
    return 0


def _headroom_said(row: dict) -> str:
    """'2.1x of 1,800 IOPS (read)', or why there is no knee: no figure is better than an invented one."""
    for direction, k in row["knee"].items():
        ratio = row["headroom_ratio"].get(direction)
        unit = "IOPS" if k["unit"] == "iops" else "KiB/s"
        if k["load"] is not None:
            return (f"{ratio:.1f}x of " if ratio is not None else "knee ") + f"{k['load']:,.0f} {unit} ({direction})"
        return f"no knee ({direction}): {k['why_none']}"
    return "-"


def _burst_said(row: dict) -> str:
    """'300 -> 2,900 IOPS, 4,680,000 I/Os, 40 % left' where a bucket was learned from a fall and a recovery."""
    b = row.get("burst")
    if not b:
        return "-"
    left = f", {b['balance_ratio']:.0%} left" if b.get("balance_ratio") is not None else ""
    return f"{b['baseline_iops']:,} -> {b['burst_iops']:,} IOPS, {b['capacity_ios']:,} I/Os{left}"


def _replay_passive(args) -> int:
    from iowarden.daemon.passive.values import PassiveParams
    from iowarden.daemon.passive.replay import explain, parse_lines, replay
    lines = parse_lines(args.passive, read_recording(args.passive))
    params = PassiveParams(window_seconds=args.window) if args.window else PassiveParams()
    intervals, detector = replay(lines, params)
    if args.json:
        found = [{k: i[k] for k in ("device", "start", "end", "severity", "kind")} for i in intervals]
        _print(json.dumps({"alerts": found, "explain": explain(detector, intervals)} if args.explain else found))
        return 0
    if args.explain:
        _print(table(["device", "vs peers", "stray", "blocks above", "evidence", "peak", "threshold", "vs own normal",
                      "headroom", "burst bucket", "named"],
                     [[r["device"], f"{r['peer_ratio']:.3f}x" if r["peer_ratio"] else "-",
                       f"{r['stray_percent']:g} %" if r["stray_percent"] is not None else "-",
                       f"{r['blocks_above']} of {r['blocks']}" if r["blocks"] is not None else "-",
                       r["evidence"], r["evidence_peak"], r["threshold"],
                       f"{r['self_ratio']:.2f}x" if r["self_ratio"] else "-", _headroom_said(r), _burst_said(r),
                       ", ".join(r["named"]) or "no"]
                      for r in explain(detector, intervals)]))
        _print("")
    if intervals:
        _print(table(["device", "kind", "start", "end", "severity", "evidence"],
                     [[i["device"], i["kind"], _when(i["start"]), _when(i["end"]) if i["end"] else "open",
                       i["severity"], i["summary"]] for i in intervals]))
    else:
        _print(f"no alerts in {len(lines)} lines of {len({x.device for x in lines})} devices")
    return 0
