"""`iowarden characterize --path DIR`: runs the plan of daemon/commands/characterize.py as ordinary probes.

The plan and its estimated cost are printed first (`--dry-run` stops there). A busy device is
refused unless `--force`. Ctrl-C stops after the step under way and keeps what was measured.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import time

from iowarden.probes.blockqueue import identity_of
from iowarden.probes import diskstats
from iowarden.probes.common import Roots, parse_size_bytes
from iowarden.probes.fio_run import ProbeLimits, run_probe
from iowarden.probes.probe_dir import device_name_for

from iowarden.daemon.commands import characterize as ch
from iowarden.daemon.commands.characterize_report import findings, render_tables
from iowarden.daemon.commands.characterize_compare import cmd_compare
from iowarden.daemon.commands.outdir import OutDir, OutDirRefused
from iowarden.daemon.snapshot import CAPABILITY_PROFILE

BUSY_UTIL_PERCENT = 20.0



def _busy_percent(path: str, roots: Roots) -> tuple[str | None, float | None]:
    """The path's device and its %util over one second, before anything is run."""
    try:
        st = os.stat(path)
    except OSError:
        return None, None
    dev = device_name_for(st.st_dev, roots)
    if dev is None:
        return None, None
    a = diskstats.read(roots)
    time.sleep(1.0)
    b = diskstats.read(roots)
    rates = diskstats.rates_between(a, b).get(dev)
    return dev, rates.util_percent if rates else None


def _device_bytes(dev: str | None, roots: Roots) -> tuple[int, int] | None:
    """(bytes read, bytes written) by the device since boot (diskstats' sectors are 512 bytes whatever the device)."""
    try:
        counters = diskstats.read(roots).counters.get(dev) if dev else None
    except OSError:
        return None
    return (counters.sectors_read * 512, counters.sectors_written * 512) if counters else None


def _bytes_written_to(dev: str | None, roots: Roots) -> int | None:
    both = _device_bytes(dev, roots)
    return both[1] if both else None


def _bytes_moved(dev: str | None, roots: Roots) -> int | None:
    both = _device_bytes(dev, roots)
    return sum(both) if both else None


def _measured(step: ch.Step, profile, path: str, limits: ProbeLimits, size_of: int, dev: str | None, roots: Roots,
              earlier: list[ch.Point]):
    """One run of a step: (its result, its point, why it cannot be taken as it is or None), the device's own
    count of the bytes it moved set against the step's (its ramp's and its file's layout included: fio's
    report leaves them out)."""
    before = _bytes_moved(dev, roots)
    r = run_probe("characterize", path, profile, limits, keep_sizes={size_of}, files_of="characterize")
    after = _bytes_moved(dev, roots)
    point = _point(step, r)
    # the step's own: fio's I/O, its ramp's, and the probe file it laid out first (the first step of a run
    # on a fresh volume writes the whole file: 64 MiB read as "other work" beside a 28 MiB step)
    own = int(sum(d.io_bytes + d.bw_bytes * r.ramp_seconds for d in r.report.directions.values())
              + r.layout_bytes) if r.ok and r.report is not None else None
    moved = after - before if before is not None and after is not None else None
    return r, point, ch.step_problem(point, earlier, own, moved)


def _charge(fio_measured: int, before: int | None, after: int | None, cap: int) -> int:
    """What a write step cost the budget. fio's figure leaves out its ramp, so the device's own count is
    taken where it is known (it can only count more: metadata, another writer); else the whole cap."""
    if before is None or after is None:
        return cap
    return max(fio_measured, after - before)


