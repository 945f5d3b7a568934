"""`replay --prometheus --plot DIR`: per device the replay named, its await against its peers' over the window,
the alert intervals shaded: what a person would rather look at than read. matplotlib, as characterize's
plots (an optional extra); files written through an OutDir, never through a link found there.

The replay keeps, per device, the I/O-weighted await of its windows summed into at most MAX_POINTS buckets
over the window (a month at 15 s windows is 170,000 windows a device; 1,500 buckets is finer than a screen).
"""
from __future__ import annotations

import re
import statistics
from datetime import datetime

from iowarden.daemon.passive.values import Window

MAX_POINTS = 1500


class AwaitTrace:
    """The awaits of a host's windows, bucketed by time: device -> bucket -> [await-ms x I/Os, I/Os]."""

    def __init__(self, start: float, end: float):
        self.start, self.width = start, max(1.0, (end - start) / MAX_POINTS)
        self.buckets: dict[str, dict[int, list]] = {}

    def add(self, w: Window) -> None:
        ios = sum((f.iops or 0.0) * w.seconds for f in w.flows.values())
        if ios <= 0:
            return
        waited = sum(f.await_ms * (f.iops or 0.0) * w.seconds for f in w.flows.values())
        b = self.buckets.setdefault(w.device, {}).setdefault(int((w.end - self.start) // self.width), [0.0, 0.0])
        b[0] += waited
        b[1] += ios

    def series(self, device: str) -> dict[int, float]:
        return {k: s / n for k, (s, n) in self.buckets.get(device, {}).items() if n > 0}

    def time_of(self, bucket: int) -> float:
        return self.start + (bucket + 0.5) * self.width


def file_name(instance: str, device: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{instance}_{device}")[:150] + ".png"


def write_plots(out, instance: str, trace: AwaitTrace, groups, intervals: list[dict]) -> list[str]:
    """One PNG (and SVG) per device named in `intervals`."""
    from iowarden.daemon.commands.characterize_plots import pyplot, save_figure
    plt = pyplot()
    written = []
    for device in sorted({i["device"] for i in intervals}):
        peers = next((g for g in groups if device in g), ())
        mine = trace.series(device)
        others = [trace.series(p) for p in peers if p != device]
        fig, ax = plt.subplots(figsize=(9, 4.2))
        xs = sorted(mine)
        lines = ax.plot([datetime.fromtimestamp(trace.time_of(k)) for k in xs], [mine[k] for k in xs], "-",
                        color="tab:red", linewidth=1, label=f"{device} await (ms)")
        if others:
            keys = sorted({k for s in others for k in s})
            median = [(k, statistics.median(s[k] for s in others if k in s)) for k in keys]
            lines += ax.plot([datetime.fromtimestamp(trace.time_of(k)) for k, _ in median], [v for _, v in median],
                             "-", color="tab:blue", linewidth=1,
                             label=f"its peers' median ({', '.join(p for p in peers if p != device)})")
        for n, i in enumerate(x for x in intervals if x["device"] == device):
            end = i["end"] if i["end"] is not None else trace.start + trace.width * MAX_POINTS
            span = ax.axvspan(datetime.fromtimestamp(i["start"]), datetime.fromtimestamp(end), color="orange",
                              alpha=0.25, label="alert (iowarden)" if n == 0 else None)
            if n == 0:
                lines.append(span)
        ax.set_yscale("log")
        ax.set_ylabel("await (ms), I/O-weighted")
        ax.set_title(f"{instance} {device}: " + ", ".join(sorted({i['kind'] for i in intervals
                                                                  if i['device'] == device})))
        ax.legend(lines, [x.get_label() for x in lines], loc="upper center", bbox_to_anchor=(0.5, -0.14),
                  ncol=3, fontsize="small", frameon=False)
        fig.autofmt_xdate()
        written.append(save_figure(fig, plt, out, file_name(instance, device)))
    return written
