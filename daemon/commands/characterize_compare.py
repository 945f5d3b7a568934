"""`iowarden characterize --compare A.json B.json`: two runs side by side, step by step, with the change."""
from __future__ import annotations

import json
import os
import sys

from iowarden.daemon.commands import characterize as ch
from iowarden.daemon.commands.tables import table


def cmd_compare(args) -> int:
    docs = []
    for path in args.compare:
        try:
            with open(path) as f:
                docs.append(json.load(f))
        except (OSError, ValueError) as exc:
            print(f"iowarden characterize: {path}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
            return 2
    rows = ch.compare(docs[0]["points"], docs[1]["points"])
    if args.out:
        from iowarden.daemon.commands import characterize_plots
        from iowarden.daemon.commands.outdir import OutDir, OutDirRefused
        if characterize_plots.available():
            try:
                with OutDir(args.out) as out:
                    path = characterize_plots.write_compare_plot(rows, (os.path.basename(args.compare[0]),
                                                                       os.path.basename(args.compare[1])),
                                                                 out, "compare.png")
            except OutDirRefused as exc:
                print(f"iowarden characterize: --out {exc}", file=sys.stderr)
                return 2
            print(f"plot: {path}", file=sys.stderr)
    out = [{"sweep": sw, "value": v, "a_iops": x, "b_iops": y, "change": c} for sw, v, x, y, c in rows]
    if args.json:
        print(json.dumps({"a": args.compare[0], "b": args.compare[1], "points": out}))
        return 0
    print(f"A: {args.compare[0]} ({docs[0].get('path')})\nB: {args.compare[1]} ({docs[1].get('path')})")
    print(table(["sweep", "step", "A IOPS", "B IOPS", "change"],
                [[sw, ch._size(v) if sw in ("bs", "working-set") else v,
                  f"{x:.0f}" if x is not None else "-", f"{y:.0f}" if y is not None else "-",
                  f"{c:+.1%}" if c is not None else "-"] for sw, v, x, y, c in rows]))
    return 0
