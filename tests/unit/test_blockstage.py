"""The compiled tracer's loader (probes/blockstage.py), its pure parts: what it prints is what bpftrace's program
printed (one parser reads both), its input is bounded, and a tracer set to it says why it cannot run. No root."""
import json
import types

import pytest

from iowarden.daemon.sources import tracer
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
