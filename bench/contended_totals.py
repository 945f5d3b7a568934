"""What a busy device delivered in total during each contended probe, over that probe's normal, from the runs
`bench/soak.py --keep DIR` kept: the figure the contended judgement (daemon/verdicts/contended.py) reads.

    .venv/bin/python bench/contended_totals.py DIR/seed-S [DIR/seed-T ...] [--lowest 8]

    .venv/bin/python bench/contended_totals.py DIR/seed-S ... --window soakC/seed-287:vol2:04:07:00-04:16:00

Per seed: every contended probe whose profile has a normal in the kept state database, lowest ratio first,
with its time, volume, profile, queue depth (the profile's), its own IOPS, the device's total and the device's
own latency for its load over its normal (the journal says it). Each probe is labelled: "fault" on the volume
of a throttle or a collapse while it held (the seed's faults.json, written by bench/soak.py --keep, or
--window for a seed kept before it was), "healthy" outside every fault window (and not in the ten minutes after
one) once its profile was armed, else "-" (a profile still learning, whose probes the judgement cannot read; a
noisy neighbour's victim, a host-wide contention: other rules' faults, not this one's).

Then the thresholds of daemon/verdicts/contended.py chosen by leaving one seed out: for each seed, the shallow
and deep shortfalls and the device's agreement are chosen on the other seeds alone (the geometric middle of the
gap between their healthy and fault probes, where one exists) and the held-out seed's probes are judged by
them: its healthy probes that would strike, its fault probes that would not. The shipped constants are judged
on every seed beside them.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import sqlite3
import statistics
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from iowarden.daemon.verdicts.contended import CONTENDED_HALF


# the probe's one line in the daemon's journal (daemon/core/knowledge.py)
LINE = re.compile(r"^(\S+) (\S+) INFO probe (\S+)/(\S+) on (\S+): read (\d+) IOPS, write (\d+) IOPS.*\(contended\): "
                  r"the busy disk delivered (\d+) IOPS, ([\d.]+) MiB/s[^;]*(?:; the device at ([\d.]+)x its normal latency)?")
MAX_LOG_BYTES = 256 << 20


def normals(db: sqlite3.Connection, metrics=("read_iops", "write_iops")) -> dict[tuple[str, str], float]:
    """(identity, profile) -> the profile's normal IOPS (read and write; or bytes a second with `metrics`
    read_bw_bytes, write_bw_bytes), the median of its learned values."""
    out: dict[tuple[str, str], float] = {}
    for identity, profile, state in db.execute(
            f"SELECT identity, profile, state FROM baselines WHERE metric IN ({','.join('?' * len(metrics))})",
            metrics):
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


@dataclass(frozen=True)
class Row:
    ratio: float          # the device's total over the probe's normal: the larger of IOPS and bytes, as the
                          # judgement reads it (short only when both are short)
    seed: str
    at: str               # HH:MM:SS
    target: str
    profile: str
    depth: int | None
    probe_iops: int
    total_iops: int
    normal_iops: int
    own: float | None     # the device's own latency for its load over its normal (None: not said)
    recorded: bool        # the journal line carries the context (a journal from before it did: agreement unknown)
    label: str            # "fault", "healthy" or "-"
    unix: float = 0.0
    floor_ratio: float = 0.0   # the smaller of the two: a saturating probe at half its normal in both is whole
    cpu: float | None = None   # tasks waiting for a CPU during the probe, % of the time (None: not said)


AFTER_FAULT_SECONDS = 600.0
WARMUP = 12   # the example's [detector] warmup_probes: a profile is judged after this many quiet probes
PAGED_BY_THIS = ("throttle", "collapse")


def windows_of(kept: Path, given: list[str]) -> list[tuple[str, str | None, float, float]]:
    """(kind, target, from, to) in unix time: the seed's faults.json, or --window SEED:TARGET:HH:MM:SS-HH:MM:SS
    (a throttle or collapse on that day of the seed's log)."""
    out = []
    f = kept / "faults.json"
    if f.exists():
        out += [(x["kind"], x["target"], x["from"], x["to"]) for x in json.loads(f.read_text())]
    return out + [w for w in given_windows(given, kept)]


def given_windows(given: list[str], kept: Path):
    day = None
    for spec in given:
        seed, target, span = spec.split(":", 2)
        if seed != run_name(kept):
            continue
        if day is None:
            with open(kept / "daemon-1.log", errors="replace") as f:
                day = f.readline().split(" ", 1)[0]
        a, b = span.split("-")
        yield ("throttle", target, _unix(day, a), _unix(day, b))


def run_name(kept: Path) -> str:
    """A kept seed's name in the report: its directory and the one it was kept in (a seed is run more than once)."""
    return f"{kept.parent.name}/{kept.name}"


def _unix(day: str, hms: str) -> float:
    return datetime.datetime.fromisoformat(f"{day}T{hms}").timestamp()


def rows_of(kept: Path, depth_of: dict[str, int], given: list[str]) -> list[Row]:
    with sqlite3.connect(f"file:{kept / 'state' / 'state.db'}?mode=ro", uri=True) as db:
        identity = dict(db.execute("SELECT target, identity FROM probe_results GROUP BY target"))
        normal = normals(db)
        normal_bytes = normals(db, ("read_bw_bytes", "write_bw_bytes"))
        # when each profile was armed: its WARMUP-th quiet probe (before it, the judgement had no normal to read)
        quiet: dict[tuple[str, str], list[float]] = {}
        for target, profile, started in db.execute(
                "SELECT target, profile, started_at FROM probe_results WHERE ok AND NOT contended ORDER BY started_at"):
            quiet.setdefault((target, profile), []).append(started)
    armed_at = {k: v[WARMUP - 1] for k, v in quiet.items() if len(v) >= WARMUP}
    wins = windows_of(kept, given)
    out = []
    with open(kept / "daemon-1.log", errors="replace") as f:
        for line in f.read(MAX_LOG_BYTES).splitlines():
            m = LINE.match(line)
            if not m:
                continue
            day, at, target, profile, _, read, write, total, mib, own = m.groups()
            n = normal.get((identity.get(target), profile))
            if not n:
                continue
            nb = normal_bytes.get((identity.get(target), profile))
            ratio = max(int(total) / n, float(mib) * (1 << 20) / nb if nb else 0.0)
            floor = min(int(total) / n, float(mib) * (1 << 20) / nb if nb else 0.0)
            t = _unix(day, at[:8])
            label = "healthy" if t >= armed_at.get((target, profile), math.inf) else "-"
            for kind, where, a, b in wins:
                if kind in PAGED_BY_THIS and where == target and a <= t <= b + 60:
                    label = "fault"
                    break
                if a <= t <= b + AFTER_FAULT_SECONDS and (where is None or where == target):
                    label = "-"
            out.append(Row(ratio, run_name(kept), at[:8], target, profile, depth_of.get(profile),
                           int(read) + int(write), int(total), round(n), float(own) if own else None,
                           "tasks waited for a CPU" in line, label, t, floor,
                           float(cpu.group(1)) if (cpu := CPU.search(line)) else None))
    return sorted(out, key=lambda r: r.ratio)


CPU = re.compile(r"tasks waited for a CPU (\d+) %")
QUIET = re.compile(r"^(\S+) (\S+) INFO probe (\S+)/(\S+) on (\S+): read \d+ IOPS, write \d+ IOPS")


def quiet_of(kept: Path) -> list[tuple[float, str]]:
    """(unix time, target) of every quiet probe in the kept journal: they age a volume's count of strikes."""
    out = []
    with open(kept / "daemon-1.log", errors="replace") as f:
        for line in f.read(MAX_LOG_BYTES).splitlines():
            m = QUIET.match(line)
            if m and "(contended)" not in line:
                out.append((_unix(m.group(1), m.group(2)[:8]), m.group(3)))
    return out


def middle(healthy: list[float], fault: list[float], fault_below: bool = True) -> float | None:
    """The geometric middle of the gap between the two groups (faults below healthy, or above with
    fault_below False); None where they overlap or a group is empty."""
    if not healthy or not fault:
        return None
    lo, hi = (max(fault), min(healthy)) if fault_below else (max(healthy), min(fault))
    return math.sqrt(lo * hi) if 0 < lo < hi else None


def strikes(r: Row, shallow_at: float, deep_at: float, agree_at: float, saturating: int) -> bool:
    deep = (r.depth or saturating) >= saturating
    short = r.ratio < (deep_at if deep else shallow_at)
    # the soaks' faults are cgroup limits (the judgement's other way to agree): a fault probe agrees by it; a
    # line that says no device latency had its last window unjudged, which the judgement takes as agreeing
    agrees = r.label == "fault" or r.own is None or r.own >= agree_at
    return short and agrees


def nested(rows: list[Row], saturating: int, shipped: tuple[float, float, float]) -> list[str]:
    seeds = sorted({r.seed for r in rows})
    out = []
    for held in seeds:
        train = [r for r in rows if r.seed != held and r.label != "-"]
        test = [r for r in rows if r.seed == held and r.label != "-"]

        def of(group, deep):
            return [r.ratio for r in train if r.label == group and ((r.depth or saturating) >= saturating) == deep]
        shallow_at = middle(of("healthy", False), of("fault", False))
        deep_at = middle(of("healthy", True), of("fault", True))
        # agreement: the healthy probes a shortfall would strike, against nothing (faults agree by their limit):
        # the device's latency just above the highest such healthy probe's
        short_healthy = [r.own for r in train if r.label == "healthy" and r.recorded and r.own is not None
                         and r.ratio < ((deep_at or shipped[1]) if (r.depth or saturating) >= saturating
                                        else (shallow_at or shipped[0]))]
        agree_at = max(max(short_healthy, default=0.0) * 1.25, shipped[2])
        chosen = (shallow_at or shipped[0], deep_at or shipped[1], agree_at)
        known = [r for r in test if r.recorded or r.label == "fault"]
        unknown = [r for r in test if r not in known and r.label == "healthy"
                   and r.ratio < (shipped[1] if (r.depth or saturating) >= saturating else shipped[0])]
        bad = lambda at: ([r for r in known if r.label == "healthy" and strikes(r, *at, saturating)],
                          [r for r in known if r.label == "fault" and not strikes(r, *at, saturating)])
        fp, fn = bad(chosen)
        sfp, sfn = bad(shipped)
        n_h, n_f = sum(r.label == "healthy" for r in known), sum(r.label == "fault" for r in known)
        out.append(f"  held out {held}: chosen on the others shallow {_f(shallow_at)}, deep {_f(deep_at)}, agree "
                   f"{agree_at:.2f}x -> of {n_h} healthy, {len(fp)} would strike; of {n_f} fault, {len(fn)} would "
                   f"not | shipped: {len(sfp)} and {len(sfn)}"
                   + (f"; {len(unknown)} healthy short by the shipped shortfall in a journal that did not record "
                      "the device's latency (agreement unknown)" if unknown else "")
                   + "".join(f"\n      strikes, healthy: {r.at} {r.target}/{r.profile} {r.ratio:.4f} at {r.own}x"
                             for r in sfp)
                   + "".join(f"\n      misses, fault: {r.at} {r.target}/{r.profile} {r.ratio:.4f}" for r in sfn))
    return out


def raises(rows: list[Row], at: tuple[float, float, float], saturating: int, need: int, span: int = 0,
           quiet: dict[str, list[tuple[float, str]]] | None = None) -> list[str]:
    """What the volume's count makes of the probes, as the judgement counts it (verdicts/contended.counted): `need`
    strikes on a volume (any profile) raise; a contended probe that shows the volume whole (saturating, half its
    normal or more in IOPS and bytes) or is short with nothing agreeing ends the run, and any other probe (a quiet
    one of `quiet`, per seed) leaves it for at most `span` probes after the last strike (0: strictly in a row).
    Per raise: when, on what, and whether its probes were all healthy (a false page, were no other layer to hold
    it)."""
    out = []
    for seed in sorted({r.seed for r in rows}):
        run: dict[str, list[Row]] = {}
        since: dict[str, int] = {}
        probes = [(r.unix, r.target, r) for r in rows if r.seed == seed]
        probes += [(t, target, None) for t, target in (quiet or {}).get(seed, [])]
        for _, target, r in sorted(probes, key=lambda x: x[0]):
            if r is None or not strikes(r, *at, saturating):
                deep = r is not None and (r.depth or saturating) >= saturating
                short = r is not None and r.ratio < (at[1] if deep else at[0])
                whole = deep and r.floor_ratio >= CONTENDED_HALF
                since[target] = since.get(target, 0) + 1
                if whole or short or since[target] > span:
                    run.pop(target, None)
                continue
            since[target] = 0
            run.setdefault(r.target, []).append(r)
            if len(run[r.target]) == need:
                labels = {x.label for x in run[r.target]}
                kind = "FALSE" if labels == {"healthy"} else "fault" if "fault" in labels else "unarmed"
                out.append(f"  {seed} {r.at} {r.target}: raise ({kind}) on "
                           + ", ".join(f"{x.profile} {x.ratio:.4f} at {x.own or '-'}x" for x in run[r.target]))
    return out


AGREE_CANDIDATES = (1.25, 1.5, 2.0, 3.0, 5.0, 10.0)


def nested_raises(rows: list[Row], shipped: tuple[float, float, float], saturating: int, need: int) -> list[str]:
    """The device's agreement chosen by leaving one run out, on what pages (the replayed run of strikes), not on
    single probes: on the other runs, the smallest of AGREE_CANDIDATES that raises on no healthy volume; then the
    held-out run replayed with it: its false raises, and its fault volumes raised and not."""
    out = []
    for held in sorted({r.seed for r in rows}):
        train = [r for r in rows if r.seed != held]
        test = [r for r in rows if r.seed == held]
        chosen = next((a for a in AGREE_CANDIDATES
                       if not any("(FALSE)" in x for x in raises(train, (shipped[0], shipped[1], a), saturating, need))),
                      None)
        if chosen is None:
            out.append(f"  held out {held}: no agreement of {AGREE_CANDIDATES} raises on no healthy volume of the others")
            continue
        got = raises(test, (shipped[0], shipped[1], chosen), saturating, need)
        faults = {(r.target) for r in test if r.label == "fault"}
        raised = {x.split()[2].rstrip(":") for x in got if "(fault)" in x}
        out.append(f"  held out {held}: chosen {chosen}x -> {sum('(FALSE)' in x for x in got)} false raises; "
                   f"fault volumes raised {len(raised & faults)} of {len(faults)}")
    return out


SPAN_CANDIDATES = (0, 1, 2, 3, 4, 6, 8)


def nested_span(rows: list[Row], shipped: tuple[float, float, float], saturating: int, need: int,
                quiet: dict[str, list[tuple[float, str]]]) -> list[str]:
    """The count's span (contended.STRIKE_SPAN_PROBES) chosen by leaving one run out: on the other runs, the
    longest of SPAN_CANDIDATES that raises on no healthy volume (the longer, the sooner a fault short for one
    profile pages); then the held-out run replayed with it: its false raises, its fault volumes raised and when."""
    out = []
    for held in sorted({r.seed for r in rows}):
        train = [r for r in rows if r.seed != held]
        test = [r for r in rows if r.seed == held]
        clean = [s for s in SPAN_CANDIDATES
                 if not any("(FALSE)" in x for x in raises(train, shipped, saturating, need, s, quiet))]
        chosen = max(clean, default=None)
        if chosen is None:
            out.append(f"  held out {held}: every span of {SPAN_CANDIDATES} raises on a healthy volume of the others")
            continue
        got = raises(test, shipped, saturating, need, chosen, quiet)
        faults = {r.target for r in test if r.label == "fault"}
        first = {}
        for x in got:
            if "(fault)" in x:
                first.setdefault(x.split()[2].rstrip(":"), x.split()[1])
        out.append(f"  held out {held}: chosen span {chosen} -> {sum('(FALSE)' in x for x in got)} false raises; "
                   f"fault volumes raised {len(set(first) & faults)} of {len(faults)}"
                   + "".join(f"; {t} first at {a}" for t, a in sorted(first.items())))
    return out


def nested_recovered(rows: list[Row], starved_percent: float, shipped: float) -> list[str]:
    """The passive view's "back" on a starved CPU (contended.STARVED_PASSIVE_RECOVERED_SLOWDOWN) chosen by leaving one
    run out: on the other runs, the geometric middle of the gap between the device's latency over its normal at
    armed healthy probes on a starved CPU (what a volume that is back reads there) and at the probes of a throttle
    or collapse on a starved CPU (what one still faulty reads); then the held-out run judged by it: its healthy
    probes above it (a volume back that the bar would not call back) and its fault probes at or under it (one still
    faulty it would, were no cgroup limit on its stack to keep the free CPU's bar: the soaks' faults are limits)."""
    starved = [r for r in rows if r.cpu is not None and r.cpu >= starved_percent and r.own is not None]
    out = []
    for held in sorted({r.seed for r in rows}):
        train = [r for r in starved if r.seed != held]
        test = [r for r in starved if r.seed == held]
        bar = middle([r.own for r in train if r.label == "healthy"], [r.own for r in train if r.label == "fault"],
                     fault_below=False)
        line = f"  held out {held}: "
        for name, at in (("chosen", bar), ("shipped", shipped)):
            if at is None:
                line += f"{name}: no gap on the others; "
                continue
            high = [r for r in test if r.label == "healthy" and r.own > at]
            under = [r for r in test if r.label == "fault" and r.own <= at]
            line += (f"{name} {at:.2f}x -> of {sum(r.label == 'healthy' for r in test)} healthy, {len(high)} above; "
                     f"of {sum(r.label == 'fault' for r in test)} fault, {len(under)} at or under; ")
        out.append(line.rstrip("; "))
    for label in ("healthy", "fault"):
        got = sorted(r.own for r in starved if r.label == label)
        if got:
            out.append(f"  {label} on a starved CPU: {len(got)} probes, the device at {got[0]:.2f}-{got[-1]:.2f}x "
                       f"(median {statistics.median(got):.2f}x)")
    return out


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("kept", nargs="+", type=Path, help="a seed's directory kept by bench/soak.py --keep")
    ap.add_argument("--lowest", type=int, default=8)
    ap.add_argument("--window", action="append", default=[],
                    help="KEPT-IN/SEED-DIR:TARGET:HH:MM:SS-HH:MM:SS (soakC/seed-287:vol2:04:07:00-04:16:00): a "
                         "throttle or collapse of a seed kept "
                         "without faults.json")
    ap.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[1] / "config.example.toml",
                    help="where the profiles' queue depths are read (the soak runs the example's)")
    args = ap.parse_args()
    from iowarden.daemon.verdicts import contended as c
    depth_of = depths(args.config)
    rows = []
    quiet: dict[str, list[tuple[float, str]]] = {}
    for kept in args.kept:
        mine = rows_of(kept, depth_of, args.window)
        rows += mine
        quiet[run_name(kept)] = quiet_of(kept)
        print(f"== {kept}: {len(mine)} contended probes with a normal "
              f"({sum(r.label == 'fault' for r in mine)} in a throttle or collapse)")
        for r in mine[:args.lowest]:
            print(f"  {r.ratio:.4f}  {r.at} {r.target}/{r.profile} (QD {r.depth}): probe {r.probe_iops} IOPS, "
                  f"device {r.total_iops} in total, normal {r.normal_iops}; device at {r.own or '-'}x; {r.label}")
    sat = c.SATURATING_QUEUE_DEPTH
    for name, deep in (("shallow", False), ("deep", True)):
        for label in ("healthy", "fault"):
            group = sorted((r for r in rows if r.label == label and ((r.depth or sat) >= sat) == deep),
                           key=lambda r: r.ratio)
            if group:
                pick = group[:args.lowest] if label == "healthy" else group[-args.lowest:]
                print(f"== {name} probes, {label}: {len(group)}; {'lowest' if label == 'healthy' else 'highest'}: "
                      + "; ".join(f"{r.ratio:.4f} ({r.seed} {r.at} {r.target}/{r.profile}, device {r.own or '-'}x)"
                                  for r in pick))
    print(f"== leave one seed out (shipped: shallow {c.SHALLOW_SHORTFALL}, deep {c.CONTENDED_SHORTFALL}, device "
          f"agrees at {c.DEVICE_AGREES_SLOWDOWN}x)")
    shipped = (c.SHALLOW_SHORTFALL, c.CONTENDED_SHORTFALL, c.DEVICE_AGREES_SLOWDOWN)
    for line in nested(rows, sat, shipped):
        print(line)
    print(f"== raises by the shipped judgement ({c.SHORT_PROBES_TO_RAISE} strikes on a volume, counted across at "
          f"most {c.STRIKE_SPAN_PROBES} probes that are neither), before the slowed-host layer and the open-alert rules")
    for line in raises(rows, shipped, sat, c.SHORT_PROBES_TO_RAISE, c.STRIKE_SPAN_PROBES, quiet) or ["  none"]:
        print(line)
    print("== the same strictly in a row (span 0)")
    for line in raises(rows, shipped, sat, c.SHORT_PROBES_TO_RAISE, 0, quiet) or ["  none"]:
        print(line)
    print("== the count's span chosen by leaving one run out")
    for line in nested_span(rows, shipped, sat, c.SHORT_PROBES_TO_RAISE, quiet):
        print(line)
    print("== the device's agreement chosen by leaving one run out, on the raises (the shortfalls as shipped)")
    for line in nested_raises(rows, shipped, sat, c.SHORT_PROBES_TO_RAISE):
        print(line)
    print(f"== the passive view's \"back\" on a starved CPU (tasks waiting {c.CPU_STARVED_PERCENT:g} % of the time or "
          f"more) chosen by leaving one run out (shipped {c.STARVED_PASSIVE_RECOVERED_SLOWDOWN:g}x)")
    for line in nested_recovered(rows, c.CPU_STARVED_PERCENT, c.STARVED_PASSIVE_RECOVERED_SLOWDOWN) or ["  none"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
