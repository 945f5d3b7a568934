"""What a busy device delivered in total during each contended probe, over that probe's normal, from the runs
`bench/soak.py --keep DIR` kept: the figure the contended judgement (daemon/verdicts/contended.py) reads.

    .venv/bin/python bench/contended_totals.py DIR/seed-S [DIR/seed-T ...] [--lowest 8]

Per seed: every contended probe whose profile has a normal in the kept state database, lowest ratio first,
with its time, volume, profile, queue depth (the profile's, from the daemon's log line of its start), its own
IOPS and the device's total. Then, over all seeds, the lowest ratios of shallow (queue depth under
SATURATING_QUEUE_DEPTH) and deep probes. Which of them fell inside a fault is for the reader to say from the
soak's report (its fault times are relative to the fault phase); a healthy soak's are all healthy.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sqlite3
import statistics
import sys
import tomllib
from pathlib import Path


# the probe's one line in the daemon's journal (daemon/core/knowledge.py)
LINE = re.compile(r"^\S+ (\S+) INFO probe (\S+)/(\S+) on (\S+): read (\d+) IOPS, write (\d+) IOPS.*\(contended\): "
                  r"the busy disk delivered (\d+) IOPS, ([\d.]+) MiB/s[^;]*(?:; the device at ([\d.]+)x its normal latency)?")
MAX_LOG_BYTES = 256 << 20


def normals(db: sqlite3.Connection) -> dict[tuple[str, str], float]:
    """(identity, profile) -> the profile's normal IOPS (read and write), the median of its learned values."""
    out: dict[tuple[str, str], float] = {}
    for identity, profile, state in db.execute(
            "SELECT identity, profile, state FROM baselines WHERE metric IN ('read_iops', 'write_iops')"):
        values = json.loads(state).get("values") or []
        if values:   # kept as logarithms
            out[(identity, profile)] = out.get((identity, profile), 0.0) + math.exp(statistics.median(values))
    return out


def depths(config: Path) -> dict[str, int]:
    """profile -> its iodepth, from the soak's configuration (the example's profiles)."""
    try:
        doc = tomllib.loads(config.read_text())
    except (OSError, ValueError):
        return {}
    return {name: int(p.get("iodepth", 1)) for name, p in (doc.get("profiles") or {}).items()}


def rows_of(kept: Path, depth_of: dict[str, int]) -> list[tuple]:
    with sqlite3.connect(f"file:{kept / 'state' / 'state.db'}?mode=ro", uri=True) as db:
        identity = dict(db.execute("SELECT target, identity FROM probe_results GROUP BY target"))
        normal = normals(db)
    out = []
    with open(kept / "daemon-1.log", errors="replace") as f:
        for line in f.read(MAX_LOG_BYTES).splitlines():
            m = LINE.match(line)
            if not m:
                continue
            at, target, profile, _, read, write, total, _, own = m.groups()
            n = normal.get((identity.get(target), profile))
            if n:
                out.append((int(total) / n, at[:8], target, profile, depth_of.get(profile), int(read) + int(write),
                            int(total), round(n), own or "-"))
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kept", nargs="+", type=Path, help="a seed's directory kept by bench/soak.py --keep")
    ap.add_argument("--lowest", type=int, default=8)
    ap.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[1] / "config.example.toml",
                    help="where the profiles' queue depths are read (the soak runs the example's)")
    args = ap.parse_args()
    from iowarden.daemon.verdicts.contended import SATURATING_QUEUE_DEPTH
    depth_of = depths(args.config)
    shallow, deep = [], []
    for kept in args.kept:
        rows = rows_of(kept, depth_of)
        print(f"== {kept}: {len(rows)} contended probes with a normal")
        for r in rows[:args.lowest]:
            print("  %.4f  %s %s/%s (QD %s): probe %d IOPS, device %d in total, normal %d; device at %sx" % r)
        for r in rows:
            (deep if (r[4] or SATURATING_QUEUE_DEPTH) >= SATURATING_QUEUE_DEPTH else shallow).append((r[0], kept.name, *r[1:4]))
    for name, rows in (("shallow", shallow), ("deep", deep)):
        print(f"== {name} probes, all seeds: {len(rows)}; lowest: "
              + "; ".join(f"{r[0]:.4f} ({r[1]} {r[2]} {r[3]}/{r[4]})" for r in sorted(rows)[:args.lowest]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
