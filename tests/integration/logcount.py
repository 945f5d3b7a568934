"""The daemon's log counted by message (no message more than once a minute without a repeat count).

A message is its text with the numbers taken out ("probe vol0/rr deferred: device busy (71% util)" and
"(93% util)" are one message; "vol0" and "loop7" keep their digits, they name the subject). A message
repeated within a minute is chatter unless it carries the daemon's repeat count ("N more like this").
One line per probe is the record of a run the schedule asked for, not chatter: it is counted, and left
out of the check (the warm-up runs each profile every `warmup_interval_seconds`, 60 s as shipped)."""
from __future__ import annotations

import re
from collections import Counter
from datetime import datetime

LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ([A-Z]+) (.*)$")
NUMBER = re.compile(r"(?<![\w.#-])[-+]?\d[\d.,:]*")
PER_PROBE = re.compile(r"^INFO probe \S+ on \S+: read ")


def message(level: str, text: str) -> str:
    return f"{level} " + NUMBER.sub("#", text)


def count(log_text: str, window_seconds: float = 60.0) -> tuple[Counter, list[str]]:
    """(lines per message, the messages said again within window_seconds without a repeat count)."""
    counts: Counter = Counter()
    last: dict[str, float] = {}
    chatter: list[str] = []
    for line in log_text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        at = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S").timestamp() + int(m[2]) / 1000
        key = message(m[3], m[4])
        counts[key] += 1
        if PER_PROBE.match(key) or "more like this" in key:
            last[key.split(" (# more like this")[0]] = at
            continue
        if key in last and at - last[key] < window_seconds:
            chatter.append(f"{at - last[key]:.0f} s apart: {line[:300]}")
        last[key] = at
    return counts, chatter


def summary(log_text: str, top: int = 8) -> list[str]:
    counts, chatter = count(log_text)
    lines = [f"daemon log: {sum(counts.values())} lines, {len(counts)} messages; most said:"]
    lines += [f"  {n:5d}  {text[:160]}" for text, n in counts.most_common(top)]
    lines.append(f"said again within a minute without a repeat count: {len(chatter)}")
    return lines + ["  " + c for c in chatter[:10]]
