"""Where the time of real I/O goes: per disk, direction and stage (queue, device, total), from eBPF.

A registered source (sources/registry.py). Its reader keeps one tracer process running, reads the cumulative
counts it prints every window, and hands the core one immutable TraceReading: the counts since the daemon
started (Prometheus histograms) and the last window's (tail latency, and the cause: device or kernel queue).

Two engines print the same lines ([tracer] engine; auto, the default, picks the first that can run):
- compiled: probes/bpf/blockstage.bpf.c, one program at each request's completion timed from the times the
  request carries, a CO-RE object the packages build with clang and install, loaded through libbpf1 by a helper
  process (probes/blockstage.py). Some 100-150 ns per request (bench/tracer_overhead.py). Needs kernel BTF.
- bpftrace (probes/blocktrace.py): three classic tracepoints and two start maps, compiled by bpftrace at each
  start against the running kernel; some 300-400 ns per request and a process of some 100 MB, but any kernel
  with block tracepoints.
Why not BCC: clang and kernel headers on every host at run time. The daemon works without either: the
reading then says the tracer is off and why.

Per service (the compiled engine): each timed request is also counted under the cgroup it was charged to (its bio's
blkcg: on cgroup v2 the writer of page-cache writeback, on v1 the root for all writeback), per disk, in a map of
[tracer] max_cgroups entries whose overflow is each disk's "other". The reader names the ids by a walk of the I/O
hierarchy (an id is its directory's inode number), at most once a window while an id is unknown; it names
max_cgroup_series cgroups per disk, the busiest when first seen (a named one stays named while it exists, so its
series do not come and go with its rank), and sums the rest as "other". bpftrace's engine keeps no count per cgroup.

Bounds: one line of output at most MAX_LINE_BYTES; a process that prints nothing for three windows is
killed and started again; restarts back off from 30 s to 10 min. The program samples requests on a
disk faster than max_timed_iops (one in N: bpftrace by a hash of the sector, the compiled engine at random)
and re-plans N when a disk's rate moves by a factor of four, at most every replan_seconds. Sampling bounds
the programs' own time, not the tracepoints' (some 300-400 ns per request here, timed or not): above
max_cpu_cores' worth of the host's I/O rate over the last minute the tracer pauses (over_budget,
sustained_rate), judged for the compiled engine on its program's time measured near that rate
(figure_is_stale).
"""
from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import time
from dataclasses import dataclass, field
from types import MappingProxyType

from iowarden.probes import blockstage, blocktrace, cgroupio, diskstats
from iowarden.probes.common import Roots

from iowarden.daemon.config_schema import Key
from iowarden.daemon.sources.spec import SourceSpec, stoppable
from iowarden.daemon.sources.tracer_plan import (cost_per_io_ns, figure_is_stale, measured_cost, needs_replan,
                                                  over_budget, skip_for, sustained_rate)
from iowarden.daemon.sources.tracer_proc import (read_available, block_tracepoints, bpftrace_process, choose_engine,
                                                 compiled_process, missing_tracepoints, mount_tracefs, traceable_disks)
from iowarden.daemon.sources.tracer_views import (GONE, NO_CGROUP, OTHER, TraceReading, add_histograms, causes,
                                                   families, status_text, summary)

log = logging.getLogger("iowarden")

# Octave buckets of nanoseconds, 2^12 ns (4.1 µs) to 2^35 ns (34 s): the program's eighth-octave counts
# add up into them exactly, as both are powers of two of the same unit.
RESTART_BACKOFF_SECONDS = (30.0, 60.0, 120.0, 300.0, 600.0)
COMPILE_GRACE_SECONDS = 300.0  # before its first line bpftrace compiles: minutes on a slow (emulated) CPU
PAUSE_MIN_SECONDS = 60.0    # a paused tracer stays off at least this long (each start compiles for seconds)
RATE_AVERAGE_SECONDS = 60.0  # the budget is judged on the host's I/O rate over this (sustained_rate)
WAYS = {"stamped": "the issue time the request carries", "issue map": "the issue program's map (the queue does not "
        "stamp its requests)"}
PAUSED = "paused: the host's I/O rate would take the tracepoints over [tracer] max_cpu_cores"