def _free_bytes(path: str) -> tuple[int, int] | None:
    """(free bytes for an unprivileged writer... as root: all free, total) of the path's filesystem."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def _point(step: ch.Step, r) -> ch.Point:
    if not r.ok or r.report is None:
        return ch.Point(step.sweep, step.value, 0.0, 0.0, None, None, None, ok=False, error=r.error)
    dirs = [d for d in r.report.directions.values() if d.total_ios]
    ios = sum(d.total_ios for d in dirs)
    mean = sum(d.clat.mean_seconds * d.total_ios for d in dirs if d.clat) / ios if ios else None
    return ch.Point(step.sweep, step.value, sum(d.iops for d in dirs), sum(d.bw_bytes for d in dirs), mean,
                    r.clat_percentile_seconds(99.0), r.clat_percentile_seconds(99.9))


def store_capability(config_path: str, dev: str | None, roots: Roots, doc: dict) -> str:
    """The run's saturation figures, kept in the state database under the volume's identity: `status` shows
    them and the daemon measures each disk's load against them (headroom, and the ceiling it sits at)."""
    from iowarden.probes import blockqueue
    from iowarden.daemon import config as configmod
    from iowarden.daemon.core.state import State
    cfg = configmod.load(config_path)
    devices = blockqueue.read_sysfs_and_superblocks(roots)
    identity = identity_of(dev, devices)
    cap = {"saturation_iops": doc["findings"]["qd"]["saturation_iops"],
           "knee_depth": doc["findings"]["qd"]["knee_depth"],
           "bandwidth_bytes": (doc["findings"].get("bs") or {}).get("best_bw_bytes"),
           "path": doc["path"], "device": dev, "measured_at": doc["started_at"]}
    state = State(os.path.join(cfg.section("daemon").state_dir, "state.db"))
    try:
        state.save_baseline(identity, CAPABILITY_PROFILE, "characterize", time.time(), cap)
    finally:
        state.close()
    return (f"capability of {identity} stored: {cap['saturation_iops']:,.0f} IOPS"
            + (f", {cap['bandwidth_bytes'] / 2 ** 20:,.0f} MiB/s" if cap["bandwidth_bytes"] else ""))


def earlier_run(out: OutDir) -> str | None:
    """What an earlier run left in --out, said in a few words; None when there is nothing to overwrite."""
    path = out.join("characterize.json")
    try:
        text = out.read_text("characterize.json")
        if text is None:
            return None
        started = json.loads(text).get("started_at")
    except (OSError, ValueError, AttributeError):
        return f"{path}, unreadable"
    return f"{path} of {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}" if started else path


def write_out(out: OutDir, doc: dict, points: list, found: dict, title: str, say) -> None:
    """characterize.json, characterize.txt and the plots, each created in --out, never through a link there."""
    with out.open("characterize.json") as f:
        json.dump(doc, f, indent=1)
    with out.open("characterize.txt") as f:
        f.write(render_tables(points, found) + "\n")
    from iowarden.daemon.commands import characterize_plots
    if characterize_plots.available():
        say("plots: " + ", ".join(characterize_plots.write_plots(points, found, out, title)))
    else:
        say("no plots: they need matplotlib (for the .deb or .rpm, the distro's python3-matplotlib; for a pip "
            "install, pip install 'iowarden[plots]')")


def run_parameters(args, kept: list, results: list, size: int, budget_bytes: int) -> dict:
    """How the run was made, so a reader of characterize.json can compare two runs or repeat one."""
    from iowarden.daemon.commands.args import version_text
    engines = sorted({s.profile.ioengine for s in kept})
    finished = time.time()
    return {
        "iowarden": version_text(), "fio_version": next((r.report.fio_version for r in results if r.report), None),
        "host": os.uname().nodename, "kernel": os.uname().release,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(results[0].started_at)) if results else None,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(finished)),
        "ioengine": engines[0] if len(engines) == 1 else engines,
        "direct": not args.buffered, "file_size_bytes": size, "step_seconds": args.step_seconds,
        "ramp_seconds": args.ramp_seconds, "budget_seconds": args.budget_seconds, "budget_bytes": budget_bytes,
        "writes": args.writes, "max_working_set": args.max_working_set,
    }


def _probe_files_notice(path: str, remove: bool) -> str:
    """Say what the run left on the volume (a 1 GiB file is not left in silence), or remove it with --cleanup."""
    from iowarden.daemon.commands.tables import human_bytes
    from iowarden.probes.fio_run import is_file_of, remove_probe_dir
    from iowarden.probes.probe_dir import PROBE_DIR_NAME
    probe_dir = os.path.join(path, PROBE_DIR_NAME)
    try:   # its own files: a daemon's beside them are the daemon's
        files = [e for e in os.scandir(probe_dir) if e.is_file(follow_symlinks=False) and
                 is_file_of(e.name, "characterize")]
        total = sum(e.stat(follow_symlinks=False).st_size for e in files)
    except OSError:
        return f"no probe files left in {probe_dir}"
    if remove:
        removed = remove_probe_dir(path, "characterize")
        return f"removed the probe files ({human_bytes(total)}): {', '.join(removed) or 'none'}"
    return (f"probe files left in {probe_dir}: {len(files)} files, {human_bytes(total)}, so that the next run "
            "need not lay them out again; --cleanup removes them at the end of a run")


