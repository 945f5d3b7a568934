"""The tracer's program, its output and its policy (sampling, re-planning, where the time goes): no root, no bpftrace."""
import json
import time
import types

import pytest

from iowarden.daemon.sources import tracer, tracer_proc, tracer_views
from iowarden.probes import blocktrace as bt
from iowarden.probes.common import ParseError, Roots


@pytest.mark.parametrize("ns", [1, 2, 3, 4, 5, 7, 8, 100, 1023, 1024, 1500, 65_000, 999_999, 10**9, 2**40 + 7])
def test_each_value_falls_in_its_bucket_and_buckets_are_an_eighth_of_an_octave(ns):
    i = bt.bucket_of_ns(ns)
    assert bt.bucket_lower_ns(i) <= ns < bt.bucket_upper_ns(i)
    if ns >= 8:
        assert bt.bucket_upper_ns(i) / bt.bucket_lower_ns(i) <= 1.125 + 1e-9


def test_the_program_traces_only_the_disks_named_with_their_sampling():
    text = bt.program({bt.dev_t(8, 0): 0, bt.dev_t(259, 1): 960}, 15.0)
    # the disks are a map filled at the start: skip + 1 (0, a disk not named, is not traced)
    assert "BEGIN { @sk[(uint64)8388608] = 1; @sk[(uint64)271581185] = 961; }" in text
    assert "args->dev ==" not in text    # one lookup per event, not a comparison per disk
    assert f"$k > 0 && {bt.HASH} + 1 >= $k" in text
    assert "interval:ms:15000 { print(@lat); print(@ns); }" in text
    for tp in ("block_bio_queue", "block_rq_issue", "block_rq_complete"):
        assert f"tracepoint:block:{tp} " in text
    assert "printf" not in text   # nothing per I/O leaves the kernel


def test_the_program_is_the_same_size_for_any_number_of_disks_but_its_start():
    """What runs per event does not grow with the disks: only the BEGIN that fills the map does (the
    verifier refused a chain of comparisons from about ten disks; 183 KB of text at 1,024)."""
    def per_event(n):
        text = bt.program({bt.dev_t(7, i): 0 for i in range(n)}, 15.0)
        return text[text.index("\ntracepoint:"):]
    assert per_event(1) == per_event(4000)
    assert len(bt.program({bt.dev_t(7, i): 0 for i in range(1024)}, 15.0)) < 40_000


def test_the_program_deletes_merged_keys_in_the_kernel_and_clears_nothing_while_it_runs():
    """bpftrace 0.17 aborted clearing a map the kernel deleted from; the kernel now drops every key."""
    text = bt.program({bt.dev_t(8, 0): 0}, 15.0)
    running, end = text.split("\nEND ")
    assert "clear(" not in running and "clear(@start); clear(@issue)" in end   # END runs once detached
    for tp in ("block_bio_backmerge", "block_bio_frontmerge", "block_rq_merge"):
        probe = running[running.index(f"tracepoint:block:{tp} "):]
        assert probe.startswith(f"tracepoint:block:{tp} {{ $k = (uint64)@sk[(uint64)args->dev];")
        assert "if ($k > 0)" in probe.split("\ntracepoint:")[0]
    lacking = bt.program({bt.dev_t(8, 0): 0}, 15.0, bt.REQUIRED_TRACEPOINTS + ("block_bio_backmerge",))
    assert "block_rq_merge" not in lacking and "block_bio_frontmerge" not in lacking
    assert "tracepoint:block:block_bio_backmerge " in lacking


def test_the_kernels_tracepoints_are_looked_up_before_compiling_and_a_missing_stage_says_so(tmp_path):
    """A kernel without block_rq_merge (the lab's 6.1 guest has it; older ones do not) gets a program
    without it; one without a stage's edge gets no program, and the reason."""
    events = tmp_path / "sys" / "kernel" / "tracing" / "events" / "block"
    for tp in bt.REQUIRED_TRACEPOINTS + ("block_bio_backmerge", "block_bio_frontmerge", "block_getrq"):
        (events / tp).mkdir(parents=True)
    roots = Roots(proc=tmp_path / "proc", sys=tmp_path / "sys", dev=tmp_path / "dev")
    present = tracer_proc.block_tracepoints(roots)
    assert present == frozenset(bt.REQUIRED_TRACEPOINTS + ("block_bio_backmerge", "block_bio_frontmerge"))
    assert tracer_proc.missing_tracepoints(present) is None
    (events / "block_rq_issue").rmdir()
    assert tracer_proc.missing_tracepoints(tracer_proc.block_tracepoints(roots)) == \
        "the kernel has no tracepoint block_rq_issue (tracefs events/block)"


