"""The tracer's compiled engine: probes/bpf/blockstage.bpf.c, a CO-RE object loaded through libbpf, run as a
helper process that prints what bpftrace's program printed (blocktrace.parse_message reads both).

    python -m iowarden.probes.blockstage --object blockstage.bpf.o --interval-ms 15000 < disks.json

Its standard input is one JSON object, {"dev_t": skip, ...} (the disks to trace, the kernel's dev_t, and of
blocktrace.SAMPLE_SCALE how many requests not to time); every interval it prints the cumulative counts as
two JSON lines, {"type": "map", "data": {"@lat": {"dev,dir,stage,bucket": count}}} and the same for "@ns"
(nanoseconds summed), then {"type": "paths", "data": {"dev_t": path}}: how each disk's requests are timed
(1: from the issue time the request carries, 2: from the issue program's map, 0: no request yet). Once a
minute it measures its programs' own run time for a second (the kernel's bpf_stats) and prints
{"type": "cost", "data": {"run_ns": N, "runs": M, "seconds": S}}: what the tracer's budget is judged on.

Per cgroup (unless --max-cgroups 0), every interval, one line per (disk, cgroup) pair the program counts,
{"type": "cgroup", "data": {"dev": D, "cgroup": ID, "read": [requests, bytes, ns, [[bucket, count], ...]],
"write": [...]}} (cumulative, buckets in blocktrace's index; each disk's "other" as cgroup OTHER_CGROUP), then
{"type": "cgroups_done", "data": {"entries": N, "capacity": M, "evicted": E}}: the set is whole, and a pair missing
from it was freed (its counts are the reader's to keep). The program has --max-cgroups slots for pairs; when over
EVICT_FILL of them are taken, pairs idle for EVICT_IDLE_READS intervals are freed, so that a host whose containers
come and go keeps room for the living.

Why a program of our own and not bpftrace: bpftrace 0.17 has no BTF-typed tracepoints, so it cannot read
the times a request carries and needs three tracepoints and two start maps per request (docs/measurements.md, "The compiled engine").

Pure: `messages` (the maps' contents as the lines printed). Thin: `Loaded` (libbpf through ctypes), `main`.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

from . import blocktrace
from .blocktrace import SAMPLE_SCALE
from .common import ParseError

OBJECT_NAME = "blockstage.bpf.o"
EM_BPF = 247          # the ELF machine of a BPF object


def object_problem(head: bytes, size_bytes: int) -> str | None:
    """Why these first 64 bytes of a file of this size are not a whole 64-bit little-endian BPF object, or None.
    The section headers sit at the file's end, so a cut file is told by its size (libbpf would only say
    "could not open", and the tracer would retry it every window)."""
    if len(head) < 64 or head[:4] != b"\x7fELF":
        return "not an ELF object"
    if head[4] != 2 or head[5] != 1:
        return "not a 64-bit little-endian ELF object"
    machine = int.from_bytes(head[18:20], "little")
    if machine != EM_BPF:
        return f"an ELF object for machine {machine}, not BPF ({EM_BPF})"
    shoff = int.from_bytes(head[40:48], "little")
    shentsize, shnum = int.from_bytes(head[58:60], "little"), int.from_bytes(head[60:62], "little")
    if shoff + shentsize * shnum > size_bytes:
        return f"cut short: its section headers end at byte {shoff + shentsize * shnum}, the file has {size_bytes}"
    return None
MAX_DISKS = 8192                # the `disks` map and the `sums` slots: more is refused at the start
MAX_INPUT_BYTES = 1 << 20       # the disks on standard input
BATCH = 4096                    # entries read from a map per system call
PATH_ISSUE_MAP = 2
STAGE_UNQUEUED = 3             # blockstage.bpf.c: device = total, queue 0, counted once
SLOTS_PER_DISK = 8             # blockstage.bpf.c: the sums of two directions of four stages
PATHS = {0: "none", 1: "stamped", PATH_ISSUE_MAP: "issue map"}
CG_FIRST_BUCKET = 10 << blocktrace.SUB_BITS   # blockstage.bpf.c: a cgroup's bucket 0 is blocktrace's 80 (1 us)...
CG_BUCKETS = 32 << blocktrace.SUB_BITS        # ...and its last 2^42 ns (73 min), times outside counted at the ends
OTHER_CGROUP = (1 << 64) - 1                  # a disk's own slot: its cgroups the program had no slot for
MAX_CGROUPS = 4096                            # entries of the map the loader may be asked for
EVICT_FILL = 0.75
EVICT_IDLE_READS = 4
BPF_STATS_RUN_TIME = 0
COST_EVERY_SECONDS = 60.0      # how often the programs' own run time is measured...
COST_SAMPLE_SECONDS = 1.0      # ...and for how long: the kernel's statistics cost every BPF program on the host
                               # two clock reads a run while they are on, so they are on 1/60 of the time


def spread_unqueued(lat: dict) -> dict:
    """The program counts a request that spent no time in the queue once, at STAGE_UNQUEUED (one map update
    where three would be): it is a device and a total time of that bucket, and a queue time of 0."""
    out: dict = {}
    for (dev, d, stage, bucket), c in lat.items():
        for key in ([(dev, d, 1, bucket), (dev, d, 2, bucket), (dev, d, 0, 0)] if stage == STAGE_UNQUEUED
                    else [(dev, d, stage, bucket)]):
            out[key] = out.get(key, 0) + c
    return out


def messages(lat: dict, sums: dict, dev_of_index: dict, paths: dict) -> list[dict]:
    """The maps as the lines printed: lat {(dev, dir, stage, bucket): count}, sums {slot: ns} (slot = disk
    index * SLOTS_PER_DISK + dir * 4 + stage, the unqueued requests' time in stage 3), paths {dev: path}."""
    lat = spread_unqueued(lat)
    ns: dict = {}
    for slot, total in sums.items():
        index, rest = divmod(slot, SLOTS_PER_DISK)
        d, stage = divmod(rest, STAGE_UNQUEUED + 1)
        dev = dev_of_index.get(index)
        if dev is None or not total:
            continue
        for st in ((1, 2) if stage == STAGE_UNQUEUED else (stage,)):   # an unqueued time is both of these
            ns[f"{dev},{d},{st}"] = ns.get(f"{dev},{d},{st}", 0) + total
    return [{"type": "map", "data": {"@lat": {f"{dev},{d},{s},{b}": c for (dev, d, s, b), c in lat.items() if c}}},
            {"type": "map", "data": {"@ns": ns}},
            {"type": "paths", "data": {str(dev): p for dev, p in paths.items()}}]


def cgroup_messages(entries: dict, capacity: int, evicted: int, monotonic_seconds: float | None = None) -> list[dict]:
    """The cgroups map as the lines printed: entries {(dev, cgroup): ((requests, bytes, ns, {cg bucket: count}),
    (the same for writes))}, buckets in the program's own index (CG_FIRST_BUCKET below blocktrace's).
    monotonic_seconds: when the map was read (CLOCK_MONOTONIC, the host's one): the span two prints' counts
    cover, whenever the daemon reads them."""
    out = []
    for (dev, cgroup), dirs in sorted(entries.items()):
        data = {"dev": dev, "cgroup": cgroup}
        for name, (requests, nbytes, ns, buckets) in zip(blocktrace.DIRECTIONS, dirs):
            if requests:
                data[name] = [requests, nbytes, ns, [[b + CG_FIRST_BUCKET, c] for b, c in sorted(buckets.items()) if c]]
        if len(data) > 2:
            out.append({"type": "cgroup", "data": data})
    done = {"entries": len(entries), "capacity": capacity, "evicted": evicted}
    if monotonic_seconds is not None:
        done["monotonic"] = round(monotonic_seconds, 3)
    out.append({"type": "cgroups_done", "data": done})
    return out


def parse_cgroup(data) -> dict:
    """One "cgroup" line's data -> {(dev, cgroup, direction): CgroupCounts}, checked (the loader's output is input
    like any other: a ParseError names what is wrong)."""
    try:
        dev, cgroup = int(data["dev"]), int(data["cgroup"])
        if not (0 < dev < 1 << 32 and 0 <= cgroup < 1 << 64):
            raise ValueError
        out = {}
        for direction in blocktrace.DIRECTIONS:
            if direction not in data:
                continue
            requests, nbytes, ns, buckets = data[direction]
            if len(buckets) > CG_BUCKETS:
                raise ValueError
            counts = tuple(sorted((int(b), int(c)) for b, c in buckets))
            if any(not 0 <= b < 64 * blocktrace.SUB_BUCKETS or not 0 < c < 1 << 64 for b, c in counts) \
                    or not all(0 <= int(x) < 1 << 64 for x in (requests, nbytes, ns)):
                raise ValueError
            out[(dev, cgroup, direction)] = blocktrace.CgroupCounts(int(requests), int(nbytes), int(ns),
                                                                    blocktrace.StageHistogram(counts))
        return out
    except (KeyError, TypeError, ValueError, OverflowError):
        raise ParseError(f"a cgroup line that is not the loader's: {json.dumps(data)[:80]!r}") from None


def idle_to_evict(requests_now: dict, last: dict, idle: dict, used: int, capacity: int) -> list:
    """Which entries to delete: {key: requests} now and at the last read, {key: reads it has not moved} (updated in
    place). Only when the map is over EVICT_FILL full, only entries idle for EVICT_IDLE_READS reads, never a
    disk's OTHER_CGROUP entry (the program's place for what has no room)."""
    for key, n in requests_now.items():
        idle[key] = idle.get(key, 0) + 1 if last.get(key) == n else 0
    for key in list(idle):
        if key not in requests_now:
            del idle[key]
    if used <= EVICT_FILL * capacity:
        return []
    return [k for k, reads in idle.items() if reads >= EVICT_IDLE_READS and k[1] != OTHER_CGROUP]


def fdinfo_run_stats(text: str) -> tuple[int, int]:
    """(run_time_ns, run_cnt) from a BPF program's /proc/self/fdinfo (0, 0 where the kernel does not say)."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields.get("run_time_ns", "0").strip() or 0), int(fields.get("run_cnt", "0").strip() or 0)


def cost_message(before: dict, after: dict, seconds: float) -> dict:
    """The programs' run time over a measurement of `seconds`: {program: (run_time_ns, run_cnt)} before and after
    -> a line saying the nanoseconds all programs ran and the requests completed (the completion program's runs),
    which the tracer divides into its cost per request, and the seconds, which say at what rate it was measured
    (sources/tracer_plan.py)."""
    run_ns = sum(after[p][0] - before.get(p, (0, 0))[0] for p in after)
    runs = after.get("on_complete", (0, 0))[1] - before.get("on_complete", (0, 0))[1]
    return {"type": "cost", "data": {"run_ns": max(0, run_ns), "runs": max(0, runs), "seconds": round(seconds, 3)}}


def read_disks(text: str) -> dict[int, int]:
    """{"dev_t": skip} from standard input, bounded and checked."""
    raw = json.loads(text)
    if not isinstance(raw, dict) or len(raw) > MAX_DISKS:
        raise ValueError(f"the disks must be an object of at most {MAX_DISKS} entries")
    out = {}
    for dev, skip in raw.items():
        dev, skip = int(dev), int(skip)
        if not (0 < dev < 1 << 32 and 0 <= skip < SAMPLE_SCALE):
            raise ValueError(f"disk {dev}: skip {skip} out of range")
        out[dev] = skip
    return out


class _CgKey(ctypes.Structure):
    _fields_ = [("cgroup", ctypes.c_uint64), ("dev", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class _CgDir(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint64), ("ns", ctypes.c_uint64),
                ("buckets", ctypes.c_uint32 * CG_BUCKETS)]


class _CgVal(ctypes.Structure):
    _fields_ = [("dir", _CgDir * 2)]


class _Options(ctypes.Structure):   # blockstage.bpf.c's `options`, the object's read-only data
    _fields_ = [("ignore_stamp", ctypes.c_uint32), ("by_cgroup", ctypes.c_uint32), ("slots", ctypes.c_uint32)]


class _CgState(ctypes.Structure):
    _fields_ = [("gen", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class _Disk(ctypes.Structure):
    _fields_ = [("index", ctypes.c_uint32), ("skip", ctypes.c_uint32), ("path", ctypes.c_uint32),
                ("pad", ctypes.c_uint32)]


class _HKey(ctypes.Structure):
    _fields_ = [("dev", ctypes.c_uint32), ("dir", ctypes.c_uint8), ("stage", ctypes.c_uint8),
                ("bucket", ctypes.c_uint16)]


def _libbpf():
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    vp, cp, i, u32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32
    for name, res, args in (
            ("bpf_object__open_file", vp, [cp, vp]), ("bpf_object__load", i, [vp]), ("bpf_object__close", None, [vp]),
            ("bpf_object__find_map_by_name", vp, [vp, cp]), ("bpf_object__find_program_by_name", vp, [vp, cp]),
            ("bpf_map__set_max_entries", i, [vp, u32]), ("bpf_map__fd", i, [vp]),
            ("bpf_program__attach", vp, [vp]), ("bpf_link__destroy", i, [vp]),
            ("bpf_map_update_elem", i, [i, vp, vp, ctypes.c_uint64]), ("bpf_map_lookup_elem", i, [i, vp, vp]),
            ("bpf_map_get_next_key", i, [i, vp, vp]), ("libbpf_num_possible_cpus", i, []),
            ("bpf_program__fd", i, [vp]), ("bpf_enable_stats", i, [i]),
            ("bpf_map__set_initial_value", i, [vp, vp, ctypes.c_size_t]),
            ("bpf_map_delete_elem", i, [i, vp])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


class Loaded:
    """The object loaded, its disks filled and its two programs attached; read() the maps' contents."""

    def __init__(self, path: Path, disks: dict[int, int], issue_map: bool = False, max_cgroups: int = 0):
        self.by_cgroup = False
        self.lib = lib = _libbpf()
        self.obj = lib.bpf_object__open_file(str(path).encode(), None)
        if not self.obj:
            raise OSError(ctypes.get_errno(), f"libbpf could not open {path}")
        self.links, self.prog_fds = [], {}
        self.ncpu = lib.libbpf_num_possible_cpus()
        n = max(1, len(disks))
        # cgvals: a slot per disk (its "other"), then max_cgroups for (cgroup, disk) pairs, all free at the start
        self.cg_capacity = n + max_cgroups
        for name, entries in (("disks", n), ("sums", n * SLOTS_PER_DISK), ("cgvals", self.cg_capacity),
                              ("cgslot", max(1, max_cgroups)), ("cgfree", max(1, max_cgroups))):
            lib.bpf_map__set_max_entries(self._map(name), entries)
        options = _Options(1 if issue_map else 0, 1 if max_cgroups else 0, self.cg_capacity)
        if lib.bpf_map__set_initial_value(self._map(".rodata"), ctypes.byref(options), ctypes.sizeof(options)):
            raise OSError(ctypes.get_errno(), "could not set the object's read-only data")
        if lib.bpf_object__load(self.obj):
            raise OSError(ctypes.get_errno(), "the kernel refused the tracer's program (libbpf's log says why)")
        self.fd = {m: lib.bpf_map__fd(self._map(m)) for m in ("disks", "lat", "sums", "cgvals", "cgslot", "cgfree",
                                                              "cgstate")}
        self.dev_of_index = {}
        self.by_cgroup = bool(max_cgroups)
        self.cg_last, self.cg_idle, self.cg_evicted = {}, {}, 0
        for index, (dev, skip) in enumerate(sorted(disks.items())):
            key, value = ctypes.c_uint32(dev), _Disk(index, skip, 0, 0)
            if lib.bpf_map_update_elem(self.fd["disks"], ctypes.byref(key), ctypes.byref(value), 0):
                raise OSError(ctypes.get_errno(), f"could not add disk {dev}")
            self.dev_of_index[index] = dev
        for slot in range(n, self.cg_capacity if self.by_cgroup else n):
            self._free(slot)
        self.issue_attached = issue_map
        self._attach("on_complete")
        if issue_map:
            self._attach("on_issue")

    def _attach(self, prog: str) -> None:
        p = self.lib.bpf_object__find_program_by_name(self.obj, prog.encode())
        link = self.lib.bpf_program__attach(p) if p else None
        if not link:
            raise OSError(ctypes.get_errno(), f"could not attach {prog}")
        self.links.append(link)
        self.prog_fds[prog] = self.lib.bpf_program__fd(p)

    def run_stats(self) -> dict:
        """{program: (run_time_ns, run_cnt)} of the attached programs, from their fdinfo."""
        out = {}
        for prog, fd in self.prog_fds.items():
            with open(f"/proc/self/fdinfo/{fd}") as f:
                out[prog] = fdinfo_run_stats(f.read(1 << 14))
        return out

    def cost(self, seconds: float) -> dict | None:
        """The programs' run time over `seconds` with the kernel's statistics on (BPF_ENABLE_STATS: on while its
        descriptor is open, for every program on the host); None where the kernel refuses it."""
        fd = self.lib.bpf_enable_stats(BPF_STATS_RUN_TIME)
        if fd < 0:
            return None
        try:
            before, start = self.run_stats(), time.monotonic()
            time.sleep(seconds)
            after = self.run_stats()
            return cost_message(before, after, time.monotonic() - start)
        finally:
            os.close(fd)

    def _map(self, name: str):
        m = self.lib.bpf_object__find_map_by_name(self.obj, name.encode())
        if not m:
            raise OSError(0, f"the object has no map {name}")
        return m

    def _entries(self, fd: int, key_type, value_cpus: int):
        """(key, per-CPU values summed) of every entry, walking the keys."""
        lib, key, nxt = self.lib, key_type(), key_type()
        values = (ctypes.c_uint64 * value_cpus)()
        first = True
        while lib.bpf_map_get_next_key(fd, None if first else ctypes.byref(key), ctypes.byref(nxt)) == 0:
            first = False
            ctypes.memmove(ctypes.byref(key), ctypes.byref(nxt), ctypes.sizeof(key_type))
            if lib.bpf_map_lookup_elem(fd, ctypes.byref(key), values) == 0:
                yield key, sum(values)

    def read(self) -> tuple[dict, dict, dict]:
        lat = {(k.dev, k.dir, k.stage, k.bucket): v for k, v in self._entries(self.fd["lat"], _HKey, self.ncpu)}
        sums = {}
        values = (ctypes.c_uint64 * self.ncpu)()
        for slot in range(len(self.dev_of_index) * SLOTS_PER_DISK):
            key = ctypes.c_uint32(slot)
            if self.lib.bpf_map_lookup_elem(self.fd["sums"], ctypes.byref(key), values) == 0:
                sums[slot] = sum(values)
        paths = {}
        disk = _Disk()
        for dev in self.dev_of_index.values():
            key = ctypes.c_uint32(dev)
            if self.lib.bpf_map_lookup_elem(self.fd["disks"], ctypes.byref(key), ctypes.byref(disk)) == 0:
                paths[dev] = disk.path
        if not self.issue_attached and PATH_ISSUE_MAP in paths.values():
            # a disk whose requests carry no issue time: the issue program keeps it, from now on. Not before:
            # on disks that stamp their requests it would be one more program on every request, for nothing
            self._attach("on_issue")
            self.issue_attached = True
        return lat, sums, paths

    def _free(self, slot: int) -> None:
        value = ctypes.c_uint32(slot)
        if self.lib.bpf_map_update_elem(self.fd["cgfree"], None, ctypes.byref(value), 0):
            raise OSError(ctypes.get_errno(), f"could not free the cgroup slot {slot}")

    def _slot_values(self, slot: int, value: _CgVal) -> tuple | None:
        key = ctypes.c_uint32(slot)
        if self.lib.bpf_map_lookup_elem(self.fd["cgvals"], ctypes.byref(key), ctypes.byref(value)):
            return None
        return tuple((sum(counts.values()), d.bytes, d.ns, counts)
                     for d in value.dir for counts in [{b: c for b, c in enumerate(d.buckets) if c}])

    def read_cgroups(self) -> dict:
        """{(dev, cgroup): ((requests, bytes, ns, {bucket: count}) for reads, the same for writes)}: each disk's own
        slot as OTHER_CGROUP, then every (cgroup, disk) pair's; the slots of pairs idle too long freed when nearly
        all are taken (idle_to_evict)."""
        lib, fd = self.lib, self.fd["cgslot"]
        key, nxt, slot, value = _CgKey(), _CgKey(), ctypes.c_uint32(), _CgVal()
        out, slots, first = {}, {}, True
        for index, dev in self.dev_of_index.items():
            got = self._slot_values(index, value)
            if got is not None:
                out[(dev, OTHER_CGROUP)] = got
        while len(slots) < self.cg_capacity and lib.bpf_map_get_next_key(
                fd, None if first else ctypes.byref(key), ctypes.byref(nxt)) == 0:
            first = False
            ctypes.memmove(ctypes.byref(key), ctypes.byref(nxt), ctypes.sizeof(_CgKey))
            if lib.bpf_map_lookup_elem(fd, ctypes.byref(key), ctypes.byref(slot)) == 0:
                got = self._slot_values(slot.value, value)
                if got is not None:
                    out[(key.dev, key.cgroup)] = got
                    slots[(key.dev, key.cgroup)] = slot.value
        requests = {k: v[0][0] + v[1][0] for k, v in out.items()}
        evict = idle_to_evict(requests, self.cg_last, self.cg_idle, len(out), self.cg_capacity)
        if evict:
            # the pairs out of the hash first, then every CPU's cached pair made stale (cggen), then their slots
            # zeroed and free: a CPU that counts the pair again finds no slot and takes a new one
            for dev, cgroup in evict:
                gone = _CgKey(cgroup, dev, 0)
                lib.bpf_map_delete_elem(fd, ctypes.byref(gone))
            zero, state = ctypes.c_uint32(0), _CgState()
            if lib.bpf_map_lookup_elem(self.fd["cgstate"], ctypes.byref(zero), ctypes.byref(state)) == 0:
                state.gen += 1
                lib.bpf_map_update_elem(self.fd["cgstate"], ctypes.byref(zero), ctypes.byref(state), 0)
            empty = _CgVal()
            for pair in evict:
                s_key = ctypes.c_uint32(slots[pair])
                lib.bpf_map_update_elem(self.fd["cgvals"], ctypes.byref(s_key), ctypes.byref(empty), 0)
                self._free(slots[pair])
                self.cg_evicted += 1
                del out[pair]
                self.cg_idle.pop(pair, None)
        self.cg_last = requests
        return out

    def close(self) -> None:
        for link in self.links:
            self.lib.bpf_link__destroy(link)
        self.links = []
        if self.obj:
            self.lib.bpf_object__close(self.obj)
            self.obj = None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="iowarden-blockstage")
    ap.add_argument("--object", type=Path, default=Path(__file__).parent / "bpf" / OBJECT_NAME)
    ap.add_argument("--interval-ms", type=int, default=15000)
    ap.add_argument("--max-cgroups", type=int, default=512,
                    help=f"entries of the per-cgroup map, one per (disk, cgroup); 0: no count per cgroup "
                         f"(at most {MAX_CGROUPS})")
    ap.add_argument("--issue-map", action="store_true",
                    help="time every disk from the issue program's map, as a queue that does not stamp its requests "
                         "is timed (how that path is tested where every queue stamps)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    try:
        if not 0 <= args.max_cgroups <= MAX_CGROUPS:
            raise ValueError(f"--max-cgroups {args.max_cgroups}: out of 0..{MAX_CGROUPS}")
        disks = read_disks(sys.stdin.read(MAX_INPUT_BYTES + 1)[:MAX_INPUT_BYTES])
        loaded = Loaded(args.object, disks, issue_map=args.issue_map, max_cgroups=args.max_cgroups)
    except (OSError, ValueError) as exc:   # one line the daemon's tracer says as its reason (sources/tracer.py)
        print(f"ERROR: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}", file=sys.stderr)
        return 1
    try:
        print(json.dumps({"type": "attached_probes", "data": {"probes": len(loaded.links)}}), flush=True)
        period = max(0.1, args.interval_ms / 1000)
        due = time.monotonic() + period
        cost_due = time.monotonic()
        while True:
            sample = min(COST_SAMPLE_SECONDS, period / 2)
            if time.monotonic() >= cost_due and due - time.monotonic() >= sample:
                cost_due = time.monotonic() + COST_EVERY_SECONDS
                msg = loaded.cost(sample)
                if msg is not None:
                    sys.stdout.write(json.dumps(msg, separators=(",", ":")) + "\n")
            time.sleep(max(0.0, due - time.monotonic()))
            due += period
            lat, sums, paths = loaded.read()
            out = messages(lat, sums, loaded.dev_of_index, paths)
            if loaded.by_cgroup:
                out += cgroup_messages(loaded.read_cgroups(), loaded.cg_capacity, loaded.cg_evicted, time.monotonic())
            for msg in out:
                sys.stdout.write(json.dumps(msg, separators=(",", ":")) + "\n")
            sys.stdout.flush()
    except _Stopped:
        return 0
    finally:
        loaded.close()


class _Stopped(Exception):
    """SIGTERM, raised where the loader is (a sleep would otherwise run to the window's end)."""


def _stop(*_):
    raise _Stopped


if __name__ == "__main__":
    sys.exit(main())
