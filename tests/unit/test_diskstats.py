"""diskstats parsing per kernel format, and iostat -x arithmetic checked by hand."""
import pytest

from iowarden.probes import diskstats
from iowarden.probes.common import ParseError
from tests.conftest import FIXTURES

D = FIXTURES / "diskstats"


def test_kernel_4_14_has_no_discard_or_flush_fields():
    devs = diskstats.parse((D / "linux-4.14-14-fields.txt").read_text())
    sda = devs["sda"]
    assert (sda.reads, sda.sectors_read, sda.io_ms, sda.weighted_io_ms) == (218349, 11385298, 665048, 2453488)
    assert not sda.has_discards and not sda.has_flushes and sda.discards == 0
    assert devs["dm-0"].in_flight == 3


def test_kernel_5_4_adds_discards():
    devs = diskstats.parse((D / "linux-5.4-18-fields.txt").read_text())
    nvme = devs["nvme0n1"]
    assert nvme.has_discards and not nvme.has_flushes
    assert (nvme.discards, nvme.sectors_discarded, nvme.discard_ms) == (20731, 98131328, 1832)


def test_this_kernel_has_flushes():
    devs = diskstats.parse((D / "linux-6.18-20-fields.txt").read_text())
    assert all(d.has_flushes for d in devs.values())


def test_old_partition_format():
    devs = diskstats.parse((D / "linux-2.6-partition-7-fields.txt").read_text())
    p = devs["hda1"]
    assert (p.reads, p.sectors_read, p.writes, p.sectors_written) == (35486, 38030, 38030, 38030)
    assert devs["hda"].reads == 446216


@pytest.mark.parametrize("line", [
    "8 0 sda 1 2 3",                                   # wrong column count
    "8 0 sda 1 2 3 4 5 6 7 8 9 10 x",                  # non-numeric
    "8 0 sda 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",  # 19 columns
    "8 0 sda 1 2 3 4 5 6 7 8 9 10 -11",                # negative
])
def test_malformed_lines_are_rejected_with_the_line_and_cost_only_themselves_in_a_table(line):
    with pytest.raises(ParseError, match="diskstats line"):
        diskstats.parse_line(line)
    # in a table, the odd line is passed over and every other device read (unguarded, the table was lost)
    good = "8 16 sdb 1 2 3 4 5 6 7 8 9 10 11"
    assert set(diskstats.parse(f"{good}\n{line}\n{good.replace('sdb', 'sdc')}")) == {"sdb", "sdc"}


def _c(**kw):
    base = dict(major=8, minor=0, name="sda")
    base.update(kw)
    return diskstats.DiskCounters(**base)


def test_iostat_formulas_by_hand():
    a = _c(reads=1000, reads_merged=10, sectors_read=8000, read_ms=500, writes=200, writes_merged=50,
           sectors_written=3200, write_ms=400, io_ms=1000, weighted_io_ms=2000, discards=0, flushes=10, flush_ms=5)
    b = _c(reads=1400, reads_merged=110, sectors_read=11200, read_ms=900, writes=300, writes_merged=150,
           sectors_written=6400, write_ms=1400, io_ms=1500, weighted_io_ms=4000, discards=4, sectors_discarded=64,
           discard_ms=8, flushes=14, flush_ms=25, in_flight=2)
    r = diskstats.compute_rates(a, b, 2.0)
    assert r.reads_per_second == 200 and r.writes_per_second == 50
    assert r.read_kib_per_second == 800 and r.write_kib_per_second == 800
    assert r.read_merges_per_second == 50 and r.read_merges_percent == pytest.approx(100 * 100 / 500)
    assert r.read_await_ms == 1.0 and r.write_await_ms == 10.0
    assert r.read_request_kib == 4.0 and r.write_request_kib == 16.0
    assert r.discards_per_second == 2 and r.discard_await_ms == 2.0 and r.discard_request_kib == 8.0
    assert r.flushes_per_second == 2 and r.flush_await_ms == 5.0
    assert r.queue_size == 1.0 and r.util_percent == 25.0 and r.in_flight == 2


def test_zero_denominators_give_zero():
    r = diskstats.compute_rates(_c(), _c(io_ms=10), 1.0)
    assert r.read_await_ms == 0 and r.read_request_kib == 0 and r.read_merges_percent == 0


def test_32_bit_time_counter_wrap_gives_the_true_delta():
    a = _c(reads=100, read_ms=2**32 - 100, io_ms=2**32 - 50, weighted_io_ms=2**32 - 10)
    b = _c(reads=200, read_ms=100, io_ms=450, weighted_io_ms=990)
    r = diskstats.compute_rates(a, b, 1.0)
    assert r.read_await_ms == 2.0           # (100 + 100) ms over 100 reads
    assert r.util_percent == 50.0            # 500 ms busy in 1 s
    assert r.queue_size == 1.0


def test_counter_reset_is_not_a_huge_rate():
    # device removed and re-added under the same name: counters restart
    a = _c(reads=5_000_000, io_ms=90_000)
    b = _c(reads=10, io_ms=20)
    r = diskstats.compute_rates(a, b, 1.0)
    assert r.reads_per_second == 10 and r.util_percent == 2.0