def test_a_front_merge_moves_the_older_start_only_to_a_sampled_sector():
    """A front merge takes the request's key over: its older time moves to the bio's sector, and only when
    that sector is timed (else the completion would never find it and it would stay)."""
    text = bt.program({bt.dev_t(259, 1): 960}, 15.0)
    front = text[text.index("tracepoint:block:block_bio_frontmerge"):text.index("tracepoint:block:block_rq_merge")]
    assert "delete(@start[args->dev, args->sector + args->nr_sector])" in front
    assert f"if ($o > 0 && {bt.HASH} + 1 >= $k)" in front


def _line(name, entries):
    return json.dumps({"type": "map", "data": {name: entries}})


def test_parse_reads_counts_and_sums_and_passes_other_messages():
    kind, counts = bt.parse_message(_line("@lat", {"8388608,0,2,68": 5, "8388608,0,2,70": 3, "8388608,1,1,40": 2}))
    assert kind == "counts"
    h = counts[(8388608, "read", "total")]
    assert h.counts == ((68, 5), (70, 3)) and h.total == 8
    assert counts[(8388608, "write", "device")].total == 2
    kind, sums = bt.parse_message(_line("@ns", {"8388608,0,2": 2_500_000}))
    assert kind == "sums" and sums[(8388608, "read", "total")] == pytest.approx(0.0025)
    assert bt.parse_message('{"type": "attached_probes", "data": {"probes": 5}}') is None


@pytest.mark.parametrize("line", ["not json", _line("@lat", {"1,2,0,5": 1}), _line("@lat", {"1,0,0": 1}),
                                  _line("@lat", {"1,0,0,999": 1}), _line("@lat", {"1,0,0,5": -1}),
                                  _line("@lat", ["a"]), _line("@ns", {"x,0,0": 1})])
def test_a_line_that_is_not_the_programs_is_a_parse_error(line):
    with pytest.raises(ParseError):
        bt.parse_message(line)


def test_quantiles_interpolate_inside_a_bucket_and_windows_subtract():
    b = bt.bucket_of_ns(1_000_000)   # 1 ms
    h = bt.StageHistogram(((b, 99), (bt.bucket_of_ns(100_000_000), 1)))
    lo, hi = bt.bucket_lower_ns(b) / 1e9, bt.bucket_upper_ns(b) / 1e9
    assert lo <= h.quantile_seconds(0.5) <= hi
    assert h.quantile_seconds(0.999) > 0.09
    later = bt.StageHistogram(((b, 150), (bt.bucket_of_ns(100_000_000), 1)))
    assert later.minus(h).counts == ((b, 51),)
    restarted = bt.StageHistogram(((b, 10),))
    assert restarted.minus(h) is restarted      # a count that went down: a new process, all of it new
    assert bt.StageHistogram(()).quantile_seconds(0.99) is None


def test_sampling_keeps_about_the_configured_rate_and_replans_only_on_a_fourfold_change():
    assert tracer.skip_for(1500, 2000) == 0
    skip = tracer.skip_for(200_000, 2000)
    assert (bt.SAMPLE_SCALE - skip) / bt.SAMPLE_SCALE * 200_000 == pytest.approx(2000, rel=0.25)
    assert not tracer.needs_replan({"sda": skip}, {"sda": tracer.skip_for(300_000, 2000)})
    assert tracer.needs_replan({"sda": skip}, {"sda": tracer.skip_for(2_000_000, 2000)})
    assert tracer.needs_replan({"sda": 0}, {"sda": 0, "sdb": 0})


