"""`iowarden iostat --latency`: where the time of real I/O goes, for a few seconds, as bcc's biolatency.

The daemon's tracer (its engine chosen as the daemon's is: the compiled program where it can run, else bpftrace's,
probes/blocktrace.py) run once in the foreground: every INTERVAL seconds a
table per disk, direction and stage (queue: submission to issue; device: issue to completion; total),
with the I/Os timed and their p50, p99 and p99.9 in one unit, and with --json one object per row.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from iowarden.probes import blocktrace
from iowarden.probes.common import ParseError, Roots

from iowarden.daemon.commands.tables import print_lines as _print, table
from iowarden.daemon.sources.tracer_proc import (block_tracepoints, bpftrace_process, choose_engine, compiled_process,
                                                 missing_tracepoints, traceable_disks)
from iowarden.daemon.wording import latency_unit

COMPILE_SECONDS = 60.0   # bpftrace's start, before the first window (LLVM compiles the program)


def cmd_latency(args) -> int:
    roots = Roots()
    engine, binary, missing = choose_engine(getattr(args, "engine", "auto"), "bpftrace", roots)   # as the daemon's
    if engine is None:
        raise SystemExit(f"iowarden iostat --latency: {missing}")
    disks = traceable_disks(roots, list(args.devices) + list(args.device_globs))
    if not disks:
        raise SystemExit("iowarden iostat --latency: no request-based disk matches "
                         + (" ".join(args.devices + args.device_globs) or "(none on this host)"))
    interval = args.interval or 5.0
    count = args.count or 1
    names = {dev: name for name, dev in disks.items()}
    present = None
    if binary is not None:
        present = block_tracepoints(roots)
        if missing_tracepoints(present):
            raise SystemExit(f"iowarden iostat --latency: {missing_tracepoints(present)}")
    previous: dict = {}
    deadline = time.monotonic() + COMPILE_SECONDS + interval * (count + 1)
    # SIGTERM (timeout(1), systemd-run, a bench) ends it as Ctrl-C does, through the `finally` below: its tracer
    # process is in a session of its own and would otherwise run on, attached, until its next write failed. Set
    # before the tracer starts: a SIGTERM the moment it has would otherwise kill this process and leave it behind
    signal.signal(signal.SIGTERM, _terminated)
    proc = watchdog = None
    try:
        if binary is None:   # the compiled engine: one program at completion, loaded in a second
            proc = compiled_process({dev: 0 for dev in disks.values()}, interval, text=True)
        else:
            proc = bpftrace_process(binary, blocktrace.program({dev: 0 for dev in disks.values()}, interval,
                                                               present), text=True)
        # a bpftrace that prints nothing (stuck compiling) is killed, which ends the loop below
        watchdog = threading.Timer(deadline - time.monotonic(), lambda: _kill(proc))
        watchdog.daemon = True
        watchdog.start()
        if not args.json:
            print(f"tracing {', '.join(sorted(disks))} every {interval:g} s ... Ctrl-C to stop", file=sys.stderr)
        counts = None
        for line in proc.stdout:
            if len(line) > blocktrace.MAX_LINE_BYTES or time.monotonic() > deadline:
                raise SystemExit("iowarden iostat --latency: bpftrace's output is over its bounds")
            try:
                parsed = blocktrace.parse_message(line)
            except ParseError as exc:
                raise SystemExit(f"iowarden iostat --latency: {exc}") from None
            if parsed is None:
                continue
            kind, values = parsed
            if kind == "counts":
                counts = values
                continue
            window = {k: h.minus(previous.get(k)) for k, h in (counts or {}).items()}
            previous = counts or {}
            _report(window, names, args.json)
            count -= 1
            if count <= 0:
                return 0
        err = proc.stderr.read()[-2000:]
        lines = [x for x in err.splitlines() if "ERROR" in x and "RLIMIT_MEMLOCK" not in x]
        raise SystemExit(f"iowarden iostat --latency: {'bpftrace' if binary else 'the compiled tracer'} exited with "
                         f"{proc.wait()}: "
                         f"{(lines[-1] if lines else err.strip()[-300:]) or 'no message'}")
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if proc is not None:
            _kill(proc)


def _terminated(*_) -> None:
    raise SystemExit(128 + signal.SIGTERM)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


# No request spends less than a microsecond in a stage a device times; a stage whose every request took less was
# not stamped by the device (a loop device's queue stage, under the compiled engine, read as "2 nsec")
UNTIMED_BELOW_SECONDS = 1e-6
NOT_TIMED = "not timed by this device"


def timed(stage: str, h) -> bool:
    """False for a queue or device stage the device does not stamp (all of it under a microsecond)."""
    top = h.quantile_seconds(0.999)
    return stage == "total" or top is None or top >= UNTIMED_BELOW_SECONDS


def person_unit(values_seconds) -> tuple[str, float]:
    """µs, or ms when every value is over 2 ms and one over 100 ms: the units biolatency and a person read
    latency in (fio's nsec is for its own percentile lists)."""
    unit, scale = latency_unit(values_seconds)
    return (unit, scale) if unit == "msec" else ("usec", 1e-6)


def _report(window: dict, names: dict, as_json: bool) -> None:
    rows = sorted(((names[dev], d, s, h) for (dev, d, s), h in window.items() if h.total and dev in names),
                  key=lambda r: (r[0], r[1], blocktrace.STAGES.index(r[2])))
    if as_json:
        for name, d, s, h in rows:
            ok = timed(s, h)
            _print(json.dumps({"timestamp": round(time.time(), 3), "device": name, "direction": d, "stage": s,
                               "ios": h.total, "timed": ok,
                               **{f"p{p}_seconds": h.quantile_seconds(float(p) / 100) if ok else None
                                  for p in ("50", "99", "99.9")}}))
        return
    if not rows:
        _print(time.strftime("%H:%M:%S") + "  no I/O on the traced disks\n")
        return
    shown = {p: [h.quantile_seconds(float(p.lstrip("p")) / 100) if timed(s, h) else None for _, _, s, h in rows]
             for p in ("p50", "p99", "p99.9")}
    unit, scale = person_unit(v for values in shown.values() for v in values)
    cells = [[NOT_TIMED, "", ""] if row[0] is None else ["<1" if v < scale else f"{v / scale:,.0f}" for v in row]
             for row in zip(*shown.values())]
    _print(time.strftime("%H:%M:%S") + "\n" + table(["device", "dir", "stage", "I/Os", *(f"{p} {unit}" for p in shown)],
                                                    [[n, d, s, h.total, *c] for (n, d, s, h), c in zip(rows, cells)]) + "\n")