def test_util_never_exceeds_100():
    r = diskstats.compute_rates(_c(io_ms=0), _c(io_ms=1200), 1.0)
    assert r.util_percent == 100.0


def test_sysstat_keys_are_sysstats_own():
    r = diskstats.compute_rates(_c(), _c(reads=1), 1.0).as_sysstat()
    for key in ("r/s", "w/s", "rkB/s", "wkB/s", "r_await", "w_await", "aqu-sz", "util", "rareq-sz", "f_await"):
        assert key in r
    assert r["disk_device"] == "sda" and r["r/s"] == 1.0


def test_rates_between_skips_devices_that_came_or_went():
    a = diskstats.DiskSample(10.0, {"sda": _c(), "sdb": _c(name="sdb")})
    b = diskstats.DiskSample(11.0, {"sda": _c(reads=5), "sdc": _c(name="sdc")})
    assert set(diskstats.rates_between(a, b)) == {"sda"}


def test_the_sampler_leaves_out_ram_zram_and_unattached_loops_unless_asked(tmp_path):
    """node_exporter's default: devices nobody asked about are not sampled; a glob naming them wins."""
    from iowarden.daemon.sources.sampler import Sampler
    from iowarden.probes.common import Roots
    roots = Roots.under(tmp_path)
    for name in ("sda", "sda1", "ram0", "zram0", "loop0", "loop1", "nvme0n1"):
        (roots.sys / "class" / "block" / name).mkdir(parents=True)
    (roots.sys / "class" / "block" / "sda1" / "partition").write_text("1\n")
    (roots.sys / "block" / "loop0" / "loop").mkdir(parents=True)
    (roots.sys / "block" / "loop0" / "loop" / "backing_file").write_text("/srv/img\n")   # attached; loop1 is not
    lines = "".join(f"   7       {i} {n} 1 0 8 1 0 0 0 0 0 1 1 0 0 0 0 0 0\n"
                    for i, n in enumerate(("sda", "sda1", "ram0", "zram0", "loop0", "loop1", "nvme0n1")))
    (roots.proc).mkdir()
    (roots.proc / "diskstats").write_text(lines)
    s = Sampler(roots, [])
    s.step()
    assert s.reading.sampled == {"sda", "loop0", "nvme0n1"}
    s = Sampler(roots, [], exclude_globs=())
    s.step()
    assert s.reading.sampled == {"sda", "loop0", "nvme0n1", "ram0", "zram0"}
    s = Sampler(roots, ["loop*", "zram*"])
    s.step()
    assert s.reading.sampled == {"loop0", "loop1", "zram0"}
    # attaching is seen at the next tick, without a diskstats change
    (roots.sys / "block" / "loop1" / "loop").mkdir(parents=True)
    (roots.sys / "block" / "loop1" / "loop" / "backing_file").write_text("/srv/img2\n")
    s = Sampler(roots, [])
    s.step()
    assert "loop1" in s.reading.sampled


def test_rates_computed_when_asked_for_are_the_rates_of_every_device_named_and_only_them():
    a = diskstats.DiskSample(10.0, {n: _c(name=n, reads=100 * i, sectors_read=800 * i, read_ms=50 * i,
                                             io_ms=300 * i, weighted_io_ms=400 * i)
                                    for i, n in enumerate(("sda", "sdb", "sdc", "loop0"))})
    b = diskstats.DiskSample(12.0, {n: _c(name=n, reads=100 * i + 90, sectors_read=800 * i + 720, read_ms=50 * i + 45,
                                             io_ms=300 * i + 1500, weighted_io_ms=400 * i + 900)
                                    for i, n in enumerate(("sda", "sdb", "sdc", "sdd"))})
    lazy = diskstats.RatesBetween(a, b, {"sda", "sdb", "sdd", "loop0"})
    # in both samples and named: sdd is new (no interval), loop0 went away, sdc is not named
    assert list(lazy) == ["sda", "sdb"] and len(lazy) == 2 and "sdc" not in lazy and "sdd" not in lazy
    full = diskstats.rates_between(a, b)
    assert dict(lazy.items()) == {n: full[n] for n in ("sda", "sdb")}
    assert lazy.util_percent("sdb") == full["sdb"].util_percent == 75.0
    with pytest.raises(KeyError):
        lazy["sdc"]


def test_an_unchanged_line_is_not_parsed_again_and_a_changed_one_is():
    idle = "   7       0 loop0 10 0 80 1 0 0 0 0 0 4 1 0 0 0 0 0 0"
    busy = "   8       0 sda 1234 5 67890 123 456 7 8910 11 0 1213 1415 0 0 0 0 0 0"
    first = diskstats.parse("\n".join([idle, busy, "garbage line", ""]))
    busier = busy.replace(" 1234 ", " 1240 ")
    second = diskstats.parse("\n".join([idle, busier, "garbage line", ""]))
    assert second["loop0"] is first["loop0"]                 # the same text: the same counters, not parsed again
    assert second["sda"].reads == 1240 and first["sda"].reads == 1234
    assert set(second) == {"loop0", "sda"}                    # the odd line still costs only itself
    assert second["sda"] == diskstats.DiskCounters(8, 0, "sda", 1240, 5, 67890, 123, 456, 7, 8910, 11, 0, 1213, 1415,
                                                    0, 0, 0, 0, 0, 0, True, True)
