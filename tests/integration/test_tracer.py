"""The block-layer tracer on real devices: its latencies against fio's, and where it says the time goes.

The volume under test is a loop device whose image lives on another loop XFS (a stacked volume): a blkio
throttle on the inner device slows the outer one below its own block layer, as a cloud volume's
provisioned limit does, so the outer disk's *device* time is what grows.
"""
import functools
import json
import os
import re
import shutil
import signal
import sys
import subprocess
import tempfile
import time
import types
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from iowarden.daemon.sources import tracer, tracer_views
from iowarden.probes import blocktrace, cgroupio
from iowarden.probes.common import Roots
from tests.conftest import LoopXfs, fresh_loop_queue
from tests.integration.helpers import blkio_cap, config_text, free_port, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]   # bpftrace: scripts/setup.sh installs it

WINDOW_SECONDS = 2.0


@pytest.fixture(scope="module")
def stacked(direct_loop_xfs):
    outer = LoopXfs("512M", direct_io=True, image_dir=direct_loop_xfs.mountpoint)
    yield direct_loop_xfs, outer
    outer.close()


ENGINES = pytest.mark.parametrize("engine", ["bpftrace", "compiled"])   # [tracer] engine: both, on the same I/O


def _section(name, engine="bpftrace"):
    sec = types.SimpleNamespace(**{k: v.default for k, v in tracer.CONFIG.items()})
    sec.interval_seconds, sec.devices, sec.engine = WINDOW_SECONDS, [name], engine
    # these tests are about the data, not the budget: the host's I/O rate (another job's fio on other loop devices)
    # must not pause them (CI, beside two such jobs: bpftrace paused at 129,947 I/O per second). The budget has
    # its own tests (test_blocktrace.py, and the 60,000-IOPS test below with the default)
    sec.max_cpu_cores = 8.0
    return sec


