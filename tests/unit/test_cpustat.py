"""/proc/stat's cpu line and iostat's avg-cpu shares (sysstat's write_plain_cpu_stat)."""
import pytest

from iowarden.daemon.commands.iostat import avg_cpu_block, device_block, report_lines, EXTENDED_COLUMNS
from iowarden.probes import cpustat, diskstats
from iowarden.probes.common import ParseError

# The layout of Documentation/filesystems/proc.rst: user nice system idle iowait irq softirq steal guest guest_nice
STAT = "cpu  1000 50 300 8000 100 20 30 500 400 0\ncpu0 500 25 150 4000 50 10 15 250 200 0\nintr 12345\n"


def test_parse_takes_the_all_cpu_line_and_leaves_guest_out_of_the_total():
    t = cpustat.parse(STAT)
    assert (t.user, t.nice, t.system, t.idle, t.iowait, t.irq, t.softirq, t.steal) == (1000, 50, 300, 8000, 100, 20, 30, 500)
    assert t.total == 10000   # guest (400) is inside user already


def test_an_old_kernels_short_line_reads_as_zeros():
    assert cpustat.parse("cpu  1 2 3 4\n") == cpustat.CpuTicks(1, 2, 3, 4)


@pytest.mark.parametrize("text", ["", "cpu0 1 2 3 4\n", "cpu  1 2 x 4\n", "cpu  1 2\n"])
def test_a_table_without_a_readable_cpu_line_is_a_parse_error(text):
    with pytest.raises(ParseError):
        cpustat.parse(text)


def test_avg_cpu_shares_of_the_interval_with_irq_in_system():
    prev = cpustat.parse(STAT)
    cur = cpustat.CpuTicks(user=1100, nice=50, system=320, idle=8800, iowait=150, irq=25, softirq=35, steal=520)
    a = cpustat.avg_cpu(prev, cur)   # 1000 ticks in all
    assert (a.user, a.nice, a.system, a.iowait, a.steal, a.idle) == pytest.approx((10.0, 0.0, 3.0, 5.0, 2.0, 80.0))


def test_a_counter_that_went_back_gives_zero_not_a_negative_share():
    prev = cpustat.parse(STAT)
    cur = cpustat.CpuTicks(user=900, nice=50, system=300, idle=9000, iowait=100, irq=20, softirq=30, steal=500)
    a = cpustat.avg_cpu(prev, cur)
    assert a.user == 0.0 and a.idle > 0
    assert cpustat.avg_cpu(prev, prev) == cpustat.AvgCpuPercent(0, 0, 0, 0, 0, 0)


def test_columns_keep_sysstats_widths_whatever_the_values():
    """sysstat's columns do not re-align per report: a row of small values and one of large ones
    end every column at the same place as the header."""
    zero = diskstats.DiskCounters(7, 0, "loop0")
    big = diskstats.DiskCounters(7, 0, "loop0", reads=5000, sectors_read=900_000, read_ms=5000, io_ms=900)
    small = diskstats.compute_rates(zero, diskstats.DiskCounters(7, 0, "loop0", reads=1), 1.0)
    large = diskstats.compute_rates(zero, big, 1.0)
    lines = device_block([small, large])
    ends = [[i + 1 for i, ch in enumerate(line) if ch != " " and (i + 1 == len(line) or line[i + 1] == " ")]
            for line in lines[:3]]
    assert ends[0][1:] == ends[1][1:] == ends[2][1:] and len(ends[0]) == len(EXTENDED_COLUMNS) + 1
    assert lines[0].startswith("Device            r/s     rkB/s   rrqm/s  %rrqm r_await rareq-sz")
    assert lines[0].endswith("drqm/s  %drqm d_await dareq-sz     f/s f_await  aqu-sz  %util")
    assert avg_cpu_block(cpustat.AvgCpuPercent(1, 2, 3, 4, 5, 85))[1] == \
        "           1.00    2.00    3.00    4.00    5.00   85.00"
    assert report_lines(None, [small])[-2:] == ["", ""]
