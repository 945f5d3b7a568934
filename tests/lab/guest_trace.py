"""Run inside the lab guest by test_lab_tracer.py, with the installed package's python: the daemon's own
tracer source around fio jobs, one tracer process for all of them (its default engine: the compiled one where
the guest can run it; bpftrace, where not, compiles for minutes under TCG).

    guest_trace.py STEPS_JSON OUT_PATH

STEPS_JSON is a list; each step is one of
  {"job": LABEL, "disk": "vdb", "file": "/srv/x/f", "fio": [...], "writer": [...], "queue": {"scheduler": ...}}
      fio reads `file` (its args added to a QD1 4k random read); with "writer", a second fio writes beside it
      for the whole job; "queue" sets /sys/block/DISK/queue/* for the job and puts back what was there.
  {"wait": LABEL, "flag": PATH}
      the host has something to do (a QEMU throttle): say so, and wait for PATH to appear.
One JSON object per step is appended to OUT_PATH (the host polls it); the last line is {"done": true} or
{"error": ...}.
"""
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import types

from iowarden.daemon.sources import tracer, tracer_views
from iowarden.probes.common import Roots

WINDOW_SECONDS = 2.0
STAGES = ("queue", "device", "total")
ARM_SECONDS = float(os.environ.get("LAB_TRACE_ARM_SECONDS", "600"))


def fio_argv(path: str, *extra: str) -> list[str]:
    """fio on the second vCPU (the host pins this script, with bpftrace, to the first): the completion's
    wake-up is part of fio's clat but not of the block layer's time, and under TCG it waited behind
    bpftrace printing its maps (fio's p99 22 % above the tracer's, beside the suite's other tests, unpinned)."""
    return ["fio", "--name=t", f"--filename={path}", "--size=64m", "--rw=randread", "--bs=4k", "--iodepth=1",
            "--ioengine=libaio", "--direct=1", "--runtime=10", "--time_based", "--output-format=json",
            "--cpus_allowed=1", "--lat_percentiles=1", *extra]


class Traced:
    """The tracer, read every half second so its process's pipe never fills while fio runs."""

    def __init__(self, disks: list[str]):
        section = types.SimpleNamespace(**{k: v.default for k, v in tracer.CONFIG.items()})
        section.interval_seconds, section.devices = WINDOW_SECONDS, disks
        self.read = tracer.start(section, Roots())
        self.state = self.read.state   # the reader's own state: its process, its engine, what it said
        self.last = self.read()

    def tick(self):
        self.last = self.read()
        return self.last

    def wait(self, seconds: float):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.tick()
            time.sleep(0.5)
        return self.last

    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        end = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > end:
                proc.kill()
                raise TimeoutError(f"{argv[:3]} ran over {timeout} s")
            self.tick()
            time.sleep(0.5)
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"fio failed: {err[-1000:]}")
        return subprocess.CompletedProcess(argv, 0, out, err)


class Restarted(RuntimeError):
    """bpftrace exited during a job (0.17 aborted when the program cleared a map the kernel deleted from,
    until the program stopped clearing: docs/lab.md)."""


def arm(traced: Traced, step: dict, since: float) -> None:
    """Until the running bpftrace has timed reads of the step's disk (it compiles for most of a minute
    under TCG, and after an exit the tracer waits 30 s before starting it again)."""
    pid = None
    while True:
        proc = traced.state.proc
        if proc is not None and proc.pid == pid and (step["disk"], "read", "total") in traced.last.total:
            return
        if time.monotonic() - since > ARM_SECONDS:
            raise TimeoutError(f"the tracer saw no read of {step['disk']} in {ARM_SECONDS:.0f} s: up "
                               f"{traced.last.up}, {traced.last.reason}; stderr {traced.state.err_tail[-800:]!r}")
        pid = proc.pid if proc is not None and traced.state.heard else None
        traced.run(fio_argv(step["file"], "--runtime=1"), 120)
        traced.wait(WINDOW_SECONDS + 0.5)


def set_queue(disk: str, values: dict) -> dict:
    before = {}
    for key, value in values.items():
        path = f"/sys/block/{disk}/queue/{key}"
        with open(path) as f:
            before[key] = f.read().split("[")[-1].split("]")[0].strip()
        with open(path, "w") as f:
            f.write(str(value))
    return before


def percentiles(h) -> dict:
    if h is None or not h.total:
        return {"n": 0}
    return {"n": h.total, **{f"p{q}": h.quantile_seconds(q / 100) * 1e3 for q in (50, 99, 99.9)}}


