"""iowarden's numbers beside the reference tools', on the same real device at the same time.

- `iowarden iostat` vs sysstat's `iostat -x` on the same counters (a device's under fio load, read once and
  given to both as their /proc/diskstats): awaits to sysstat's last digit, rates within 2 %.
- a short `iowarden probe` vs a 30 s plain fio run of the same job: within 10 %, over a loop device
  with direct I/O capped at a steady pace (a blkio throttle, as a provisioned-IOPS volume).
- the QD1 probe's median latency vs `ioping`'s on the same file, over a loop device with direct I/O.
- extent counts of a deliberately fragmented file vs `xfs_bmap`, and the filesystem total vs `xfs_db frag`.
"""
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from iowarden.probes import xfs
from iowarden.probes.common import kill_group
from iowarden.probes.fio_job import ProbeProfile
from iowarden.probes.fio_run import ProbeLimits, probe_file_name, run_probe
from iowarden.probes.probe_dir import PROBE_DIR_NAME
from tests.conftest import latency_measured
from tests.integration.helpers import read_iops_cap

pytestmark = [pytest.mark.slow, pytest.mark.root]

IOWARDEN = [sys.executable, "-m", "iowarden.daemon.cli"]
LIMITS = ProbeLimits(min_free_bytes=1 << 20, min_free_ratio=0.0)
FIELDS = ["r/s", "w/s", "rkB/s", "wkB/s", "r_await", "w_await", "aqu-sz", "util"]


def close(a: float, b: float, rel: float, abs_floor: float) -> bool:
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_floor)


def _with_files(files: dict[str, Path], argv: list[str]) -> list[str]:
    """argv in a mount namespace of its own where each kernel file named (an absolute path) is the test's file (a
    bind mount: the host's /proc and /sys are untouched, and the namespace ends with the process)."""
    mounts = " && ".join(f'mount --bind "${i + 1}" "{target}"' for i, target in enumerate(files))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && shift {len(files)} && exec "$@"',
            "sh", *(str(f) for f in files.values()), *argv]


def _overwrite(path: Path, text: str) -> None:
    """In place: a bind mount holds the file's inode, so a rename would not be seen through it."""
    with open(path, "r+") as f:
        f.write(text)
        f.truncate()


