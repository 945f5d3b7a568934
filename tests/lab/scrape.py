"""Reading a Prometheus text exposition in the lab's tests: samples by name and labels."""
from __future__ import annotations

import re

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str, name: str, **want: str) -> list[tuple[dict, float]]:
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m.group(1) != name:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        if all(labels.get(k) == v for k, v in want.items()):
            out.append((labels, float(m.group(3))))
    return out


def value(text: str, name: str, **want: str) -> float | None:
    found = samples(text, name, **want)
    return found[0][1] if found else None


def alerts(text: str, alert: str) -> list[dict]:
    """The labels of every active alert of that kind (iowarden_alert_active == 1)."""
    return [labels for labels, v in samples(text, "iowarden_alert_active", alert=alert) if v == 1]
