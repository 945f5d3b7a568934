"""The passive detector on real fail-slow traces: drive-level precision and recall.

    .venv/bin/python bench/passive_perseus.py [--data ../shared/data/perseus-dev] [--keep DIR]

Reads the Perseus development sample where it lies (never copied into the
project), converts each host into `iowarden iostat --json` lines (throughput as
rkB/s, latency as r_await in ms: the data's latency is in microseconds by its
magnitude; drives of one host are peers), replays every host through the same
passive detector the daemon runs (daemon.passive_replay), and prints per host
the drives flagged, then precision and recall against labels.csv and, for each
drive found, how long into its trace it was named. With --keep the converted
files are left in DIR, to replay with `iowarden replay --passive FILE`.
"""
import argparse
import csv
import io
import json
import os
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from iowarden.daemon.passive_replay import parse_lines, replay_passive  # noqa: E402


def convert(archive: str) -> dict[str, list[str]]:
    """host ("cluster_A/host_22") -> JSON lines, in time order."""
    rows: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    with tarfile.open(archive) as tar:
        for member in tar:
            if not member.isfile() or not member.name.endswith(".csv"):
                continue
            parts = Path(member.name).parts
            host = "/".join(parts[-3:-1])
            text = io.TextIOWrapper(tar.extractfile(member), encoding="utf-8")
            for r in csv.DictReader(text):
                obj = {"timestamp": int(r["ts"]), "disk_device": r["disk_id"]}
                if r["throughput"] != "NA":
                    obj["rkB/s"] = float(r["throughput"]) / 1024
                if r["latency"] != "NA":
                    obj["r_await"] = float(r["latency"]) / 1000
                rows[host].append((obj["timestamp"], r["disk_id"], json.dumps(obj)))
    return {h: [line for _, _, line in sorted(v)] for h, v in rows.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "perseus-dev")
                    if (ROOT.parent / "shared").exists() else str(ROOT / ".." / "shared" / "data" / "perseus-dev"))
    ap.add_argument("--keep", help="write the converted replay files here")
    args = ap.parse_args()
    archive = os.path.join(args.data, "perseus-dev.tar.xz")
    labels = set()
    with open(os.path.join(args.data, "labels.csv")) as f:
        for r in csv.DictReader(f):
            labels.add((f"{r['cluster']}/{r['host']}", r["disk"]))
    hosts = convert(archive)
    out_dir = args.keep or tempfile.mkdtemp(prefix="perseus-replay-")
    os.makedirs(out_dir, exist_ok=True)
    flagged, drives, first_seen, replay_seconds = set(), set(), {}, 0.0
    print(f"{'host':<20} {'drives':>6} {'days':>4}  flagged by any kind of alert (kinds, hours of its trace "
          "before the first)")
    for host, lines in sorted(hosts.items()):
        path = os.path.join(out_dir, host.replace("/", "_") + ".jsonl")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        parsed = parse_lines(path, "\n".join(lines))
        start = {}
        for line in parsed:
            start.setdefault(line.device, line.timestamp)
            drives.add((host, line.device))
        t0 = time.perf_counter()
        intervals = replay_passive(parsed)
        replay_seconds += time.perf_counter() - t0
        named, kinds = {}, defaultdict(set)
        for i in intervals:
            kinds[i["device"]].add(i["kind"])
            if i["device"] not in named:
                # hours of trace (evening windows only) from its first line to the alert
                seen = sum(1 for x in parsed if x.device == i["device"] and x.timestamp <= i["start"])
                named[i["device"]] = seen * 15 / 3600
        for dev in named:
            flagged.add((host, dev))
            first_seen[(host, dev)] = named[dev]
        days = len({time.strftime("%Y-%m-%d", time.gmtime(x.timestamp)) for x in parsed})
        shown = ", ".join(f"{d}{'*' if (host, d) in labels else ''} ({'+'.join(sorted(kinds[d]))}, "
                          f"{named[d]:.1f} h)" for d in sorted(named))
        print(f"{host:<20} {len({d for h, d in drives if h == host}):>6} {days:>4}  {shown or '-'}")
    tp = len(flagged & labels)
    fp = len(flagged - labels)
    fn = len(labels - flagged)
    print(f"\n{len(drives)} drives, {len(labels)} confirmed slow (* above)")
    print(f"flagged {len(flagged)}: true {tp}, false {fp}; missed {fn}")
    print(f"precision {tp / len(flagged) if flagged else float('nan'):.2f}  recall {tp / len(labels):.2f}")
    for key in sorted(labels & flagged):
        print(f"  {key[0]} {key[1]}: named after {first_seen[key]:.1f} h of its trace")
    windows = sum(len(v) for v in hosts.values())
    print(f"replay: {windows} drive-windows in {replay_seconds:.1f} s "
          f"({replay_seconds / windows * 12 * 720 * 1000:.0f} ms per host-day of 12 drives x 720 windows)")
    print(f"replay files: {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