def _fio(path, *args, runtime=8):
    r = subprocess.run(["fio", "--name=t", f"--filename={path}/tracer.dat", "--size=128m", "--rw=randread",
                        "--bs=4k", "--ioengine=libaio", "--direct=1", f"--runtime={runtime}", "--time_based",
                        "--output-format=json", *args], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(r.stdout)["jobs"][0]["read"]


def _until_up(read) -> None:
    """Readings until bpftrace has compiled and attached the program (its first line)."""
    last = []
    wait_for(lambda: last.append(read()) or last[-1].up, timeout=300, what="the tracer up")


def _traced(outer, *fio_args, engine="bpftrace", paths=None):
    """fio on the outer volume with the tracer running: (fio's read stats, the tracer's reading before and after,
    the reads the kernel completed on the volume meanwhile, from /proc/diskstats). paths, a dict, gets how the
    compiled engine said each disk's requests were timed."""
    read = tracer.start(_section(outer.name, engine), Roots())
    try:
        _until_up(read)
        _fio(outer.mountpoint, "--runtime=1", "--time_based=0", "--size=128m", "--rw=read", "--bs=1m")  # lay out
        before = _settled(read)
        completed = _reads(outer.name)
        fio = _fio(outer.mountpoint, *fio_args)
        after = _settled(read)
        return fio, before, after, _reads(outer.name) - completed
    finally:
        if paths is not None:
            paths.update(read.state.paths)
        read.stop()   # its bpftrace, by the reader that started it


def _settled(read):
    """The tracer's reading once a whole window more has not changed its totals: every completion fio waited for
    has been read out of the engine. A fixed wait is not that on a busy machine, where bpftrace's printer runs
    late (33 of 400 reads were still unprinted a window and a half after fio ended)."""
    seen: list[tuple[float, dict]] = []

    def settled():
        r = read()
        totals = {k: h.total for k, h in r.total.items()}
        now = time.monotonic()
        if seen and seen[-1][1] != totals:
            seen.clear()
        if not seen:
            seen.append((now, totals))
        return r if now - seen[0][0] >= WINDOW_SECONDS + 0.5 else None
    return wait_for(settled, timeout=90, what="the tracer's totals the same a whole window on")


def _reading_between(before, after):
    """`after` with its window replaced by what was added since `before` (what a cause is built from)."""
    window = types.SimpleNamespace(**{**after.__dict__})
    window.window = {k: after.total[k].minus(before.total.get(k)) for k in after.total}
    return window


def _window(before, after, key):
    return after.total[key].minus(before.total.get(key))


# and the compiled engine's second path, a disk whose requests carry no issue time, timed from the issue program's
# map: every queue here stamps its requests, so the loader is told to ignore the stamp (blockstage --issue-map)
@pytest.mark.parametrize("engine", ["bpftrace", "compiled", "compiled-issue-map"])
def test_tracer_percentiles_agree_with_fios_and_the_device_is_named(stacked, engine, monkeypatch):
    """128k reads at QD1 (one request each: max_sectors_kb is 1280) while the inner device is held to
    32 MiB/s. blk-throttle works in slices: about half the reads pass at once (p50 ~0.2 ms), the rest
    wait for the next slice (p99 ~95 ms). The tracer's total runs a few per cent above fio's clat at p50:
    fio's libaio clock starts when io_submit has returned, the bio was queued inside it."""
    inner, outer = stacked
    if engine == "compiled-issue-map":
        engine = "compiled"
        monkeypatch.setattr(tracer, "compiled_process", functools.partial(tracer.compiled_process, issue_map=True))
    paths = {}
    with blkio_cap("read_bps_device", inner.major_minor, 32 << 20):
        # 400 reads, however long they take (a minute at most): on a busy machine 8 s of them were 175, under the
        # 200 timed I/Os a window needs before its tail is quoted as a cause
        fio, before, after, completed = _traced(outer, "--iodepth=1", "--bs=128k", "--number_ios=400",
                                                "--time_based=0", "--runtime=60", "--percentile_list=50:98:99:99.5",
                                                engine=engine, paths=paths)
    if engine == "compiled":
        want = "issue map" if isinstance(tracer.compiled_process, functools.partial) else "stamped"
        assert paths == {outer.name: want}, paths
    key = (outer.name, "read", "total")
    h = _window(before, after, key)
    fio_p = {q: fio["clat_ns"]["percentile"][f"{q:.6f}"] / 1e9 for q in (50.0, 98.0, 99.0, 99.5)}
    ours = {q: h.quantile_seconds(q / 100) for q in (45.0, 50.0, 55.0, 99.0)}
    print(f"I/Os fio {fio['total_ios']} completed {completed} traced {h.total}; p50 fio {fio_p[50.0] * 1e3:.3f} ms traced "
          f"{ours[50.0] * 1e3:.3f} ms; p99 fio {fio_p[99.0] * 1e3:.3f} ms (p98 {fio_p[98.0] * 1e3:.3f}, p99.5 "
          f"{fio_p[99.5] * 1e3:.3f}) traced {ours[99.0] * 1e3:.3f} ms")
    # every request timed, none twice: the reads the kernel completed (fio's, and one of XFS's now and then), not
    # one in N (a sampled disk would time a half or less). Not all of them to the read: on a busy machine the
    # completion tracepoint reaches a BPF program for some 94-100 % of the requests /proc/diskstats counts (beside
    # five soaks, load 40: the compiled program 391-401 of 401, a bpftrace program counting only that tracepoint
    # beside it 396-401, on the stamped path and the issue map alike; the whole suite side by side: 375 of fio's
    # 400). Those missing were never delivered, so no wait brings them
    assert 0.90 * completed <= h.total <= completed + 0.02 * completed + 5, (h.total, completed, fio["total_ios"])
    assert completed >= fio["total_ios"], (completed, fio["total_ios"])
    # fio's clock is user space's: on a busy machine its process waits for a CPU before it reaps a
    # completion the block layer saw earlier (seen: p50 1.17 ms by fio, 0.82 ms in the block layer), so
    # half a millisecond is allowed beside the 10 % and 20 %
    slack = 0.5e-3
    # the median sits where the reads that passed at once end and those held for a slice begin: a request or
    # two either side moves it across that gap (fio 0.98 ms, the block layer 0.31 ms over the same 400 reads).
    # As for p99 below, fio's p50 must lie within the traced p45 to p55, twenty requests either way
    assert 0.90 * fio_p[50.0] - slack <= ours[55.0] and ours[45.0] <= 1.10 * fio_p[50.0] + slack, (ours, fio_p)
    # p99 of 400 is the fourth-largest, and blk-throttle's waits come in whole slices: the tail is a few
    # modes, and one request more or less moves a rank across a gap (CI: fio's p99 32.6 ms, the block
    # layer's 46.1 ms over 401 requests, one not fio's). So the traced p99 must lie within fio's p98 to
    # p99.5, four requests either way, with the same 20 % and slack
    assert 0.80 * fio_p[98.0] - slack <= ours[99.0] <= 1.20 * fio_p[99.5] + slack, fio_p
    # the time is below the block layer: the cause says the device
    said = tracer_views.where_the_time_goes(_reading_between(before, after), outer.name, "read")
    print(said)
    assert said and "in the device: the time goes to the device" in said


@pytest.mark.parametrize("engine", ["bpftrace", "compiled", "compiled-issue-map"])
def test_a_journals_flushed_writes_are_each_timed_once_as_diskstats_counts_them(stacked, engine, monkeypatch):
    """A WAL appender: 4 KiB writes, each followed by fdatasync, on XFS. Each fdatasync flushes the disk's cache
    through the block layer's flush sequence (block/blk-flush.c). While the file grows, XFS commits its size in a
    journal write with PREFLUSH and FUA, whose request completes twice: once when its data is written, and once,
    with no bytes, when its flushes are. Once the file is laid out, an overwrite's fdatasync is an empty PREFLUSH
    write that no driver takes: the queue's flush request does its work. /proc/diskstats counts each write once,
    the empty ones too; so must the tracer, or the write rate, percentiles and cgroup shares of a database's WAL
    disk are off."""
    _, outer = stacked
    if engine == "compiled-issue-map":
        engine = "compiled"
        monkeypatch.setattr(tracer, "compiled_process", functools.partial(tracer.compiled_process, issue_map=True))
    path = Path(outer.mountpoint) / f"wal-{engine}-{os.getpid()}.dat"
    key = (outer.name, "write", "total")
    read = tracer.start(_section(outer.name, engine), Roots())
    seen = {}
    try:
        _until_up(read)
        before = _settled(read)
        for phase in ("grows", "overwrites"):    # the same file twice: laid out by the first run
            written = _writes(outer.name)
            subprocess.run(["fio", "--name=wal", f"--filename={path}", "--rw=write", "--bs=4k", "--fdatasync=1",
                            "--number_ios=300", "--size=8m", "--output=/dev/null"], check=True, timeout=120)
            after = _settled(read)
            seen[phase] = (_writes(outer.name) - written, _window(before, after, key).total)
            before = after
        paths = dict(read.state.paths)
    finally:
        read.stop()
        path.unlink(missing_ok=True)
    print(f"{engine}: fio wrote 300 a run; (diskstats' writes, the tracer's) {seen}")
    for phase, (completed, traced) in seen.items():
        # the flushes are in the mix: a journal write or an empty one per fdatasync beside fio's own
        assert completed >= 1.5 * 300, (phase, completed)
        # every write timed once: none twice (timing a journal write's both completions: 897 of 598, growing),
        # the empty ones too (leaving them untimed: 301 of 599, overwriting); the same allowance for completions
        # never delivered as the reads' test above
        assert 0.90 * completed <= traced <= completed + 0.02 * completed + 5, (phase, traced, completed)
    if engine == "compiled":
        # an empty write's missing issue time says nothing of the disk: a stamping disk stays on its stamps
        want = "issue map" if isinstance(tracer.compiled_process, functools.partial) else "stamped"
        assert paths == {outer.name: want}, paths


@ENGINES
def test_iostat_latency_prints_each_stage_as_biolatency_would(stacked, engine):
    _, outer = stacked
    load = subprocess.Popen(["fio", "--name=t", f"--filename={outer.mountpoint}/tracer.dat", "--size=128m",
                             "--rw=randread", "--bs=4k", "--ioengine=libaio", "--direct=1", "--iodepth=4",
                             "--runtime=60", "--time_based", "--output=/dev/null"], start_new_session=True)
    try:
        r = subprocess.run([sys.executable, "-m", "iowarden.daemon.cli", "iostat", "--latency", "--json",
                            "--engine", engine, outer.name, "2", "2"], capture_output=True, text=True, timeout=180)
    finally:
        os.killpg(load.pid, signal.SIGTERM)
        load.wait()
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    mine = {(x["direction"], x["stage"]) for x in rows if x["device"] == outer.name and x["ios"] > 0}
    assert {("read", "queue"), ("read", "device"), ("read", "total")} <= mine, rows
    total = [x for x in rows if x["device"] == outer.name and x["stage"] == "total"][-1]
    assert 0 < total["p50_seconds"] <= total["p99_seconds"] <= total["p99.9_seconds"] < 5
    # ended by SIGTERM (timeout(1), a unit stopping) it takes its tracer process with it: that process is in a
    # session of its own, and ran on, attached, until its next write failed
    cmd = subprocess.Popen([sys.executable, "-m", "iowarden.daemon.cli", "iostat", "--latency", "--engine", engine,
                            outer.name, "60", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    word = "bpftrace" if engine == "bpftrace" else "iowarden.probes.blockstage"
    tracer_pid = wait_for(lambda: _children_named(cmd.pid, word), timeout=60, what=f"iostat's {word}")[0]
    cmd.terminate()
    assert cmd.wait(timeout=30) == 128 + signal.SIGTERM, cmd.stderr.read()
    assert not os.path.exists(f"/proc/{tracer_pid}"), f"{word} {tracer_pid} outlived iostat --latency"


def _children_named(pid: int, word: str) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", word], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_the_daemon_exports_the_tracers_histograms_and_stops_it_with_itself(stacked, tmp_path, daemon_factory):
    _, outer = stacked
    port = free_port()
    d = daemon_factory(config_text(outer.mountpoint, tmp_path / "state", interval=1.0, port=port, tracer=True))
    d.wait_message("READY=1")

    def scraped():
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        want = (f'iowarden_io_latency_seconds_count{{device="{outer.name}",direction="read",stage="device"')
        return text if "iowarden_tracer_up 1.0" in text and want in text else None
    text = wait_for(scraped, timeout=90, what="the tracer's histograms on /metrics")
    count = next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith(f'iowarden_io_latency_seconds_count{{device="{outer.name}",direction="read",stage="total"'))
    assert count > 0   # the daemon's own probes, timed in the block layer
    assert f'iowarden_io_latency_timed_ratio{{device="{outer.name}"}} 1.0' in text
    # and per cgroup: the daemon's probes are charged to the cgroup it runs in, and named with it
    own = cgroupio.own_cgroup(Roots(), 1, str(d.proc.pid))
    seen = [""]

    def charged():
        seen[0] = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        return any(x.startswith("iowarden_cgroup_io_requests_total{") and f'device="{outer.name}"' in x and
                   f'cgroup="{own}"' in x and float(x.rsplit(" ", 1)[1]) > 0 for x in seen[0].splitlines())
    try:
        wait_for(charged, timeout=60, what=f"the daemon's own cgroup ({own}) on /metrics")
    except AssertionError:
        print("\n".join(x for x in seen[0].splitlines() if "cgroup" in x))
        raise

    def status():   # `status` (its own process, reading the database) shows the tail of the last window
        out = subprocess.run([sys.executable, "-m", "iowarden.daemon.cli", "status", "-c", str(d.cfg)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = [line.split() for line in out.stdout.splitlines() if line.startswith(outer.name + " ")]
        said[:] = [out.stdout[-1500:]]
        return out.stdout if "where the time goes (real I/O" in out.stdout and \
            any(r[1] == "read" and int(r[2]) > 0 and r[-1].endswith("%") for r in rows) and \
            "who is charged for it (per cgroup" in out.stdout else None
    said = [""]
    try:
        wait_for(status, timeout=60, what="the tracer's tail in `iowarden status`")
    except AssertionError:
        print(said[0])
        raise
    # the default engine (auto) runs the compiled one here (scripts/setup.sh builds it)
    tracers = _children_named(d.proc.pid, "iowarden.probes.blockstage")
    assert len(tracers) == 1, _children_named(d.proc.pid, "bpftrace")
    d.close()
    assert not os.path.exists(f"/proc/{tracers[0]}"), "the tracer's loader outlived the daemon"


def test_a_daemon_keeps_its_tracer_up_beside_a_busy_disk_elsewhere_and_exports_its_volumes_stages(
        stacked, tmp_path, daemon_factory, engine="compiled"):
    """The tracer paused on any busy host when its budget assumed 1,800 ns per request. fio reads a loop device over
    /dev/shm, not the daemon's, as fast as it can up to 120,000 IOPS throughout (what it reaches depends on what else
    the machine runs: 25,000-110,000 here). The daemon's CPU budget is the default, or less: what a 600 ns price
    would take at the rate fio reached before the daemon started, where that is less. Either way a tracer priced
    at 1,800 ns a request would exceed it at that rate, on a machine with spare capacity or without. The daemon
    keeps its compiled tracer up, its volume's stage histograms appear within two windows of its start, and the
    program's measured cost at the rate reached is inside the budget."""
    _, outer = stacked
    work = tempfile.mkdtemp(dir="/dev/shm", prefix="iowarden-test-hot-")
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        image = os.path.join(work, "img")
        with open(image, "wb") as f:
            f.truncate(256 << 20)
        hot = subprocess.run(["losetup", "--find", "--show", image], capture_output=True, text=True,
                             check=True).stdout.strip()
        stack.callback(subprocess.run, ["losetup", "-d", hot], capture_output=True)
        fresh_loop_queue(os.path.basename(hot))
        def hot_fio(rate_iops: int, seconds: int):
            return subprocess.Popen(["fio", "--name=hot", f"--filename={hot}", "--readonly", "--rw=randread",
                                     "--bs=4k", "--iodepth=32", "--ioengine=libaio", "--direct=1",
                                     f"--rate_iops={rate_iops}", f"--runtime={seconds}", "--time_based",
                                     "--output=/dev/null"])
        # the rate this machine lends fio now, measured over 5 s before the daemon starts; the load then runs
        # held to it: a rate that rose later (the host less busy) would take the tracer past a budget set from
        # this one, and pause it rightly (seen once beside the suite)
        probe, reads_before, t0 = hot_fio(120000, 6), _reads(hot), time.monotonic()
        time.sleep(5)
        rate_before = (_reads(hot) - reads_before) / (time.monotonic() - t0)
        probe.wait(timeout=60)
        fio = hot_fio(max(1000, int(rate_before)), 600)
        stack.callback(lambda: (fio.terminate(), fio.wait(timeout=30)))
        started, reads_before = time.monotonic(), _reads(hot)
        budget_cores = min(tracer.CONFIG["max_cpu_cores"].default, rate_before * BUDGET_PRICE_PER_IO_SECONDS)
        port = free_port()
        d = daemon_factory(config_text(outer.mountpoint, tmp_path / "state", interval=1.0, port=port,
                                       tracer=engine, tracer_cores=budget_cores))
        d.wait_message("READY=1")
        stack.callback(d.close)
        want = f'iowarden_io_latency_seconds_count{{device="{outer.name}",direction="read",stage="queue"'

        def scraped():
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            return text if "iowarden_tracer_up 1.0" in text and want in text else None
        up_at = time.monotonic()
        wait_for(lambda: "iowarden_tracer_up 1.0" in urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode(), timeout=300, what="the tracer up")
        # the volume's stages appear once it has I/O to time: its first probe, which a machine busy with other
        # work may start a while after the tracer is up; from then, within two windows
        wait_for(lambda: "iowarden_probe_last_success_timestamp_seconds{" in urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode(), timeout=180, what="the volume's first probe")
        probed_at = time.monotonic()
        text = wait_for(scraped, timeout=2 * WINDOW_SECONDS + 5, what="its volume's stage histograms, two windows")
        assert text
        print(f"{engine}: up, its first probe {probed_at - up_at:.1f} s after, its volume's stages "
              f"{time.monotonic() - probed_at:.1f} s after that")
        time.sleep(3 * WINDOW_SECONDS)   # and it stays up under the load
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "iowarden_tracer_up 1.0" in text
        host_iops = (_reads(hot) - reads_before) / (time.monotonic() - started)
        print(f"{os.path.basename(hot)}: {host_iops:,.0f} reads/s throughout")
        print(f"the tracer's budget: {budget_cores:.4f} of a core ({rate_before:,.0f} reads/s before the daemon)")
        # the load ran throughout, at a rate that would have paused a tracer priced at 1,800 ns a request
        assert fio.poll() is None and host_iops * OLD_ASSUMED_COST_PER_IO_SECONDS > budget_cores, host_iops
        # the budget is judged on the program's cost as the kernel measured it under this load (bpf_stats)
        cost = re.search(r'iowarden_tracer_cost_per_io_seconds\{engine="compiled",source="measured"\} (\S+)', text)
        assert cost, [x for x in text.splitlines() if "tracer_cost" in x]
        print(f"measured: {float(cost.group(1)) * 1e9:.0f} ns per request, "
              f"{host_iops * float(cost.group(1)):.4f} of a core at this rate")
        assert host_iops * float(cost.group(1)) < budget_cores


# what the tracer's budget once assumed every request cost; the load must be one that price would have paused at
OLD_ASSUMED_COST_PER_IO_SECONDS = 1800e-9
# a budget no lower than this price fills at the rate reached: the compiled program (some 150 ns a request) fits
# it four times over, the old price exceeds it three times
BUDGET_PRICE_PER_IO_SECONDS = 600e-9


def _completed(device: str, field: int) -> int:
    name = os.path.basename(device)
    for line in open("/proc/diskstats"):
        fields = line.split()
        if fields[2] == name:
            return int(fields[field])
    raise AssertionError(f"{name} is not in /proc/diskstats")


def _reads(device: str) -> int:
    """Reads completed on the device, from /proc/diskstats."""
    return _completed(device, 3)


def _writes(device: str) -> int:
    """Writes completed on the device, from /proc/diskstats (the empty ones a cache flush makes among them)."""
    return _completed(device, 7)


@contextmanager
def queue_settings(name: str, **values):
    """Set /sys/block/NAME/queue/KEY for the block; put back what was there, by the device's name."""
    base = f"/sys/block/{name}/queue"
    before = {k: open(f"{base}/{k}").read().split("[")[-1].split("]")[0].strip() for k in values}
    try:
        for k, v in values.items():
            with open(f"{base}/{k}", "w") as f:
                f.write(str(v))
        yield
    finally:
        for k in reversed(list(values)):
            with open(f"{base}/{k}", "w") as f:
                f.write(before[k])


@ENGINES
def test_a_deep_queue_in_front_of_a_shallow_device_names_the_kernel_queue_with_device_time_flat(stacked, engine):
    """The outer loop device takes 128 requests at a time (loop's hw_queue_depth) and serves them at the
    pace of the inner one, held to 4,000 reads a second; mq-deadline with nr_requests 1024 holds the rest,
    as a SATA disk's 32 NCQ slots behind a deep scheduler queue do. At QD128 every request is in the
    device at once; at QD1024 the device holds the same 128 (its time stays flat) and the rest wait in
    the scheduler: the tail is the kernel's queue, and the cause says so. (A device that is the CPU, a
    loop over the page cache, shows nothing alike: fio and the loop worker share two cores.)"""
    inner, outer = stacked
    name = outer.name
    windows, iops = {}, {}
    with ExitStack() as stack:
        stack.enter_context(queue_settings(name, scheduler="mq-deadline", nr_requests=1024))
        read = tracer.start(_section(name, engine), Roots())
        stack.callback(read.stop)
        _until_up(read)
        _fio(outer.mountpoint, "--runtime=1", "--time_based=0", "--rw=read", "--bs=1m")   # lay out
        stack.enter_context(blkio_cap("read_iops_device", inner.major_minor, 4000))
        for depth in (128, 1024):
            before = _settled(read)
            iops[depth] = _fio(outer.mountpoint, f"--iodepth={depth}", "--iodepth_batch_submit=64", runtime=6)["iops"]
            windows[depth] = _reading_between(before, _settled(read))

    def p99(depth, stage):
        return windows[depth].window[(name, "read", stage)].quantile_seconds(0.99)

    def p50(depth, stage):
        return windows[depth].window[(name, "read", stage)].quantile_seconds(0.5)

    def mean_ms(depth, stage):
        """From the eighth-octave buckets' midpoints: within 6 % of the true mean."""
        counts = windows[depth].window[(name, "read", stage)].counts
        spent = sum(c * (blocktrace.bucket_lower_ns(i) + blocktrace.bucket_upper_ns(i)) / 2 for i, c in counts)
        return spent / sum(c for _, c in counts) / 1e6
    shallow, deep = (tracer_views.where_the_time_goes(windows[d], name, "read") for d in (128, 1024))
    print(f"QD128: queue p99 {p99(128, 'queue') * 1e3:.3f} ms, device p99 {p99(128, 'device') * 1e3:.3f} ms; "
          f"QD1024: queue p99 {p99(1024, 'queue') * 1e3:.3f} ms, device p99 {p99(1024, 'device') * 1e3:.3f} ms")
    print(shallow, deep, sep="\n")
    print({d: (round(iops[d]), {st: round(windows[d].window[(name, "read", st)].quantile_seconds(0.5) * 1e3, 3)
                                for st in ("queue", "device", "total")}) for d in iops})
    # Device time flat: it holds the same 128 either way, so by Little's law its mean is 128 over the rate the
    # throttle lets through, alike at both depths (4,018 and 4,385 reads a second in one run). Its mean, not a
    # quantile: the throttle releases requests in bursts, and where a burst lands moves any one quantile. On the
    # suite's busy two cores the device's p99 moved 4.8x between the two runs ten seconds apart (485 and 101 ms)
    # and its median 3.1x (1.15 and 3.59 ms) while the queue's p99 went from nothing to 547 ms
    print({d: round(mean_ms(d, "device"), 3) for d in iops}, "ms mean device time")
    assert 1 / 2 <= mean_ms(1024, "device") / mean_ms(128, "device") <= 2
    assert p99(1024, "queue") >= 2 * p99(1024, "device")   # the tail is the queue's, not the device's
    assert p99(1024, "queue") >= 4 * max(p99(128, "queue"), p50(128, "device"))   # the queue grew
    assert "the time goes to the kernel's queue in front of the device" in deep, deep
    assert "the kernel's queue in front" not in shallow, shallow
