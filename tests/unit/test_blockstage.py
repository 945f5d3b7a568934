"""The compiled tracer's loader (probes/blockstage.py), its pure parts: what it prints is what bpftrace's program
printed (one parser reads both), its input is bounded, and a tracer set to it says why it cannot run. No root."""
import json
import time
import types
from pathlib import Path

import pytest

from iowarden.daemon.sources import tracer, tracer_plan, tracer_proc
from iowarden.probes import blocktrace, blockstage
from iowarden.probes.common import Roots


def test_what_the_loader_prints_is_read_as_bpftraces_output_was():
    loop0, sdb = blocktrace.dev_t(7, 0), blocktrace.dev_t(8, 16)
    unqueued = blockstage.STAGE_UNQUEUED
    # loop0: 7 reads queued (queue 0.1 µs each), and 5 not queued at all, counted once each (the program's
    # STAGE_UNQUEUED); sdb: 3 writes not queued; an emptied bucket is not printed
    lat = {(loop0, 0, 1, 100): 7, (loop0, 0, 2, 101): 7, (loop0, 0, 0, 40): 7, (loop0, 0, unqueued, 100): 5,
           (sdb, 1, unqueued, 120): 3, (sdb, 1, 1, 121): 0}
    slot = blockstage.SLOTS_PER_DISK   # sums: disk index * 8 + direction * 4 + stage
    sums = {0 * slot + 0 * 4 + 0: 700, 0 * slot + 0 * 4 + 1: 7000, 0 * slot + 0 * 4 + 2: 7700,
            0 * slot + 0 * 4 + unqueued: 5000, 1 * slot + 1 * 4 + unqueued: 900, 9: 0}
    lines = [json.dumps(m) for m in blockstage.messages(lat, sums, {0: loop0, 1: sdb}, {loop0: 1, sdb: 2})]
    kinds = dict(p for p in map(blocktrace.parse_message, lines) if p is not None)
    counts, ns = kinds["counts"], kinds["sums"]
    assert counts[(loop0, "read", "device")].counts == ((100, 12),)
    assert counts[(loop0, "read", "total")].counts == ((100, 5), (101, 7))
    assert counts[(loop0, "read", "queue")].counts == ((0, 5), (40, 7))
    assert counts[(sdb, "write", "device")].counts == counts[(sdb, "write", "total")].counts == ((120, 3),)
    assert counts[(sdb, "write", "queue")].counts == ((0, 3),)
    assert ns == {(loop0, "read", "queue"): 7e-7, (loop0, "read", "device"): 1.2e-5, (loop0, "read", "total"): 1.27e-5,
                  (sdb, "write", "device"): 9e-7, (sdb, "write", "total"): 9e-7}
    assert json.loads(lines[2]) == {"type": "paths", "data": {str(loop0): 1, str(sdb): 2}}


def test_the_loaders_input_is_checked_and_bounded():
    assert blockstage.read_disks('{"7340032": 0, "8388624": 1000}') == {7340032: 0, 8388624: 1000}
    for bad in ('{"7340032": 1024}', '{"0": 0}', '{"x": 0}', "[1, 2]",
                json.dumps({str(i + 1): 0 for i in range(blockstage.MAX_DISKS + 1)})):
        with pytest.raises(ValueError):
            blockstage.read_disks(bad)


def test_a_tracer_set_to_the_compiled_engine_on_a_kernel_without_btf_says_so(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "diskstats").write_text("")
    section = types.SimpleNamespace(**{k: v.default for k, v in tracer.CONFIG.items()})
    section.engine = "compiled"
    read = tracer.start(section, Roots(proc=tmp_path / "proc", sys=tmp_path / "sys", dev=tmp_path / "dev"))
    r = read()
    assert not r.up and ("BTF" in r.reason or "not built" in r.reason or "libbpf" in r.reason), r.reason


