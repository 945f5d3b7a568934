"""The shipped fleet rules on the real fail-slow traces, every drive a one-volume host of its cluster's class,
evaluated by a real vmalert over the history in a real VictoriaMetrics.

    .venv/bin/python bench/fleet_perseus.py [--data ../shared/data/perseus-dev] [--keep DIR]

DATA is the data set's own layout: `cluster_X/host_N/DAY.csv` with `slow_drive_info.csv` beside the clusters
(the public repository's, unpacked), or a directory holding that layout as `*.tar.xz` with the labels file beside
it (the development sample). The same command runs on any part of the data set.

Each drive alone is a host with one volume: no peers on its host, so the passive detector (the daemon's own,
through daemon.passive.replay) judges it by its own normal only, and exports what a daemon exports for the fleet:
iowarden_fleet_slowdown_ratio (its latency over its own normal at its load, the median of five minutes) and
iowarden_fleet_normal_latency_seconds (its own normal by octave of load, once learned), one sample a minute, and
iowarden_volume_class_info with its cluster as its class. Those series go into a
victoria-metrics of this run's (/api/v1/import), and `vmalert -replay` evaluates
packaging/prometheus/iowarden.fleet.rules.yml over them (its expressions as shipped; the alerts' annotations
left out, as vmalert's replay cannot evaluate their `query` templates), writing its recordings and ALERTS back. The trace's days
are three-hour evenings far apart: each cluster's days are laid one after another, a minute apart (`--gap-minutes`),
from one start (the same for every cluster: a class's volumes are only ever compared with each other), so the replay
walks one unbroken series, as the rules see a volume a daemon reports every minute. A gap between days is absence
to the rules, and their evidence is a share of wall-clock minutes: with two hours between three-hour evenings a
four-hour window never holds more than 180 minutes of data, and three quarters of it (the patient tier) is every
minute of one whole evening, a far stricter rule than the file's on a volume reported without a break. Laid end to
end, a day's last hour and the next day's first are one window, which the rules would see of a drive watched
through the hours the trace does not hold if those hours were like the ones it does.

Printed, per cluster and in all: drives, slow drives (the data set's labels), drives with an IowardenFleetOutlier,
precision and recall at the drive level, the hours of each slow drive's trace before its first fleet alert (median
and worst), and each IowardenFleetClassShift with the outliers raised in its class while it fired (a class that
moved together must be one page, not one a drive). The hour's threshold (4 spreads) was set before this data was seen;
the patient tier's (2 spreads over four hours) after looking at it, so the tables below the first choose each
by leaving one cluster out and judge it on the cluster left out.
"""
import argparse
import csv
import io
import json
import math
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from collections import defaultdict, deque
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._support import free_port, stop_session, wait_ready  # noqa: E402

from iowarden.daemon.passive.replay import Line, PassiveReplay, windows_of  # noqa: E402
from iowarden.daemon.passive.values import PassiveParams  # noqa: E402

RULES = Path(__file__).resolve().parents[1] / "packaging" / "prometheus" / "iowarden.fleet.rules.yml"
ROW_SECONDS = 15.0                # the data set's rows: one a drive every 15 s
DAY_GAP_SECONDS = 60              # between one evening's last row and the next's first: a scrape's minute
BASE = 1_700_000_000              # where every cluster's first day is laid (2023-11-14, UTC)


def _csv_rows(text) -> list[tuple[int, str, float | None, float | None]]:
    out = []
    for r in csv.DictReader(text):
        tput = None if r["throughput"] in ("NA", "") else float(r["throughput"])
        lat = None if r["latency"] in ("NA", "") else float(r["latency"])
        out.append((int(r["ts"]), r["disk_id"], tput, lat))
    return out


