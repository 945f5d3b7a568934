"""The text exposition format (0.0.4), byte for byte as prometheus_client's generate_latest writes it.

generate_latest checks every label name against the legacy name pattern and escapes it, per sample;
with 64 devices that is most of a render (a profile: 0.12 of 0.19 s per ten renders went to label
names). iowarden's metric and label names are its own vocabulary, checked once by promtool in the
unit tests, so only what can carry a user's or the kernel's text is escaped here: label values and
help texts. tests/unit/test_exposition.py holds the output equal to generate_latest's.
"""
from __future__ import annotations

import zlib
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPE_OF = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


def _escape_value(v: str) -> str:
    if "\\" in v or '"' in v or "\n" in v:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return v


def _escape_help(doc: str) -> str:
    return doc.replace("\\", "\\\\").replace("\n", "\\n")


def _line(sample) -> str:
    if sample.labels:
        labels = "{" + ",".join([f'{k}="{_escape_value(v)}"' for k, v in sorted(sample.labels.items())]) + "}"
    else:
        labels = ""
    stamp = f" {int(float(sample.timestamp) * 1000):d}" if sample.timestamp is not None else ""
    return f"{sample.name}{labels} {floatToGoString(sample.value)}{stamp}\n"


class TextFamily(Metric):
    """A family of many series with the same label names, written straight to text: at 1,024 disks the
    per-device families built through add_metric and written sample by sample were a third of the daemon's
    CPU. `rows` are (label text, label values, value), or a function that returns them when asked; the label
    text is the caller's (kept across scrapes, a device's labels do not change). `samples` is built only when
    something asks for it (generate_latest in the tests), so the exposition is the same either way."""

    def __init__(self, name: str, documentation: str, typ: str, label_names: tuple[str, ...], rows: list,
                 lines: list[str] | None = None):
        super().__init__(name, documentation, typ)
        self.label_names = label_names
        self._rows = rows            # [(label text '{a="x",b="y"}', label values, value)], or () -> that
        self._lines = lines          # the rows' lines, when the caller wrote them (kept for rows that did not change)
        self._text: str | None = None

    @property
    def sample_name(self) -> str:
        return self.name + ("_total" if self.type == "counter" else "")

    def rows(self) -> list:
        return self._rows() if callable(self._rows) else self._rows

    @property
    def samples(self):   # noqa: D401 - prometheus_client reads it as an attribute
        if self._samples is None:
            self._samples = [Sample(self.sample_name, dict(zip(self.label_names, values)), value)
                             for _, values, value in self.rows()]
        return self._samples

    @samples.setter
    def samples(self, value):    # Metric.__init__ sets []: the rows are the samples until asked for
        self._samples = value or None

    def part(self) -> tuple[str, list[str]]:
        """(its HELP and TYPE lines, its sample lines): what an Exposition writes, never joined here."""
        name = self.sample_name
        head = f"# HELP {name} {_escape_help(self.documentation)}\n# TYPE {name} {_TYPE_OF.get(self.type, self.type)}\n"
        lines = self._lines if self._lines is not None else [
            sample_line(name, labels, value) for labels, _, value in self.rows()]
        return head, lines

    def text(self) -> str:
        if self._text is None:
            head, lines = self.part()
            self._text = head + "".join(lines)
        return self._text


class WrittenFamily(Metric):
    """A family the collector keeps between scrapes (its section's inputs did not change), kept as the text it
    renders to, not as client_python's samples: at 1,024 disks the settings section's 7,000 Sample objects
    and their label dicts were 2.5 MB held beside their own text. `samples` is parsed back from the text when
    something asks (generate_latest in the tests): the same samples, as floatToGoString round-trips."""

    def __init__(self, metric: Metric):
        super().__init__(metric.name, metric.documentation, metric.type, metric.unit)
        self._text = _family(metric)

    @property
    def samples(self):   # noqa: D401 - prometheus_client reads it as an attribute
        from prometheus_client.parser import text_string_to_metric_families
        return [s for family in text_string_to_metric_families(self._text) for s in family.samples]

    @samples.setter
    def samples(self, value):    # Metric.__init__ sets []: the text is the samples
        pass

    def text(self) -> str:
        return self._text


