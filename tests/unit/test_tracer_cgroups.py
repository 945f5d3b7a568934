"""The tracer per cgroup, its pure parts and its reader on a fake host: what the loader prints is read back whole,
its map's room is kept for the living, ids are named by a walk of the hierarchy, and the series are bounded. No root.
"""
import json
import os
import time
import types

import pytest

from iowarden.daemon.sources import tracer, tracer_views
from iowarden.probes import blockstage, blocktrace, cgroupio
from iowarden.probes.common import ParseError, Roots


def _dirs(requests: int, nbytes: int, ns: int, buckets: dict):
    return (requests, nbytes, ns, buckets)


def test_what_the_loader_prints_per_cgroup_is_read_back_whole():
    loop0 = blocktrace.dev_t(7, 0)
    entries = {(loop0, 1021): (_dirs(3, 12288, 900_000, {46: 2, 47: 1}), _dirs(0, 0, 0, {})),
               (loop0, blockstage.OTHER_CGROUP): (_dirs(0, 0, 0, {}), _dirs(2, 8192, 4_000_000, {0: 1, 207: 1})),
               (loop0, 1041): (_dirs(0, 0, 0, {}), _dirs(0, 0, 0, {}))}   # made, never counted: not printed
    lines = blockstage.cgroup_messages(entries, capacity=513, evicted=4)
    assert [m["type"] for m in lines] == ["cgroup", "cgroup", "cgroups_done"]
    assert lines[-1]["data"] == {"entries": 3, "capacity": 513, "evicted": 4}
    parsed = {}
    for m in lines[:-1]:
        parsed.update(blockstage.parse_cgroup(json.loads(json.dumps(m))["data"]))
    read = parsed[(loop0, 1021, "read")]
    assert (read.requests, read.bytes, read.ns) == (3, 12288, 900_000)
    # the program's bucket 46 is blocktrace's 126: 2^15.75 ns, some 55 us; its first and last are 1 us and 69 s
    assert read.hist.counts == ((126, 2), (127, 1))
    assert 50e-6 < read.hist.quantile_seconds(0.5) < 62e-6
    other = parsed[(loop0, blockstage.OTHER_CGROUP, "write")]
    assert other.hist.counts == ((80, 1), (287, 1))
    assert (loop0, 1021, "write") not in parsed


@pytest.mark.parametrize("data", [
    {"dev": 0, "cgroup": 1, "read": [1, 1, 1, [[100, 1]]]},            # no such disk
    {"dev": 7340032, "cgroup": -1, "read": [1, 1, 1, [[100, 1]]]},
    {"dev": 7340032, "cgroup": 1, "read": [1, 1, 1, [[600, 1]]]},      # a bucket past 2^64 ns
    {"dev": 7340032, "cgroup": 1, "read": [1, 1, 1, [[100, 0]]]},      # a count of nothing
    {"dev": 7340032, "cgroup": 1, "read": [1, 1, 1, [[i, 1] for i in range(300)]]},   # more buckets than it has
    {"dev": 7340032, "cgroup": 1, "read": [1, 1]},
    {"dev": 7340032, "read": [1, 1, 1, []]},
    {"dev": "x", "cgroup": 1},
])
def test_a_cgroup_line_that_is_not_the_loaders_is_a_parse_error(data):
    with pytest.raises(ParseError):
        blockstage.parse_cgroup(data)


def test_the_maps_room_is_kept_for_the_living_only_when_it_is_nearly_full():
    last, idle = {}, {}
    other = (7, blockstage.OTHER_CGROUP)
    now = {(7, 1): 10, (7, 2): 5, other: 1}
    for _ in range(blockstage.EVICT_IDLE_READS + 1):       # nothing moves, but the map is a quarter full
        assert blockstage.idle_to_evict(now, last, idle, used=3, capacity=12) == []
        last = dict(now)
    # nearly full: the idle cgroups go, never a disk's "other"; an entry that moved is not idle
    now = {(7, 1): 11, (7, 2): 5, other: 1}
    assert blockstage.idle_to_evict(now, last, idle, used=10, capacity=12) == [(7, 2)]
    assert idle[(7, 1)] == 0