CONFIG = {
    "enabled": Key("bool", True, "Trace the block layer with bpftrace (when installed): latency of real I/O per "
                   "disk, split into time in the kernel's queue and time in the device."),
    "interval_seconds": Key("float", 15.0, "The window: how often the counts are read, and what the tail "
                            "latency of `status` and of a cause covers.", minimum=1.0, maximum=600.0),
    "engine": Key("str", "auto", "compiled: one BTF tracepoint per request, timed from the times it carries "
                  "(probes/bpf/blockstage.bpf.c, which the packages install, loaded through libbpf; needs libbpf1 "
                  "and a kernel with BTF). bpftrace: three classic tracepoints and two start maps per request, "
                  "compiled at each start (any kernel with block tracepoints). auto: compiled where it can run, "
                  "else bpftrace. bench/tracer_overhead.py measures both.",
                  choices=("auto", "compiled", "bpftrace")),
    "bpftrace_path": Key("str", "bpftrace", "The bpftrace binary."),
    "devices": Key("strlist", [], "Glob patterns of kernel names to trace (empty: [sampler] devices when set, else "
                   "every request-based disk but RAM disks and unattached loop devices)."),
    "max_timed_iops": Key("float", 2000.0, "Above this rate, a disk's requests are sampled (one in N, by a hash "
                          "of the sector) so that about this many per second are timed: the programs' own time "
                          "stays bounded (what the tracepoints cost is bounded by max_cpu_cores).",
                          minimum=10.0, maximum=1e7),
    "max_cpu_cores": Key("float", 0.05, "The tracer's CPU budget. The kernel's tracepoints cost about "
                         "cost_per_io_ns on every request of every disk, timed or not; when the host's I/O rate "
                         "over the last minute would take them over this share of a core the tracer pauses (for "
                         "at least a minute, until the cost is below half of it). 0.05 pauses above some "
                         "125,000 IOPS held for a minute with bpftrace, 330,000 with the compiled engine; a burst "
                         "of seconds (iowarden's own probe) does not.",
                         minimum=0.001, maximum=64.0),
    "cost_per_io_ns": Key("float", 0.0, "What the tracer costs the machine per request of any disk, before "
                          "sampling saves anything. 0: what bench/tracer_overhead.py measured for the engine on a "
                          "2-core VM (bpftrace 400, compiled 150); set it to this host's figure from that bench.",
                          minimum=0.0, maximum=1e6),
    "per_cgroup": Key("bool", True, "The compiled engine also counts each timed request under the cgroup it was "
                      "charged to (a systemd service, scope or container): its latency, requests and bytes per disk. "
                      "bench/tracer_overhead.py measures what it adds per request."),
    "max_cgroups": Key("int", 512, "Entries of the compiled program's map of (disk, cgroup) pairs; requests of pairs "
                       "beyond it are counted as their disk's \"other\" (entries idle for a minute are freed when it "
                       "is three quarters full). About 2 kB each.", minimum=1, maximum=blockstage.MAX_CGROUPS),
    "max_cgroup_series": Key("int", 8, "Cgroups named per disk in the exported series and `status`: the busiest when "
                             "first seen, kept while they exist; the rest are summed as cgroup=\"other\".",
                             minimum=1, maximum=64),
    "replan_seconds": Key("float", 600.0, "At most this often the program is restarted to follow a disk's rate.",
                          minimum=60.0, maximum=86400.0),
}


