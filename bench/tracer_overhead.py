"""What the block-layer tracer costs per I/O, and so at 200k IOPS, side by side with fio alone.

A loop device over an image in /dev/shm (its reads are page-cache copies: the fastest device this
machine has) takes fio's 4k random reads. Two measurements:

1. The programs: at QD32 for RUN_SECONDS: without the tracer, with bpftrace's timing every request and
   sampling as the daemon does (max_timed_iops = 2000), with biolatency, and then the compiled one timing every
   request without and with its counts per cgroup, and with the map of cgroups full (MANY_CGROUPS cgroups did I/O
   first), those three interleaved over PROGRAM_ROUNDS rounds. The cost is the kernel's
   own account of the tracer's BPF programs (kernel.bpf_stats_enabled: run_time_ns of every program
   bpftrace loaded, from /proc/PID/fdinfo), so other work on the machine does not blur it; the
   bpftrace process's own CPU (reading its maps once per window) is shown beside it. It leaves out
   what the tracepoint itself costs before the program runs (the kernel fills the event's record).
2. Everything: at fixed rates (FIXED_RATES) the machine's busy CPU time (/proc/stat, all CPUs) per
   I/O, without the tracer, with three programs attached that only filter (another disk: what any
   tracepoint-based tracer costs at the least), with bpftrace's sampled tracer, with the compiled one (the
   daemon's default engine; `iowarden iostat --latency` runs the same loader and program, every request
   timed) and with biolatency; interleaved for ROUNDS rounds, medians shown. Other work on the machine blurs
   this one: run it on a quiet machine.

Run as root: .venv/bin/python bench/tracer_overhead.py [--programs-only]
"""
import glob
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time

from iowarden.daemon.sources.tracer import skip_for
from iowarden.probes import blockstage, blocktrace

RUN_SECONDS = 10
AT_IOPS = 200_000
FIXED_RATES = (20_000, 100_000)
FIXED_SECONDS = 8
ROUNDS = 5
READY_WITHIN_S = 120   # bpftrace compiles for seconds; the others attach at once
# the three tracepoints the tracer uses, each with a filter that matches no disk: the floor of the mechanism
FILTER_ONLY = "\n".join(f"tracepoint:block:{tp} / args->dev == 1 / {{ @n = count(); }}"
                        for tp in ("block_bio_queue", "block_rq_issue", "block_rq_complete"))


def fio(device: str, wrap=lambda argv: argv) -> float:
    out = subprocess.run(wrap(["fio", "--name=b", f"--filename={device}", "--rw=randread", "--bs=4k", "--iodepth=32",
                          "--ioengine=libaio", "--direct=1", "--runtime", str(RUN_SECONDS), "--time_based",
                          "--output-format=json"]), capture_output=True, text=True, check=True).stdout
    return json.loads(out)["jobs"][0]["read"]["iops"]


def busy_cpu_seconds() -> float:
    """All CPUs' busy time since boot (/proc/stat: everything but idle and iowait)."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def at_fixed_rate(device: str, iops: int, wrap=lambda argv: argv) -> tuple[float, float]:
    """(I/Os done, busy CPU seconds of the machine) for FIXED_SECONDS of reads at `iops`."""
    cpu0 = busy_cpu_seconds()
    out = subprocess.run(wrap(["fio", "--name=b", f"--filename={device}", "--rw=randread", "--bs=4k", "--iodepth=8",
                          "--ioengine=libaio", "--direct=1", "--runtime", str(FIXED_SECONDS), "--time_based",
                          f"--rate_iops={iops}", "--output-format=json"]),
                         capture_output=True, text=True, check=True).stdout
    cpu = busy_cpu_seconds() - cpu0
    return json.loads(out)["jobs"][0]["read"]["total_ios"], cpu


def with_program(text: str, fn):
    """fn() while bpftrace runs `text`, attached."""
    return with_process(["bpftrace", "-f", "json", "-e", text], None, '"attached_probes"', fn)


def compiled(disks: dict[int, int], max_cgroups: int = 512) -> list:
    """The compiled engine's helper (probes/blockstage.py) for these disks (dev_t -> skip): argv and stdin.
    max_cgroups 0: no count per cgroup; the daemon's default is 512 ([tracer] max_cgroups)."""
    return [[sys.executable, "-m", "iowarden.probes.blockstage", "--interval-ms", "5000",
             "--max-cgroups", str(max_cgroups)],
            json.dumps({str(dev): skip for dev, skip in disks.items()})]