def test_a_damaged_object_is_said_and_the_default_engine_goes_to_bpftrace(tmp_path, monkeypatch):
    """A cut, empty or foreign object: libbpf only says "could not open" and the tracer would start the loader
    again every window; the object is checked first and auto runs bpftrace, saying why."""
    good = tracer_proc.compiled_object()
    built = good.read_bytes() if good is not None else None
    sys_root = tmp_path / "sys"
    (sys_root / "kernel" / "btf").mkdir(parents=True)
    (sys_root / "kernel" / "btf" / "vmlinux").write_text("")
    monkeypatch.setattr(tracer_proc, "_libbpf_installed", lambda: True)
    for name, data, says in (("cut", (built or b"")[:3000], "cut short" if built else "not an ELF"),
                             ("empty", b"", "not an ELF object"),
                             ("foreign", Path("/bin/true").read_bytes(), "not BPF (247)")):
        obj = tmp_path / f"{name}.bpf.o"
        obj.write_bytes(data)
        monkeypatch.setattr(tracer_proc, "compiled_object", lambda obj=obj: obj)
        missing = tracer_proc.compiled_missing(Roots(sys=sys_root))
        assert missing and "is damaged" in missing and says in missing, (name, missing)
        engine, _binary, why = tracer_proc.choose_engine("auto", "bpftrace", Roots(sys=sys_root))
        assert engine in ("bpftrace", None) and says in (why or ""), (name, engine, why)
    if built is not None:
        assert blockstage.object_problem(built[:64], len(built)) is None