# a family of fewer samples is kept as it is: its text would save little
WRITTEN_MIN_SAMPLES = 64


def for_keeping(metric: Metric) -> Metric:
    """A family to keep between scrapes, in its cheapest form."""
    if isinstance(metric, (TextFamily, WrittenFamily)) or len(metric.samples) < WRITTEN_MIN_SAMPLES:
        return metric
    return WrittenFamily(metric)


def sample_line(sample_name: str, labels: str, value) -> str:
    return f"{sample_name}{labels} {floatToGoString(value)}\n"


def label_text(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """'{a="x",b="y"}' as generate_latest writes it (names sorted, values escaped)."""
    return "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(zip(names, values))) + "}"


def _family(metric) -> str:
    if isinstance(metric, (TextFamily, WrittenFamily)):
        return metric.text()
    out: list[str] = []
    name, kind = metric.name, metric.type
    if kind == "counter":
        name += "_total"
    elif kind == "info":
        name += "_info"
    kind = _TYPE_OF.get(kind, kind)
    out.append(f"# HELP {name} {_escape_help(metric.documentation)}\n")
    out.append(f"# TYPE {name} {kind}\n")
    extra: dict[str, list[str]] = {}
    openmetrics_only = {metric.name + x: x for x in _OPENMETRICS_SUFFIXES}
    for s in metric.samples:
        suffix = openmetrics_only.get(s.name)
        if suffix is None:
            out.append(_line(s))
        else:   # OpenMetrics-only samples become gauges of their own after the family, as generate_latest does
            extra.setdefault(suffix, []).append(_line(s))
    for suffix, lines in extra.items():
        out.append(f"# HELP {metric.name}{suffix} {_escape_help(metric.documentation)}\n")
        out.append(f"# TYPE {metric.name}{suffix} gauge\n")
        out.extend(lines)
    return "".join(out)


def render(registry) -> bytes:
    return "".join(_family(m) for m in registry.collect()).encode("utf-8")


# lines written to the compressor at a time: pieces well under glibc's mmap threshold, reused block by block
CHUNK_LINES = 256


class Exposition:
    """One render, as the pieces it is made of: the families' texts in order and, for a TextFamily, its head
    and its lines, never joined. At 1,024 disks the joined families, the joined body and its bytes were three
    more copies of 3 MB a render, and a glibc heap that grows to its largest freed block kept them all.
    A scrape asking for gzip (Prometheus always does) gets the lines compressed as they come; the plain body
    is built only for a scraper that asks for it. Immutable: read from any thread."""
    __slots__ = ("_parts",)

    def __init__(self, parts: list):
        self._parts = parts   # str, or (head, lines)

    def chunks(self) -> Iterator[str]:
        for part in self._parts:
            if isinstance(part, str):
                yield part
                continue
            head, lines = part
            yield head
            for i in range(0, len(lines), CHUNK_LINES):
                yield "".join(lines[i:i + CHUNK_LINES])

    def body(self) -> bytes:
        return b"".join(chunk.encode("utf-8") for chunk in self.chunks())

    def gzipped(self, level: int = 1) -> bytes:
        z = zlib.compressobj(level, zlib.DEFLATED, 31)   # wbits 31: a gzip member, as gzip.compress writes
        out = [z.compress(chunk.encode("utf-8")) for chunk in self.chunks()]
        out.append(z.flush())
        return b"".join(out)


class Renderer:
    """render() that writes a family the collector serves again (the same object: its section's inputs did not
    change) from the text it wrote last time."""

    def __init__(self):
        self._text: dict[int, tuple[object, str]] = {}   # id(family) -> (the family, kept so its id is not reused; text)

    def exposition(self, registry) -> Exposition:
        last, now, parts = self._text, {}, []
        for metric in registry.collect():
            if isinstance(metric, TextFamily):
                parts.append(metric.part())   # its lines are the collector's, kept per disk: nothing to keep here
                continue
            hit = last.get(id(metric))
            text = hit[1] if hit is not None and hit[0] is metric else _family(metric)
            now[id(metric)] = (metric, text)
            parts.append(text)
        self._text = now
        return Exposition(parts)

    def render(self, registry) -> bytes:
        return self.exposition(registry).body()