def _hierarchy(tmp_path, names):
    """A cgroup v1 blkio hierarchy under a fake /sys: {name: id}, the id being the directory's inode number."""
    root = tmp_path / "sys" / "fs" / "cgroup" / "blkio"
    root.mkdir(parents=True, exist_ok=True)
    (root / "blkio.throttle.io_serviced").write_text("Total 0\n")
    for n in names:
        (root / n.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return {"/" + n.lstrip("/"): os.stat(root / n.lstrip("/")).st_ino for n in names} | {"/": os.stat(root).st_ino}


def test_a_cgroups_id_is_named_by_its_directorys_inode_and_the_walk_is_bounded(tmp_path):
    ids = _hierarchy(tmp_path, ["system.slice", "system.slice/postgresql.service", "batch"])
    roots = Roots(sys=tmp_path / "sys")
    version, named, cut = cgroupio.ids(roots)
    assert version == 1 and not cut
    assert named == {ino: path for path, ino in ids.items()}
    version, named, cut = cgroupio.ids(roots, max_cgroups=2)
    assert cut and len(named) == 2
    assert tracer_views.unit_of("/system.slice/postgresql.service") == "postgresql.service"
    assert tracer_views.unit_of("/kubepods/pod1234/cri-containerd-ab") == "" == tracer_views.unit_of("/")


def _line(dev, cgroup, reads, bucket=120):
    return json.dumps({"type": "cgroup", "data": {"dev": dev, "cgroup": cgroup,
                                                   "read": [reads, 4096 * reads, 1000 * reads, [[bucket, reads]]]}},
                      separators=(",", ":"))   # as the loader prints it


def _done(entries):
    return json.dumps({"type": "cgroups_done", "data": {"entries": entries, "capacity": 20, "evicted": 0}},
                      separators=(",", ":"))


def test_the_reader_names_the_busiest_cgroups_up_to_its_bound_keeps_the_evicted_and_sums_the_rest(tmp_path, monkeypatch):
    """Four cgroups and the map's "other" do reads on sda, two series per disk allowed: the two busiest are named,
    the rest are one "other". Then c's entry is evicted (its counts are kept), b is removed and e starts: after
    the walk e the new cgroup takes b's place, and no count is lost or counted twice."""
    from tests.unit.test_blocktrace import ATTACHED, _fake_host
    ids = _hierarchy(tmp_path, ["a.service", "b.scope", "c", "d"])
    sda, other = blocktrace.dev_t(8, 0), blockstage.OTHER_CGROUP
    go = tmp_path / "go"
    phase1 = [_line(sda, ids["/a.service"], 100), _line(sda, ids["/b.scope"], 50), _line(sda, ids["/c"], 10),
              _line(sda, ids["/d"], 5), _line(sda, other, 7), _done(5)]
    script = "".join(f"echo '{x}'\n" for x in phase1)
    clock, section, roots = _fake_host(tmp_path, monkeypatch, ATTACHED + script +
                                       f"while [ ! -e {go} ]; do sleep 0.01; done\n"
                                       f"cat {tmp_path / 'phase2'}\nexec sleep 600\n")
    section.max_cgroup_series = 2

    def until(pred):
        deadline = time.time() + 20
        while time.time() < deadline:
            clock[0] += 0.05
            r = read()
            if pred(r):
                return r
            time.sleep(0.02)
        raise AssertionError(sorted(r.cgroups))
    read = tracer.start(section, roots)
    try:
        r = until(lambda r: ("sda", "/a.service", "read") in r.cgroups)
        totals = {k[1]: c.requests for k, (c, _) in r.cgroups.items()}
        assert totals == {"/a.service": 100, "/b.scope": 50, tracer_views.OTHER: 22}, totals
        fams = {f.name: f for f in tracer.families(r, types.SimpleNamespace(devices={}))}
        units = {s.labels["cgroup"]: s.labels["unit"] for s in fams["iowarden_cgroup_io_requests"].samples}
        assert units == {"/a.service": "a.service", "/b.scope": "b.scope", "other": ""}
        buckets = [s for s in fams["iowarden_cgroup_io_latency_seconds"].samples if s.name.endswith("_bucket")]
        assert {s.labels["cgroup"] for s in buckets} == {"/a.service", "/b.scope", "other"}
        share = {(s.labels["cgroup"], s.labels["of"]): s.value for s in fams["iowarden_cgroup_io_share_ratio"].samples}
        assert share[("/a.service", "requests")] == pytest.approx(100 / 172)
        left = {s.labels["why"]: s.value for s in fams["iowarden_tracer_cgroups_left_out"].samples}
        assert left == {"folded": 2, "unnamed": 0, "walk_cut": 0}   # c and d, past the two series allowed

        # (e first: kernfs never gives a removed cgroup's id again, a test's filesystem may)
        (tmp_path / "sys" / "fs" / "cgroup" / "blkio" / "e").mkdir()
        e = os.stat(tmp_path / "sys" / "fs" / "cgroup" / "blkio" / "e").st_ino
        (tmp_path / "sys" / "fs" / "cgroup" / "blkio" / "b.scope").rmdir()
        # c evicted from the program's map; b's entry is still there (the kernel's, until evicted); e is new
        phase2 = [_line(sda, ids["/a.service"], 120), _line(sda, ids["/b.scope"], 50), _line(sda, ids["/d"], 5),
                  _line(sda, e, 30), _line(sda, other, 7), _done(5)]
        (tmp_path / "phase2").write_text("".join(x + "\n" for x in phase2))
        go.touch()
        clock[0] += section.interval_seconds   # a window on: the unknown id may be walked for
        r = until(lambda r: ("sda", "/e", "read") in r.cgroups)
        totals = {k[1]: c.requests for k, (c, _) in r.cgroups.items()}
        # e is named where b was; b's 50 (removed), c's 10 (evicted, kept) and d's 5 and the map's 7 are other
        assert totals == {"/a.service": 120, "/e": 30, tracer_views.OTHER: 72}, totals
        assert sum(totals.values()) == 120 + 50 + 10 + 5 + 30 + 7
        rows = {x["cgroup"]: x for x in tracer_views.cgroup_rows(r)}   # the window: what moved since the last
        assert rows["/e"]["requests"] == 30 and rows["/e"]["unit"] == ""
        assert rows["/a.service"]["requests"] == 20
    finally:
        read.stop()


def test_the_loader_says_when_it_read_its_map_and_only_a_time_that_could_be_is_taken():
    """The span two prints' counts cover is the time between the loader's reads of its map (CLOCK_MONOTONIC,
    the host's one), whenever the daemon drains them; the daemon takes it as input from another process."""
    from iowarden.daemon.sources.tracer import printed_at
    done = blockstage.cgroup_messages({}, capacity=513, evicted=0, monotonic_seconds=1234.56789)[-1]["data"]
    assert done == {"entries": 0, "capacity": 513, "evicted": 0, "monotonic": 1234.568}
    assert printed_at(done["monotonic"], now_monotonic=1240.0) == 1234.568
    for said in (None, "1234", True, float("nan"), float("inf"), -1.0, 1250.0, [1.0]):
        assert printed_at(said, now_monotonic=1240.0) is None, said
