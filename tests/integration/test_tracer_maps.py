"""The tracer's start maps stay bounded with nothing clearing them from user space.

bpftrace 0.17 aborted ("failed to look up elem: -2") when the program cleared its start maps every
minute while the kernel deleted from them: the program now deletes every key in the kernel, at the
request's completion or when its bio is merged into another request. This runs the program itself on
a real kernel over writes that merge (4 KiB O_DIRECT writes submitted 32 at a time, forwards and
backwards, to files nothing reads afterwards, so a leaked key is not overwritten later), and counts
the keys left when the disk is idle: the maps are printed at exit with the END clear taken out.

It runs alone (the suite's `alone` phase, some 5 s): beside other tests, their daemons' tracers run BPF
programs on the same block tracepoints, and the kernel then skips runs of this one, not all of them counted
as recursion misses (perf drops a nested tracepoint event before any program runs). A run on a busy machine left 632
keys beside 495 counted misses and 30 merges seen of the workload's hundreds: the test could no longer tell a
key the program failed to delete from one whose deletion never ran. Alone it leaves 0-1.
"""
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from iowarden.probes import blocktrace as bt
from tests.conftest import LoopXfs

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.alone]   # bpftrace: scripts/setup.sh installs it

MERGING_WRITES = (("forward", "write"), ("backward", "write:-8k"))   # fio: next offset +4k, or -4k
COMPILE_AND_RUN_SECONDS = 600   # bpftrace's compile, the two fio jobs (seconds here) and its exit
LEFT_AT_MOST = 12   # requests a flush or a log write leaves for a while; the old program left one a merge
IDLE_FOR_SECONDS = 2     # nothing in flight on the test's disk this long before the maps are read
IDLE_WAIT_SECONDS = 120


DELETING = ("block_rq_comple", "block_bio_backm", "block_bio_front", "block_rq_merge")   # bpftool's names: 15 chars


