"""`iowarden` commands: thin layers over the probes, each with --json.

Exit codes: 0 fine, 1 a probe failed, 2 usage, 77 permission (needs root),
78 invalid configuration (sysexits.h).
"""
from __future__ import annotations

import argparse


import os
import time
import stat

import sys


from iowarden.probes.common import ParseError, parse_size_bytes
from iowarden.probes.fio_job import PROFILE_RW, ProbeProfile, profile_from_job_file
from iowarden.probes import pathstat
from iowarden.probes.fio_run import ProbeLimits, run_probe

from iowarden.daemon import config as configmod
from iowarden.daemon.probing.discovery import targets_now
from iowarden.daemon.core.state_schema import StateDamaged, StateUnavailable
from iowarden.daemon.core.statedir import state_dir_problem
from iowarden.daemon.commands.args import DefaultsShown, duration, instant, positive_int, positive_seconds, version_text
from iowarden.daemon.commands.inspect import cmd_settings, cmd_xfs
from iowarden.daemon.commands.replay import REPLAY_METRICS, cmd_replay
from iowarden.daemon.commands.tables import dumps, human_bytes, print_lines as _print, table
from iowarden.daemon.wording import latency_columns

EX_NOPERM = 77


# ---- check-config ---------------------------------------------------------------------------

def target_problems(cfg) -> list[str]:
    """What stops the configured targets from being probed on this host now (the file may be right for
    another host, or for a volume not mounted yet: these are reported, not config errors)."""
    problems = []
    state_problem = state_dir_problem(cfg.section("daemon").state_dir)
    if state_problem:
        problems.append(f"daemon.state_dir: {state_problem}: `iowarden run` refuses it")
    answers = pathstat.WATCH.check([t.path for t in cfg.targets])   # at once, each with a deadline
    for i, t in enumerate(cfg.targets):
        where = f"targets[{i}] ({t.name}): path {t.path}"
        answer = answers[t.path]
        if answer.hung:
            problems.append(f"targets[{i}] ({t.name}): {answer.hung_text()}")
            continue
        if answer.error == "No such file or directory":
            problems.append(f"{where} does not exist")
            continue
        if answer.error:
            problems.append(f"{where}: {answer.error}")
            continue
        is_dir = stat.S_ISDIR(answer.st_mode)
        try:   # the path answered a moment ago: its filesystem is there
            read_only = is_dir and bool(os.statvfs(t.path).f_flag & os.ST_RDONLY)
        except OSError as exc:
            problems.append(f"{where}: {exc.strerror}")
            continue
        if not is_dir:
            problems.append(f"{where} is not a directory")
        elif read_only:
            problems.append(f"{where} is on a read-only file system: probes cannot write their file")
    return problems


def budget_problems(cfg) -> list[str]:
    """Targets whose profiles, at what they are expected to cost, ask more of a disk than [budget] gives
    routine probes (probing/fit.py): the daemon would stretch their intervals, and says so; this says it first."""
    from iowarden.daemon.probing import fit
    b = cfg.section("budget")
    allowed = b.device_time_ratio * b.window_seconds
    out = []
    for i, t in enumerate(cfg.targets):
        entries = [(fit.nominal_cost_seconds(cfg.profiles[p], cfg.limits.max_runtime_seconds), t.interval_seconds)
                   for p in t.profiles if p in cfg.profiles]
        demand = fit.demand_seconds(entries, b.window_seconds)
        if fit.stretch(demand, allowed) > 1.0:
            out.append(f"targets[{i}] ({t.name}): " + fit.fit_sentence("its disk", demand, allowed, b.device_time_ratio,
                                                                          b.window_seconds, entries))
    return out


