"""iowarden's own text exposition (outputs/exposition.py) is byte for byte prometheus_client's."""
import re

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily,
                                    SummaryMetricFamily)

from iowarden.daemon.outputs.exposition import render
from iowarden.daemon.outputs.prometheus import SnapshotCollector
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


class _Reads:
    """A snapshot that records which of its fields a section reads."""

    def __init__(self, snap):
        self._snap, self.read = snap, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._snap, name)


def test_every_section_reads_only_the_inputs_it_declares(tree):
    # a section reading a field it does not declare would be served stale when only that field changed
    from iowarden.daemon.outputs.prometheus import SECTION_INPUTS
    from iowarden.daemon.sources.registry import SOURCES
    snap = snapshot(tree)
    sources = {s.name for s in SOURCES}
    for name, build in SnapshotCollector(lambda: snap).sections():
        reads = _Reads(snap)
        built = list(build(reads))
        # every section has something to say here, but a registered source the fixture holds no reading of
        # (its own tests build its section from its fixture): its inputs are checked all the same
        assert built or (name in sources and name not in snap.sources), name
        assert reads.read <= set(SECTION_INPUTS[name]), (name, reads.read - set(SECTION_INPUTS[name]))
    assert {"smart", "cgroups"} <= set(snap.sources)   # the readings the fixture holds were built above


def _rendering(tree):
    """A collector over a snapshot the test replaces (current[0]), registered, and a Renderer."""
    from iowarden.daemon.outputs.exposition import Renderer
    snap = snapshot(tree)
    current = [snap]
    collector = SnapshotCollector(lambda: current[0])
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return snap, current, collector, reg, Renderer()


def test_a_section_whose_inputs_did_not_change_is_served_again_and_its_text_reused(tree):
    import dataclasses

    snap, current, collector, reg, renderer = _rendering(tree)
    first = renderer.render(reg)
    settings = collector._built["settings"][1]
    # a new snapshot a second later: the disks' rates changed, the settings did not
    rates = {n: dataclasses.replace(r, util_percent=r.util_percent + 1) for n, r in snap.disk_rates.items()}
    current[0] = dataclasses.replace(snap, disk_reading=dataclasses.replace(snap.disk_reading, rates=rates),
                                     taken_at=snap.taken_at + 1)
    second = renderer.render(reg)
    assert collector._built["settings"][1] is settings   # not built again
    assert _without_durations(second) == _without_durations(generate_latest(reg)) != _without_durations(first)
    # the device view replaced (a scheduler changed): the settings section is built again, and says so
    dev = next(iter(snap.devices))
    queue = dataclasses.replace(snap.devices[dev].queue, scheduler="bfq")
    devices = {**snap.devices, dev: dataclasses.replace(snap.devices[dev], queue=queue)}
    current[0] = dataclasses.replace(current[0], devices=devices)
    third = renderer.render(reg).decode()
    assert collector._built["settings"][1] is not settings
    assert re.search(rf'iowarden_block_queue_info{{[^}}]*device="{dev}"[^}}]*scheduler="bfq"', third), dev
    assert _without_durations(third.encode()) == _without_durations(generate_latest(reg))


def test_a_disk_whose_counters_did_not_move_keeps_its_lines_and_one_that_moved_is_written_again(tree):
    """The disk section keeps each disk's lines while its counters are the same object (diskstats.parse keeps
    an unchanged line's); a disk that moved, or a new device view, is written again, and the text stays
    generate_latest's."""
    import dataclasses

    snap, current, collector, reg, renderer = _rendering(tree)
    renderer.render(reg)
    counters = snap.disk_sample.counters
    moved, idle = sorted(n for n in snap.disk_rates if n in counters)[:2]
    kept_idle = collector._disk_rows[1][idle][3]
    sample = dataclasses.replace(snap.disk_sample, counters={
        **counters, moved: counters[moved]._replace(reads=counters[moved].reads + 12345)})
    current[0] = dataclasses.replace(snap, disk_reading=dataclasses.replace(snap.disk_reading, sample=sample),
                                     taken_at=snap.taken_at + 1)
    text = renderer.render(reg)
    assert collector._disk_rows[1][idle][3] is kept_idle
    assert f'iowarden_disk_reads_completed_total{{device="{moved}",'.encode() in text
    line = re.search(rf'^iowarden_disk_reads_completed_total{{device="{moved}",[^}}]*}} (\S+)$', text.decode(), re.M)
    assert float(line.group(1)) == counters[moved].reads + 12345
    assert _without_durations(text) == _without_durations(generate_latest(reg))