def test_octave_buckets_add_the_fine_counts_up_exactly():
    h = bt.StageHistogram(((bt.bucket_of_ns(5_000), 2), (bt.bucket_of_ns(7_900), 3), (bt.bucket_of_ns(9_000), 4)))
    buckets = dict(tracer_views.octave_buckets(h))
    assert buckets[repr(2 ** 13 / 1e9)] == 5 and buckets[repr(2 ** 14 / 1e9)] == 9 and buckets["+Inf"] == 9
    assert buckets[repr(2 ** 12 / 1e9)] == 0


def _reading(device_ms, queue_ms, n=1000):
    def hist(ms):
        return bt.StageHistogram(((bt.bucket_of_ns(int(ms * 1e6)), n),))
    window = {("sdb", "read", "device"): hist(device_ms), ("sdb", "read", "queue"): hist(queue_ms),
              ("sdb", "read", "total"): hist(device_ms + queue_ms)}
    return tracer.TraceReading(0.0, True, None, 15.0, {}, window, {}, window)


def test_the_cause_says_where_the_tail_is():
    said = tracer.causes(_reading(180, 2), {"sdb"})
    assert len(said) == 1 and said[0].startswith("sdb: p99 read ") and " ms over the last 15 s" in said[0] and "in the device: the time goes to the device" in said[0]
    said = tracer.causes(_reading(1, 40), {"sdb"})[0]
    assert "the kernel's queue in front of the device" in said
    assert tracer.causes(_reading(180, 2, n=20), {"sdb"}) == []   # too few I/Os in the window to quote a p99
    assert tracer.causes(_reading(180, 2), {"sdc"}) == []


def test_without_bpftrace_the_reading_says_the_tracer_is_off_and_why(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "diskstats").write_text("")
    section = types.SimpleNamespace(**{k: v.default for k, v in tracer.CONFIG.items()})
    section.bpftrace_path = str(tmp_path / "no-bpftrace")
    read = tracer.start(section, Roots(proc=tmp_path / "proc", sys=tmp_path / "sys", dev=tmp_path / "dev"))
    r = read()
    assert not r.up and "is not installed" in r.reason
    snap = types.SimpleNamespace(devices={})
    fams = {f.name: f for f in tracer.families(r, snap)}
    assert fams["iowarden_tracer_up"].samples[0].value == 0
    assert "is not installed" in fams["iowarden_tracer_off_reason"].samples[0].labels["reason"]


def test_only_request_based_disks_are_traced(tmp_path):
    sys_block = tmp_path / "sys" / "block"
    for name, dev, mq in (("sda", "8:0", True), ("dm-0", "253:0", False), ("zram0", "252:0", True),
                          ("loop0", "7:0", True), ("loop1", "7:1", True)):
        d = sys_block / name
        d.mkdir(parents=True)
        (d / "dev").write_text(dev + "\n")
        if mq:
            (d / "mq").mkdir()
    (sys_block / "loop1" / "loop").mkdir()
    (sys_block / "loop1" / "loop" / "backing_file").write_text("/img\n")
    roots = Roots(sys=tmp_path / "sys")
    assert tracer_proc.traceable_disks(roots, []) == {"loop1": bt.dev_t(7, 1), "sda": bt.dev_t(8, 0)}
    assert tracer_proc.traceable_disks(roots, ["zram*"]) == {"zram0": bt.dev_t(252, 0)}


def test_the_histograms_pass_promtool_and_the_naming_check():
    import subprocess

    from prometheus_client import CollectorRegistry, generate_latest

    from tests.unit.test_exporter import family_problems
    r = _reading(2, 0.01)
    r = tracer.TraceReading(0.0, True, None, 15.0, {"sdb": 0.25}, r.total, {("sdb", "read", "total"): 2.0}, r.window)

    class One:
        def collect(self):
            return tracer.families(r, types.SimpleNamespace(devices={}))
    reg = CollectorRegistry()
    reg.register(One())
    text = generate_latest(reg).decode()
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), p.stdout + p.stderr
    assert 'iowarden_io_latency_seconds_bucket{device="sdb",direction="read",le="+Inf",stage="total",volume="kernel:sdb"} 1000.0' in text
    assert 'iowarden_io_latency_timed_ratio{device="sdb"} 0.25' in text
    for fam in tracer.families(r, types.SimpleNamespace(devices={})):
        assert family_problems(fam.name, fam.type, fam.documentation) == [], fam.name


