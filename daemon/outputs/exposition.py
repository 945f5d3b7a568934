"""The text exposition format (0.0.4), byte for byte as prometheus_client's generate_latest writes it.

generate_latest checks every label name against the legacy name pattern and escapes it, per sample;
with 64 devices that is most of a render (a profile: 0.12 of 0.19 s per ten renders went to label
names). iowarden's metric and label names are its own vocabulary, checked once by promtool in the
unit tests, so only what can carry a user's or the kernel's text is escaped here: label values and
help texts. tests/unit/test_exposition.py holds the output equal to generate_latest's.
"""
from __future__ import annotations

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


def _family(metric) -> str:
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


class Renderer:
    """render() that writes a family the collector serves again (the same object: its section's inputs did not
    change) from the text it wrote last time."""

    def __init__(self):
        self._text: dict[int, tuple[object, str]] = {}   # id(family) -> (the family, kept so its id is not reused; text)

    def render(self, registry) -> bytes:
        last, now, parts = self._text, {}, []
        for metric in registry.collect():
            hit = last.get(id(metric))
            text = hit[1] if hit is not None and hit[0] is metric else _family(metric)
            now[id(metric)] = (metric, text)
            parts.append(text)
        self._text = now
        return "".join(parts).encode("utf-8")
