"""Where the time goes, on a real kernel's virtio and NVMe disks (the guest's Debian kernel, libbpf1 from its
archive and the package's compiled tracer, the default engine where it can run): the tracer's per-I/O
percentiles against fio's for the same job; a QEMU throttle on the NVMe disk (below the guest's block layer)
names the device. The guest runs tests/lab/guest_trace.py (the installed
package's own tracer source around fio) with the daemon stopped, so its probes do not share the disks;
then the daemon itself runs the tracer under its systemd unit (CAP_BPF, the bpf system call)."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from daemon.sources.tracer_views import MIN_TAIL_SAMPLES
from tests.integration.helpers import wait_for

from .scrape import samples, value

OUT = "/root/lab-trace.jsonl"
LOAD_SECONDS = 120
FLAG = "/root/lab-trace.throttled"
THROTTLE_IOPS = 150        # the cap at most; under it, a fifth of what the free job got (below)


def _run_in_guest(lab, steps: list[dict], on_wait) -> dict[str, dict]:
    """Start guest_trace.py as a transient unit; poll its output; call on_wait(label, results so far) when it
    asks, and hand what it returns (extra fio options for the next job) to the guest in the flag file."""
    g = lab.guest
    g.write("/root/guest_trace.py", (Path(__file__).parent / "guest_trace.py").read_text())
    g.run(["rm", "-f", OUT, FLAG])
    g.run(["systemd-run", "--unit=lab-trace", "--collect", "-p", "CPUAffinity=0", "/usr/lib/iowarden/venv/bin/python",
           "/root/guest_trace.py", json.dumps(steps), OUT])
    results, handled = {}, set()
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        lines = [json.loads(x) for x in g.run(["sh", "-c", f"cat {OUT} 2>/dev/null || true"]).splitlines() if x]
        for line in lines:
            if "error" in line:
                raise AssertionError(f"the guest's tracer run failed: {line['error']}\n{line.get('trace')}")
            if "waiting" in line and line["waiting"] not in handled:
                handled.add(line["waiting"])
                g.write(FLAG, json.dumps(on_wait(line["waiting"], results)))
            if "job" in line:
                results[line["job"]] = line
            if "armed_after_seconds" in line:
                results["armed"] = line
        if any(x.get("done") for x in lines):
            return results
        time.sleep(5)
    g.run(["systemctl", "stop", "lab-trace"], check=False)
    raise AssertionError(f"the guest's tracer run did not finish in 30 min; got {sorted(results)}")


# The tracer times a read from its insertion into the block layer to its completion. fio's completion latency
# (clat) starts after io_submit returns, so it holds the interrupt and the reap but not the submission; fio's
# whole latency (lat: submission and completion) holds all of the tracer's span. Below: the tracer's percentile
# may lie under fio's clat by the tolerance plus the path outside the block layer, a fixed cost per read that
# TCG makes about 40 us (CI: 37 us on virtio, 39 us on NVMe, 10.4 % of a 0.37 ms p50). Above: it may not pass
# fio's whole latency by more than the width of one of its buckets (an eighth of an octave, interpolated
# inside: blocktrace.SUB_BUCKETS). A vCPU the busy host preempts inside io_submit, after the request entered
# the block layer, lands in the tracer's time and in fio's submission, not in fio's clat (the tracer's NVMe p99
# 1.38 ms against a clat p99 of 1.16 ms once, with the host's two cores running four workers of tests).
PATH_MS = 0.06
ABOVE_TOLERANCE = 1 / 8


# Above the block layer the path is not always short: a machine busy elsewhere delays the guest's vCPU between
# the completion and fio's reap, and that lands on a few reads, all in fio's tail (fio's p99 0.91 ms against the
# tracer's 0.60 ms, p50s within 4 %, once with the host's two cores running other tests). So the tracer's p99
# is held from below by fio's p95, from above by fio's whole-latency p99: time the tracer failed to count would
# move every rank, and the p50 is held to 10 %.
def _agree(r: dict, p50_tolerance=0.10, p99_tolerance=0.20) -> None:
    fio, total = r["fio"], r["tracer"]["total"]
    assert total["n"] >= 0.95 * r["fio_ios"], r   # every read of the job timed (no sampling at this rate)
    for q, tolerance, below in (("p50", p50_tolerance, "p50"), ("p99", p99_tolerance, "p95")):
        low = fio[below] * (1 - tolerance) - PATH_MS
        high = fio[f"lat_{q}"] * (1 + ABOVE_TOLERANCE)
        assert low <= total[q] <= high, (q, f"tracer {total[q]:.3f} ms, fio clat {fio[q]:.3f} ms, "
                                            f"lat {fio[f'lat_{q}']:.3f} ms", r)


def test_tracer_agrees_with_fio_on_virtio_and_nvme_and_names_a_throttled_device(lab):
    g = lab.guest
    vd, nv = lab.dev("virtio-lab-cc"), lab.dev("nvme-QEMU_NVMe_Ctrl_LABNVME1")
    steps = [
        {"job": "virtio", "disk": vd, "file": "/srv/single/trace.dat"},
        {"job": "nvme", "disk": nv, "file": "/srv/nvme/trace.dat"},
        {"wait": "throttle nvme", "flag": FLAG},
        {"job": "nvme throttled", "disk": nv, "file": "/srv/nvme/trace.dat"},
    ]
    g.run(["systemctl", "stop", "iowarden"], timeout=120)
    cap = {}

    def throttle(_label, so_far):
        # A cap a fifth of what the free job got holds each read about five times as long, whatever this
        # machine lends the guest today (a busy host once gave the free job 10 IOPS, under a fixed cap of 150).
        # The job runs long enough for the tracer to quote its tail (MIN_TAIL_SAMPLES, with room).
        cap["iops"] = min(THROTTLE_IOPS, max(5, int(so_far["nvme"]["iops"] / 5)))
        g.throttle("nv1", cap["iops"])
        return {"fio": [f"--runtime={max(10, math.ceil(2 * MIN_TAIL_SAMPLES / cap['iops']))}"]}
    try:
        results = _run_in_guest(lab, steps, throttle)
    finally:
        g.throttle("nv1", 0)
    for r in results.values():
        print(json.dumps(r))

    # 1. the same job seen by fio and by the tracer, on virtio and on NVMe, by the default engine: the compiled one
    assert results["armed"]["engine"] == "compiled", results["armed"]
    _agree(results["virtio"])
    _agree(results["nvme"])
    _agree(results["nvme throttled"])

    # 2. (bfq with a sequential writer beside the reader named the kernel's queue in three standalone runs,
    # but where the tail lands depends on the writer: over a new file the reads waited in bfq, 100 ms, over
    # an overwritten one they waited in the device. Not asserted until that is understood: docs/lab.md.)

    # 3. QEMU's throttle is below the guest's block layer: the reads' time grows in the device, and it says so
    free, held = results["nvme"]["tracer"], results["nvme throttled"]["tracer"]
    assert held["total"]["p50"] >= 3 * free["total"]["p50"], (free, held)
    assert held["device"]["p99"] >= 0.8 * held["total"]["p99"], held
    assert "the time goes to the device" in results["nvme throttled"]["cause"]
    assert results["nvme throttled"]["iops"] <= 1.1 * cap["iops"]


def _tracer_pids(g) -> list[str]:
    """The tracer's process: the compiled engine's loader (the guest has its object and libbpf1)."""
    return g.run(["pgrep", "-f", "iowarden.probes.blockstage"], check=False).split()


def test_the_daemon_runs_the_tracer_under_its_systemd_unit(lab):
    """The unit's capabilities, system-call filter and memory protections let the compiled engine load its
    program: the daemon exports the histograms of its own probes' reads on the NVMe disk, and keeps one
    loader through minutes of reads beside merging writes, every read counted."""
    nv = lab.dev("nvme-QEMU_NVMe_Ctrl_LABNVME1")
    lab.configure({"nvme": 5.0}, traced=(nv,))

    def timed():
        text = lab.metrics()
        seen = value(text, "iowarden_tracer_up") == 1 and [
            v for _, v in samples(text, "iowarden_io_latency_seconds_count", device=nv, stage="total") if v > 0]
        if not seen:
            time.sleep(5)   # a scrape costs the guest under TCG
        return seen
    try:
        wait_for(timed, timeout=600, what="the daemon's tracer timing the NVMe disk's reads")
    except AssertionError:
        said = [x for x in lab.journal().splitlines() if "tracer" in x or "bpftrace" in x or "libbpf" in x]
        raise AssertionError("no histogram of the NVMe disk; the journal says:\n" + "\n".join(said[-20:])) from None

    # the default engine, auto, chose the compiled one, and the journal says so
    assert "tracer: compiled started on 1 disks" in lab.journal(), \
        [x for x in lab.journal().splitlines() if "tracer" in x][-10:]
    # Minutes of load, reads beside 4 KiB writes that merge: one loader throughout. (bpftrace 0.17 aborted in 3
    # runs of 5 at ~1,800 IOPS when its program cleared its start maps every minute from user space.)
    g = lab.guest
    pids = _tracer_pids(g)
    assert len(pids) == 1, pids

    def reads_timed():
        return sum(v for _, v in samples(lab.metrics(), "iowarden_io_latency_seconds_count", device=nv,
                                         stage="total", direction="read"))
    before, load_began = reads_timed(), lab.guest_now()
    try:
        out = g.run(["fio", "--output-format=json", f"--runtime={LOAD_SECONDS}", "--time_based",
                     "--ioengine=libaio", "--direct=1", "--bs=4k", "--size=64m",
                     "--name=reads", "--filename=/srv/nvme/load.dat", "--rw=randread", "--iodepth=1",
                     "--name=merging", "--filename=/srv/nvme/merging.dat", "--rw=write", "--iodepth=16",
                     "--iodepth_batch_submit=16"], timeout=LOAD_SECONDS + 600)
    finally:   # 128 MiB that a later test on this guest should not find taking its disk
        g.run(["rm", "-f", "/srv/nvme/load.dat", "/srv/nvme/merging.dat"], check=False)
    jobs = json.loads(out[out.index("{"):])["jobs"]
    fio_reads = jobs[0]["read"]["total_ios"]
    print(f"fio: {fio_reads} reads, {jobs[1]['write']['total_ios']} writes in {LOAD_SECONDS} s")
    wait_for(lambda: reads_timed() - before >= 0.95 * fio_reads, timeout=180,
             what=f"the daemon's histograms counting fio's {fio_reads} reads")
    # what the journal says of the tracer process since the load began comes first: the reason for a new loader
    # (its exit, a silence, a re-plan) is what a failure has to show
    said = [x for x in lab.journal(since=load_began).splitlines()
            if "tracer:" in x and any(w in x for w in ("stopped", "started", "trying again", "paused"))]
    assert said == [] and _tracer_pids(g) == pids, (said, pids, _tracer_pids(g))


WRITEBACK_MIB = 64


def test_buffered_writes_on_cgroup_v2_are_charged_to_the_unit_that_dirtied_the_pages(lab):
    """On cgroup v2 with the io and memory controllers on (the guest's systemd boots the unified hierarchy), the
    kernel charges page-cache writeback to the cgroup that dirtied the pages: 64 MiB a unit wrote buffered, then
    written back by a `sync` from another cgroup (the guest agent's), are counted under that unit, not under the
    root's (the flusher's, on cgroup v1) nor the syncer's."""
    g = lab.guest
    hierarchy = g.run(["stat", "-fc", "%T", "/sys/fs/cgroup"]).strip()
    assert hierarchy == "cgroup2fs", f"the guest's cgroup hierarchy is {hierarchy}, not the unified one"
    assert "io" in g.run(["cat", "/sys/fs/cgroup/cgroup.controllers"]).split()
    nv = lab.dev("nvme-QEMU_NVMe_Ctrl_LABNVME1")
    lab.configure({"nvme": 3600.0}, traced=(nv,))   # its probe once an hour: not the subject
    unit, done = "lab-writeback", "/root/lab-writeback.done"
    path = f"/system.slice/{unit}.service"

    def written(text: str) -> dict[str, float]:
        """Bytes of writes on the NVMe disk the daemon counted, per cgroup."""
        return {labels["cgroup"]: v for labels, v in samples(text, "iowarden_cgroup_io_bytes_total", device=nv,
                                                             direction="write")}
    wait_for(lambda: value(lab.metrics(), "iowarden_tracer_up") == 1 or time.sleep(5), timeout=600,
             what="the daemon's tracer up")
    time.sleep(20)   # the daemon's first probe (its writes are its own unit's) and the tracer's first windows
    before = written(lab.metrics())
    g.run(["rm", "-f", done])
    # the unit lives on after its writes: a cgroup removed before its pages are written back is named by no walk
    g.run(["systemd-run", f"--unit={unit}", "-p", "IOAccounting=yes", "-p", "MemoryAccounting=yes", "sh", "-c",
           f"dd if=/dev/zero of=/srv/nvme/writeback.dat bs=1M count={WRITEBACK_MIB} status=none && touch {done} "
           f"&& exec sleep 900"])
    try:
        wait_for(lambda: g.run(["sh", "-c", f"test -e {done} && echo yes || true"]).strip() == "yes", timeout=300,
                 what="the unit's buffered writes")
        g.run(["sync"], timeout=300)
        want = 0.9 * WRITEBACK_MIB * (1 << 20)

        def charged():
            now = written(lab.metrics())
            delta = {c: v - before.get(c, 0.0) for c, v in now.items()}
            if delta.get(path, 0.0) >= want:
                return delta
            time.sleep(5)
            return None
        try:
            delta = wait_for(charged, timeout=300, what=f"{WRITEBACK_MIB} MiB of writeback counted under {path}")
        except AssertionError:
            raise AssertionError(f"written since the unit began, per cgroup: "
                                 f"{ {c: v - before.get(c, 0.0) for c, v in written(lab.metrics()).items()} }") \
                from None
        print("bytes written on the NVMe disk per cgroup:", {c: round(v) for c, v in delta.items() if v})
        # the root (the flusher's, were it v1) and the syncer (the guest agent) charged for a small part at most
        others = sum(v for c, v in delta.items() if c != path and c != "/system.slice/iowarden.service")
        assert others < 0.1 * delta[path], delta
    finally:
        g.run(["systemctl", "stop", unit], check=False)
        g.run(["rm", "-f", "/srv/nvme/writeback.dat", done], check=False)
