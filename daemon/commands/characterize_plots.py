"""Plots of a characterisation, by matplotlib (an optional extra: `pip install 'iowarden[plots]'`).

One PNG per sweep, drawn to be read at a glance: IOPS and p99 against queue depth with the
knee marked; MiB/s and IOPS against block size with the turn to bandwidth-bound; IOPS against
working-set size (log scale) with the cache knee; and for --compare, both runs' IOPS per sweep.
"""
from __future__ import annotations

import os

from iowarden.daemon.commands import characterize as ch


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")   # files only: no display on a server
    import matplotlib.pyplot as plt
    return plt


def write_plots(points: list[ch.Point], found: dict, out_dir: str, title: str) -> list[str]:
    plt = _pyplot()
    written = []
    by = {}
    for p in points:
        if p.ok:
            by.setdefault(p.sweep, []).append(p)
    if "qd" in by:
        pts = sorted(by["qd"], key=lambda p: p.value)
        fig, ax = plt.subplots(figsize=(7, 4.2))
        ax.plot([p.value for p in pts], [p.iops for p in pts], "o-", color="tab:blue", label="IOPS")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("queue depth (4k random read)")
        ax.set_ylabel("IOPS", color="tab:blue")
        ax.set_ylim(bottom=0)
        ax2 = ax.twinx()
        ax2.plot([p.value for p in pts], [(p.p99_seconds or 0) * 1000 for p in pts], "s--", color="tab:red",
                 label="p99")
        ax2.set_ylabel("p99 latency (ms)", color="tab:red")
        ax2.set_ylim(bottom=0)
        knee = found.get("qd", {}).get("knee_depth")
        if knee:
            ax.axvline(knee, color="gray", linestyle=":")
            ax.annotate(f"knee: QD {knee}", (knee, max(p.iops for p in pts) * 0.5), rotation=90, va="center",
                        ha="right", color="gray")
        ax.set_title(f"{title}: queue depth")
        written.append(_save(fig, plt, out_dir, "qd.png"))
    if "bs" in by:
        pts = sorted(by["bs"], key=lambda p: p.value)
        fig, ax = plt.subplots(figsize=(7, 4.2))
        ax.plot([p.value / 1024 for p in pts], [p.bw_bytes / 2 ** 20 for p in pts], "o-", color="tab:green")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (KiB), random read QD 16")
        ax.set_ylabel("MiB/s", color="tab:green")
        ax.set_ylim(bottom=0)
        ax2 = ax.twinx()
        ax2.plot([p.value / 1024 for p in pts], [p.iops for p in pts], "s--", color="tab:blue")
        ax2.set_ylabel("IOPS", color="tab:blue")
        ax2.set_ylim(bottom=0)
        turn = found.get("bs", {}).get("bandwidth_bound_from_bytes")
        if turn:
            ax.axvline(turn / 1024, color="gray", linestyle=":")
            ax.annotate(f"bandwidth-bound from {ch._size(turn)}", (turn / 1024, 0), rotation=90, va="bottom",
                        ha="right", color="gray")
        ax.set_title(f"{title}: block size")
        written.append(_save(fig, plt, out_dir, "bs.png"))
    if "working-set" in by:
        pts = sorted(by["working-set"], key=lambda p: p.value)
        fig, ax = plt.subplots(figsize=(7, 4.2))
        ax.plot([p.value / 2 ** 20 for p in pts], [p.iops for p in pts], "o-", color="tab:purple")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("working set (MiB), 4k random read QD 16")
        ax.set_ylabel("IOPS")
        knee = found.get("working-set", {}).get("cache_knee_bytes")
        if knee:
            ax.axvline(knee / 2 ** 20, color="gray", linestyle=":")
            ax.annotate(f"cache knee: {ch._size(knee)}", (knee / 2 ** 20, min(p.iops for p in pts)), rotation=90,
                        va="bottom", ha="right", color="gray")
        ax.set_title(f"{title}: working set")
        written.append(_save(fig, plt, out_dir, "working-set.png"))
    for sweep in ("jobs", "mix", "qd-write"):
        if sweep in by:
            pts = sorted(by[sweep], key=lambda p: p.value)
            fig, ax = plt.subplots(figsize=(7, 4.2))
            ax.plot([p.value for p in pts], [p.iops for p in pts], "o-")
            ax.set_xlabel({"jobs": "jobs (QD 8 each)", "mix": "read share (%)", "qd-write": "queue depth (4k random write)"}[sweep])
            ax.set_ylabel("IOPS")
            ax.set_title(f"{title}: {sweep}")
            written.append(_save(fig, plt, out_dir, f"{sweep}.png"))
    return written


def write_compare_plot(rows, names: tuple[str, str], out_path: str) -> str:
    plt = _pyplot()
    sweeps = list(dict.fromkeys(r[0] for r in rows))
    fig, axes = plt.subplots(len(sweeps), 1, figsize=(7, 3.2 * len(sweeps)), squeeze=False)
    for ax, sweep in zip(axes[:, 0], sweeps):
        pts = [r for r in rows if r[0] == sweep]
        for idx, (name, style) in enumerate(zip(names, ("o-", "s--"))):
            xs = [r[1] for r in pts if r[2 + idx] is not None]
            ys = [r[2 + idx] for r in pts if r[2 + idx] is not None]
            ax.plot(xs, ys, style, label=name)
        if sweep in ("qd", "bs", "working-set", "jobs", "qd-write"):
            ax.set_xscale("log", base=2)
        ax.set_title(sweep)
        ax.set_ylabel("IOPS")
        ax.legend()
    _plain_ticks(fig)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path


def _plain_ticks(fig) -> None:
    """1, 2, 4, ... 64 on a log-2 axis, not 2^0 .. 2^6."""
    from matplotlib.ticker import FuncFormatter
    for ax in fig.axes:
        if ax.get_xscale() == "log":
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))


def _save(fig, plt, out_dir: str, name: str) -> str:
    _plain_ticks(fig)
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.savefig(path[:-4] + ".svg")   # the same plot, to scale in a report or a browser
    plt.close(fig)
    return path