def test_status_shows_the_last_windows_tail_saved_by_the_core_at_most_every_15_s(tmp_path):
    from iowarden.daemon.sources.tracer_views import status_text as render_tail
    from iowarden.daemon.commands.tables import table
    from iowarden.daemon.core.core import Core
    from iowarden.daemon.events import SourceRead
    from iowarden.daemon.core.state import State
    from iowarden.daemon.snapshot import SOURCE_PROFILE
    from iowarden.daemon.core.effects import health_from

    now = [100.0]
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st), "test", clock=lambda: now[0])
    core.run_batch([SourceRead("tracer", _reading(180, 2))])
    now[0] += 5
    core.run_batch([SourceRead("tracer", _reading(1, 40))])    # within 15 s of the last save: not written
    saved = [s for i, p, m, at, s in st.load_baselines() if p == SOURCE_PROFILE and i == "tracer"]
    assert len(saved) == 1 and saved[0]["rows"][0]["in_device_p99"] > 0.95
    now[0] += 15
    core.run_batch([SourceRead("tracer", _reading(1, 40))])
    (saved,) = [{"at": at, **s} for i, p, m, at, s in st.load_baselines() if p == SOURCE_PROFILE]
    out = render_tail(saved, table)
    row = next(line for line in out.splitlines() if line.startswith("sdb"))
    assert "the last 15 s" in out and "p99.9 usec" in out and "p99 in device" in out, out
    assert row.split()[1:3] == ["read", "1000"] and row.split()[-1] in ("2%", "3%"), row   # the queue took the tail
    off = render_tail({"at": 0.0, "up": False, "reason": "bpftrace is not installed", "rows": []}, table)
    assert "the tracer is off (bpftrace is not installed)" in off
    st.close()


ATTACHED = "echo '{\"type\": \"attached_probes\", \"data\": {\"probes\": 9}}'\n"


def _until_up(read, seconds: float = 10.0):
    """Readings until the stand-in's first line is read (it is read without blocking)."""
    deadline = time.time() + seconds
    while True:
        r = read()
        if r.up or time.time() > deadline:
            return r
        time.sleep(0.02)


def _fake_host(tmp_path, monkeypatch, script: str):
    """A fake clock, /proc and /sys with one request-based disk (sda), and a stand-in bpftrace running
    `script`: (clock, section, roots)."""
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc" / "diskstats").write_text("   8       0 sda 0 0 0 0 0 0 0 0 0 0 0\n")
    disk = tmp_path / "sys" / "block" / "sda"
    (disk / "mq").mkdir(parents=True, exist_ok=True)
    (disk / "dev").write_text("8:0\n")
    for tp in bt.REQUIRED_TRACEPOINTS + bt.MERGE_TRACEPOINTS:   # the kernel's block tracepoints, in tracefs
        (tmp_path / "sys" / "kernel" / "tracing" / "events" / "block" / tp).mkdir(parents=True, exist_ok=True)
    fake = tmp_path / f"bpftrace-{len(list(tmp_path.glob('bpftrace-*')))}"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    section = types.SimpleNamespace(**{k: v.default for k, v in tracer.CONFIG.items()})
    section.bpftrace_path = str(fake)
    return clock, section, Roots(proc=tmp_path / "proc", sys=tmp_path / "sys", dev=tmp_path / "dev")