class _ManyDisks:
    """One family of 1,000 series written line by line (more lines than one chunk) between two others."""

    def collect(self):
        from iowarden.daemon.outputs.exposition import TextFamily, label_text, sample_line
        yield GaugeMetricFamily("before_gauge", "a family before", value=1.0)
        rows = [(label_text(("device",), (f"loop{i}",)), (f"loop{i}",), float(i)) for i in range(1000)]
        yield TextFamily("many_reads", "reads by disk", "counter", ("device",), lambda: rows,
                         [sample_line("many_reads_total", text, value) for text, _, value in rows])
        yield GaugeMetricFamily("after_gauge", "a family after", value=2.0)


def test_the_gzipped_exposition_and_the_plain_body_are_generate_latests_text_written_in_pieces():
    """Prometheus asks for gzip: the lines are compressed piece by piece, never joined into one body; the
    plain body, built only when asked, is the same text."""
    import gzip

    from iowarden.daemon.outputs.exposition import CHUNK_LINES, Renderer

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_ManyDisks())
    pieces = Renderer().exposition(reg)
    assert sum(1 for _ in pieces.chunks()) > 1000 // CHUNK_LINES + 3   # written in pieces
    theirs = generate_latest(reg)
    assert pieces.body() == theirs
    assert gzip.decompress(pieces.gzipped()) == theirs
    assert b'many_reads_total{device="loop999"} 999.0\n' in theirs


def test_a_kept_family_of_many_series_is_its_text_and_gives_back_the_same_samples():
    """A family the collector keeps between scrapes is kept as its text; asked for its samples (as
    generate_latest asks), it gives back the very samples it was made from: odd label values, NaN, Inf,
    counters' _total, large and tiny floats."""
    from iowarden.daemon.outputs.exposition import WRITTEN_MIN_SAMPLES, WrittenFamily, for_keeping

    g = GaugeMetricFamily("many_settings", 'help with a \\ and a\nline feed', labels=["device", "odd"])
    c = CounterMetricFamily("many_changes", "a counter", labels=["device"])
    for i in range(WRITTEN_MIN_SAMPLES + 36):
        g.add_metric([f"sd{i}", ['db "main"\\x', "line\nfeed", "ümlaut ✓", ""][i % 4]],
                     [float("nan"), float("inf"), 1e-6 * i, 131072.0 * i, 0.1 + i / 3][i % 5])
        c.add_metric([f"sd{i}"], i)
    small = GaugeMetricFamily("few", "a family of one", value=3.0)
    families = [g, c, small]

    class _Reg:
        def __init__(self, fams):
            self.fams = fams

        def collect(self):
            return iter(self.fams)

    written = [for_keeping(f) for f in families]
    assert [type(f) for f in written] == [WrittenFamily, WrittenFamily, GaugeMetricFamily]
    assert generate_latest(_Reg(written)) == generate_latest(_Reg(families)) == render(_Reg(written))
    for mine, theirs in zip(written[0].samples, g.samples):
        assert mine.name == theirs.name and mine.labels == theirs.labels
        assert (mine.value == theirs.value) or (mine.value != mine.value and theirs.value != theirs.value)


def test_a_scrape_renders_the_counters_read_at_the_scrape_over_the_sampler_reading(tree, caplog):
    """/proc/diskstats is read again at each scrape (a rate() window is then exact, as node_exporter's): its
    counters replace the published sample's, the rest of the sampler's reading (which disks) stays."""
    import dataclasses
    import logging

    snap = snapshot(tree)
    counters = snap.disk_sample.counters
    dev = sorted(n for n in snap.disk_rates if n in counters)[0]
    fresh = dataclasses.replace(snap.disk_sample, counters={
        **counters, dev: counters[dev]._replace(reads=counters[dev].reads + 777)})
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(lambda: snap, read_disk_sample=lambda: fresh))
    with caplog.at_level(logging.ERROR, logger="iowarden"):
        text = generate_latest(reg).decode()
    line = re.search(rf'^iowarden_disk_reads_completed_total{{device="{dev}",[^}}]*}} (\S+)$', text, re.M)
    assert float(line.group(1)) == counters[dev].reads + 777
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