MANY_CGROUPS = 1000
# joins the cgroup in argv[1], then execs the rest (a process of its own does the join)
JOIN_THEN_EXEC = ("import os, sys\n"
                  "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
                  "os.execvp(sys.argv[2], sys.argv[2:])\n")


class ManyCgroups:
    """MANY_CGROUPS blkio cgroups of the bench's own, each of which has read one block of the device once the
    tracer runs, so its map is full (512 entries) before fio starts, from the last of them: every one of fio's
    requests then takes the program's slow path (a lookup that misses, an insert the full map refuses, the disk's
    "other" entry). Removed, by name, on exit."""

    def __init__(self, device: str):
        self.device = device
        root = "/sys/fs/cgroup/blkio"
        self.paths = [f"{root}/iowarden-bench-{os.getpid()}-{i}" for i in range(MANY_CGROUPS)]

    def __enter__(self):
        for p in self.paths:
            os.makedirs(p, exist_ok=True)
        return self

    def fill(self, _proc=None) -> None:
        for i, p in enumerate(self.paths):
            subprocess.run([sys.executable, "-c", JOIN_THEN_EXEC, f"{p}/cgroup.procs", "dd", f"if={self.device}",
                            "of=/dev/null", "bs=4k", "count=1", f"skip={i}", "iflag=direct", "status=none"],
                           check=True)

    def argv(self, argv: list[str]) -> list[str]:
        return [sys.executable, "-c", JOIN_THEN_EXEC, f"{self.paths[-1]}/cgroup.procs", *argv]

    def __exit__(self, *exc):
        for p in self.paths:
            for _ in range(50):
                try:
                    os.rmdir(p)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def attached_below(pid: int) -> bool:
    """Whether a child of `pid` holds a BPF program (`iowarden iostat --latency` prints nothing when its loader
    has attached: the loader is its child)."""
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            child = stat.split("/")[2]
            if int(open(stat).read().rsplit(")", 1)[1].split()[1]) == pid:
                if any("prog_type:" in open(f).read() for f in glob.glob(f"/proc/{child}/fdinfo/*")):
                    return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def with_process(argv: list[str], stdin_text: str | None, ready: str | None, fn, on_ready=None):
    """fn() while the process runs, once it printed a line with `ready` (its programs attached), or, `ready` None,
    once a child of it holds a BPF program."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        if stdin_text is not None:
            proc.stdin.write(stdin_text)
        proc.stdin.close()
        deadline = time.monotonic() + READY_WITHIN_S
        while ready is None and not attached_below(proc.pid):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{argv[:4]} attached no program within {READY_WITHIN_S} s")
            time.sleep(0.2)
        if ready is None:
            time.sleep(0.5)   # its program loaded; attached a moment after
        while ready is not None:   # its line, within the deadline (a process that says nothing must not hang)
            if not select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise SystemExit(f"{argv[0]} did not say {ready!r} within {READY_WITHIN_S} s")
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"{argv[0]} exited before it said {ready!r}")
            if ready in line:
                break
        if on_ready is not None:
            on_ready(proc)
        return fn()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:   # a bpftrace that hangs detaching its probes must not stop the bench
            proc.kill()
            proc.wait(timeout=30)


def bpf_run_time_ns(pid: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the BPF programs the process holds."""
    ns = cnt = 0
    for fdinfo in glob.glob(f"/proc/{pid}/fdinfo/*"):
        try:
            text = open(fdinfo).read()
        except OSError:
            continue
        if "prog_type:" in text:
            run_ns, runs = blockstage.fdinfo_run_stats(text)   # the loader's own reading of the same fields
            ns, cnt = ns + run_ns, cnt + runs
    return ns, cnt


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def traced(device: str, argv: list[str], stdin_text: str | None, ready: str,
           cgroups: ManyCgroups | None = None) -> tuple[float, float, float, int]:
    """(fio's IOPS, the process's BPF programs' run time per I/O, its own CPU seconds, program runs). cgroups: fio
    runs from the last of them, once all have done I/O."""
    start = {}

    def measure():
        ns0, _ = bpf_run_time_ns(start["pid"])
        cpu0 = cpu_seconds(start["pid"])
        iops = fio(device, cgroups.argv if cgroups else lambda a: a)
        ns1, cnt = bpf_run_time_ns(start["pid"])
        return iops, (ns1 - ns0) / (iops * RUN_SECONDS), cpu_seconds(start["pid"]) - cpu0, cnt

    def ready_then(proc):
        start.update(pid=proc.pid)
        if cgroups:
            cgroups.fill()
    return with_process(argv, stdin_text, ready, measure, on_ready=ready_then)