def test_the_tracer_pauses_over_its_cpu_budget_and_resumes_below_half_of_it_after_a_minute(tmp_path, monkeypatch):
    """Fake clock, fake /proc and /sys, and a stand-in bpftrace that only sleeps: at 1,800 ns a request
    and a budget of 0.05 cores, 40,000 IOPS (0.072 cores) pause it; 20,000 (0.036, above half the budget)
    keep it paused; 10,000 (0.018) resume it, but not before a minute has passed."""
    clock, section, roots = _fake_host(tmp_path, monkeypatch, ATTACHED + "exec sleep 600\n")
    section.max_cpu_cores, section.cost_per_io_ns = 0.05, 1800.0
    reads = [0]

    def step(seconds: float, iops: float):
        clock[0] += seconds
        reads[0] += int(iops * seconds)
        (tmp_path / "proc" / "diskstats").write_text(   # sda1's requests are sda's: not counted twice
            f"   8       0 sda {reads[0]} 0 {reads[0] * 8} 0 0 0 0 0 0 0 0\n"
            f"   8       1 sda1 {reads[0]} 0 {reads[0] * 8} 0 0 0 0 0 0 0 0\n")
        return read()

    read = tracer.start(section, roots)
    try:
        assert _until_up(read).up
        assert step(15, 20_000).up                        # 0.036 cores: under the budget
        r = step(15, 40_000)                              # 0.072 cores: over it
        assert not r.up and r.reason == tracer.PAUSED
        assert not step(15, 20_000).up                    # above half the budget: still paused
        assert not step(15, 10_000).up                    # below half, but paused 30 s ago: not yet
        assert not step(15, 10_000).up                    # 45 s
        again = step(15, 10_000)                          # a minute on, the last minute's mean 12,500: started
        assert again.up or again.reason == "compiling the program", again.reason   # again (up once it has spoken)
        assert _until_up(read).up                         # and up once attached
        fams = {f.name: f for f in tracer.families(r, types.SimpleNamespace(devices={}))}
        assert fams["iowarden_tracer_off_reason"].samples[0].labels["reason"] == tracer.PAUSED
    finally:
        read.stop()


def test_a_burst_of_seconds_does_not_pause_the_tracer_and_a_rate_held_for_a_minute_does(tmp_path, monkeypatch):
    """The budget is judged on the last minute's rate: a 15 s probe at 60,000 IOPS after 45 s at 10,000
    (0.108 cores for 15 s, a minute's mean of 22,500: 0.041) leaves it up; 60,000 held pauses it."""
    speaking = ATTACHED + "while true; do echo '{\"type\": \"map\", \"data\": {\"@ns\": {}}}'; sleep 0.02; done\n"
    clock, section, roots = _fake_host(tmp_path, monkeypatch, speaking)
    section.max_cpu_cores, section.cost_per_io_ns = 0.05, 1800.0
    reads = [0]

    def step(seconds: float, iops: float):
        clock[0] += seconds
        reads[0] += int(iops * seconds)
        time.sleep(0.1)   # a line of the stand-in's to read: it is not silent
        (tmp_path / "proc" / "diskstats").write_text(f"   8       0 sda {reads[0]} 0 {reads[0] * 8} 0 0 0 0 0 0 0 0\n")
        return read()

    read = tracer.start(section, roots)
    try:
        assert _until_up(read).up
        for _ in range(3):
            assert step(15, 10_000).up
        assert step(15, 60_000).up              # the burst
        for _ in range(4):
            assert step(15, 10_000).up           # a minute: the burst has aged out
        ups = [step(15, 60_000).up for _ in range(4)]
        assert ups[0] and not ups[-1], ups     # held: paused within the minute
    finally:
        read.stop()


