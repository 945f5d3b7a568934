"""iowarden's own text exposition (exporters/exposition.py) is byte for byte prometheus_client's."""
import re

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily,
                                    SummaryMetricFamily)

from iowarden.daemon.exporters.exposition import render
from iowarden.daemon.exporters.prometheus import SnapshotCollector
from tests.unit.test_exporter import snapshot


def _without_durations(text: bytes) -> str:
    return re.sub(r"^(iowarden_scrape_collector_duration_seconds\{[^}]*\}) .*$", r"\1 0", text.decode(), flags=re.M)


def test_the_full_scrape_is_what_generate_latest_writes(tree):
    reg = CollectorRegistry(auto_describe=False)
    snap = snapshot(tree)
    reg.register(SnapshotCollector(lambda: snap))
    assert _without_durations(render(reg)) == _without_durations(generate_latest(reg))


class _Odd:
    """Values a user or the kernel names: quotes, backslashes, line feeds, Unicode; every kind of family."""

    def collect(self):
        g = GaugeMetricFamily("odd_gauge", 'help with a \\ and a\nline feed', labels=["target", "b"])
        g.add_metric(['db "main"\\x', "line\nfeed"], 1.5)
        g.add_metric(["ümlaut ✓", ""], float("nan"))
        g.add_metric(["inf", "x"], float("inf"))
        yield g
        c = CounterMetricFamily("odd_events", "a counter with a creation time", labels=["k"], created=1.7e9)
        c.add_metric(["v"], 3, created=1.7e9)
        yield c
        h = HistogramMetricFamily("odd_latency_seconds", "a histogram", labels=["d"])
        h.add_metric(["r"], [("0.001", 2), ("+Inf", 5)], sum_value=0.01)
        yield h
        s = SummaryMetricFamily("odd_summary", "a summary", labels=["d"])
        s.add_metric(["r"], count_value=4, sum_value=2.0)
        yield s
        yield InfoMetricFamily("odd_build", "an info family", value={"version": "1.0"})
        empty = GaugeMetricFamily("odd_absent", "a family with no samples")
        yield empty


def test_odd_values_and_every_family_kind_are_written_as_generate_latest_writes_them():
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Odd())
    mine, theirs = render(reg), generate_latest(reg)
    assert mine == theirs, (mine.decode(), theirs.decode())
    assert b'target="db \\"main\\"\\\\x"' in mine and b'b="line\\nfeed"' in mine