@dataclass
class _Tracer:
    """The reader's own state, touched by the source's thread only."""
    section: object
    roots: Roots
    proc: subprocess.Popen | None = None
    out_buf: bytes = b""
    err_tail: bytes = b""
    plan: dict = field(default_factory=dict)             # name -> skip
    names: dict = field(default_factory=dict)            # dev_t -> name
    started_at: float = 0.0
    last_line_at: float = 0.0
    failures: int = 0
    next_start_at: float = 0.0
    reason: str | None = None
    base: dict = field(default_factory=dict)             # counts of earlier processes, added on
    base_sums: dict = field(default_factory=dict)
    current: dict = field(default_factory=dict)          # the running process's last counts
    current_sums: dict = field(default_factory=dict)
    previous_total: dict = field(default_factory=dict)   # the totals at the last window's end (for the window)
    # The window is what the last print of counts added. The source reads every interval_seconds and the loader
    # prints every interval_seconds, each on its own clock: a read that found no print since the one before took
    # an empty window, and the last window's percentiles, its cause line and the cgroups' shares went missing
    # from a scrape or a page now and then (on a loaded host, one read in a few). Until a new print comes, a
    # reading keeps the last window.
    counts_printed: int = 0                              # counts lines read, of every process
    counts_windowed: int = -1                            # ... as many as there were when the window was taken
    last_window: dict = field(default_factory=dict)
    rates_prev: diskstats.DiskSample | None = None
    last_iops: dict = field(default_factory=dict)
    last_interval: float = 0.0                           # seconds the last rates cover
    host_rates: list = field(default_factory=list)       # (monotonic, the host's I/O rate, seconds it covers)
    paused: bool = False
    heard: bool = False                                  # the running process has printed a line
    unknown_dropped: int = 0                             # map entries for a dev_t not traced, dropped
    disk_reading: object = None                          # () -> the sampler's latest SamplerReading, or None
    last_reading: object = None                          # the sampler's sample the rates were last taken from
    paths: dict = field(default_factory=dict)            # the compiled engine: name -> how its requests are timed
    engine: str = ""                                     # the engine chosen at the last read: "compiled" or "bpftrace"
    program_cost: object = None                          # the compiled program's last tracer_plan.ProgramCost
    stale_since: float | None = None                     # since when that figure was measured at too low a rate
    cg_pending: dict = field(default_factory=dict)       # (dev, cgroup id, direction) -> counts: the set being read
    cg_current: dict = field(default_factory=dict)       # the running process's last whole set
    cg_base: dict = field(default_factory=dict)          # (name, path, direction) -> counts of entries gone before
    cg_paths: dict = field(default_factory=dict)         # cgroup id -> path on the I/O hierarchy
    cg_walked_at: float = float("-inf")
    cg_hierarchy: int | None = None                      # 1 or 2: the cgroup version of the I/O controller
    cg_named: dict = field(default_factory=dict)         # name -> the paths named in its series, in order
    cg_map: dict = field(default_factory=dict)           # the loader's last word: entries, capacity, evicted
    cg_printed_at: float | None = None                   # ... and when it read the map (monotonic), if it said
    cg_previous: dict = field(default_factory=dict)      # the cgroup totals at the last window's end
    cg_sets_read: int = 0                                # whole sets of cgroup entries read, of every process
    cg_windowed: int = -1                                # ... as many as there were when its window was taken
    cg_last_window: dict = field(default_factory=dict)
    cg_walk_cut: bool = False                            # the last walk of the hierarchy met its bound
    cg_bounds: dict = field(default_factory=dict)        # what the bounds left out: folded, unnamed, walk_cut

    def read(self) -> TraceReading:
        now = time.monotonic()
        iops = self._iops()
        engine, binary, missing = choose_engine(self.section.engine, self.section.bpftrace_path, self.roots)
        if engine is None:
            self._stop("no engine can run")
            return self._off(missing)
        if engine != self.engine:
            if self.proc is not None:   # the object or bpftrace came or went under a running engine
                self._stop(f"the {engine} engine is chosen now")
            log.info("tracer: the %s engine%s", engine, f" ({missing})" if missing else "")
            self.engine = engine
        if engine == "bpftrace" and not (self.roots.sys / "kernel" / "tracing" / "events" / "block").is_dir():
            mount_tracefs(self.roots)
        if self._paused(now, iops):
            return self._reading()
        disks = traceable_disks(self.roots, self.section.devices)
        wanted = {n: skip_for(iops.get(n, 0.0), self.section.max_timed_iops) for n in disks}
        if self.proc is not None and self.proc.poll() is None:
            self._drain()   # what it printed while the reader was away counts before its silence is judged
        if self.proc is not None and self.proc.poll() is None:
            replan_due = now - self.started_at >= self.section.replan_seconds or self.plan.keys() != wanted.keys()
            if replan_due and needs_replan(self.plan, wanted):
                self._stop("re-planned")
            elif now - self.last_line_at > 3 * self.section.interval_seconds + 10 + (
                    0 if self.heard else COMPILE_GRACE_SECONDS):
                self._stop("printed nothing for three windows")
                self.reason = "bpftrace printed nothing for three windows; started again"
        if self.proc is not None and self.proc.poll() is not None:
            self._exited()
        if self.proc is None and now >= self.next_start_at and disks:
            self._start(binary, disks, wanted)
        if self.proc is not None:
            self._drain()
        return self._reading()

    def _paused(self, now: float, iops: dict[str, float]) -> bool:
        whole = os.listdir(self.roots.sys / "block") if (self.roots.sys / "block").is_dir() else []
        rate_now = sum(iops.get(n, 0.0) for n in whole)   # partitions are their disk's requests again
        if iops and (not self.host_rates or now > self.host_rates[-1][0]):
            self.host_rates = [r for r in self.host_rates if r[0] > now - RATE_AVERAGE_SECONDS]
            self.host_rates.append((now, rate_now, self.last_interval))
        host_iops = sustained_rate(self.host_rates, now, RATE_AVERAGE_SECONDS)
        stale = self.proc is not None and figure_is_stale(self.program_cost, host_iops)
        self.stale_since = (self.stale_since if self.stale_since is not None else now) if stale else None
        if over_budget(host_iops, self.paused, self.section, self.engine, self.program_cost,
                       now - self.stale_since if stale else 0.0):
            if not self.paused:
                self._stop("over its CPU budget")
                self.paused, self.next_start_at = True, now + PAUSE_MIN_SECONDS
                log.warning("tracer: paused: the host does %.0f I/O per second (over the last minute); at %.0f ns "
                            "each the tracepoints "
                            "would cost %.2f cores, over [tracer] max_cpu_cores = %g", host_iops,
                            self._cost_ns(), host_iops * self._cost_ns() / 1e9,
                            self.section.max_cpu_cores)
            self.reason = PAUSED
            return True
        if self.paused and now < self.next_start_at:
            return True
        if self.paused:
            self.paused, self.reason = False, None
            log.info("tracer: resumed: the host does %.0f I/O per second", host_iops)
        return False

    # ---- the process ----

    def _start(self, binary: str | None, disks: dict[str, int], wanted: dict[str, int]) -> None:
        skip_by_dev = {disks[n]: s for n, s in wanted.items()}
        try:
            if binary is None:   # the compiled engine: no tracepoint named, nothing compiled
                self.proc = compiled_process(skip_by_dev, self.section.interval_seconds,
                                             max_cgroups=self.section.max_cgroups if self.section.per_cgroup else 0)
            else:
                present = block_tracepoints(self.roots)
                lacking = missing_tracepoints(present)
                if lacking:
                    self._failed(lacking)
                    return
                self.proc = bpftrace_process(binary, blocktrace.program(
                    skip_by_dev, self.section.interval_seconds, present))
        except OSError as exc:
            self._failed(f"cannot start the {self.engine} tracer: {exc.strerror or exc}")
            return
        for stream in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(stream.fileno(), False)
        self.plan, self.names = dict(wanted), {v: k for k, v in disks.items()}
        self.started_at = self.last_line_at = time.monotonic()
        self.out_buf, self.err_tail, self.heard = b"", b"", False
        log.info("tracer: %s started on %d disks (%s)", self.engine, len(disks),
                 ", ".join(f"{n}{'' if not s else f' 1 in {blocktrace.SAMPLE_SCALE / (blocktrace.SAMPLE_SCALE - s):.0f}'}"
                           for n, s in sorted(wanted.items())))

    def _stop(self, why: str) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(timeout=5)
        except ProcessLookupError:
            pass
        self._drain()
        self._retire()
        log.info("tracer: %s stopped: %s", self.engine, why)

    def stop(self) -> None:
        self._stop("the daemon stops")

    def _retire(self) -> None:
        """The process is gone: what it counted becomes the base the next one adds to."""
        for key, hist in self.current.items():
            self.base[key] = add_histograms(self.base.get(key), hist)
            self.base_sums[key] = self.base_sums.get(key, 0.0) + self.current_sums.get(key, 0.0)
        self.current, self.current_sums = {}, {}
        self._cg_set({})   # every entry of the process gone: its counts kept in the base
        self.cg_pending = {}
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        self.proc = None

    def _exited(self) -> None:
        self._drain()
        code = self.proc.returncode
        tail = self.err_tail.decode("utf-8", "replace")
        lines = [x for x in tail.splitlines() if "ERROR" in x and "RLIMIT_MEMLOCK" not in x]
        self._retire()
        engine = "bpftrace" if self.engine == "bpftrace" else "the compiled tracer"
        self._failed(f"{engine} exited with {code}: {(lines[-1] if lines else tail.strip()[-300:]) or 'no message'}")

    def _failed(self, reason: str) -> None:
        delay = RESTART_BACKOFF_SECONDS[min(self.failures, len(RESTART_BACKOFF_SECONDS) - 1)]
        self.failures += 1
        self.next_start_at = time.monotonic() + delay
        if reason != self.reason:
            log.warning("tracer: %s; trying again in %.0f s", reason, delay)
        self.reason = reason

    def _drain(self) -> None:
        """Everything bpftrace has printed since the last read, without blocking."""
        self.err_tail = (self.err_tail + read_available(self.proc.stderr, 1 << 16))[-4096:]
        self.out_buf += read_available(self.proc.stdout, 4 * blocktrace.MAX_LINE_BYTES)
        *lines, self.out_buf = self.out_buf.split(b"\n")
        if not self.heard and any(x.strip() for x in lines):   # "attached_probes": it has compiled, and
            self.heard, self.last_line_at = True, time.monotonic()   # its silence is counted from now
        if len(self.out_buf) > blocktrace.MAX_LINE_BYTES:
            self.out_buf = b""
            self._stop("a line over the bound")
            self._failed(f"bpftrace printed a line over {blocktrace.MAX_LINE_BYTES} bytes")
            return
        for line in lines:
            if not line.strip():
                continue
            if line.startswith(b'{"type":"paths"'):
                self._paths(line)
                continue
            if line.startswith(b'{"type":"cost"'):
                self._measured(line)
                continue
            if line.startswith(b'{"type":"cgroup'):
                self._cgroup_line(line)
                continue
            try:
                parsed = blocktrace.parse_message(line.decode("utf-8", "replace"))
            except ValueError as exc:
                log.warning("tracer: %s", exc)
                continue
            if parsed is None:
                continue
            kind, values = parsed
            # only the disks the program was given: a line naming 60,000 other devices (bpftrace's output
            # is input like any other) must not become 60,000 label sets
            named = {(self.names[dev], d, s): v for (dev, d, s), v in values.items() if dev in self.names}
            self.unknown_dropped += len(values) - len(named)
            if kind == "counts":
                self.current = named
                self.counts_printed += 1
            else:
                self.current_sums = named
            self.last_line_at = time.monotonic()
            self.failures, self.reason = 0, None

    def _paths(self, line: bytes) -> None:
        """The compiled engine's word on how each disk's requests are timed: said when it changes."""
        try:
            paths = {self.names[int(dev)]: blockstage.PATHS.get(int(p), "?")
                     for dev, p in json.loads(line)["data"].items() if int(p) and int(dev) in self.names}
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        if paths != self.paths:
            self.paths = paths
            said = [f"on {', '.join(sorted(n for n in paths if paths[n] == way))} from {WAYS.get(way, way)}"
                    for way in sorted(set(paths.values()))]
            log.info("tracer: requests timed %s", "; ".join(said))

    def _measured(self, line: bytes) -> None:
        """The compiled engine's measured run time (blockstage.cost_message): what the budget is judged on."""
        try:
            data = json.loads(line)["data"]
            run_ns, runs = int(data["run_ns"]), int(data["runs"])
            seconds = float(data.get("seconds", blockstage.COST_SAMPLE_SECONDS))
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        if not 0 < seconds <= blockstage.COST_EVERY_SECONDS:
            return
        before = self.program_cost
        self.program_cost = measured_cost(run_ns, runs, seconds, before)
        cost = self.program_cost
        if cost is not None and cost is not before and (
                before is None or abs(cost.ns_per_request - before.ns_per_request) > 0.25 * before.ns_per_request):
            log.info("tracer: its program runs %.0f ns per request (bpf_stats, %d requests in %.1f s): the budget "
                     "takes %.0f ns with the tracepoint", cost.ns_per_request, runs, seconds, self._cost_ns())

    def _cgroup_line(self, line: bytes) -> None:
        """One (disk, cgroup) entry of the loader's map, or its word that the set is whole."""
        try:
            msg = json.loads(line)
            if msg["type"] == "cgroups_done":
                self.cg_map = {k: int(msg["data"][k]) for k in ("entries", "capacity", "evicted")}
                self.cg_printed_at = printed_at(msg["data"].get("monotonic"), time.monotonic())
                self._cg_set(self.cg_pending)
                self.cg_pending = {}
                self.cg_sets_read += 1
                self.last_line_at = time.monotonic()
            elif len(self.cg_pending) < 2 * blockstage.MAX_CGROUPS + 2 * len(self.names):
                self.cg_pending.update((k, v) for k, v in blockstage.parse_cgroup(msg["data"]).items()
                                       if k[0] in self.names)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("tracer: %s", exc)

    def _cg_set(self, entries: dict) -> None:
        """The process's whole set of cgroup entries now: an entry missing from it was evicted (or the process is
        gone), and its last counts join the base under its path, or under "gone" when its cgroup no longer exists
        (so the base holds the living and one entry per disk for the dead)."""
        for key, counts in self.cg_current.items():
            if key not in entries:
                dev, cgroup, direction = key
                path = self._cg_path(cgroup, live_only=True) or GONE
                base_key = (self.names.get(dev, str(dev)), path, direction)
                self.cg_base[base_key] = counts.plus(self.cg_base.get(base_key))
        self.cg_current = entries

    def _cg_path(self, cgroup: int, live_only: bool = False) -> str | None:
        if cgroup == blockstage.OTHER_CGROUP:
            return OTHER
        if cgroup == 0:
            return NO_CGROUP
        if live_only:
            return self.cg_paths.get(cgroup)
        return self.cg_paths.get(cgroup, f"(cgroup id {cgroup}, removed)")

    def _cg_names(self, now: float) -> None:
        """Walk the I/O hierarchy when an id is unknown, at most once a window: ids of cgroups removed since stay
        unknown, and are not walked for again and again."""
        unknown = {c for (_, c, _) in self.cg_current if c not in self.cg_paths and c != blockstage.OTHER_CGROUP and c}
        if not unknown or now - self.cg_walked_at < self.section.interval_seconds:
            return
        self.cg_walked_at = now
        self.cg_hierarchy, paths, cut = cgroupio.ids(self.roots)
        self.cg_paths, self.cg_walk_cut = paths, cut
        live = set(paths.values())
        for (name, path, direction) in [k for k in self.cg_base if k[1] not in live and k[1] != GONE]:
            gone = (name, GONE, direction)   # the dead: one entry per disk and direction, not one each
            self.cg_base[gone] = self.cg_base.pop((name, path, direction)).plus(self.cg_base.get(gone))
        if cut:
            log.warning("tracer: the cgroup hierarchy has over %d cgroups: those past them are not named",
                        cgroupio.MAX_CGROUPS)

    def _cg_totals(self) -> dict:
        """(name, path, direction) -> counts since the daemon started: the base and the living entries, the paths
        beyond max_cgroup_series of a disk summed as OTHER."""
        merged: dict = dict(self.cg_base)
        for (dev, cgroup, direction), counts in self.cg_current.items():
            key = (self.names.get(dev, str(dev)), self._cg_path(cgroup), direction)
            merged[key] = counts.plus(merged.get(key))
        live = set(self.cg_paths.values())
        for name in list(self.cg_named):   # a removed cgroup's name frees its place
            self.cg_named[name] = [p for p in self.cg_named[name] if p in live]
        busiest: dict = {}
        for (name, path, _), counts in merged.items():
            busiest[(name, path)] = busiest.get((name, path), 0) + counts.requests
        for (name, path), _ in sorted(busiest.items(), key=lambda kv: -kv[1]):
            named = self.cg_named.setdefault(name, [])
            if path not in named and path in live and len(named) < self.section.max_cgroup_series:
                named.append(path)
        out: dict = {}
        folded = set()
        for (name, path, direction), counts in merged.items():
            named = path in self.cg_named.get(name, ())
            if not named and path in live:
                folded.add((name, path))
            key = (name, path if named else OTHER, direction)
            out[key] = counts.plus(out.get(key))
        self.cg_bounds = {"folded": len(folded), "walk_cut": int(self.cg_walk_cut),
                          "unnamed": len({c for (_, c, _) in self.cg_current
                                          if c not in self.cg_paths and c not in (0, blockstage.OTHER_CGROUP)})}
        return out

    def _cost_ns(self) -> float:
        return cost_per_io_ns(self.section, self.engine or "bpftrace", self.program_cost)

    def _iops(self) -> dict[str, float]:
        if self.disk_reading is not None:
            # the sampler's sample, every device's counters: the tracepoints cost every request on the host,
            # whatever [sampler] devices watches
            reading = self.disk_reading()
            cur = reading.sample if reading is not None else None
            if cur is None or cur is self.last_reading:
                return self.last_iops
            self.last_reading = cur
        else:
            cur = diskstats.read(self.roots)
        prev = self.rates_prev
        if prev is not None and cur.monotonic_seconds <= prev.monotonic_seconds:
            return self.last_iops   # read again within the same instant: the rates it had
        self.rates_prev = cur
        if prev is None:
            return {}
        self.last_interval = cur.monotonic_seconds - prev.monotonic_seconds
        t = self.last_interval
        self.last_iops = {n: (diskstats.counter_delta(prev.counters[n].reads, c.reads)
                              + diskstats.counter_delta(prev.counters[n].writes, c.writes)) / t
                          for n, c in cur.counters.items() if n in prev.counters}
        return self.last_iops

    # ---- the reading ----

    def _off(self, reason: str) -> TraceReading:
        if reason != self.reason:
            log.info("tracer: off: %s", reason)
        self.reason = reason
        return self._reading()

    def _reading(self) -> TraceReading:
        keys = self.base.keys() | self.current.keys()
        total = {k: add_histograms(self.base.get(k), self.current.get(k)) for k in keys}
        sums = {k: self.base_sums.get(k, 0.0) + self.current_sums.get(k, 0.0) for k in keys}
        # up once the program is attached (its first line), not while bpftrace compiles or the kernel refuses it
        up = self.proc is not None and self.proc.poll() is None and self.heard
        # off, paused or compiling, a window is what moved since the last reading: nothing, after the first
        if not up or self.counts_printed != self.counts_windowed or total.keys() != self.previous_total.keys():
            self.last_window = {k: h.minus(self.previous_total.get(k)) for k, h in total.items()}
            self.previous_total, self.counts_windowed = total, self.counts_printed
        window = self.last_window
        share = {n: (blocktrace.SAMPLE_SCALE - s) / blocktrace.SAMPLE_SCALE for n, s in self.plan.items()}
        self._cg_names(time.monotonic())
        cg_total = self._cg_totals()
        # a walk that names a cgroup moves its counts from "other" to its own key with no new set: a new window
        if not up or self.cg_sets_read != self.cg_windowed or cg_total.keys() != self.cg_previous.keys():
            self.cg_last_window = {k: c.minus(self.cg_previous.get(k)) for k, c in cg_total.items()}
            self.cg_previous, self.cg_windowed = cg_total, self.cg_sets_read
        cg_window = self.cg_last_window
        starting = self.proc is not None and not up and self.proc.poll() is None
        return TraceReading(time.time(), up, None if up else ("compiling the program" if starting and not self.reason
                                                              else self.reason or "not started yet"),
                            self.section.interval_seconds, MappingProxyType(share if up else {}),
                            MappingProxyType(total), MappingProxyType(sums), MappingProxyType(window),
                            self.unknown_dropped, self.engine, self._cost_ns(),
                            "configured" if self.section.cost_per_io_ns else
                            "measured" if self.program_cost is not None and self.engine == "compiled" else "bench",
                            MappingProxyType({k: (c, cg_window[k]) for k, c in cg_total.items()}),
                            self.cg_hierarchy, MappingProxyType({**self.cg_map, **self.cg_bounds}),
                            self.cg_printed_at)