def cmd_characterize(args) -> int:
    if args.compare:
        return cmd_compare(args)
    if not args.path:
        print("iowarden characterize: --path DIR (or --compare A.json B.json)", file=sys.stderr)
        return 2
    roots = Roots()
    try:
        raw = stat.S_ISBLK(os.stat(args.path).st_mode)
    except OSError:
        raw = False
    if raw and args.writes:
        print(f"iowarden characterize: {args.path} is a block device: iowarden never writes to a raw device; "
              "give a directory on its filesystem for write sweeps", file=sys.stderr)
        return 2
    out = None
    if args.out:
        try:
            out = OutDir(args.out)
        except OutDirRefused as exc:
            print(f"iowarden characterize: --out {exc}", file=sys.stderr)
            return 2
        earlier = earlier_run(out)
        if earlier and not args.overwrite:
            print(f"iowarden characterize: {args.out} already holds a run ({earlier}): give another --out, or "
                  "--overwrite to replace it", file=sys.stderr)
            out.close()
            return 2
    sweeps = [s.strip() for s in args.sweep.split(",") if s.strip()]
    bad = [s for s in sweeps if s not in ch.SWEEPS]
    if bad:
        print(f"iowarden characterize: unknown sweep {', '.join(bad)}: choose from {', '.join(ch.SWEEPS)}",
              file=sys.stderr)
        return 2
    size = parse_size_bytes(args.size)
    largest = parse_size_bytes(args.max_working_set)
    if "working-set" in sweeps:
        free = _free_bytes(args.path)
        floor = max(parse_size_bytes(args.min_free_bytes), int(args.min_free_ratio * (free[1] if free else 0)))
        if free is not None:
            largest = min(largest, free[0] - floor)   # never below the free-space floor
    steps = ch.plan(sweeps, size, args.step_seconds, args.ramp_seconds, writes=args.writes,
                    largest_working_set=largest, buffered=args.buffered)
    kept, dropped = ch.within_budget(steps, args.budget_seconds)
    seconds, layout, write_steps = ch.estimate(kept, size)
    budget_bytes = parse_size_bytes(args.budget_bytes)
    say = (lambda m: print(m, file=sys.stderr)) if args.json else print
    say(f"plan: {len(kept)} probes on {args.path} ({', '.join(sweeps)}), about {seconds:.0f} s; lays out "
        f"{layout / 1048576:,.0f} MiB of probe files"
        + (", and up to two more working sets to narrow a cache knee" if "working-set" in sweeps else "")
        + (f", and {write_steps} write steps what the volume takes in their runtime, stopped before "
           f"--budget-bytes {args.budget_bytes} would be passed" if write_steps else "")
        + (f"; {len(dropped)} steps left out by --budget-seconds {args.budget_seconds:g}" if dropped else ""))
    if layout > budget_bytes:
        say(f"iowarden characterize: the probe files alone ({layout / 1048576:,.0f} MiB) are over --budget-bytes "
            f"{args.budget_bytes}: lower --size or --max-working-set, or raise the budget")
        return 2
    if args.dry_run:
        for s in kept:
            say(f"  {s.sweep:<8} {s.label:<10} {s.profile.name}")
        return 0
    dev, util = _busy_percent(args.path, roots)
    if util is not None and util > BUSY_UTIL_PERCENT and not args.force:
        say(f"iowarden characterize: {dev} is busy ({util:.0f}% util from other work): the sweeps would measure "
            "that work as much as the volume. Run it idle, or --force")
        return 1
    biggest = max([size] + [s.value if s.sweep in ("warm", "working-set") else s.profile.size_bytes for s in kept])
    limits = ProbeLimits(max_runtime_seconds=max(60.0, args.step_seconds + 1), max_size_bytes=max(biggest, 1 << 20),
                         min_free_bytes=parse_size_bytes(args.min_free_bytes), min_free_ratio=args.min_free_ratio)
    points: list[ch.Point] = []
    results = []
    progress = sys.stderr.isatty() and not args.json
    interrupted = False
    written, largest_write, skipped_writes, cut_short, out_of_time = 0, 0, 0, [], 0
    # every step asked for and not measured, with why: the tables, plots and findings say them
    not_measured = [{"sweep": s.sweep, "step": s.label, "why": f"--budget-seconds {args.budget_seconds:g}: not in "
                     "the plan that fits it"} for s in dropped if s.sweep != "warm"]
    started = time.monotonic()
    refined, refine_refused = 0, False
    try:
        i = 0
        while i < len(kept):
            step = kept[i]
            i += 1
            if not ch.step_fits(time.monotonic() - started, step, args.budget_seconds):
                out_of_time += 1
                not_measured += [{"sweep": step.sweep, "step": step.label, "why": "the run reached "
                                  f"--budget-seconds {args.budget_seconds:g}"}] if step.sweep != "warm" else []
                continue
            profile, cap = step.profile, None
            if step.profile.writes:
                cap = ch.write_step_cap(budget_bytes, written + layout, largest_write, step.profile.bs_bytes)
                if cap is None:
                    skipped_writes += 1
                    not_measured.append({"sweep": step.sweep, "step": step.label,
                                         "why": f"another write step would have passed --budget-bytes {args.budget_bytes}"})
                    continue
                profile = ch.capped_at(step.profile, cap)
            if progress:
                print(f"\r[{i}/{len(kept)}] {step.sweep} {step.label}   ", end="", file=sys.stderr, flush=True)
            size_of = step.value if step.sweep in ("warm", "working-set") else step.profile.size_bytes
            before = _bytes_written_to(dev, roots) if cap else None
            r, point, why = _measured(step, profile, args.path, limits, size_of, dev, roots, points)
            if step.sweep == "warm":
                continue   # a first pass over the file, not a measurement
            if why and cap and ch.write_step_cap(budget_bytes, written + layout + _charge(
                    r.write_io_bytes, before, _bytes_written_to(dev, roots), cap), cap, step.profile.bs_bytes) is None:
                # a write step measured again writes its cap again: where that would pass the budget, the first
                # measurement stands (a busy machine disturbed a step, and the run wrote 9 % over --budget-bytes)
                say(f"{step.sweep} {step.label}: {why}; not measured again: it would pass --budget-bytes "
                    f"{args.budget_bytes}")
            elif why:   # measured again, once: a disturbed or out-of-line step is not taken as the volume's
                say(f"{step.sweep} {step.label}: {why}; measured again")
                r, again, still = _measured(step, profile, args.path, limits, size_of, dev, roots, points)
                point = ch.settle(point, again, still)
                if still:
                    say(f"{step.sweep} {step.label}: the same again ({still}): left out of the findings")
            results.append(r)
            points.append(point)
            if step.sweep == "working-set" and not any(s.sweep == "working-set" for s in kept[i:]):
                # the doubling sweep is done: narrow its cache knee with a point in the middle
                ws = ch.next_knee_point([p for p in points if p.sweep == "working-set"])
                if ws is not None and layout + written + ws > budget_bytes:
                    refine_refused = True
                elif ws is not None:
                    kept[i:i] = ch.working_set_steps(ws, args.step_seconds, args.ramp_seconds, args.buffered)
                    layout += ws
                    refined += 1
            if cap:
                took = _charge(r.write_io_bytes, before, _bytes_written_to(dev, roots), cap)
                written += took
                largest_write = max(largest_write, took)
                if took >= cap - step.profile.bs_bytes:
                    cut_short.append(f"{step.sweep} {step.label}")
    except KeyboardInterrupt:
        interrupted = True
        not_measured += [{"sweep": s.sweep, "step": s.label, "why": "interrupted"} for s in kept[max(0, i - 1):]
                         if s.sweep != "warm" and not any((p.sweep, p.value) == (s.sweep, s.value) for p in points)]
    if refined:
        say(f"{refined} working sets added between the last served from the cache and the first not, to narrow "
            "the cache knee")
    if refine_refused:
        say(f"the cache knee was not narrowed further: another probe file would have passed --budget-bytes "
            f"{args.budget_bytes}")
    if out_of_time:
        say(f"{out_of_time} steps left out: the run reached --budget-seconds {args.budget_seconds:g} sooner than "
            "planned (laying out probe files, fio starting up)")
    if cut_short:
        say(f"write step {', '.join(cut_short)} stopped at what was left of --budget-bytes {args.budget_bytes}")
    if skipped_writes:
        say(f"{skipped_writes} write steps left out: another would have passed --budget-bytes {args.budget_bytes}")
    if progress:
        print("\r", end="", file=sys.stderr)
    found = findings(points, not_measured)
    doc = {"path": args.path, "device": dev, "started_at": results[0].started_at if results else None,
           "sweeps": sweeps, "run": run_parameters(args, kept, results, size, budget_bytes),
           "points": [p.__dict__ for p in points], "findings": found, "not_measured": not_measured,
           # complete: every step asked for was measured (an interrupt or a budget that left steps out is not)
           "complete": not interrupted and not not_measured}
    if out is not None:
        with out:
            write_out(out, doc, points, found, f"{args.path} ({dev or 'device ?'})", say)
    if not raw:
        say(_probe_files_notice(args.path, args.cleanup))
    if args.config and not interrupted and found.get("qd", {}).get("saturation_iops"):
        say(store_capability(args.config, dev, roots, doc))
    if args.json:
        print(json.dumps(doc))
    else:
        print(render_tables(points, found))
        if interrupted:
            print(f"interrupted: {len(points)} of {sum(s.sweep != 'warm' for s in kept)} steps measured, kept above")
    return 130 if interrupted else (0 if all(p.ok for p in points) else 1)