def read_data(root: Path) -> tuple[dict, set]:
    """({(cluster, host, disk): [(ts, throughput B/s, latency us)]}, {(cluster, host, disk) labelled slow})."""
    drives: dict = defaultdict(list)

    def add(parts: tuple[str, ...], rows) -> None:
        cluster, host = parts[-3], parts[-2]
        for ts, disk, tput, lat in rows:
            drives[(cluster, host, disk)].append((ts, tput, lat))

    archives = sorted(root.glob("*.tar.xz"))
    if archives:
        for archive in archives:
            with tarfile.open(archive) as tar:
                for member in tar:
                    parts = Path(member.name).parts
                    if member.isfile() and member.name.endswith(".csv") and len(parts) >= 3:
                        add(parts, _csv_rows(io.TextIOWrapper(tar.extractfile(member), encoding="utf-8")))
    else:
        for path in sorted(root.glob("cluster_*/host_*/*.csv")):
            with open(path, encoding="utf-8") as f:
                add(path.parts, _csv_rows(f))
    if not drives:
        raise SystemExit(f"{root}: no cluster_X/host_N/DAY.csv here, nor a .tar.xz holding them")
    slow = set()
    with open(root / "slow_drive_info.csv", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            slow.add((r["cluster"], r["host_name"], r["disk_id"]))
    return {k: sorted(v) for k, v in drives.items()}, slow


class DayLayout:
    """A cluster's trace days laid one after another from BASE, each `gap` seconds after the last one's end (its
    longest day's span: the same slot for each day, so a time maps back), and back."""

    def __init__(self, timestamps: list[int], gap: float = DAY_GAP_SECONDS):
        by_day: dict = defaultdict(list)
        for ts in timestamps:
            by_day[time.strftime("%Y-%m-%d", time.gmtime(ts))].append(ts)
        self.starts = [min(v) for _, v in sorted(by_day.items())]
        longest = max(max(v) - min(v) for v in by_day.values())
        self.slot = (longest // 60 + 1) * 60 + gap
        self._index = {d: i for i, d in enumerate(sorted(by_day))}

    def laid(self, ts: float) -> float:
        i = self._index[time.strftime("%Y-%m-%d", time.gmtime(ts))]
        return BASE + i * self.slot + (ts - self.starts[i])

    def original(self, t: float) -> float:
        i = int((t - BASE) // self.slot)
        i = max(0, min(i, len(self.starts) - 1))
        return self.starts[i] + (t - BASE - i * self.slot)

    def end(self) -> float:
        return BASE + len(self.starts) * self.slot


def fleet_signals(rows, params: PassiveParams) -> list[tuple[float, float, tuple]]:
    """The drive alone through the passive detector, as a scrape a minute would see it: (unix time,
    iowarden_fleet_slowdown_ratio, its iowarden_fleet_normal_latency_seconds as FleetNormal values), a minute
    apart."""
    lines = [Line(float(ts), "d", None, {k: v for k, v in (("rkB/s", None if tput is None else tput / 1024),
                                                          ("r_await", None if lat is None else lat / 1000))
                                        if v is not None})
             for ts, tput, lat in rows]
    run = PassiveReplay(params, [])
    out, minute = [], None
    for end, batch in windows_of(lines, params.window_seconds):
        run.observe(end, batch)
        m = int(end // 60)
        if m == minute:
            continue
        minute = m
        d = run.detector.devices.get("d")
        if d is not None and d.fleet_ring:
            out.append((end, math.exp(statistics.median(d.fleet_ring)), run.detector.fleet_normal("d")))
    return out


class Victoria:
    def __init__(self, where: Path):
        self.port = free_port()
        self.log = open(where / "victoria-metrics.log", "w")
        self.proc = subprocess.Popen(["victoria-metrics", f"-storageDataPath={where / 'vm-data'}",
                                      f"-httpListenAddr=127.0.0.1:{self.port}", "-retentionPeriod=100y",
                                      "-search.disableCache"],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_ready(self.proc, self.url + "/health", "victoria-metrics", str(where / "victoria-metrics.log"),
                   seconds=60)

    def import_lines(self, lines: list[str]) -> None:
        req = urllib.request.Request(self.url + "/api/v1/import", data="\n".join(lines).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()

    def flush(self) -> None:
        with urllib.request.urlopen(self.url + "/internal/force_flush", timeout=60) as r:
            r.read()

    def export(self, match: str) -> list[dict]:
        url = self.url + "/api/v1/export?" + urllib.parse.urlencode({"match[]": match})
        with urllib.request.urlopen(url, timeout=300) as r:
            return [json.loads(x) for x in r.read().decode().splitlines() if x.strip()]

    def stop(self) -> None:
        stop_session(self.proc)


def replayable(rules: Path, out: Path) -> Path:
    """The rule file with its alerts' annotations left out: vmalert's replay refuses the `query` template they use
    for their figures ("not supported in replay mode") and stops. Every expression, `for` and label is the file's."""
    doc = yaml.safe_load(rules.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _firsts(series: list[dict], key) -> dict:
    """The first firing time (unix s) of each alert series, by key(labels)."""
    out: dict = {}
    for s in series:
        on = [t / 1000 for t, v in zip(s["timestamps"], s["values"]) if v]
        if on:
            k = key(s["metric"])
            out[k] = min(out.get(k, math.inf), min(on))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "perseus-dev"))
    ap.add_argument("--keep", help="keep the run's files (the database, vmalert's log) here")
    ap.add_argument("--gap-minutes", type=float, default=DAY_GAP_SECONDS / 60,
                    help="minutes between one trace day's last row and the next's first, as laid (default: 1)")
    ap.add_argument("--replayed", help="a --keep directory of an earlier run on the same data and layout: its "
                    "recordings and alerts judged again, nothing replayed (the tables below the first change only "
                    "with this file's choices)")
    a = ap.parse_args()
    for tool in ("victoria-metrics", "vmalert"):
        if shutil.which(tool) is None:
            raise SystemExit(f"needs {tool} (apt-get install victoria-metrics)")
    t0 = time.monotonic()
    drives, slow = read_data(Path(a.data))
    clusters = sorted({c for c, _, _ in drives})
    layouts = {c: DayLayout([ts for (cc, _, _), rows in drives.items() if cc == c for ts, _, _ in rows],
                            gap=a.gap_minutes * 60)
               for c in clusters}
    print(f"{len(drives)} drives ({len(slow & set(drives))} labelled slow) in {len(clusters)} clusters, "
          f"read in {time.monotonic() - t0:.0f} s")
    where = Path(a.replayed or a.keep or tempfile.mkdtemp(prefix="iowarden-fleet-perseus-"))
    where.mkdir(parents=True, exist_ok=True)
    vm = Victoria(where)
    try:
        if not a.replayed:
            t1 = time.monotonic()
            params = PassiveParams()
            samples = 0
            for (cluster, host, disk), rows in sorted(drives.items()):
                signals = fleet_signals(rows, params)
                if not signals:
                    continue
                lay = layouts[cluster]
                stamps = [int(lay.laid(t) * 1000) for t, _, _ in signals]
                own = {"instance": f"{cluster}/{host}", "job": "iowarden", "device": disk,
                       "volume": f"{cluster}/{host}/{disk}"}
                normals: dict = defaultdict(lambda: ([], []))
                for stamp, (_, _, levels) in zip(stamps, signals):
                    for f in levels:
                        values, times = normals[(f.direction, f.load_unit, str(f.octave))]
                        values.append(round(f.median_ms / 1e3, 7))
                        times.append(stamp)
                lines = [json.dumps({"metric": {"__name__": "iowarden_fleet_slowdown_ratio", **own},
                                     "values": [round(r, 4) for _, r, _ in signals], "timestamps": stamps}),
                         json.dumps({"metric": {"__name__": "iowarden_volume_class_info", **own, "class": cluster,
                                                "source": "config"}, "values": [1] * len(stamps), "timestamps": stamps})]
                lines += [json.dumps({"metric": {"__name__": "iowarden_fleet_normal_latency_seconds", **own,
                                                 "direction": direction, "load_unit": unit, "load_octave": octave},
                                      "values": values, "timestamps": times})
                          for (direction, unit, octave), (values, times) in sorted(normals.items())]
                vm.import_lines(lines)
                samples += 2 * len(stamps) + sum(len(v) for v, _ in normals.values())
            vm.flush()
            print(f"the passive detector over every drive alone, and {samples:,} samples imported, in "
                  f"{time.monotonic() - t1:.0f} s")
            t2 = time.monotonic()
            end = max(lay.end() for lay in layouts.values())
            # each rule over the whole range in turn, its results written back before the next reads them: vmalert's
            # remote write sends what it holds every flush interval, and VictoriaMetrics makes what it takes
            # searchable within a second, so the delay between rules is both and more (with a delay shorter than the
            # flush interval a chained rule reads its input before all of it has arrived, and the same data gives
            # different figures); a step of the group's interval (vmalert's queries otherwise ask for one point in
            # five minutes: the evidence would count a fifth)
            replay = subprocess.run(["vmalert", f"-rule={replayable(RULES, where / 'fleet.rules.yml')}",
                                     f"-datasource.url={vm.url}", f"-remoteWrite.url={vm.url}",
                                     f"-replay.timeFrom={_iso(BASE)}", f"-replay.timeTo={_iso(end)}",
                                     "-remoteWrite.flushInterval=1s", "-replay.rulesDelay=5s",
                                     "-datasource.queryStep=1m", "-loggerOutput=stdout"],
                                    capture_output=True, text=True, timeout=7200)
            (where / "vmalert.log").write_text(replay.stdout + replay.stderr)
            if replay.returncode != 0:
                raise SystemExit(f"vmalert -replay exited {replay.returncode}: {(replay.stdout + replay.stderr)[-2000:]}")
            vm.flush()
            print(f"vmalert -replay over {(end - BASE) / 3600:.0f} h of laid days in {time.monotonic() - t2:.0f} s")
        outliers = _firsts(vm.export('ALERTS{alertname="IowardenFleetOutlier",alertstate="firing"}'),
                           lambda m: (m["class"], m["instance"].split("/", 1)[1], m["device"]))
        shifts = vm.export('ALERTS{alertname="IowardenFleetClassShift",alertstate="firing"}')
        out_series = vm.export('ALERTS{alertname="IowardenFleetOutlier",alertstate="firing"}')
        distances = {signal: vm.export(f"iowarden:fleet_{signal}:spreads") for signal in ("slowdown", "normal")}
    finally:
        vm.stop()
        if not (a.keep or a.replayed):
            shutil.rmtree(where, ignore_errors=True)

    def hours_before(drive, t_laid: float) -> float:
        t = layouts[drive[0]].original(t_laid)
        return sum(1 for ts, _, _ in drives[drive] if ts <= t) * ROW_SECONDS / 3600

    print(f"\n{'cluster':<10} {'drives':>6} {'slow':>5} {'named':>6} {'right':>6} {'wrong':>6} {'missed':>7} "
          f"{'precision':>9} {'recall':>7}  hours to the first fleet alert (median, worst)")
    for cluster in clusters + ["all"]:
        mine = {d for d in drives if cluster in ("all", d[0])}
        bad = slow & mine
        named = {d for d in outliers if d in mine}
        right, wrong, missed = named & bad, named - bad, bad - named
        precision = len(right) / len(named) if named else float("nan")
        recall = len(right) / len(bad) if bad else float("nan")
        hours = sorted(hours_before(d, outliers[d]) for d in right)
        when = f"{statistics.median(hours):.1f}, {hours[-1]:.1f}" if hours else "-"
        print(f"{cluster:<10} {len(mine):>6} {len(bad):>5} {len(named):>6} {len(right):>6} {len(wrong):>6} "
              f"{len(missed):>7} {precision:>9.2f} {recall:>7.2f}  {when}")
    for d in sorted(outliers):
        tag = "slow" if d in slow else "HEALTHY"
        print(f"  named {'/'.join(d)} ({tag}) after {hours_before(d, outliers[d]):.1f} h of its trace")
    for d in sorted(slow & set(drives) - set(outliers)):
        print(f"  missed {'/'.join(d)}")
    for s in shifts:
        on = [t / 1000 for t, v in zip(s["timestamps"], s["values"]) if v]
        cls = s["metric"].get("class")
        if not on:
            continue
        lo, hi = min(on), max(on)
        during = {(m["metric"]["instance"], m["metric"]["device"]) for m in out_series
                  if m["metric"].get("class") == cls and any(lo <= t / 1000 <= hi for t in m["timestamps"])}
        print(f"  IowardenFleetClassShift {cls}: {len(on)} minutes firing, from "
              f"{_iso(layouts[cls].original(lo))}; {len(during)} outliers of that class while it fired")
    if not shifts:
        print("  no IowardenFleetClassShift")
    nested(drives, slow, clusters, distances, hours_before)
    return 0


EVIDENCE_MINUTES, EVIDENCE_SHARE = 60, 0.75      # the rule file's: 45 of the last 60 minutes, and now
PATIENT_MINUTES, PATIENT_SPREADS = 240, 2.0     # and its patient tier: 180 of the last 240 minutes two spreads out
THRESHOLD_GRID = (2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
PATIENT_GRID = (1.5, 2.0, 2.5, 3.0, 4.0)
PATIENT_WINDOWS = (120, 180, 240, 360, 480)    # minutes: the patient tier's window, chosen with its threshold
SHIPPED_SPREADS = 4.0
RECENT_MINUTES, RECENT_OUT = 15, 12             # and both tiers' guard: 12 of the last 15 minutes out


def first_out(series: dict, k: float, minutes: int = EVIDENCE_MINUTES) -> float | None:
    """The first minute (unix s) a volume's distance in spreads is past k now, in 12 of the last 15 minutes and in
    three quarters of the last `minutes` (a minute with no value counts as not out), as the rule file's evidence;
    None: never."""
    window: deque = deque()
    recent: deque = deque()
    out_in_window = out_recently = 0
    for t in sorted(series):
        now = series[t] > k
        window.append((t, now))
        recent.append((t, now))
        out_in_window += now
        out_recently += now
        while window[0][0] <= t - minutes * 60:
            out_in_window -= window.popleft()[1]
        while recent[0][0] <= t - RECENT_MINUTES * 60:
            out_recently -= recent.popleft()[1]
        if now and out_in_window >= EVIDENCE_SHARE * minutes and out_recently >= RECENT_OUT:
            return t
    return None


def nested(drives, slow, clusters, distances, hours_before) -> None:
    """The threshold in spreads chosen by leaving one cluster out: on the other clusters, the smallest on a grid at
    which no healthy drive is named (by either signal, each with the rule file's evidence); then judged on the
    cluster left out, which had no say. The rule file ships 4 for both, chosen before this data was seen."""
    by_drive: dict = {}
    for signal, series in distances.items():
        for s in series:
            m = s["metric"]
            key = (m["class"], m["instance"].split("/", 1)[1], m["device"])
            by_drive.setdefault(signal, {}).setdefault(key, {}).update(
                {t / 1000: v for t, v in zip(s["timestamps"], s["values"])})

    def named_at(k: float, signals=("slowdown", "normal"), minutes: int = EVIDENCE_MINUTES) -> dict:
        out = {}
        for signal in signals:
            for d, series in by_drive.get(signal, {}).items():
                t = first_out(series, k, minutes)
                if t is not None:
                    out[d] = min(out.get(d, math.inf), t)
        return out

    table = {k: named_at(k) for k in THRESHOLD_GRID}
    print("\nthe threshold by leaving one cluster out (both signals, the rule file's evidence; chosen: the smallest "
          "on the grid naming no healthy drive of the other clusters)")
    print(f"{'held out':<10} {'chosen':>6} {'named':>6} {'right':>6} {'wrong':>6} {'missed':>7} {'precision':>9} "
          f"{'recall':>7}  hours to the first alert (median)   at the shipped 4: right, wrong")
    total = [0, 0, 0]
    for held in clusters:
        train = {d for d in drives if d[0] != held}
        chosen = next((k for k in THRESHOLD_GRID if not {d for d in table[k] if d in train} - slow),
                      THRESHOLD_GRID[-1])
        mine = {d for d in drives if d[0] == held}
        named = {d for d in table[chosen] if d in mine}
        bad = slow & mine
        right, wrong = named & bad, named - bad
        total = [total[0] + len(right), total[1] + len(wrong), total[2] + len(bad)]
        hours = sorted(hours_before(d, table[chosen][d]) for d in right)
        shipped = {d for d in table[4.0] if d in mine}
        print(f"{held:<10} {chosen:>6.0f} {len(named):>6} {len(right):>6} {len(wrong):>6} {len(bad - named):>7} "
              f"{len(right) / len(named) if named else float('nan'):>9.2f} "
              f"{len(right) / len(bad) if bad else float('nan'):>7.2f}  "
              f"{statistics.median(hours) if hours else float('nan'):>6.1f}{'':>31}{len(shipped & bad)}, "
              f"{len(shipped - bad)}")
    right, wrong, bad = total
    print(f"{'held out, all':<17} {right + wrong:>6} {right:>6} {wrong:>6} {bad - right:>7} "
          f"{right / (right + wrong) if right + wrong else float('nan'):>9.2f} {right / bad:>7.2f}")
    for k in THRESHOLD_GRID:
        per = {c: (len({d for d in table[k] if d[0] == c} & slow), len({d for d in table[k] if d[0] == c} - slow))
               for c in clusters}
        print(f"  at {k:>4.0f} spreads, (right, wrong) per cluster: " + ", ".join(f"{c} {r}, {w}" for c, (r, w)
                                                                             in per.items()))

    # the patient tier beside the shipped hour's: its window and threshold chosen by the clusters not held out,
    # among those that name no healthy drive of theirs the hour's tier does not already name, the one naming the
    # most of their slow drives, then the soonest (the median hours to the first alert), then the longest window
    # and the higher threshold (the more patient of two that do as well)
    fast = table[SHIPPED_SPREADS]
    patient = {(w, k): named_at(k, minutes=w) for w in PATIENT_WINDOWS for k in PATIENT_GRID}

    def both(w: int, k: float) -> dict:
        return {d: min(t for t in (fast.get(d), patient[(w, k)].get(d)) if t is not None)
                for d in set(fast) | set(patient[(w, k)])}

    def merit(w: int, k: float, among: set) -> tuple | None:
        named = {d: t for d, t in both(w, k).items() if d in among}
        if set(named) - slow - {d for d in fast if d in among}:
            return None
        hours = [hours_before(d, t) for d, t in named.items() if d in slow]
        return len(hours), -(statistics.median(hours) if hours else math.inf), w, k

    def folds(title: str, choose) -> None:
        """One table of folds: `choose(train)` gives (window, threshold, how many choices did as well on train)."""
        print(title)
        print(f"{'held out':<10} {'chosen':>12} {'tied':>4} {'named':>6} {'right':>6} {'wrong':>6} {'missed':>7} "
              f"{'precision':>9} {'recall':>7}  hours to the first alert (median, worst)   shipped: right, wrong")
        total = [0, 0, 0]
        hours_all = []
        for held in clusters:
            w, k, tied = choose({d for d in drives if d[0] != held})
            named_all = both(w, k)
            mine = {d for d in drives if d[0] == held}
            named = {d for d in named_all if d in mine}
            bad = slow & mine
            right, wrong = named & bad, named - bad
            total = [total[0] + len(right), total[1] + len(wrong), total[2] + len(bad)]
            hours = sorted(hours_before(d, named_all[d]) for d in right)
            hours_all += hours
            shipped = {d for d in both(PATIENT_MINUTES, PATIENT_SPREADS) if d in mine}
            print(f"{held:<10} {f'{w} min, {k:.1f}':>12} {tied:>4} {len(named):>6} {len(right):>6} {len(wrong):>6} "
                  f"{len(bad - named):>7} {len(right) / len(named) if named else float('nan'):>9.2f} "
                  f"{len(right) / len(bad) if bad else float('nan'):>7.2f}  "
                  + (f"{statistics.median(hours):.1f}, {hours[-1]:.1f}" if hours else "-").ljust(41)
                  + f"{len(shipped & bad)}, {len(shipped - bad)}")
        right, wrong, bad = total
        print(f"{'held out, all':<28} {right + wrong:>6} {right:>6} {wrong:>6} {bad - right:>7} "
              f"{right / (right + wrong) if right + wrong else float('nan'):>9.2f} {right / bad:>7.2f}  "
              + (f"{statistics.median(hours_all):.1f}, {max(hours_all):.1f}" if hours_all else "-"))

    def threshold_alone(train: set) -> tuple:
        ok = [k for k in PATIENT_GRID if merit(PATIENT_MINUTES, k, train) is not None]
        return PATIENT_MINUTES, (ok or PATIENT_GRID[-1:])[0], len(ok)

    def window_and_threshold(train: set) -> tuple:
        scored = [m for w in PATIENT_WINDOWS for k in PATIENT_GRID if (m := merit(w, k, train)) is not None]
        if not scored:
            return PATIENT_WINDOWS[-1], PATIENT_GRID[-1], 0
        best = max(scored)
        return best[2], best[3], sum(1 for m in scored if m[:2] == best[:2])

    folds(f"\nthe patient tier (three quarters of its window's minutes out, and now, and 12 of the last 15) beside "
          f"the hour's at {SHIPPED_SPREADS:.0f} spreads, by leaving one cluster out; first its threshold alone at the "
          f"shipped {PATIENT_MINUTES} minutes (chosen: the smallest of {PATIENT_GRID} naming no healthy drive of the "
          f"other clusters the hour's tier does not; tied: how many did not)", threshold_alone)
    folds(f"\nthen its window ({PATIENT_WINDOWS} minutes) and threshold together (chosen: of those naming no "
          f"healthy drive of the other clusters the hour's tier does not, the one naming most of their slow drives, "
          f"then the soonest, then the more patient; tied: how many named as many as soon; shipped: "
          f"{PATIENT_MINUTES} minutes, {PATIENT_SPREADS:.0f} spreads)", window_and_threshold)
    for w in PATIENT_WINDOWS:
        for k in PATIENT_GRID:
            named_all = both(w, k)
            per = {c: (len({d for d in named_all if d[0] == c} & slow),
                       len({d for d in named_all if d[0] == c} - slow)) for c in clusters}
            hours = sorted(hours_before(d, t) for d, t in named_all.items() if d in slow)
            print(f"  patient {w} min at {k:>3.1f} spreads with the hour's at {SHIPPED_SPREADS:.0f}, (right, wrong) "
                  f"per cluster: " + ", ".join(f"{c} {r}, {wr}" for c, (r, wr) in per.items())
                  + (f"; hours (median, worst) {statistics.median(hours):.1f}, {hours[-1]:.1f}" if hours else ""))


if __name__ == "__main__":
    sys.exit(main())