def whole_cost(loop: str, dev: int, rate: int) -> None:
    """The machine's busy CPU per I/O at a fixed rate, each tracer beside fio alone, rounds interleaved."""
    print(f"\nthe whole cost at a fixed {rate:,} IOPS (4k random reads QD8, {FIXED_SECONDS} s a run, "
          f"{ROUNDS} rounds interleaved, medians; the machine's busy CPU per I/O)")
    sampled_text = blocktrace.program({dev: skip_for(AT_IOPS, 2000.0)}, 5.0)
    floor, every, plain = compiled({}), compiled({dev: 0}), compiled({dev: 0}, max_cgroups=0)
    at = lambda: at_fixed_rate(loop, rate)  # noqa: E731
    modes = {"fio alone": at,
             "3 tracepoints, filter only": lambda: with_program(FILTER_ONLY, at),
             "bpftrace tracer, sampled": lambda: with_program(sampled_text, at),
             "compiled, no disk traced": lambda: with_process(*floor, '"attached_probes"', at),
             "compiled, every request, no cgroup": lambda: with_process(*plain, '"attached_probes"', at),
             "compiled, every request (daemon)": lambda: with_process(*every, '"attached_probes"', at),
             "iowarden iostat --latency": lambda: with_process(
                 [sys.executable, "-m", "iowarden.daemon.cli", "iostat", "--latency", "--engine", "compiled",
                  os.path.basename(loop), "60", "1"], None, None, at),
             "biolatency -D": lambda: with_process(["stdbuf", "-oL", "biolatency", "-D", "60"], None, "Tracing", at)}
    per_io: dict[str, list[float]] = {m: [] for m in modes}
    reached: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(ROUNDS):
        for mode, run in modes.items():
            ios, cpu = run()
            per_io[mode].append(cpu / ios * 1e9)
            reached[mode].append(ios / FIXED_SECONDS)
    base = statistics.median(per_io["fio alone"])
    print(f"{'run':<34}{'IOPS':>9}{'CPU ns/I/O':>12}{'extra ns/I/O':>14}{'cores at 200k IOPS':>20}{'spread ns':>12}")
    for mode, values in per_io.items():
        med = statistics.median(values)
        extra = med - base
        print(f"{mode:<34}{statistics.median(reached[mode]):>9.0f}{med:>12.0f}"
              f"{extra if mode != 'fio alone' else 0:>14.0f}"
              f"{max(0.0, extra) * AT_IOPS / 1e9 if mode != 'fio alone' else 0:>20.4f}"
              f"{max(values) - min(values):>12.0f}")


PROGRAM_ROUNDS = 5


def by_cgroup(loop: str, dev: int) -> None:
    """What counting per cgroup adds to the compiled program: its three runs (without cgroups, with, and with every
    slot taken) interleaved for PROGRAM_ROUNDS rounds, so a machine whose speed drifts over minutes (a VM's does,
    two- to threefold over a day) moves all three alike; the extra is the median of each round's difference."""
    modes = {"compiled, every request, no cgroup": (compiled({dev: 0}, max_cgroups=0), False),
             "compiled, every request timed": (compiled({dev: 0}), False),
             f"compiled, {MANY_CGROUPS:,} cgroups did I/O": (compiled({dev: 0}), True)}
    ns: dict[str, list[float]] = {m: [] for m in modes}
    iops: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(PROGRAM_ROUNDS):
        for mode, ((argv, stdin_text), many) in modes.items():
            if many:
                with ManyCgroups(loop) as cgroups:
                    got, per_io, _, _ = traced(loop, argv, stdin_text, '"attached_probes"', cgroups)
            else:
                got, per_io, _, _ = traced(loop, argv, stdin_text, '"attached_probes"')
            ns[mode].append(per_io)
            iops[mode].append(got)
    base = "compiled, every request, no cgroup"
    print(f"\nthe compiled program per cgroup: {PROGRAM_ROUNDS} rounds of the three runs interleaved, QD32, "
          f"{RUN_SECONDS} s a run")
    print(f"{'run':<34}{'fio IOPS':>10}{'BPF ns/I/O':>12}{'min-max ns':>14}{'extra ns/I/O':>14}")
    for mode in modes:
        extra = "-" if mode == base else f"{statistics.median(a - b for a, b in zip(ns[mode], ns[base])):.0f}"
        print(f"{mode:<34}{statistics.median(iops[mode]):>10.0f}{statistics.median(ns[mode]):>12.0f}"
              f"{f'{min(ns[mode]):.0f}-{max(ns[mode]):.0f}':>14}{extra:>14}")
    print("extra ns/I/O: the median over rounds of the run's run time per I/O less the same round's run without "
          "cgroups (the issue's goal: at most 25 ns).")


