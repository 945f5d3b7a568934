"""`iowarden` commands: thin layers over the probes, each with --json.

Exit codes: 0 fine, 1 a probe failed, 2 usage, 77 permission (needs root),
78 invalid configuration (sysexits.h).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import stat
import sys
import time

from iowarden.probes import blockqueue, cpupower, diskstats, xfs
from iowarden.probes.common import ParseError, Roots, parse_size_bytes, printable, printable_lines
from iowarden.probes.fio_job import PROFILE_RW, ProbeProfile, profile_from_job_file
from iowarden.probes.fio_run import ProbeLimits, run_probe

from iowarden.daemon import config as configmod
from iowarden.daemon.sources.discovery import targets_now
from iowarden.daemon.core.state import StateDamaged, StateUnavailable
from iowarden.daemon.commands.tables import dumps, table

EX_NOPERM = 77


def _print(text: str) -> None:
    sys.stdout.write(printable_lines(text) + "\n")
    sys.stdout.flush()


# ---- check-config ---------------------------------------------------------------------------

def cmd_check_config(args) -> int:
    cfg = configmod.load(args.config)
    _print(f"{args.config}: valid ({len(cfg.profiles)} profiles, {len(cfg.targets)} targets, "
           f"{len(cfg.discover)} discovery rules)")
    return 0


# ---- probe ----------------------------------------------------------------------------------

def _adhoc_profile(args) -> ProbeProfile:
    if args.job_file:
        return profile_from_job_file("job-file", args.job_file)
    size, bs = parse_size_bytes(args.size), parse_size_bytes(args.bs)
    name = args.profile or f"{args.rw}-{args.bs}-qd{args.iodepth}"
    return ProbeProfile(name=name, rw=args.rw, bs_bytes=bs, iodepth=args.iodepth, numjobs=args.numjobs,
                        size_bytes=size, runtime_seconds=args.runtime, ramp_time_seconds=args.ramp_time,
                        rate_iops=args.rate_iops, ioengine=args.ioengine)


def cmd_probe(args) -> int:
    if args.path:
        limits = ProbeLimits(max_runtime_seconds=max(args.runtime, 60.0), min_free_bytes=args.min_free_bytes,
                             min_free_ratio=args.min_free_ratio)
        plan = [(args.path, args.path, _adhoc_profile(args), set())]
    elif args.config:
        cfg = configmod.load(args.config)
        limits = cfg.limits
        plan = []
        for t in targets_now(cfg):
            if args.target and t.name != args.target:
                continue
            sizes = {min(cfg.profiles[p].effective_size_bytes(), limits.max_size_bytes) for p in t.profiles}
            for p in t.profiles:
                if args.profile and p != args.profile:
                    continue
                plan.append((t.name, t.path, cfg.profiles[p], sizes))
        if not plan:
            raise SystemExit(f"iowarden: nothing to probe: no target/profile matches in {args.config}")
    else:
        raise SystemExit("iowarden probe: give -c CONFIG or --path DIR_OR_DEVICE")
    results = []
    for target, path, profile, sizes in plan:
        results.append(run_probe(target, path, profile, limits, keep_sizes=sizes))
        if not args.json:
            _print_probe(results[-1])
    if args.json:
        _print(dumps([r.to_json() for r in results]))
    return 0 if all(r.ok for r in results) else 1


def _ms(seconds):
    return None if seconds is None else seconds * 1000


def _print_probe(r) -> None:
    j = r.to_json()
    if not r.ok:
        _print(f"{r.target} {r.profile}: FAILED: {r.error}")
        return
    mib = 1024 * 1024
    _print(table(
        ["target", "profile", "device", "r IOPS", "w IOPS", "r MiB/s", "w MiB/s",
         "p50 ms", "p99 ms", "p99.9 ms", "p99.99 ms"],
        [[r.target, r.profile, r.device or "-", round(j["read_iops"]), round(j["write_iops"]),
          j["read_bw_bytes"] / mib, j["write_bw_bytes"] / mib, _ms(j["clat_p50_seconds"]),
          _ms(j["clat_p99_seconds"]), _ms(j["clat_p999_seconds"]), _ms(j["clat_p9999_seconds"])]]))


# ---- iostat ---------------------------------------------------------------------------------

def _uptime_seconds(roots: Roots) -> float:
    return float((roots.proc / "uptime").read_text().split()[0])


def _select(sample: diskstats.DiskSample, args, roots: Roots) -> list[str]:
    names = []
    for name, c in sample.counters.items():
        if args.device:
            if any(fnmatch.fnmatch(name, pat) for pat in args.device):
                names.append(name)
            continue
        if not args.partitions and diskstats.is_partition(name, roots):
            continue
        # like sysstat: a device that has never done I/O is not shown unless asked for
        if c.reads or c.writes or c.discards or c.flushes:
            names.append(name)
    return names


def _emit_rates(rates: dict, names: list[str], args, stamp: float) -> None:
    rows = [rates[n] for n in names if n in rates]
    if args.json:
        for r in rows:
            obj = {"timestamp": round(stamp, 3), **r.as_sysstat()}
            _print(json.dumps(obj))
        return
    keys = ["r/s", "rkB/s", "rrqm/s", "%rrqm", "r_await", "rareq-sz", "w/s", "wkB/s", "wrqm/s", "%wrqm",
            "w_await", "wareq-sz", "d/s", "dkB/s", "d_await", "f/s", "f_await", "aqu-sz", "%util"]
    out = []
    for r in rows:
        s = r.as_sysstat()
        s["%rrqm"], s["%wrqm"], s["%util"] = s["rrqm"], s["wrqm"], s["util"]
        out.append([r.name] + [s[k] for k in keys])
    _print(table(["Device"] + keys, out) + "\n")


def cmd_iostat(args) -> int:
    roots = Roots()
    prev = diskstats.read(roots)
    names = _select(prev, args, roots)
    if args.device and not names:
        raise SystemExit(f"iowarden iostat: no device matches {' '.join(args.device)}")
    if args.interval is None or not args.omit_first:
        # The first report covers the time since boot, as iostat's does.
        zero = diskstats.DiskSample(prev.monotonic_seconds - _uptime_seconds(roots),
                                    {n: diskstats.DiskCounters(c.major, c.minor, n) for n, c in prev.counters.items()})
        _emit_rates(diskstats.rates_between(zero, prev), names, args, time.time())
    if args.interval is None:
        return 0
    count = args.count
    next_tick = time.monotonic() + args.interval
    while count is None or count > 0:
        time.sleep(max(0.0, next_tick - time.monotonic()))
        next_tick += args.interval
        cur = diskstats.read(roots)
        _emit_rates(diskstats.rates_between(prev, cur), names, args, time.time())
        prev = cur
        if count is not None:
            count -= 1
    return 0


# ---- xfs ------------------------------------------------------------------------------------

def cmd_xfs(args) -> int:
    roots = Roots()
    if args.file:
        counts = {}
        for f in args.file:
            try:
                st = os.lstat(f)
                if not stat.S_ISREG(st.st_mode):
                    # a FIFO would block the open for ever; a device or socket has no extents
                    raise ValueError(f"xfs --file {f}: not a regular file (only files have extents)")
                counts[f] = xfs.file_extent_count(f)
            except OSError as exc:  # missing, a symlink (not followed), or no FIEMAP on its filesystem
                raise SystemExit(f"iowarden xfs: cannot count the extents of {f}: {exc.strerror or exc}") from None
        _print(dumps(counts) if args.json else table(["file", "extents"], counts.items()))
        return 0
    mounts = xfs.xfs_mounts(roots)
    if args.mounts:
        wanted = [m.rstrip("/") or "/" for m in args.mounts]
        known = {mnt: dev for dev, mnt in mounts}
        missing = [m for m in wanted if m not in known]
        if missing:
            raise SystemExit(f"iowarden xfs: not an XFS mount point: {', '.join(missing)}")
        mounts = [(known[m], m) for m in wanted]
    reports = [xfs.read(mnt, dev, args.timeout) for dev, mnt in mounts]
    if args.json:
        _print(dumps(reports))
    else:
        rows = []
        for r in reports:
            f, fs = r.frag, r.free_space
            rows.append([r.mountpoint, r.device, f and f.actual_extents, f and f.ideal_extents,
                         f and f.fragmentation_ratio * 100, f and f.extents_per_file,
                         fs and fs.total_free_extents, fs and fs.average_free_extent_blocks,
                         r.free_space_source or "-"])
        _print(table(["mount", "device", "extents", "ideal", "frag %", "extents/file",
                      "free extents", "avg free ext (blocks)", "free-space source"], rows))
        for r in reports:
            for e in r.errors:
                _print(f"{printable(r.mountpoint)}: {printable(e, 400)}")
    return 0 if all(not r.errors for r in reports) else 1


# ---- settings -------------------------------------------------------------------------------

def cmd_settings(args) -> int:
    roots = Roots()
    devices = blockqueue.read_sysfs_and_superblocks(roots)
    power = cpupower.read_power_settings(roots, run_tuned_adm_verify=True)
    if args.json:
        _print(dumps({"block_devices": devices, "power": power}))
        return 0
    rows = []
    for d in devices.values():
        if d.kind == "partition" and not args.partitions:
            continue
        if d.kind == "loop" and not d.size_bytes:
            continue  # an unattached loop device is not storage
        q = d.queue
        md = d.md and f"{d.md.level} {d.md.array_state} degraded={d.md.degraded}"
        rows.append([d.name, d.kind, d.identity, q and q.scheduler, q and q.nr_requests, q and q.read_ahead_kb,
                     q and q.max_sectors_kb, q and q.rotational, q and q.write_cache, md or "-"])
    _print(table(["device", "kind", "identity", "scheduler", "nr_requests", "read_ahead_kb",
                  "max_sectors_kb", "rotational", "write_cache", "md"], rows))
    _print("")
    qos = power.pm_qos_cpu_dma_latency_usec
    _print(f"cpuidle: driver={power.idle_driver or '-'} governor={power.idle_governor or '-'}; "
           f"PM QoS cpu_dma_latency={'-' if qos is None else qos} us"
           f"{' (C-states limited)' if power.c_states_limited else ''}")
    govs = sorted(set(power.cpufreq_governors.values()))
    _print(f"cpufreq governor: {', '.join(govs) if govs else 'absent'}; intel_pstate: "
           f"{power.intel_pstate.get('status') if power.intel_pstate else 'absent'}")
    t = power.tuned
    _print(f"tuned: profile={t.active_profile or 'absent'} mode={t.profile_mode or '-'} "
           f"verify={'-' if t.verify_ok is None else ('ok' if t.verify_ok else 'FAILED: ' + (t.verify_message or ''))}")
    if power.cpus:
        cpu0 = power.cpus[0]
        shares = cpu0.residency_shares()
        _print(table(["cpu0 idle state", "exit latency us", "target residency us", "disabled", "time share"],
                     [[s.name, s.exit_latency_usec, s.target_residency_usec, s.disabled,
                       shares.get(s.name)] for s in cpu0.states]))
    return 0


# ---- run ------------------------------------------------------------------------------------

def cmd_run(args) -> int:
    from iowarden.daemon.runtime import main as run_main
    return run_main(args.config)


# ---- replay ---------------------------------------------------------------------------------

REPLAY_METRICS = {"iops": "read_iops", "bandwidth": "read_bw_bytes", "latency": "clat_p99_seconds"}


def read_series_csv(path: str) -> list[tuple[float, float]]:
    """`timestamp,value` rows (a header line is allowed); timestamps as Unix seconds or ISO 8601.

    Every value must be a finite number and timestamps must increase: a NaN, an
    infinity or a row out of order is an error naming its line, never a silent 0,
    an alert, or a different result.
    """
    from datetime import datetime
    out = []
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ParseError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
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
    if args.passive:
        return _replay_passive(args)
    if not args.csv:
        raise ParseError("replay needs a CSV of probe values, or --passive FILE of `iowarden iostat --json` lines")
    from iowarden.daemon.verdicts.detect import DetectorParams, replay
    series = read_series_csv(args.csv)
    params = DetectorParams(warmup_probes=args.warmup) if args.warmup else DetectorParams()
    intervals = replay(series, REPLAY_METRICS[args.metric], params)
    if args.json:
        _print(json.dumps(intervals))
    else:
        _print(table(["start", "end", "severity"], [[i["start"], i["end"] if i["end"] is not None else "open",
                                                      i["severity"]] for i in intervals]) if intervals
               else f"no alerts in {len(series)} values")
    return 0


def _replay_passive(args) -> int:
    from iowarden.daemon.passive.detector import PassiveParams
    from iowarden.daemon.passive.replay import explain, parse_lines, replay
    try:
        with open(args.passive) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ParseError(f"{args.passive}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    lines = parse_lines(args.passive, text)
    params = PassiveParams(window_seconds=args.window) if args.window else PassiveParams()
    intervals, detector = replay(lines, params)
    if args.json:
        found = [{k: i[k] for k in ("device", "start", "end", "severity", "kind")} for i in intervals]
        _print(json.dumps({"alerts": found, "explain": explain(detector, intervals)} if args.explain else found))
        return 0
    if args.explain:
        _print(table(["device", "vs peers", "stray", "blocks above", "evidence", "peak", "threshold", "vs own normal",
                      "named"],
                     [[r["device"], f"{r['peer_ratio']:.3f}x" if r["peer_ratio"] else "-",
                       f"{r['stray_percent']:g} %" if r["stray_percent"] is not None else "-",
                       f"{r['blocks_above']} of {r['blocks']}" if r["blocks"] is not None else "-",
                       r["evidence"], r["evidence_peak"], r["threshold"],
                       f"{r['self_ratio']:.2f}x" if r["self_ratio"] else "-", ", ".join(r["named"]) or "no"]
                      for r in explain(detector, intervals)]))
        _print("")
    if intervals:
        _print(table(["device", "kind", "start", "end", "severity", "evidence"],
                     [[i["device"], i["kind"], _when(i["start"]), _when(i["end"]) if i["end"] else "open",
                       i["severity"], i["summary"]] for i in intervals]))
    else:
        _print(f"no alerts in {len(lines)} lines of {len({x.device for x in lines})} devices")
    return 0


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


# ---- status and baseline ----------------------------------------------------------------------

def cmd_status(args) -> int:
    from iowarden.daemon.commands.status import collect, render
    st = collect(configmod.load(args.config))
    _print(dumps(st) if args.json else render(st, table))
    return 0


def cmd_baseline(args) -> int:
    from iowarden.daemon.commands.status import baseline_command
    _print(baseline_command(configmod.load(args.config), args.action, args.target, args.profile))
    return 0


def cmd_cleanup(args) -> int:
    from iowarden.probes.fio_run import remove_probe_dir
    cfg = configmod.load(args.config)
    for t in targets_now(cfg):
        if os.path.isdir(t.path):
            for path in remove_probe_dir(t.path):
                _print(f"removed {path}")
    return 0


def cmd_ack(args) -> int:
    from iowarden.daemon.commands.status import ack_command
    _print(ack_command(configmod.load(args.config), args.alert_id, args.note or ""))
    return 0


# ---- argument parsing -----------------------------------------------------------------------

def positive_seconds(text: str) -> float:
    """A number of seconds for argparse: finite and above zero (nan, inf and -1 are refused, not looped on)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number of seconds above 0")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="iowarden", description="Storage-health daemon and probes.")
    config_help = "the TOML configuration file (packaged: /etc/iowarden/config.toml)"
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run the daemon in the foreground (systemd: Type=notify)")
    r.add_argument("-c", "--config", required=True, help=config_help)
    r.set_defaults(func=cmd_run)

    st = sub.add_parser("status", help="volumes, last probes, baselines, alerts, budgets (from the state database)")
    st.add_argument("-c", "--config", required=True, help=config_help)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=cmd_status)

    bl = sub.add_parser("baseline", help="show, accept (a new normal) or reset baselines")
    bl.add_argument("action", choices=["show", "accept", "reset"],
                    help="show them; accept the recent probes as the new normal; reset (learn again)")
    bl.add_argument("-c", "--config", required=True, help=config_help)
    bl.add_argument("--target", help="only this target's baselines")
    bl.add_argument("--profile", help="only this probe profile's baselines")
    bl.set_defaults(func=cmd_baseline)

    cl = sub.add_parser("cleanup", help="remove the probe files iowarden laid out in its targets")
    cl.add_argument("-c", "--config", required=True, help=config_help)
    cl.set_defaults(func=cmd_cleanup)

    ak = sub.add_parser("ack", help="acknowledge an open alert (it stays open until the volume recovers)")
    ak.add_argument("alert_id", type=int, help="the id that `iowarden status` shows")
    ak.add_argument("-c", "--config", required=True, help=config_help)
    ak.add_argument("--note", help="why, for the alert history")
    ak.set_defaults(func=cmd_ack)

    rp = sub.add_parser("replay", help="run the detector offline over a timestamp,value CSV, or the passive "
                        "detector over `iostat --json` lines")
    rp.add_argument("csv", nargs="?", help="a file of timestamp,value lines, one probe each (Unix seconds or "
                    "ISO 8601)")
    rp.add_argument("--passive", metavar="FILE", help="JSON lines as `iowarden iostat --json` prints them: the "
                    "passive detector (self, peers, saturation) over them")
    rp.add_argument("--window", type=positive_seconds, help="with --passive: seconds per window (default 15)")
    rp.add_argument("--explain", action="store_true", help="with --passive: per drive, what it was judged on: "
                    "latency over its peers' at comparable load, the stray healthy drives of the group show, hours "
                    "above the peers, the accumulated evidence against the threshold, latency over its own normal")
    rp.add_argument("--metric", choices=sorted(REPLAY_METRICS), default="iops",
                    help="iops and bandwidth alert when they fall, latency when it rises")
    rp.add_argument("--warmup", type=positive_int, help="values learned before any alert (default 12)")
    rp.add_argument("--json", action="store_true", help="one JSON object per value")
    rp.set_defaults(func=cmd_replay)

    from iowarden.daemon.commands.characterize_cmd import add_parser as add_characterize
    add_characterize(sub, positive_seconds)

    c = sub.add_parser("check-config", help="validate a configuration file")
    c.add_argument("-c", "--config", required=True, help=config_help)
    c.set_defaults(func=cmd_check_config)

    pr = sub.add_parser("probe", help="run fio probes once and print IOPS, bandwidth, latency")
    pr.add_argument("-c", "--config", help=config_help + "; without it, an ad-hoc probe of --path")
    pr.add_argument("--target", help="only this configured target")
    pr.add_argument("--profile", help="only this configured profile (or the name of an ad-hoc one)")
    pr.add_argument("--path", type=os.path.abspath, help="ad hoc: a directory (probe file in DIR/.iowarden) or a block device (read-only)")
    pr.add_argument("--rw", default="randread", choices=PROFILE_RW, help="fio rw= of an ad-hoc probe")
    pr.add_argument("--bs", default="4k", help="block size")
    pr.add_argument("--iodepth", type=int, default=32, help="I/Os in flight per job")
    pr.add_argument("--numjobs", type=int, default=1, help="parallel fio jobs")
    pr.add_argument("--ioengine", default="libaio", help="fio ioengine= (direct I/O always)")
    pr.add_argument("--size", default="256MiB", help="probe file size (laid out once with data)")
    pr.add_argument("--runtime", type=float, default=5.0, help="seconds")
    pr.add_argument("--ramp-time", type=float, default=1.0, help="seconds excluded from the results")
    pr.add_argument("--rate-iops", type=int, default=0, help="cap the probe's IOPS (0: none)")
    pr.add_argument("--job-file", help="an existing fio job file instead of --rw/--bs/...")
    pr.add_argument("--min-free-bytes", type=parse_size_bytes, default=ProbeLimits.min_free_bytes,
                    help="refuse to lay out a probe file that would leave less free space")
    pr.add_argument("--min-free-ratio", type=float, default=ProbeLimits.min_free_ratio,
                    help="... or a smaller share of the filesystem free")
    pr.add_argument("--json", action="store_true", help="one JSON object per probe")
    pr.set_defaults(func=cmd_probe)

    io = sub.add_parser("iostat", help="iostat -x from /proc/diskstats")
    io.add_argument("-d", "--device", action="append", help="device name or glob (repeatable)")
    io.add_argument("-p", "--partitions", action="store_true", help="include partitions")
    io.add_argument("-y", dest="omit_first", action="store_true", help="omit the since-boot report")
    io.add_argument("--json", action="store_true", help="one JSON object per device per interval, one per line")
    io.add_argument("interval", nargs="?", type=positive_seconds,
                    help="seconds between reports (none: one since-boot report)")
    io.add_argument("count", nargs="?", type=positive_int, help="number of reports (none: until interrupted)")
    io.set_defaults(func=cmd_iostat)

    x = sub.add_parser("xfs", help="XFS fragmentation and free-space report")
    x.add_argument("mounts", nargs="*", help="XFS mount points (none: every mounted XFS)")
    x.add_argument("--timeout", type=positive_seconds, default=120.0, help="seconds before xfs_db is killed")
    x.add_argument("--file", action="append", help="count the extents of this file instead (repeatable)")
    x.add_argument("--json", action="store_true", help="machine-readable output")
    x.set_defaults(func=cmd_xfs)

    s = sub.add_parser("settings", help="block queue, md, C-state, PM QoS and tuned snapshot")
    s.add_argument("-p", "--partitions", action="store_true", help="include partitions")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_settings)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except configmod.ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return configmod.EX_CONFIG
    except (StateUnavailable, StateDamaged) as exc:
        print(f"iowarden: the state database cannot be read now: {exc}", file=sys.stderr)
        return 1
    except PermissionError as exc:
        print(f"iowarden: permission denied: {exc.filename or exc}. This needs root "
              "(or read access to the block devices): run it with sudo.", file=sys.stderr)
        return EX_NOPERM
    except (ParseError, ValueError) as exc:
        print(f"iowarden: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