def counted(n: int, noun: str) -> str:
    """"1 target", "2 targets", "0 targets"."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def cmd_check_config(args) -> int:
    cfg = configmod.load(args.config)
    problems = target_problems(cfg)
    _print(f"{args.config}: valid ({counted(len(cfg.profiles), 'profile')}, {counted(len(cfg.targets), 'target')}, "
           f"{counted(len(cfg.discover), 'discovery rule')})" + (", but on this host:" if problems else ""))
    for line in problems:
        print(f"{args.config}: {line}", file=sys.stderr)
    # not a mistake: the daemon fits such a schedule to its budget; said first, with what would fit it
    for line in budget_problems(cfg):
        print(f"{args.config}: note: {line}", file=sys.stderr)
    return 1 if problems else 0


# ---- probe ----------------------------------------------------------------------------------

def _adhoc_profile(args) -> ProbeProfile:
    if args.job_file:
        return profile_from_job_file("job-file", args.job_file)
    size, bs = parse_size_bytes(args.size), parse_size_bytes(args.bs)
    name = args.profile or f"{args.rw}-{args.bs}-qd{args.iodepth}"
    return ProbeProfile(name=name, rw=args.rw, bs_bytes=bs, iodepth=args.iodepth, numjobs=args.numjobs,
                        size_bytes=size, runtime_seconds=args.runtime, ramp_time_seconds=args.ramp_time,
                        rate_iops=args.rate_iops, ioengine=args.ioengine)


def nothing_matches(target: str | None, profile: str | None, targets, cfg) -> str:
    """Why a --target and --profile select no probe, with what they could have named."""
    names = [t.name for t in targets]
    if target is not None and target not in names:
        return f"no target named {target!r} (known: {', '.join(sorted(names)) or 'none'})"
    if profile is not None and profile not in cfg.profiles:
        return f"no profile named {profile!r} (configured: {', '.join(sorted(cfg.profiles)) or 'none'})"
    if target is not None and profile is not None:
        mine = next(t.profiles for t in targets if t.name == target)
        return f"target {target!r} does not run {profile!r} (it runs: {', '.join(mine)})"
    return "no targets configured or discovered"


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
            raise SystemExit(f"iowarden probe: nothing to probe in {args.config}: "
                             + nothing_matches(args.target, args.profile, targets_now(cfg), cfg))
    else:
        raise SystemExit("iowarden probe: give -c CONFIG or --path DIR_OR_DEVICE")
    for _target, _path, profile, _sizes in plan:
        _say_if_capped(profile, limits)
    results = []
    for target, path, profile, sizes in plan:
        if not args.json and sys.stderr.isatty():
            print(f"probing {target} with {profile.name} ...", file=sys.stderr)
        results.append(run_probe(target, path, profile, limits, keep_sizes=sizes, files_of="probe"))
    if args.json:
        _print(dumps([r.to_json() for r in results]))
    else:
        _print(probe_table(results))
    failed = [r for r in results if not r.ok]
    if failed and all(r.needs_root for r in failed):
        return EX_NOPERM   # nothing failed but for want of root: the documented 77
    return 1 if failed else 0


def _say_if_capped(profile: ProbeProfile, limits: ProbeLimits) -> None:
    """A limit that changes what was asked is said, not applied in silence."""
    asked = profile.effective_size_bytes()
    if asked > limits.max_size_bytes:
        print(f"iowarden probe: {profile.name}: a probe file of {human_bytes(asked)} is over the limit of "
              f"{human_bytes(limits.max_size_bytes)} (max_probe_size); probing with {human_bytes(limits.max_size_bytes)}",
              file=sys.stderr)


def probe_table(results) -> str:
    """One table for every probe: a unit per column, latencies in fio's unit and precision."""
    done = [r.to_json() for r in results if r.ok]
    mib = 1024 * 1024
    lat_keys = {"p50": "clat_p50_seconds", "p99": "clat_p99_seconds", "p99.9": "clat_p999_seconds",
                "p99.99": "clat_p9999_seconds"}
    lat_headers, lat_rows = latency_columns({name: [j[key] for j in done] for name, key in lat_keys.items()})
    rows = [[j["target"], j["profile"], j["device"] or "-", round(j["read_iops"]), round(j["write_iops"]),
             f"{j['read_bw_bytes'] / mib:.1f}", f"{j['write_bw_bytes'] / mib:.1f}", *lat]
            for j, lat in zip(done, lat_rows or [[]] * len(done))]
    lines = [table(["target", "profile", "device", "r IOPS", "w IOPS", "r MiB/s", "w MiB/s", *lat_headers], rows)]
    lines += [f"{r.target} {r.profile}: FAILED: {r.error}" for r in results if not r.ok]
    return "\n".join(lines) if done else "\n".join(lines[1:])


def cmd_run(args) -> int:
    from iowarden.daemon.runtime import main as run_main
    return run_main(args.config, args.listen_address)


# ---- replay ---------------------------------------------------------------------------------

# ---- status and baseline ----------------------------------------------------------------------

def cmd_status(args) -> int:
    from iowarden.daemon.commands.status import collect, render
    st = collect(configmod.load(args.config))
    _print(dumps(st) if args.json else render(st, table))
    return 0


