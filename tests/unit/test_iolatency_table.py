"""`iowarden iostat --latency` says what it did not measure, in the units a person reads (no root: histograms
built as the program fills them).

The compiled engine showed a loop device's queue stage as "2 nsec" at p50, p99 and p99.9 (the device does not
stamp its requests there), and one such figure put the whole table in nanoseconds ("2817393")."""
import json

from iowarden.daemon.commands import iolatency
from iowarden.probes.blocktrace import StageHistogram, bucket_of_ns


def _hist(*ns_counts):
    counts = {}
    for ns, n in ns_counts:
        counts[bucket_of_ns(ns)] = counts.get(bucket_of_ns(ns), 0) + n
    return StageHistogram(tuple(sorted(counts.items())))


WINDOW = {
    (0x700002, "read", "queue"): _hist((2, 1000)),                          # not stamped: all under a µs
    (0x700002, "read", "device"): _hist((150_000, 900), (2_800_000, 100)),
    (0x700002, "read", "total"): _hist((152_000, 900), (2_817_393, 100)),
}
NAMES = {0x700002: "loop2"}


def test_a_stage_the_device_does_not_stamp_is_said_so_and_the_rest_is_in_microseconds(capsys):
    iolatency._report(WINDOW, NAMES, as_json=False)
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("device"))
    assert "p50 usec" in header and "nsec" not in out, out
    queue = next(line for line in out.splitlines() if " queue " in line)
    assert iolatency.NOT_TIMED in queue and " 2 " not in queue, queue
    total = next(line for line in out.splitlines() if " total " in line)
    assert "2,8" in total and "2817393" not in total, total   # 2,8xx µs, grouped


def test_the_json_says_the_stage_was_not_timed_rather_than_a_number(capsys):
    iolatency._report(WINDOW, NAMES, as_json=True)
    rows = {r["stage"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["queue"]["timed"] is False and rows["queue"]["p99_seconds"] is None
    assert rows["device"]["timed"] is True and 1e-4 < rows["device"]["p50_seconds"] < 2e-4


def test_milliseconds_when_every_figure_is_over_two_of_them():
    assert iolatency.person_unit([0.0025, 0.15]) == ("msec", 1e-3)
    assert iolatency.person_unit([1e-9, 0.15]) == ("usec", 1e-6)   # never nsec