def test_iostat_agrees_with_sysstat(shared_loop_xfs, tmp_path):
    fs = shared_loop_xfs
    work = fs.mountpoint / "iostat-load"
    work.mkdir(exist_ok=True)
    interval, count = 2, 5
    # A steady load for the whole window: one job keeps the device busy (QD1 sequential reads,
    # so %util and aqu-sz are far from zero), one adds rate-limited random writes.
    # A light load alone is no test of %util: the kernel counts busy time in jiffies,
    # and at 0.1 % busy two unaligned windows differ by a third.
    load = subprocess.Popen(
        ["fio", f"--directory={work}", "--size=128m", "--ioengine=libaio", "--direct=1", "--time_based",
         "--runtime=20", "--output=/dev/null",
         "--name=busy", "--rw=read", "--bs=1m", "--iodepth=1", "--ioengine=psync",
         "--name=writes", "--rw=randwrite", "--bs=16k", "--iodepth=4", "--rate_iops=700"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    # The device's real counters under the load, read once per interval, then given to both programs as their
    # /proc/diskstats: each computes its report from the very same counters. Read live by each, the two programs
    # read them some milliseconds apart, and on a loaded machine a slow write at the window's edge falls in one's
    # window and not the other's (w_await 0.684 ms against 0.701 ms, 2.5 %): that measures the two clocks, not
    # the formulas. The uptime is the counters' clock for sysstat (its interval); it is the nominal interval here.
    try:
        time.sleep(4)  # past fio's layout phase
        uptime_at = float(Path("/proc/uptime").read_text().split()[0])
        counters = []
        next_read = time.monotonic()
        for _ in range(count + 1):
            time.sleep(max(0.0, next_read - time.monotonic()))
            counters.append(Path("/proc/diskstats").read_text())
            next_read += interval
    finally:
        kill_group(load)  # fio's job processes too: they leave fio's process group
        load.wait()
    # ours reads /proc/diskstats; sysstat reads the device's own line, /sys/block/NAME/stat (its fields after
    # the name), and its interval from /proc/uptime
    files = {"diskstats": tmp_path / "diskstats", "stat": tmp_path / "stat", "uptime": tmp_path / "uptime"}

    def write(k: int, put) -> None:
        put(files["diskstats"], counters[k])
        line = next(line for line in counters[k].splitlines() if line.split()[2] == fs.name)
        put(files["stat"], " ".join(line.split()[3:]) + "\n")
        put(files["uptime"], f"{uptime_at + k * interval:.2f} 0.00\n")
    write(0, Path.write_text)
    # both print a report right after each read (sysstat flushes each one): once both have printed the report of
    # counters k, counters k+1 are written, a whole interval before either reads again. sysstat starts once ours
    # has printed its first report (Python takes a second or more to start on a loaded machine; a C program
    # milliseconds), so that the two read within milliseconds of each other every interval
    reports = {"ours": queue.Queue(), "ref": queue.Queue()}
    our_lines, ref_lines = [], []

    def follow(proc, key, is_report, keep):
        for line in proc.stdout:
            keep.append(line)
            if is_report(line):
                reports[key].put(line)
    procs, threads = [], []

    def start(key, argv, files_of, is_report, keep):
        procs.append(subprocess.Popen(_with_files(files_of, argv), stdout=subprocess.PIPE, text=True))
        threads.append(threading.Thread(target=follow, args=(procs[-1], key, is_report, keep)))
        threads[-1].start()
    try:
        start("ours", IOWARDEN + ["iostat", "--json", "-d", fs.name, str(interval), str(count + 1)],
              {"/proc/diskstats": files["diskstats"]}, lambda line: line.startswith("{"), our_lines)
        first = reports["ours"].get(timeout=120)
        start("ref", ["iostat", "-x", "-o", "JSON", "-d", fs.name, str(interval), str(count + 1)],
              {f"/sys/block/{fs.name}/stat": files["stat"], "/proc/uptime": files["uptime"]},
              lambda line: "disk_device" in line, ref_lines)
        reports["ours"].put(first)
        for k in range(1, count + 1):
            for key in reports:
                reports[key].get(timeout=60)   # the report of counters k-1
            write(k, _overwrite)
        assert all(proc.wait(timeout=60) == 0 for proc in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for t in threads:
            t.join(timeout=10)
    ref_rows = [s["disk"][0] for s in json.loads("".join(ref_lines))["sysstat"]["hosts"][0]["statistics"]][1:]
    our_rows = [json.loads(line) for line in our_lines][1:]   # each one's since-boot report left out
    assert len(ref_rows) == len(our_rows) == count
    report = []
    for field in FIELDS:
        r = sum(row[field] for row in ref_rows) / count
        o = sum(row[field] for row in our_rows) / count
        report.append(f"{field}: iostat {r:.3f} iowarden {o:.3f}")
    print("\n".join(report))
    for i, (ref, ours) in enumerate(zip(ref_rows, our_rows)):
        # sysstat prints two decimals: the awaits are counters over counters, the same numbers for both, so
        # equal to its last digit. The rest are over the interval, which for ours is its own clock's (its reads,
        # up to tens of milliseconds late on a busy machine: report 1's aqu-sz 2.1 % apart in one run) and for
        # sysstat the uptime written; one factor for the whole report, the ratio of the I/Os a second, takes the
        # clocks out and leaves the formulas to agree to sysstat's last digit
        clocks = (ref["r/s"] + ref["w/s"]) / max(ours["r/s"] + ours["w/s"], 1e-9)
        assert 0.9 < clocks < 1.1, f"report {i + 1}: the two intervals {clocks:.3f} apart"
        for field in FIELDS:
            r, o = ref[field], ours[field] * (1.0 if field.endswith("await") else clocks)
            assert close(r, o, 0.005, 0.011), \
                f"report {i + 1}, {field}: iostat {r} iowarden {ours[field]} ({o} on sysstat's clock)\n" + \
                "\n".join(report)
    assert sum(row["util"] for row in our_rows) / count > 20, "the load did not keep the device busy"
    assert sum(row["w/s"] for row in our_rows) / count > 500, "the write load did not reach the device"


def _fio_json(argv):
    out = subprocess.run(argv + ["--output-format=json"], capture_output=True, text=True, check=True).stdout
    return json.loads(out[out.index("{"):])


def test_short_probe_agrees_with_a_long_fio_run(direct_loop_xfs):
    # On a volume of steady pace: a provisioned-IOPS cap, as the cloud volumes iowarden watches
    # have, here a blkio throttle at a third of what the first probe got from the disk under the
    # direct-I/O loop device. Uncapped, that virtio disk moved 11 % between a probe and the 30 s
    # run next to it, beside the suite's other tests (37.4k vs 42.1k IOPS at QD8): the test then measured the VM's
    # neighbours, not the probe. Capped, what is left to differ is how each run measures: its
    # ramp and runtime, the file and blocks it reads, and the probe file's layout (an unwritten
    # extent reads as zeros without touching the device, and would run far above the cap).
    fs = direct_loop_xfs
    size = 256 << 20
    prof = ProbeProfile("rr4k", rw="randread", bs_bytes=4096, iodepth=8, ioengine="libaio", size_bytes=size,
                        runtime_seconds=3, ramp_time_seconds=1)
    first = run_probe("t", str(fs.mountpoint), prof, LIMITS)
    assert first.ok, first.error
    # a third, not a half: at half (35k of 70k IOPS on a faster day) one 3 s probe in a full run
    # fell 27 % below the cap while the 30 s run held it; the 2-core VM had no headroom left
    # and at most 3,000: in a fresh clone while other work ran, a third still failed once, the capped
    # probe falling below the cap; at 3,000 IOPS the cap, not the machine's spare CPU, sets the pace
    cap = int(min(first.iops("read") / 3, 3000))
    path = fs.mountpoint / PROBE_DIR_NAME / probe_file_name(size)
    # The comparison needs a steady pace: a run that fell below the cap measured the machine (another job's
    # burst on the same 2-core VM: the test lane's probes, a neighbour's fio), not the probe (in CI beside
    # other fio: 30 s fio 3,000, probe 1,697). Such a pair is measured again, three times at most.
    tries = []
    for _ in range(3):
        with read_iops_cap(fs.major_minor, cap):
            long = _fio_json(["fio", "--name=long", f"--filename={path}", "--allow_file_create=0",
                              "--rw=randread", "--bs=4k", "--iodepth=8", "--ioengine=libaio", "--direct=1",
                              f"--size={size}", "--time_based", "--runtime=30", "--ramp_time=1"])
            probe = run_probe("t", str(fs.mountpoint), prof, LIMITS)
        assert probe.ok, probe.error
        long_iops = long["jobs"][0]["read"]["iops"]
        tries.append(f"probe {probe.iops('read'):.0f}, 30 s fio {long_iops:.0f}")
        if close(long_iops, cap, 0.10, 0) and probe.iops("read") >= 0.9 * cap:
            break   # both held the cap's pace (below it, a run was starved of CPU: it cannot go over the cap)
    figures = f"uncapped probe {first.iops('read'):.0f} IOPS; capped at {cap}: " + "; then ".join(tries)
    print(figures)
    assert close(long_iops, cap, 0.10, 0), f"the disk fell below the cap, the pace was not steady: {figures}"
    assert close(probe.iops("read"), long_iops, 0.10, 0), figures


def _ioping_request_seconds(path, seconds: float) -> list[float]:
    """Per-request latencies of QD1 4k O_DIRECT random reads over the first 64 MiB of `path`."""
    # -B -p 1: one raw-statistics line per request ("1 time_ns iops bps min avg max mdev ..."),
    # then a summary line over all of them; ioping leaves its warm-up request out of both.
    # Output goes to a file, not a pipe: a reader woken for every line took a core from ioping
    # and the loop worker on this 2-core VM and made ioping's reads ~25 % slower.
    with tempfile.TemporaryFile("w+") as out_file:
        subprocess.run(["ioping", "-B", "-q", "-p", "1", "-D", "-i", "0", "-w", f"{seconds:g}",
                        "-s", "4k", "-S", "64m", str(path)], stdout=out_file, check=True)
        out_file.seek(0)
        out = out_file.read()
    return [int(line.split()[5]) / 1e9 for line in out.splitlines()[:-1] if line.split()[0] == "1"]


def test_qd1_latency_agrees_with_ioping(direct_loop_xfs):
    # The loop device reads its image with O_DIRECT, so both tools measure the virtio disk under
    # it (~50 us). Over the page cache a loop read's "device time" is only the loop worker's
    # wake-up: ~11 us when the scheduler runs it on the issuing CPU and ~35 us when it does not,
    # and which one a tool gets depends on its process layout. There ioping's mean swung from
    # 14 to 42 us between runs while fio's stayed at 33, so the comparison tested the scheduler.
    # The disk under the image drifts too (p50 48-64 us within a minute), so the tools take
    # turns, five times, and the median of the paired ratios is compared (of three, one pair's drift on a busy
    # machine was enough: [0.72, 1.13, 0.79]).
    fs = direct_loop_xfs
    prof = ProbeProfile("qd1", rw="randread", bs_bytes=4096, iodepth=1, ioengine="psync",
                        size_bytes=64 << 20, runtime_seconds=3, ramp_time_seconds=0.5)
    probe_file = fs.mountpoint / PROBE_DIR_NAME / probe_file_name(64 << 20)
    ratios = []
    with latency_measured():
        for _ in range(5):
            r = run_probe("t", str(fs.mountpoint), prof, LIMITS)
            assert r.ok, r.error
            ours_p50 = r.report.directions["read"].clat_percentiles_seconds[50.0]
            # ioping reads the probe's own file (read-only, O_DIRECT): the same blocks fio read.
            theirs = _ioping_request_seconds(probe_file, 3)
            assert len(theirs) > 1000, len(theirs)
            theirs_p50 = statistics.median(theirs)
            print(f"QD1 4k read p50: probe {ours_p50 * 1e6:.1f} us (mean "
                  f"{r.report.directions['read'].lat.mean_seconds * 1e6:.1f}), ioping {theirs_p50 * 1e6:.1f} us "
                  f"(mean {statistics.mean(theirs) * 1e6:.1f}, {len(theirs)} requests)")
            ratios.append(ours_p50 / theirs_p50)
    ratio = statistics.median(ratios)
    assert 0.8 <= ratio <= 1.25, ratios


def test_fragmented_file_extents_match_xfs_bmap_and_xfs_db(loop_xfs):
    d = loop_xfs.mountpoint / "frag"
    d.mkdir()
    fds = [os.open(d / name, os.O_WRONLY | os.O_CREAT, 0o644) for name in ("a", "b", "c")]
    try:
        # interleaved small synchronous appends: each file's blocks land between the others'
        for _ in range(150):
            for fd in fds:
                os.write(fd, b"z" * 4096)
                os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)
    total = 0
    for name in ("a", "b", "c"):
        path = str(d / name)
        bmap = subprocess.run(["xfs_bmap", path], capture_output=True, text=True, check=True).stdout
        bmap_extents = sum(1 for line in bmap.splitlines()[1:] if line.strip() and "hole" not in line)
        ours = xfs.file_extent_count(path)
        assert ours == bmap_extents and ours > 3, (name, ours, bmap_extents)
        total += ours
    # xfs_db reads the device without the log: freeze to flush it, as the report's note explains
    subprocess.run(["xfs_freeze", "-f", str(loop_xfs.mountpoint)], check=True)
    subprocess.run(["xfs_freeze", "-u", str(loop_xfs.mountpoint)], check=True)
    out = subprocess.run(IOWARDEN + ["xfs", "--json", str(loop_xfs.mountpoint)], capture_output=True,
                         text=True, check=True).stdout
    report = json.loads(out)[0]
    ref = xfs.parse_frag(subprocess.run(["xfs_db", "-r", "-c", "frag", loop_xfs.device], capture_output=True,
                                        text=True, check=True).stdout)
    assert report["frag"]["actual_extents"] == ref.actual_extents == total
    assert report["frag"]["ideal_extents"] == 3 and report["free_space_source"] == "xfs_spaceman"
    assert report["frag"]["fragmentation_ratio"] == pytest.approx((total - 3) / total)