def test_a_flood_does_not_pause_the_compiled_tracer_on_a_figure_measured_at_a_tenth_of_its_rate(tmp_path,
                                                                                                 monkeypatch):
    """The compiled loader measured 777 ns a request at 11,000/s; the host then floods at 112,000/s (0.09 cores
    by that figure, over 0.05). The tracer stays up while a measurement at the new rate is owed, and judges on
    the old figure once none has come for REMEASURE_WAIT_SECONDS."""
    speaking = ATTACHED + ("echo '{\"type\":\"cost\",\"data\":{\"run_ns\":8547000,\"runs\":11000,\"seconds\":1.0}}'\n"
                           "while true; do echo '{\"type\": \"map\", \"data\": {\"@ns\": {}}}'; sleep 0.02; done\n")
    clock, section, roots = _fake_host(tmp_path, monkeypatch, speaking)
    section.engine = "compiled"
    monkeypatch.setattr(tracer, "choose_engine", lambda *a: ("compiled", None, None))

    def loader(skip_by_dev, interval_seconds, **popen):
        return tracer.subprocess.Popen([section.bpftrace_path], stdout=tracer.subprocess.PIPE,
                                       stderr=tracer.subprocess.PIPE, start_new_session=True)
    monkeypatch.setattr(tracer, "compiled_process", loader)
    reads = [0]

    def step(seconds: float, iops: float):
        clock[0] += seconds
        reads[0] += int(iops * seconds)
        time.sleep(0.1)
        (tmp_path / "proc" / "diskstats").write_text(f"   8       0 sda {reads[0]} 0 {reads[0] * 8} 0 0 0 0 0 0 0 0\n")
        return read()

    read = tracer.start(section, roots)
    try:
        assert _until_up(read).up
        deadline = time.time() + 10
        while read.state.program_cost is None and time.time() < deadline:
            step(0, 0)
        assert read.state.program_cost.ns_per_request == 777.0
        rs = [step(15, 112_000) for _ in range(11)]   # owed a figure from the first 15 s: 150 s on, the old
        assert [r.up for r in rs] == [True] * 10 + [False], [(r.up, r.reason) for r in rs]   # figure decides
        assert read.state.paused and read.state.reason == tracer.PAUSED
    finally:
        read.stop()


def test_the_sustained_rate_weighs_each_reading_by_its_seconds_inside_the_span():
    rates = [(100.0, 1000.0, 40.0), (110.0, 5000.0, 10.0)]
    assert tracer.sustained_rate(rates, 110.0, 60.0) == pytest.approx((1000 * 40 + 5000 * 10) / 50)
    assert tracer.sustained_rate(rates, 110.0, 15.0) == pytest.approx((1000 * 5 + 5000 * 10) / 15)
    assert tracer.sustained_rate([], 110.0, 60.0) == 0.0


def test_over_budget_is_the_rate_times_the_cost_per_request_against_the_budget():
    section = types.SimpleNamespace(max_cpu_cores=0.01, cost_per_io_ns=1800.0)
    assert not tracer.over_budget(5_000, False, section)          # 0.009 cores
    assert tracer.over_budget(6_000, False, section)               # 0.0108
    assert tracer.over_budget(3_000, True, section)                # paused: resumes only under 0.005
    assert not tracer.over_budget(2_000, True, section)
    assert tracer.over_budget(200_000, False, section)             # the issue's 200k IOPS: off, so ~0 cost


def test_a_silent_bpftrace_gets_minutes_to_compile_and_three_windows_once_it_has_spoken(tmp_path, monkeypatch):
    """Under an emulated CPU bpftrace compiles for most of a minute before its first line: killing it after
    three silent windows would kill every start. Fake clock; a stand-in that prints one line, when the test
    lets it (a file appears: on a busy machine a shell left to itself may print before the clock is moved),
    and sleeps."""
    go = tmp_path / "go"
    attached = (f"while [ ! -e {go} ]; do sleep 0.01; done\n"
                "echo '{\"type\": \"attached_probes\", \"data\": {\"probes\": 6}}'\n")
    for name, says, killed_after in (("silent", "", 3 * 15 + 10 + tracer.COMPILE_GRACE_SECONDS),
                                     ("speaks", attached, 3 * 15 + 10)):
        clock, section, roots = _fake_host(tmp_path, monkeypatch, says + "exec sleep 600\n")
        read = tracer.start(section, roots)
        state = read.state
        try:
            r = read()
            assert not r.up and r.reason == "compiling the program" and state.proc.poll() is None, r
            first = state.proc.pid
            deadline = time.time() + 10
            if name == "speaks":
                clock[0] += 100   # it compiled for 100 s: its three windows count from its first line
                go.touch()
            while name == "speaks" and not state.heard and time.time() < deadline:
                time.sleep(0.01)   # the line is read without blocking: let the shell print it
                clock[0] += 0.01
                read()
            assert state.proc.pid == first, name
            clock[0] += killed_after - 1
            read()
            assert state.proc.pid == first, name        # within its allowance: left alone
            clock[0] += 2
            read()
            assert state.proc.pid != first, name        # past it: killed and started again
        finally:
            read.stop()


