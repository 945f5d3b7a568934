"""What a characterize run found, and its tables: pure functions of its points (characterize_cmd runs them)."""
from __future__ import annotations

from iowarden.daemon.commands import characterize as ch
from iowarden.daemon.commands.tables import table
from iowarden.daemon.wording import latency_columns


def _largest(points: list[ch.Point]) -> int | None:
    """The last step of a sweep that measured: a finding there is the edge of the range, not a turn in it."""
    ok = [p.value for p in ch.trusted(points) if p.ok]
    return max(ok) if len(ok) > 1 else None


def findings(points: list[ch.Point], not_measured: list[dict] = ()) -> dict:
    """What the sweeps show, each saying what it did not measure: its steps left out by a budget or an interrupt
    (`not_measured`: sweep, step, why) and a knee or a turn at the last step measured, which is beyond the range
    (`beyond_range`), not a knee."""
    out = {}
    qd = [p for p in points if p.sweep == "qd"]
    if qd:
        depth, sat = ch.knee(ch.trusted(qd))
        out["qd"] = {"knee_depth": depth, "saturation_iops": sat, "confidence": ch.confidence(qd),
                     "beyond_range": depth is not None and depth == _largest(qd)}
    ws = [p for p in points if p.sweep == "working-set"]
    if ws:
        out["working-set"] = {"cache_knee_bytes": ch.cache_knee(ws)}
    bs = [p for p in points if p.sweep == "bs"]
    if bs:
        bound = ch.bandwidth_bound_from(ch.trusted(bs))
        ok = [p for p in ch.trusted(bs) if p.ok]
        best = max(ok, key=lambda p: p.bw_bytes, default=None)
        out["bs"] = {"bandwidth_bound_from_bytes": bound,
                     "bound_bw_bytes": next((p.bw_bytes for p in ok if p.value == bound), None),
                     "best_bw_bytes": best.bw_bytes if best else None,
                     "best_bw_block_bytes": best.value if best else None, "confidence": ch.confidence(bs),
                     "beyond_range": bound is not None and (bound == _largest(bs)
                                                         or ch.still_rising_after(ch.trusted(bs), bound))}
    for gap in not_measured:
        f = out.setdefault(gap["sweep"], {})
        f.setdefault("not_measured", []).append(gap["step"])
        f["not_measured_why"] = gap["why"]
        if "confidence" in f:
            f["confidence"] = {**f["confidence"], "trusted": False}
    return out


def not_measured_lines(found: dict, points: list[ch.Point]) -> list[str]:
    """A sweep's steps that were asked for and not measured, and why (said in the tables and the findings)."""
    return [f"{sweep}: not measured: " + ("the whole sweep, steps " if not any(p.sweep == sweep for p in points)
                                          else "steps ")
            + f"{', '.join(map(str, f['not_measured']))} ({f['not_measured_why']})"
            for sweep, f in found.items() if f.get("not_measured")]


def render_tables(points: list[ch.Point], found: dict) -> str:
    parts = []
    for sweep in dict.fromkeys(p.sweep for p in points):
        pts = [p for p in points if p.sweep == sweep]
        head = {"qd": "queue depth (4k random read)", "qd-write": "queue depth (4k random write)",
                "bs": "block size (random read, QD 16)", "jobs": "jobs (4k random read, QD 8 each)",
                "mix": "read share (4k random, QD 16)",
                "working-set": "working set (4k random read, QD 16)"}[sweep]
        lat_headers, lat_rows = latency_columns({
            "mean": [p.mean_latency_seconds if p.ok else None for p in pts],
            "p99": [p.p99_seconds if p.ok else None for p in pts],
            "p99.9": [p.p999_seconds if p.ok else None for p in pts]})
        rows = [[ch.Step(sweep, p.value, None).label if sweep != "mix" else f"{p.value}%",
                 f"{p.iops:.0f}" if p.ok else "FAILED", f"{p.bw_bytes / 1048576:.1f}" if p.ok else p.error, *lat]
                for p, lat in zip(pts, lat_rows)]
        parts.append(head + "\n" + table(["step", "IOPS", "MiB/s", *lat_headers], rows))
    for sweep, f in found.items():
        c = f.get("confidence") or {}
        if c.get("left_out"):
            parts.append(f"{sweep}: steps {', '.join(map(str, c['left_out']))} out of line twice (the device busy, or a "
                         "figure against the sweep's shape): left out; what follows may not be the volume's")
        elif c.get("measured_again"):
            parts.append(f"{sweep}: steps {', '.join(map(str, c['measured_again']))} measured again (out of line the "
                         f"first time); the two runs differ by {c['repeat_spread']:.0%} at most")
    parts += not_measured_lines(found, points)
    if (found.get("qd") or {}).get("saturation_iops") and found["qd"].get("beyond_range"):
        parts.append(f"no knee within the queue depths measured: IOPS still rising at queue depth "
                     f"{found['qd']['knee_depth']}, the deepest ({found['qd']['saturation_iops']:,.0f} IOPS, at least; "
                     "the knee is beyond the range measured)")
    elif (found.get("qd") or {}).get("saturation_iops"):
        parts.append(f"knee at queue depth {found['qd']['knee_depth']}; saturation {found['qd']['saturation_iops']:,.0f}"
                     " IOPS")
    if (found.get("bs") or {}).get("bandwidth_bound_from_bytes") and found["bs"].get("beyond_range"):
        parts.append(f"no turn to bandwidth-bound within the block sizes measured: MiB/s still rising at "
                     f"{ch._size(found['bs']['bandwidth_bound_from_bytes'])}, the largest (beyond the range measured)")
    elif (found.get("bs") or {}).get("bandwidth_bound_from_bytes"):
        b = found["bs"]
        # the figure quoted is the one at the block size named; the best, when elsewhere, is said as such
        best = (f"; {b['best_bw_bytes'] / 1048576:,.1f} MiB/s at most, at {ch._size(b['best_bw_block_bytes'])}"
                if b.get("best_bw_block_bytes") not in (None, b["bandwidth_bound_from_bytes"]) else "")
        parts.append(f"bandwidth-bound from {ch._size(b['bandwidth_bound_from_bytes'])} blocks "
                     f"({b['bound_bw_bytes'] / 1048576:,.1f} MiB/s there{best}); IOPS-bound below")
    if "cache_knee_bytes" in (found.get("working-set") or {}):
        k = found["working-set"]["cache_knee_bytes"]
        parts.append(f"cache knee: IOPS fall past a {ch._size(k)} working set" if k else
                     "no cache knee in the working sets measured")
    return "\n\n".join(parts)