def _tracepoint_programs() -> dict[int, tuple[str, int]]:
    """{program id: (name, recursion misses)} of the tracepoint programs loaded now."""
    out = subprocess.run(["bpftool", "prog", "show", "--json"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return {p["id"]: (p.get("name", ""), int(p.get("recursion_misses", 0)))
            for p in json.loads(out) if p.get("type") == "tracepoint"}


def _attached_tracepoints(pid: int) -> set[str]:
    """The tracepoints a process has BPF programs attached to now (bpftool's list of perf-event links)."""
    out = subprocess.run(["bpftool", "perf", "show", "--json"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return {p["tracepoint"] for p in json.loads(out or "[]") if p.get("pid") == pid and p.get("fd_type") == "tracepoint"}


def _run_program(text: str, workload) -> tuple[dict, int]:
    """bpftrace running `text` around workload(); the maps it prints at exit, and how many runs of its
    deleting programs the kernel skipped.

    A tracepoint program that fires while the same program runs on that CPU (a completion in an
    interrupt while a completion of another disk is being counted) is skipped by the kernel and
    counted as a recursion miss: a request whose deletion was skipped leaves its key, whatever the
    program says. On a busy machine that is about one request in a hundred."""
    before = set(_tracepoint_programs())
    proc = subprocess.Popen(["bpftrace", "-f", "json", "-e", text], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "BPFTRACE_MAP_KEYS_MAX": str(bt.START_MAP_ENTRIES)},
                            start_new_session=True)
    # a bpftrace that never prints (stuck compiling) is killed, which ends the readline below
    watchdog = threading.Timer(COMPILE_AND_RUN_SECONDS, lambda: os.killpg(proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        first = json.loads(proc.stdout.readline() or "{}")   # attached_probes: it has compiled and attached
        assert first.get("type") == "attached_probes", proc.stderr.read()[-2000:]
        # bpftrace says "attached_probes" before it attaches them: a workload started on that line ran its first
        # seconds with the completion and merge programs not yet attached, and left a key per request they missed
        # (180 on a busy machine). The kernel's own list of what this bpftrace has attached says when it has.
        wanted = set(re.findall(r"tracepoint:block:(\w+)", text))
        deadline = time.monotonic() + COMPILE_AND_RUN_SECONDS
        while (attached := _attached_tracepoints(proc.pid)) != wanted:
            assert time.monotonic() < deadline, f"bpftrace attached {sorted(attached)} of {sorted(wanted)}"
            time.sleep(0.1)
        workload()
        misses = sum(m for pid, (name, m) in _tracepoint_programs().items() if pid not in before and name in DELETING)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    maps = {}
    for line in filter(str.strip, out.splitlines()):
        msg = json.loads(line)
        if msg.get("type") == "map":
            maps.update(msg["data"])
    return maps, misses


def test_start_maps_stay_bounded_over_merging_writes_without_a_clear():
    fs = LoopXfs("512M")
    try:
        major, minor = map(int, open(f"/sys/block/{fs.name}/dev").read().split(":"))
        dev = bt.dev_t(major, minor)
        from iowarden.daemon.sources.tracer_proc import block_tracepoints
        from iowarden.probes.common import Roots
        text = bt.program({dev: 0}, 1.0, block_tracepoints(Roots()))
        assert "clear(@start)" not in text.split("END")[0], "the program clears a hot map from user space"
        end = "END { clear(@start); clear(@issue); clear(@lat); clear(@ns); clear(@sk); }"
        assert end in text
        text = text.replace(end, "END { clear(@lat); clear(@ns); clear(@sk); }")
        for tp in ("block_bio_backmerge", "block_bio_frontmerge", "block_rq_issue", "block_rq_complete"):
            text += f'tracepoint:block:{tp} / args->dev == {dev} / {{ @seen["{tp}"] = count(); }}\n'   # the test's

        def workload():
            for name, rw in MERGING_WRITES:
                subprocess.run(["fio", f"--name={name}", f"--filename={fs.mountpoint}/{name}", "--size=64m",
                                f"--rw={rw}", "--bs=4k", "--ioengine=libaio", "--direct=1", "--iodepth=32",
                                "--iodepth_batch_submit=32"], check=True, capture_output=True, timeout=300)
            subprocess.run(["sync"], check=True, timeout=120)
            # the disk idle by its own count of requests in flight, not after a fixed pause: a loop device whose
            # backing disk is busy with other work completes late, and a request still in flight has its key by
            # right; what is in the maps once nothing is in flight was left there
            idle_since, deadline = None, time.monotonic() + IDLE_WAIT_SECONDS
            while time.monotonic() < deadline:
                busy = any(map(int, open(f"/sys/block/{fs.name}/inflight").read().split()))
                idle_since = None if busy else (idle_since or time.monotonic())
                if idle_since is not None and time.monotonic() - idle_since >= IDLE_FOR_SECONDS:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"{fs.name} still had requests in flight {IDLE_WAIT_SECONDS} s after sync")

        maps, misses = _run_program(text, workload)
    finally:
        fs.close()
    seen = maps.get("@seen", {})
    left = {name: len(maps.get(name, {})) for name in ("@start", "@issue")}
    # a completion the kernel dropped before any program ran (a perf event nested in another on the CPU, counted
    # nowhere) is missing from the test's own count too: each leaves the key of a request issued and never seen
    # done, by no fault of the program. A busy machine dropped 33 of 32,717 (0.1 %) and the run left 36 keys.
    unseen = max(0, seen.get("block_rq_issue", 0) - seen.get("block_rq_complete", 0))
    print(f"seen {seen}, left {left}, deletions the kernel skipped (recursion misses, any disk) {misses}, "
          f"completions dropped unseen {unseen}")
    assert seen.get("block_rq_complete", 0) > 10_000, seen
    assert seen.get("block_bio_backmerge", 0) + seen.get("block_bio_frontmerge", 0) > 2 * LEFT_AT_MOST, \
        f"the workload did not merge enough to tell: {seen}"
    timed = sum(n for key, n in maps.get("@lat", {}).items() if key.split(",")[2] == "1")   # device stage
    assert timed > 0.9 * seen["block_rq_complete"], (timed, seen)
    # every key left needs a deletion the program did not run: a flush or log write, a skipped run, a dropped event
    bound = LEFT_AT_MOST + misses + unseen
    assert left["@start"] <= bound and left["@issue"] <= bound, (left, misses, unseen, seen,
                                                                 sorted(maps.get("@start", {}))[:40])