def job(traced: Traced, step: dict) -> dict:
    disk, path = step["disk"], step["file"]
    restore = set_queue(disk, step.get("queue", {}))
    writer = None
    try:
        if step.get("writer"):
            # 32 MiB, written over and over: it fits beside what earlier scenarios left on the disk
            writer_err = open(path + ".w.err", "w+")
            writer = subprocess.Popen(fio_argv(path + ".w", "--rw=write", "--bs=1m", "--runtime=600",
                                               "--size=32m", *step["writer"]),
                                      stdout=subprocess.DEVNULL, stderr=writer_err, start_new_session=True)
            traced.wait(3)   # the writer is under way before the reader is timed
        before = traced.wait(WINDOW_SECONDS + 0.5)
        proc = traced.state.proc
        if proc is None:
            raise Restarted(f"bpftrace is not running before {step['job']}: {before.reason}")
        pid = proc.pid
        done = traced.run(fio_argv(path, *step.get("fio", [])), 300)
        if writer is not None and writer.poll() is not None:   # the job ran beside no writer: say why
            writer_err.seek(0)
            raise RuntimeError(f"the writer stopped with {writer.returncode}: {writer_err.read()[-1000:]}")
        after = traced.wait(WINDOW_SECONDS + 0.5)
        proc = traced.state.proc
        if proc is None or proc.pid != pid:
            raise Restarted(f"bpftrace was restarted during {step['job']}: {after.reason}")
    finally:
        if writer is not None:   # fio's job is a child of the fio we started: its whole group goes
            os.killpg(writer.pid, signal.SIGKILL)
            writer.wait()
        set_queue(disk, restore)
    read = json.loads(done.stdout)["jobs"][0]["read"]
    window = {k: h.minus(before.total.get(k)) for k, h in after.total.items()}
    between = types.SimpleNamespace(**{**after.__dict__, "window": window})
    clat, lat = read["clat_ns"]["percentile"], read["lat_ns"]["percentile"]
    return {"job": step["job"], "disk": disk, "iops": read["iops"], "fio_ios": read["total_ios"],
            "fio": {"p50": clat["50.000000"] / 1e6, "p95": clat["95.000000"] / 1e6, "p99": clat["99.000000"] / 1e6,
                    "mean": read["clat_ns"]["mean"] / 1e6, "lat_mean": read["lat_ns"]["mean"] / 1e6,
                    "lat_p50": lat["50.000000"] / 1e6, "lat_p99": lat["99.000000"] / 1e6},
            "tracer": {st: percentiles(window.get((disk, "read", st))) for st in STAGES},
            "cause": tracer_views.where_the_time_goes(between, disk, "read")}


def main() -> None:
    steps, out_path = json.loads(sys.argv[1]), sys.argv[2]

    def emit(obj):
        with open(out_path, "a") as f:
            f.write(json.dumps(obj) + "\n")
    try:
        jobs = [s for s in steps if "job" in s]
        for path in sorted({s["file"] for s in jobs}):   # laid out once, sequentially, before any timing
            if not os.path.exists(path):
                subprocess.run(fio_argv(path, "--rw=write", "--bs=1m", "--time_based=0"), check=True,
                               capture_output=True, timeout=600)
        started = time.monotonic()
        traced = Traced(sorted({s["disk"] for s in jobs}))
        if not traced.last.up and traced.state.proc is None:   # "compiling the program" is on its way up
            raise RuntimeError(f"the tracer is off: {traced.last.reason}")
        arm(traced, jobs[0], started)
        extra_fio = []
        emit({"armed_after_seconds": round(time.monotonic() - started, 1), "engine": traced.state.engine})
        for step in steps:
            if "wait" in step:
                emit({"waiting": step["wait"]})
                end = time.monotonic() + 300
                while not os.path.exists(step["flag"]) or not os.path.getsize(step["flag"]):
                    if time.monotonic() > end:
                        raise TimeoutError(f"nobody raised {step['flag']}")
                    traced.tick()
                    time.sleep(0.5)
                with open(step["flag"]) as f:   # what the host asks of the next job, e.g. its runtime
                    extra_fio = json.load(f).get("fio", [])
                continue
            step = {**step, "fio": step.get("fio", []) + extra_fio}
            extra_fio = []
            restarts = []
            while True:
                try:
                    result = job(traced, step)
                    break
                except Restarted as exc:
                    restarts.append(str(exc))
                    if len(restarts) > 3:
                        raise
                    arm(traced, step, time.monotonic())
            emit({**result, "bpftrace_restarts": restarts})
        traced.read.stop()
        emit({"done": True})
    except Exception as e:   # the host reads the reason, not a silent stop
        emit({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]})


if __name__ == "__main__":
    main()
