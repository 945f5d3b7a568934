"""`iowarden iostat`: sysstat's `iostat -x` from /proc/diskstats and /proc/stat, in its layout.

The operands are sysstat's: `[DEVICE ...] [INTERVAL [COUNT]]`, -d for the device report only, -c for
the CPU report only, -y to leave out the since-boot report; -x is accepted and changes nothing (the
report is always the extended one). Columns have sysstat 12's widths, so a script or an eye used to
iostat reads ours the same way, and they do not move between reports.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import time

from iowarden.probes import cpustat, diskstats
from iowarden.probes.common import Roots

from iowarden.daemon.commands.tables import print_lines as _print

# sysstat 12's extended columns and the width of each value (after the one-space separator).
EXTENDED_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("r/s", "r/s", 7), ("rkB/s", "rkB/s", 9), ("rrqm/s", "rrqm/s", 8), ("%rrqm", "rrqm", 6),
    ("r_await", "r_await", 7), ("rareq-sz", "rareq-sz", 8),
    ("w/s", "w/s", 7), ("wkB/s", "wkB/s", 9), ("wrqm/s", "wrqm/s", 8), ("%wrqm", "wrqm", 6),
    ("w_await", "w_await", 7), ("wareq-sz", "wareq-sz", 8),
    ("d/s", "d/s", 7), ("dkB/s", "dkB/s", 9), ("drqm/s", "drqm/s", 8), ("%drqm", "drqm", 6),
    ("d_await", "d_await", 7), ("dareq-sz", "dareq-sz", 8),
    ("f/s", "f/s", 7), ("f_await", "f_await", 7), ("aqu-sz", "aqu-sz", 7), ("%util", "util", 6),
)
DEVICE_NAME_WIDTH = 13
AVG_CPU_HEADER = "avg-cpu:  %user   %nice %system %iowait  %steal   %idle"


class Operands(argparse.Action):
    """Split sysstat's operands as sysstat does: numbers are the interval, then the count; anything else is a
    device, wherever it stands (`iostat 1 2 -x sda` is sysstat's too)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from iowarden.daemon.commands.args import positive_int, positive_seconds
        devices, numbers = [], []
        for token in values:
            (numbers if _is_number(token) else devices).append(token)
        if len(numbers) > 2:
            parser.error(f"at most an interval and a count, got {' '.join(numbers)}")
        try:
            interval = positive_seconds(numbers[0]) if numbers else None
            count = positive_int(numbers[1]) if len(numbers) > 1 else None
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
        namespace.devices, namespace.interval, namespace.count = devices, interval, count


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def add_parser(sub) -> None:
    io = sub.add_parser("iostat", usage="iowarden iostat [-h] [-d | -c] [-x] [-p] [-y] [--json] [--device GLOB] "
                        "[DEVICE ...] [INTERVAL [COUNT]]", help="iostat -x from /proc/diskstats and /proc/stat, in sysstat's layout",
                        description="The reports of sysstat's `iostat -x`: avg-cpu and the extended device "
                        "statistics, computed with sysstat's formulas.")
    io.add_argument("operands", nargs="*", action=Operands, metavar="DEVICE|INTERVAL|COUNT",
                    help="devices (names or globs; none: every device that has done I/O), seconds between "
                    "reports (none: one since-boot report), number of reports (none: until interrupted)")
    what = io.add_mutually_exclusive_group()
    what.add_argument("-d", dest="device_only", action="store_true", help="the device report only")
    what.add_argument("-c", dest="cpu_only", action="store_true", help="the CPU report only")
    io.add_argument("-x", dest="extended", action="store_true", help="accepted for sysstat's sake: always extended")
    io.add_argument("--device", dest="device_globs", action="append", default=[], metavar="GLOB",
                    help="also select devices by name or glob (repeatable)")
    io.add_argument("-p", "--partitions", action="store_true", help="include partitions")
    io.add_argument("-y", dest="omit_first", action="store_true", help="omit the since-boot report")
    io.add_argument("--json", action="store_true", help="one JSON object per device per interval, one per line "
                    "(sysstat's keys; no CPU report)")
    io.add_argument("--latency", action="store_true", help="instead: the latency of real I/O per disk, direction "
                    "and stage (queue, device, total) from the block layer's tracepoints (the engine below), every "
                    "INTERVAL seconds (default 5), COUNT times (default 1), in microseconds or milliseconds as "
                    "bcc's biolatency; a stage the device does not stamp is said as not timed")
    io.add_argument("--engine", choices=("auto", "compiled", "bpftrace"), default="auto",
                    help="with --latency: the tracer's engine ([tracer] engine); auto: the compiled one where it "
                    "can run (its object built, libbpf, a kernel with BTF), else bpftrace")
    io.set_defaults(func=cmd_iostat, devices=[], interval=None, count=None)


def _select(sample: diskstats.DiskSample, patterns: list[str], partitions: bool, roots: Roots) -> list[str]:
    names = []
    for name, c in sample.counters.items():
        if patterns:
            if any(fnmatch.fnmatch(name, pat) for pat in patterns):
                names.append(name)
            continue
        if not partitions and diskstats.is_partition(name, roots):
            continue
        # like sysstat: a device that has never done I/O is not shown unless asked for
        if c.reads or c.writes or c.discards or c.flushes:
            names.append(name)
    return sorted(names)   # sysstat lists devices by name


def banner(cpu_count: int, now: float) -> str:
    """sysstat's first line: kernel, host, date, machine, CPUs (tab-separated as sysstat prints it)."""
    u = os.uname()
    return f"{u.sysname} {u.release} ({u.nodename}) \t{time.strftime('%x', time.localtime(now))} " \
           f"\t_{u.machine}_\t({cpu_count} CPU)"


def avg_cpu_block(cpu: cpustat.AvgCpuPercent) -> list[str]:
    values = (cpu.user, cpu.nice, cpu.system, cpu.iowait, cpu.steal, cpu.idle)
    return [AVG_CPU_HEADER, "       " + "".join(f" {v:7.2f}" for v in values), ""]


def device_block(rows: list[diskstats.DiskRates]) -> list[str]:
    header = "Device".ljust(DEVICE_NAME_WIDTH) + "".join(f" {title:>{w}}" for title, _, w in EXTENDED_COLUMNS)
    lines = [header]
    for r in rows:
        s = r.as_sysstat()
        lines.append(r.name.ljust(DEVICE_NAME_WIDTH) + "".join(f" {s[key]:{w}.2f}" for _, key, w in EXTENDED_COLUMNS))
    return lines + [""]


def report_lines(cpu: cpustat.AvgCpuPercent | None, rows: list[diskstats.DiskRates] | None) -> list[str]:
    """One report as sysstat lays it out: the CPU block, the device block, then a blank line."""
    lines = []
    if cpu is not None:
        lines += avg_cpu_block(cpu)
    if rows is not None:
        lines += device_block(rows)
    else:
        lines += [""]   # sysstat 12 ends a CPU-only report with one more blank line
    return lines + [""]


class _Reporter:
    def __init__(self, args, names: list[str]):
        self.args, self.names = args, names

    def emit(self, rates: dict, cpu: cpustat.AvgCpuPercent, stamp: float) -> None:
        rows = [rates[n] for n in self.names if n in rates]
        if self.args.json:
            for r in rows:
                _print(json.dumps({"timestamp": round(stamp, 3), **r.as_sysstat()}))
            return
        lines = report_lines(None if self.args.device_only else cpu, None if self.args.cpu_only else rows)
        _print("\n".join(lines))


def cmd_iostat(args) -> int:
    if args.latency:
        from iowarden.daemon.commands.iolatency import cmd_latency
        return cmd_latency(args)
    roots = Roots()
    prev, prev_cpu = diskstats.read(roots), cpustat.read(roots)
    patterns = list(args.devices) + list(args.device_globs)
    names = _select(prev, patterns, args.partitions, roots)
    if patterns and not names:
        raise SystemExit(f"iowarden iostat: no device matches {' '.join(patterns)}")
    out = _Reporter(args, names)
    if not args.json:
        _print(banner(os.cpu_count() or 1, time.time()) + "\n")
    count = args.count   # the number of reports, the first one included (sysstat's "count")
    if args.interval is None or not args.omit_first:
        # The first report covers the time since boot, as iostat's does.
        uptime_seconds = float((roots.proc / "uptime").read_text().split()[0])
        zero = diskstats.DiskSample(prev.monotonic_seconds - uptime_seconds,
                                    {n: diskstats.DiskCounters(c.major, c.minor, n) for n, c in prev.counters.items()})
        out.emit(diskstats.rates_between(zero, prev), cpustat.avg_cpu(cpustat.CpuTicks(), prev_cpu), time.time())
        if count is not None:
            count -= 1
    if args.interval is None:
        return 0
    next_tick = time.monotonic() + args.interval
    while count is None or count > 0:
        time.sleep(max(0.0, next_tick - time.monotonic()))
        next_tick += args.interval
        cur, cur_cpu = diskstats.read(roots), cpustat.read(roots)
        out.emit(diskstats.rates_between(prev, cur), cpustat.avg_cpu(prev_cpu, cur_cpu), time.time())
        prev, prev_cpu = cur, cur_cpu
        if count is not None:
            count -= 1
    return 0