def add_parser(sub, positive_seconds) -> None:
    c = sub.add_parser("characterize", help="sweep a volume (queue depth, block size, jobs, mix) within a budget")
    # os.path.abspath is lexical: it resolves no link, so the probe's walk from / still refuses one
    c.add_argument("--path", type=os.path.abspath, help="a directory on the volume (probe file in DIR/.iowarden)")
    c.add_argument("-c", "--config", help="the daemon's configuration: store the result as the volume's "
                   "capability in its state database (status shows it; /metrics the headroom)")
    c.add_argument("--compare", nargs=2, metavar="RUN.json",
                   help="two runs' characterize.json side by side, with the change per point")
    c.add_argument("--max-working-set", default="4GiB", help="the working-set sweep's largest file (and never "
                   "past the free-space floor)")
    c.add_argument("--buffered", action="store_true", help="working-set sweep through the page cache (its knee "
                   "is then the cache's size)")
    c.add_argument("--sweep", default="qd,bs", help=f"comma-separated: {', '.join(ch.SWEEPS)} (default qd,bs)")
    c.add_argument("--writes", action="store_true", help="also write sweeps (QD random writes, the write mixes)")
    c.add_argument("--size", default="1GiB", help="probe file size (the working set of every step)")
    c.add_argument("--step-seconds", type=positive_seconds, default=3.0, help="measured seconds per step")
    c.add_argument("--ramp-seconds", type=float, default=1.0, help="warm-up per step, not measured")
    c.add_argument("--budget-seconds", type=positive_seconds, default=300.0, help="the whole run's time cap")
    c.add_argument("--budget-bytes", default="4GiB", help="the most the run may write")
    c.add_argument("--min-free-bytes", default="1GiB", help="never leave less free space than this")
    c.add_argument("--min-free-ratio", type=float, default=0.10, help="... nor a smaller share of the filesystem")
    c.add_argument("--force", action="store_true", help="run on a busy device")
    c.add_argument("--dry-run", action="store_true", help="print the plan and its cost only")
    c.add_argument("--out", help="write characterize.json, characterize.txt and the plots here (a directory "
                   "that holds an earlier run is refused)")
    c.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    c.add_argument("--cleanup", action="store_true", help="remove the probe files at the end of the run (by "
                   "default they stay, and the run says where and how large)")
    c.add_argument("--json", action="store_true", help="every point and the findings as one JSON object")
    c.set_defaults(func=cmd_characterize)