def test_the_default_engine_is_the_compiled_one_where_it_can_run_and_bpftrace_where_it_cannot(tmp_path, monkeypatch):
    """auto: a host without the compiled engine's needs (here: no BTF) runs bpftrace and says why; once they are
    there, the next read stops bpftrace and starts the compiled loader. Its budget is the compiled engine's cost:
    the issue's 200,000 IOPS fit in 0.05 of a core with it, not with bpftrace."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "diskstats").write_text("   8       0 sda 0 0 0 0 0 0 0 0 0 0 0\n")
    (tmp_path / "sys" / "block" / "sda" / "mq").mkdir(parents=True)
    (tmp_path / "sys" / "block" / "sda" / "dev").write_text("8:0\n")
    for tp in blocktrace.REQUIRED_TRACEPOINTS + blocktrace.MERGE_TRACEPOINTS:
        (tmp_path / "sys" / "kernel" / "tracing" / "events" / "block" / tp).mkdir(parents=True)
    stand_in = tmp_path / "stand-in"
    stand_in.write_text("#!/bin/sh\necho '{\"type\": \"attached_probes\", \"data\": {\"probes\": 1}}'\nexec sleep 600\n")
    stand_in.chmod(0o755)
    loader = tmp_path / "loader"   # the compiled engine's loader, which also says what its program cost
    loader.write_text("#!/bin/sh\necho '{\"type\": \"attached_probes\", \"data\": {\"probes\": 1}}'\n"
                      "echo '{\"type\":\"cost\",\"data\":{\"run_ns\":1100000,\"runs\":10000,\"seconds\":1.0}}'\n"
                      "exec sleep 600\n")
    loader.chmod(0o755)
    started = []

    def compiled_process(skip_by_dev, interval_seconds, **popen):
        started.append(skip_by_dev)
        return tracer.subprocess.Popen([str(loader)], stdout=tracer.subprocess.PIPE, stderr=tracer.subprocess.PIPE,
                                       start_new_session=True)
    monkeypatch.setattr(tracer, "compiled_process", compiled_process)
    missing = ["the kernel has no BTF (/sys/kernel/btf/vmlinux): the compiled tracer cannot relocate"]
    monkeypatch.setattr(tracer_proc, "compiled_missing", lambda roots: missing[0])
    section = types.SimpleNamespace(**{k: v.default for k, v in tracer.CONFIG.items()})
    assert section.engine == "auto"
    section.bpftrace_path = str(stand_in)
    read = tracer.start(section, Roots(proc=tmp_path / "proc", sys=tmp_path / "sys", dev=tmp_path / "dev"))
    try:
        r = read()
        assert read.state.engine == "bpftrace" and read.state.proc is not None and not started
        assert (r.engine, r.cost_per_io_ns, r.cost_source) == ("bpftrace", 400.0, "bench")
        first = read.state.proc.pid
        missing[0] = None
        read()
        assert read.state.engine == "compiled" and started == [{blocktrace.dev_t(8, 0): 0}]
        assert read.state.proc.pid != first
        deadline = time.monotonic() + 10
        while read.state.program_cost is None and time.monotonic() < deadline:   # its lines, read without blocking
            r = read()
            time.sleep(0.02)
        # 110 ns of program per request, measured, and the tracepoint's firing: the budget's cost
        r = read()
        assert (r.engine, r.cost_per_io_ns, r.cost_source) == ("compiled", 150.0, "measured")
        fams = {f.name: f for f in tracer.families(r, types.SimpleNamespace(devices={}))}
        assert [(s.labels, s.value) for s in fams["iowarden_tracer_cost_per_io_seconds"].samples] == \
            [({"engine": "compiled", "source": "measured"}, 150e-9)]
        section.bpftrace_path = str(tmp_path / "no-bpftrace")   # neither: the reason names both
        missing[0] = "libbpf is not installed (apt install libbpf1)"
        read()
        r = read()
        assert not r.up and "bpftrace is not installed" in r.reason and "libbpf" in r.reason, r.reason
    finally:
        read.stop()
    assert not tracer.over_budget(200_000, False, section, "compiled")   # 0.03 of a core
    assert tracer.over_budget(200_000, False, section, "bpftrace")       # 0.08


def test_the_programs_cost_is_read_from_the_kernels_statistics_and_an_idle_measurement_keeps_the_last():
    fdinfo = "pos:\t0\nflags:\t02000002\nprog_type:\t26\nprog_id:\t812\nrun_time_ns:\t5300000\nrun_cnt:\t50000\n"
    assert blockstage.fdinfo_run_stats(fdinfo) == (5_300_000, 50_000)
    assert blockstage.fdinfo_run_stats("pos:\t0\n") == (0, 0)   # a kernel that does not say
    before = {"on_complete": (5_300_000, 50_000)}
    after = {"on_complete": (6_300_000, 60_000), "on_issue": (400_000, 3_000)}   # attached in between
    msg = blockstage.cost_message(before, after, 0.5)
    assert msg == {"type": "cost", "data": {"run_ns": 1_400_000, "runs": 10_000, "seconds": 0.5}}
    cost = tracer_plan.measured_cost(1_400_000, 10_000, 0.5, None)
    assert cost == tracer_plan.ProgramCost(140.0, 20_000.0)
    assert tracer_plan.measured_cost(5_700_000, 10_000 - 1, 1.0, cost) is cost   # a quiet second: the last
    assert tracer_plan.measured_cost(5_700_000, 50_000, 0.0, cost) is cost       # no time: not a measurement
    section = types.SimpleNamespace(cost_per_io_ns=0.0)
    assert tracer_plan.cost_per_io_ns(section, "compiled", cost) == 180.0
    assert tracer_plan.cost_per_io_ns(section, "compiled", None) == 150.0   # not measured yet: the bench's figure
    assert tracer_plan.cost_per_io_ns(section, "bpftrace", cost) == 400.0  # its classic tracepoints are unseen
    assert tracer_plan.cost_per_io_ns(types.SimpleNamespace(cost_per_io_ns=900.0), "compiled", cost) == 900.0


def test_a_figure_measured_at_a_tenth_of_the_rate_does_not_pause_the_tracer_until_one_at_the_rate_could_be_taken():
    """The program's time per request falls as its rate rises (warm caches): a figure from 11,000/s judged at
    112,000/s paused a tracer that cost a quarter of what it said, exactly when a flood made it most wanted."""
    section = types.SimpleNamespace(cost_per_io_ns=0.0, max_cpu_cores=0.05)
    cold = tracer_plan.ProgramCost(777.0, 11_000.0)
    assert tracer_plan.figure_is_stale(cold, 112_000) and not tracer_plan.figure_is_stale(cold, 22_000)
    assert not tracer_plan.over_budget(112_000, False, section, "compiled", cold, stale_for_seconds=0.0)
    assert not tracer_plan.over_budget(112_000, False, section, "compiled", cold, stale_for_seconds=149.0)
    # no figure at this rate after two of the loader's measurements: the rate bursts between them; the old one
    # decides (0.09 cores)
    assert tracer_plan.over_budget(112_000, False, section, "compiled", cold, stale_for_seconds=150.0)
    warm = tracer_plan.ProgramCost(164.0, 110_000.0)   # measured at the rate: 0.023 cores, within 0.05
    assert not tracer_plan.over_budget(112_000, False, section, "compiled", warm)
    hot = tracer_plan.ProgramCost(600.0, 100_000.0)    # measured at the rate and truly over: off at once
    assert tracer_plan.over_budget(112_000, False, section, "compiled", hot)
    # paused, nothing is measured: it resumes on the figure at hand, below half the budget
    assert tracer_plan.over_budget(112_000, True, section, "compiled", cold)
    assert not tracer_plan.over_budget(20_000, True, section, "compiled", warm)
    # a cost set by hand and the bpftrace engine (never measured) are judged as before
    assert tracer_plan.over_budget(112_000, False, types.SimpleNamespace(cost_per_io_ns=777.0, max_cpu_cores=0.05),
                                   "compiled", cold)
    assert tracer_plan.over_budget(200_000, False, section, "bpftrace", cold)