def main() -> None:
    only_programs = "--programs-only" in sys.argv[1:]   # the first measurement only (some 4 minutes, not 15)
    if os.geteuid() != 0:
        raise SystemExit("needs root (BPF, loop devices)")
    stats = "/proc/sys/kernel/bpf_stats_enabled"
    before = open(stats).read().strip()
    work = tempfile.mkdtemp(dir="/dev/shm", prefix="iowarden-bench-")
    img = os.path.join(work, "img")
    subprocess.run(["truncate", "-s", "512M", img], check=True)
    subprocess.run(["dd", "if=/dev/zero", f"of={img}", "bs=1M", "count=512", "status=none"], check=True)
    loop = subprocess.run(["losetup", "--find", "--show", img], capture_output=True, text=True, check=True).stdout.strip()
    try:
        with open(stats, "w") as f:
            f.write("1")
        major, minor = divmod(os.stat(loop).st_rdev, 256)
        dev = blocktrace.dev_t(os.major(os.stat(loop).st_rdev), os.minor(os.stat(loop).st_rdev))
        alone = fio(loop)
        print(f"{loop} over /dev/shm, 4k random reads QD32, {RUN_SECONDS} s per run")
        print(f"{'run':<34}{'fio IOPS':>10}{'BPF ns/I/O':>12}{'process CPU s':>16}{'cores at 200k IOPS':>20}")
        print(f"{'fio alone':<34}{alone:>10.0f}{'-':>12}{'-':>16}{'-':>20}")
        sampled = skip_for(AT_IOPS, 2000.0)
        once = {"bpftrace, every request timed": (["bpftrace", "-f", "json", "-e", blocktrace.program({dev: 0}, 5.0)],
                                                  None, '"attached_probes"'),
                "bpftrace, sampled (2000 timed/s)": (["bpftrace", "-f", "json", "-e",
                                                      blocktrace.program({dev: sampled}, 5.0)],
                                                     None, '"attached_probes"'),
                "biolatency -D (libbpf-tools)": (["stdbuf", "-oL", "biolatency", "-D", "60"], None, "Tracing")}
        for label, (argv, stdin_text, ready) in once.items():
            iops, ns_per_io, cpu, _ = traced(loop, argv, stdin_text, ready)
            # the per-I/O cost where the sampling is planned for 200k IOPS; the process's CPU is per window
            cores = ns_per_io * AT_IOPS / 1e9 + cpu / RUN_SECONDS
            print(f"{label:<34}{iops:>10.0f}{ns_per_io:>12.0f}{cpu:>16.2f}{cores:>20.4f}")
        by_cgroup(loop, dev)
        print(f"\n{MANY_CGROUPS:,} cgroups did I/O: each read one block once the tracer ran, taking all of its "
              f"slots for (disk, cgroup) pairs (512); fio then read from the last, a pair with no slot, counted in "
              f"the disk's own (\"other\").")
        print("BPF ns/I/O: the tracer's programs' run time (kernel.bpf_stats_enabled) over fio's I/Os. With "
              "sampling, the program still runs on every request (the hash decides), but maps are touched only "
              f"for the kept share ({blocktrace.SAMPLE_SCALE - skip_for(AT_IOPS, 2000.0)} in "
              f"{blocktrace.SAMPLE_SCALE} at 200k IOPS).")
        with open(stats, "w") as f:
            f.write(before)   # the run-time accounting adds two clock reads per program run: off here
        for rate in () if only_programs else FIXED_RATES:
            whole_cost(loop, dev, rate)
    finally:
        with open(stats, "w") as f:
            f.write(before)
        subprocess.run(["losetup", "-d", loop], check=False)
        subprocess.run(["rm", "-rf", work], check=False)


if __name__ == "__main__":
    sys.exit(main())