def test_lines_waiting_in_the_pipe_count_before_the_silence_is_judged(tmp_path, monkeypatch):
    """A reader that was away for longer than three windows (a stalled part) finds bpftrace's lines in the
    pipe: it reads them first, and does not kill a process that kept printing."""
    line = json.dumps({"type": "map", "data": {"@lat": {f"{bt.dev_t(8, 0)},0,2,183": 1}}})
    go, printed = tmp_path / "go", tmp_path / "printed"   # the test says when; the script says it has
    clock, section, roots = _fake_host(tmp_path, monkeypatch,
                                       "echo '{\"type\": \"attached_probes\", \"data\": {\"probes\": 6}}'\n"
                                       f"while [ ! -e {go} ]; do sleep 0.01; done\n"
                                       f"echo '{line}'\n: > {printed}\nexec sleep 600\n")
    read = tracer.start(section, roots)
    state = read.state
    try:
        read()
        first = state.proc.pid
        deadline = time.time() + 10
        while not state.heard and time.time() < deadline:
            time.sleep(0.01)
            clock[0] += 0.01
            read()
        go.touch()                            # the map line is printed while nobody reads
        while not printed.exists() and time.time() < deadline + 10:
            time.sleep(0.01)
        clock[0] += 3 * 15 + 10 + 1           # and the reader comes back after three windows
        r = read()
        assert state.proc.pid == first
        assert r.total[("sda", "read", "total")].total == 1
    finally:
        read.stop()


def test_a_reading_between_two_prints_keeps_the_last_window_and_the_next_print_makes_the_next(tmp_path, monkeypatch):
    """The source reads every window and the loader prints every window, each on its own clock: a read that
    finds no print since the last one keeps the window the last print made (its percentiles, cause line and
    cgroup shares stay on the scrape and the page), and the next print's window is what that print added."""
    def counts(reads: int) -> str:
        return json.dumps({"type": "map", "data": {"@lat": {f"{bt.dev_t(8, 0)},0,2,183": reads}}})
    go = tmp_path / "go"
    clock, section, roots = _fake_host(tmp_path, monkeypatch, ATTACHED + f"echo '{counts(5)}'\n"
                                       f"while [ ! -e {go} ]; do sleep 0.01; done\n"
                                       f"echo '{counts(8)}'\nexec sleep 600\n")
    key = ("sda", "read", "total")

    def until(pred):
        deadline = time.time() + 10
        while time.time() < deadline:
            clock[0] += 0.05
            r = read()
            if key in r.total and pred(r):
                return r
            time.sleep(0.01)
        raise AssertionError("the stand-in's counts were not read")
    read = tracer.start(section, roots)
    try:
        assert until(lambda r: r.total[key].total == 5).window[key].total == 5
        for _ in range(3):                    # no print since: the same window, not an empty one
            clock[0] += section.interval_seconds
            r = read()
            assert r.window[key].total == 5 and r.total[key].total == 5
        go.touch()
        r = until(lambda r: r.total[key].total == 8)
        assert r.window[key].total == 3       # what the second print added, once
        clock[0] += section.interval_seconds
        assert read().window[key].total == 3
    finally:
        read.stop()