def cmd_baseline(args) -> int:
    from iowarden.daemon.commands.status import NothingMatches, baseline_command
    try:
        _print(baseline_command(configmod.load(args.config), args.action, args.target, args.profile, args.json))
    except NothingMatches as exc:
        print(f"iowarden baseline {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_cleanup(args) -> int:
    from iowarden.probes.fio_run import remove_probe_dir
    cfg = configmod.load(args.config)
    targets = targets_now(cfg)
    answers = pathstat.WATCH.check([t.path for t in targets])
    for t in targets:
        if answers[t.path].hung:
            print(f"iowarden cleanup: {answers[t.path].hung_text()}: left as it is", file=sys.stderr)
        elif answers[t.path].ok and stat.S_ISDIR(answers[t.path].st_mode):
            for user in ("daemon", "probe"):   # what the daemon and `iowarden probe` left on its targets
                for path in remove_probe_dir(t.path, user):
                    _print(f"removed {path}")
    return 0


def cmd_ack(args) -> int:
    from iowarden.daemon.commands.status import ack_command
    _print(ack_command(configmod.load(args.config), args.alert_id, args.note or ""))
    return 0


# ---- argument parsing -----------------------------------------------------------------------

def cmd_version(args) -> int:
    print(version_text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="iowarden", description="Storage-health daemon and probes.")
    p.add_argument("-V", "--version", action="version", version=version_text())
    config_help = "the TOML configuration file, as the package installs it"
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print iowarden's version").set_defaults(func=cmd_version)

    r = sub.add_parser("run", help="run the daemon in the foreground (systemd: Type=notify)")
    r.add_argument("-c", "--config", default=configmod.DEFAULT_CONFIG_PATH, help=config_help)
    r.add_argument("--web.listen-address", dest="listen_address", metavar="ADDRESS",
                   help="serve /metrics on this address rather than [prometheus] listen_address, as the exporters' "
                        "flag of the same name (':29110' every interface, '127.0.0.1:29110', '[::1]:29110')")
    r.set_defaults(func=cmd_run)

    st = sub.add_parser("status", help="volumes, last probes, baselines, alerts, budgets (from the state database)")
    st.add_argument("-c", "--config", default=configmod.DEFAULT_CONFIG_PATH, help=config_help)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=cmd_status)

    bl = sub.add_parser("baseline", help="show, accept (a new normal) or reset baselines")
    bl.add_argument("action", choices=["show", "accept", "reset"],
                    help="show them; accept the recent probes as the new normal; reset (learn again)")
    bl.add_argument("-c", "--config", default=configmod.DEFAULT_CONFIG_PATH, help=config_help)
    bl.add_argument("--target", help="only this target's baselines")
    bl.add_argument("--profile", help="only this probe profile's baselines")
    bl.add_argument("--json", action="store_true", help="with show: a JSON array, one object per baseline")
    bl.set_defaults(func=cmd_baseline)

    cl = sub.add_parser("cleanup", help="remove the probe files iowarden laid out in its targets")
    cl.add_argument("-c", "--config", default=configmod.DEFAULT_CONFIG_PATH, help=config_help)
    cl.set_defaults(func=cmd_cleanup)

    ak = sub.add_parser("ack", help="acknowledge an open alert (it stays open until the volume recovers)")
    ak.add_argument("alert_id", type=int, help="the id that `iowarden status` shows")
    ak.add_argument("-c", "--config", default=configmod.DEFAULT_CONFIG_PATH, help=config_help)
    ak.add_argument("--note", help="why, for the alert history")
    ak.set_defaults(func=cmd_ack)

    rp = sub.add_parser("replay", help="run the detector offline over a timestamp,value CSV, or the passive "
                        "detector over `iostat --json` lines")
    rp.add_argument("csv", nargs="?", help="a file of timestamp,value lines, one probe each (Unix seconds or "
                    "ISO 8601)")
    rp.add_argument("--passive", metavar="FILE", help="JSON lines as `iowarden iostat --json` prints them: the "
                    "passive detector (self, peers, saturation) over them")
    rp.add_argument("--prometheus", metavar="URL", help="the passive detector over node_exporter's disk counters "
                    "kept in Prometheus (or Thanos, Mimir, VictoriaMetrics: the server's base URL), host by host, "
                    "beside node-mixin's NodeDiskIOSaturation over the same window")
    rp.add_argument("--instance", action="append", metavar="HOST", help="with --prometheus: only this instance "
                    "label (repeatable; default: every instance with node_disk_* series in the window)")
    rp.add_argument("--from", dest="start", type=instant, default="now-1d", metavar="T",
                    help="with --prometheus: the window's start: now-30d, Unix seconds or ISO 8601")
    rp.add_argument("--to", dest="end", type=instant, default="now", metavar="T", help="with --prometheus: its end")
    rp.add_argument("--scrape-interval", type=duration, default=15.0, metavar="DURATION",
                    help="with --prometheus: how often the server scraped node_exporter (what a chunk of "
                    "--max-points samples spans, and how far apart two scrapes may be before it is a gap)")
    rp.add_argument("--timeout", type=duration, default=30.0, metavar="DURATION",
                    help="with --prometheus: the whole time one request may take")
    rp.add_argument("--retries", type=positive_int, default=3, help="with --prometheus: tries per request")
    rp.add_argument("--max-points", type=positive_int, default=10_000,
                    help="with --prometheus: samples per series in one request (halved while the server refuses)")
    rp.add_argument("--bearer-token-file", metavar="FILE", help="with --prometheus: a token sent as "
                    "'Authorization: Bearer' (its first line; never printed)")
    rp.add_argument("--basic-auth-user", metavar="USER", help="with --prometheus: HTTP basic auth's user")
    rp.add_argument("--password-file", metavar="FILE", help="with --basic-auth-user: the password (its first line)")
    rp.add_argument("--plot", metavar="DIR", help="with --prometheus: per device named, its await against its "
                    "peers' over the window with the alerts shaded, as DIR/INSTANCE_DEVICE.png and .svg (matplotlib)")
    rp.add_argument("--window", type=positive_seconds, help="with --passive or --prometheus: seconds per window "
                    "(default 15; the lines or scrapes are pooled into windows at least this long)")
    rp.add_argument("--explain", action="store_true", help="with --passive: per drive, what it was judged on: "
                    "latency over its peers' at comparable load, the stray healthy drives of the group show, hours "
                    "above the peers, the accumulated evidence against the threshold, latency over its own normal")
    rp.add_argument("--metric", choices=sorted(REPLAY_METRICS), default="iops",
                    help="iops and bandwidth alert when they fall, latency when it rises")
    rp.add_argument("--warmup", type=positive_int, help="values learned before any alert (default 12)")
    rp.add_argument("--json", action="store_true", help="a JSON array of the alert intervals found (start and end "
                    "in Unix seconds, end null while open; with --passive, each with its device and kind)")
    rp.set_defaults(func=cmd_replay)

    from iowarden.daemon.commands.characterize_cmd import add_parser as add_characterize
    add_characterize(sub, positive_seconds)

    c = sub.add_parser("check-config", help="validate a configuration file")
    c.add_argument("-c", "--config", default=configmod.DEFAULT_CONFIG_PATH, help=config_help)
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
    pr.add_argument("--min-free-bytes", type=parse_size_bytes,
                    default=human_bytes(ProbeLimits.min_free_bytes).replace(" ", ""),   # typed: said as written
                    help="refuse to lay out a probe file that would leave less free space")
    pr.add_argument("--min-free-ratio", type=float, default=ProbeLimits.min_free_ratio,
                    help="... or a smaller share of the filesystem free")
    pr.add_argument("--json", action="store_true", help="a JSON array, one object per probe, printed when all have run")
    pr.set_defaults(func=cmd_probe)

    from iowarden.daemon.commands.iostat import add_parser as add_iostat
    add_iostat(sub)

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
    p.subcommands = sub.choices   # name -> its parser (parse_command_line)
    for command in (p, *sub.choices.values()):
        command.formatter_class = DefaultsShown
    for name in ("status", "baseline", "replay", "iostat", "characterize"):   # the commands that print instants
        sub.choices[name].add_argument("--utc", action="store_true", help="print times in UTC, not local time")
    return p


def parse_command_line(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, its options and operands in any order a person types them, as sysstat's iostat takes
    them (`iostat loop0 --json 1 2`, `iostat 1 2 -x loop0`): the command first, then its own arguments parsed
    intermixed, which argparse cannot do across subcommands. A usage error prints that command's usage."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = parser.subcommands.get(argv[0]) if argv else None
    if command is None:   # no command, or an option before it (--help, --version): the top level's own
        return parser.parse_args(argv)
    args = command.parse_intermixed_args(argv[1:])
    args.command = argv[0]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_command_line(argv)
    if getattr(args, "utc", False):   # as `date -u` does: every instant this process prints, in UTC
        os.environ["TZ"] = "UTC0"
        time.tzset()
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
