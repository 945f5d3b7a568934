"""Plots of a characterisation, by matplotlib (an optional extra: `pip install 'iowarden[plots]'`).

One PNG per sweep, drawn to be read at a glance and alike: IOPS on the left axis in blue in every
plot, the sweep's second measure on the right (p99 against queue depth, MiB/s against block size),
the finding as a dotted line (the knee, the turn to bandwidth-bound, the cache knee), and a legend
naming all three; for --compare, both runs' IOPS per sweep.
"""
from __future__ import annotations


from iowarden.daemon.commands import characterize as ch


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pyplot():
    import matplotlib
    matplotlib.use("Agg")   # files only: no display on a server
    import matplotlib.pyplot as plt
    return plt


IOPS_COLOUR = "tab:blue"
# Per sweep: the x axis's label and scale, what goes on the right axis (label, colour, value of a
# point) and the finding marked with a line. IOPS are always on the left, in blue, in every plot.
_SWEEPS = {
    "qd": dict(x_label="queue depth (4k random read)", x=lambda p: p.value,
               right=("p99 latency (ms)", "tab:red", lambda p: (p.p99_seconds or 0) * 1000),
               marker=lambda found: ((found.get("qd") or {}).get("knee_depth"), lambda v: f"knee: QD {v}", 1)),
    "bs": dict(x_label="block size (KiB), random read QD 16", x=lambda p: p.value / 1024,
               right=("bandwidth (MiB/s)", "tab:green", lambda p: p.bw_bytes / 2 ** 20),
               marker=lambda found: ((found.get("bs") or {}).get("bandwidth_bound_from_bytes"),
                                     lambda v: f"bandwidth-bound from {ch._size(v)}", 1024)),
    "working-set": dict(x_label="working set (MiB), 4k random read QD 16", x=lambda p: p.value / 2 ** 20, y_log=True,
                        marker=lambda found: ((found.get("working-set") or {}).get("cache_knee_bytes"),
                                              lambda v: f"cache knee: {ch._size(v)}", 2 ** 20)),
    "jobs": dict(x_label="jobs (4k random read, QD 8 each)", x=lambda p: p.value),
    "mix": dict(x_label="read share (%), 4k random QD 16", x=lambda p: p.value, x_log=False),
    "qd-write": dict(x_label="queue depth (4k random write)", x=lambda p: p.value,
                     right=("p99 latency (ms)", "tab:red", lambda p: (p.p99_seconds or 0) * 1000)),
}


def write_plots(points: list[ch.Point], found: dict, out, title: str) -> list[str]:
    """One PNG (and SVG) per sweep measured, in the order of _SWEEPS."""
    plt = pyplot()
    written = []
    for sweep, spec in _SWEEPS.items():
        pts = sorted((p for p in points if p.ok and p.sweep == sweep), key=lambda p: p.value)
        if pts:
            fig = sweep_figure(plt, pts, found, f"{title}: {sweep}", **spec)
            written.append(save_figure(fig, plt, out, f"{sweep}.png"))
    return written


def sweep_figure(plt, pts, found, title, x_label, x, right=None, marker=None, x_log=True, y_log=False):
    """A sweep's figure: the steps the findings rest on joined by lines; a step left out of them (out of line
    twice) a hollow grey marker, not joined; a finding at the edge of the range not drawn as a knee; the
    legend below the axes, where no line can cross it."""
    fig, ax = plt.subplots(figsize=(7, 4.6))
    shown, left_out = [p for p in pts if not p.suspect], [p for p in pts if p.suspect]
    xs = [x(p) for p in shown]
    lines = ax.plot(xs, [p.iops for p in shown], "o-", color=IOPS_COLOUR, label="IOPS")
    if left_out:
        lines += ax.plot([x(p) for p in left_out], [p.iops for p in left_out], "o", mfc="none", color="gray",
                         label="left out of the findings (out of line twice)")
    ax.set_xlabel(x_label)
    ax.set_ylabel("IOPS", color=IOPS_COLOUR)
    if x_log:
        ax.set_xscale("log", base=2)
    if y_log:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    if right:
        label, colour, value = right
        ax2 = ax.twinx()
        lines += ax2.plot(xs, [value(p) for p in shown], "s--", color=colour, label=label)
        ax2.set_ylabel(label, color=colour)
        ax2.set_ylim(bottom=0)
    if marker:
        at, text, unit = marker(found)
        if at and not _beyond_range(found, pts[0].sweep):
            lines.append(ax.axvline(at / unit, color="gray", linestyle=":", label=text(at)))
    _legend_below(ax, lines)
    ax.set_title(title)
    return fig


def _beyond_range(found: dict, sweep: str) -> bool:
    return bool((found.get(sweep) or {}).get("beyond_range"))


def _legend_below(ax, lines) -> None:
    ax.legend(lines, [line.get_label() for line in lines], loc="upper center", bbox_to_anchor=(0.5, -0.16),
              ncol=min(3, len(lines)), fontsize="small", frameon=False)


def write_compare_plot(rows, names: tuple[str, str], out, file_name: str) -> str:
    plt = pyplot()
    return save_figure(compare_figure(plt, rows, names), plt, out, file_name, svg=False)


def compare_figure(plt, rows, names: tuple[str, str]):
    """Both runs' IOPS per sweep, one panel each, each legend below its panel."""
    sweeps = list(dict.fromkeys(r[0] for r in rows))
    fig, axes = plt.subplots(len(sweeps), 1, figsize=(7, 3.6 * len(sweeps)), squeeze=False)
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
        _legend_below(ax, ax.get_lines())
    return fig


def _plain_ticks(fig) -> None:
    """1, 2, 4, ... 64 on a log-2 axis, not 2^0 .. 2^6."""
    from matplotlib.ticker import FuncFormatter
    for ax in fig.axes:
        if ax.get_xscale() == "log":
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))


def save_figure(fig, plt, out, name: str, svg: bool = True) -> str:
    """Into an OutDir (outdir.py): each file created by the command, never through a link found there."""
    _plain_ticks(fig)
    fig.tight_layout()
    with out.open(name, "wb") as f:   # "tight": the legend below the axes is inside the picture
        fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
    if svg:   # the same plot, to scale in a report or a browser
        with out.open(name[:-4] + ".svg", "wb") as f:
            fig.savefig(f, format="svg", bbox_inches="tight")
    plt.close(fig)
    return out.join(name)