def test_a_line_naming_60000_devices_makes_no_label_set_for_any_of_them(tmp_path, monkeypatch):
    """A tracer line naming 60,000 unknown device numbers took the daemon past
    1 GiB at the first scrape (every number became a label). Only the disks the program was given are kept;
    the rest are dropped and counted."""
    entries = {f"{bt.dev_t(8, 0)},0,2,183": 3}
    entries.update({f"{bt.dev_t(259, i)},0,2,183": 1 for i in range(60_000)})
    payload = tmp_path / "line.json"
    payload.write_text(json.dumps({"type": "map", "data": {"@lat": entries}}) + "\n")
    printed = tmp_path / "printed"
    clock, section, roots = _fake_host(tmp_path, monkeypatch,
                                       "echo '{\"type\": \"attached_probes\", \"data\": {\"probes\": 6}}'\n"
                                       f"cat {payload}\n: > {printed}\nexec sleep 600\n")
    read = tracer.start(section, roots)
    try:
        r = read()
        deadline = time.time() + 20
        while not (printed.exists() and r.unknown_keys_dropped) and time.time() < deadline:
            time.sleep(0.02)
            clock[0] += 0.02
            r = read()
        assert {k[0] for k in r.total} == {"sda"} and r.total[("sda", "read", "total")].total == 3
        assert r.unknown_keys_dropped == 60_000
        fams = {f.name: f for f in tracer.families(r, types.SimpleNamespace(devices={}))}
        assert fams["iowarden_tracer_unknown_keys_dropped"].samples[0].value == 60_000
    finally:
        read.stop()


def test_in_the_daemon_the_budget_is_judged_on_the_samplers_reading_not_a_read_of_its_own(tmp_path, monkeypatch):
    """One read of /proc/diskstats a tick: given the sampler's latest reading, the tracer takes its
    counters from it (here there is no /proc/diskstats at all), every disk's whatever the sampler watches, and
    pauses on them as before."""
    from iowarden.daemon.sources.sampler import SamplerReading
    from iowarden.probes import diskstats
    clock, section, roots = _fake_host(tmp_path, monkeypatch, ATTACHED + "exec sleep 600\n")
    section.max_cpu_cores, section.cost_per_io_ns = 0.05, 1800.0
    (tmp_path / "proc" / "diskstats").unlink(missing_ok=True)
    reading = [None]
    reads = [0]

    def step(seconds: float, iops: float):
        clock[0] += seconds
        a = diskstats.DiskSample(clock[0] - seconds, {"sda": diskstats.DiskCounters(8, 0, "sda", reads=reads[0])})
        reads[0] += int(iops * seconds)
        b = diskstats.DiskSample(clock[0], {"sda": diskstats.DiskCounters(8, 0, "sda", reads=reads[0])})
        # the sampler watches no disk here ([sampler] devices elsewhere): the tracepoints cost sda's I/O all the same
        reading[0] = SamplerReading(b, diskstats.RatesBetween(a, b, set()), frozenset(), None)
        return read()

    read = tracer.start(section, roots, disk_reading=lambda: reading[0])
    try:
        assert _until_up(read).up
        assert step(15, 20_000).up                        # 0.036 cores: under the budget
        r = step(15, 40_000)                              # 0.072 cores: over it
        assert not r.up and r.reason == tracer.PAUSED
        assert read().reason == tracer.PAUSED             # the same reading again: the same rates, still paused
    finally:
        read.stop()


def test_a_saved_tail_that_timed_nothing_is_replaced_by_the_first_window_that_did(tmp_path):
    """The tracer's first window comes before any I/O: `status` said "no request timed" for the next 15 s
    while the volume's probes were being timed."""
    from iowarden.daemon.core.core import Core
    from iowarden.daemon.core.state import State
    from iowarden.daemon.events import SourceRead
    from iowarden.daemon.snapshot import SOURCE_PROFILE
    from iowarden.daemon.core.effects import StoredHealth, health_from

    def saved_rows():
        (s,) = [s for i, p, m, at, s in st.load_baselines() if p == SOURCE_PROFILE and i == "tracer"]
        return len(s["rows"])
    now = [100.0]
    st = State(str(tmp_path / "s.db"))
    core = Core(st, health_from(st), "test", clock=lambda: now[0])
    core.run_batch([SourceRead("tracer", tracer.TraceReading(0.0, True, None, 2.0, {}, {}, {}, {}))])
    assert saved_rows() == 0
    now[0] += 2
    core.run_batch([SourceRead("tracer", _reading(1, 40))])    # 2 s later, not 15: saved, it has news
    assert saved_rows() == 1
    now[0] += 2
    core.run_batch([SourceRead("tracer", tracer.TraceReading(0.0, True, None, 2.0, {}, {}, {}, {}))])
    assert saved_rows() == 1   # a quiet window within 15 s does not replace a tail that said something
    st.close()