def printed_at(said, now_monotonic: float) -> float | None:
    """The loader's word of when it read its map (CLOCK_MONOTONIC, shared by every process on the host), if it is
    a time that could be: finite, not negative, not after now (a second's grace). Anything else is no word."""
    if isinstance(said, bool) or not isinstance(said, (int, float)) or not math.isfinite(said):
        return None
    return float(said) if 0.0 <= said <= now_monotonic + 1.0 else None


def start(section, roots: Roots, disk_reading=None):
    """disk_reading: the sampler's latest reading, whose sample (every device's counters) the budget is
    judged on (the daemon's one read of /proc/diskstats a tick); without it (a guest's script, `iostat
    --latency`) the tracer reads /proc/diskstats itself."""
    tracer = _Tracer(section, roots, disk_reading=disk_reading)
    # the runtime stops bpftrace with the daemon (sources/registry.py), never in the middle of a read
    return stoppable(tracer.read, tracer.stop)


# ---- /metrics ----------------------------------------------------------------------------------

SPEC = SourceSpec("tracer", CONFIG, start,
                  # one read drains a pipe and may stop and start bpftrace (5 s to stop, its start returns at once)
                  deadline_seconds=lambda c: 30.0,
                  families=families, causes=causes, summary=summary, status_text=status_text)
