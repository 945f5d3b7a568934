"""What the service rule (ServiceContended) says on a recorded history of the tracer's counts per cgroup, with and
without the cgroups held to an I/O limit of their own set aside, as a reference in the same run.

    .venv/bin/python bench/service_replay.py --prometheus http://127.0.0.1:PORT [--start UNIX] [--end UNIX]

Reads, from the Prometheus that scraped a daemon (a soak's, `bench/soak.py`), every 15 s step of
iowarden_cgroup_io_requests_total, _bytes_total and _latency_seconds_sum per device, cgroup and direction, and
the limits the daemon exported (iowarden_cgroup_io_limit_iops, _bytes_per_second). Each step's differences are a
window of the rule (daemon/passive/service.py), judged twice: as the daemon judges it, with the limited cgroups
(below the root) left out as victims, and with none left out. Prints each raise and clear of both, and their
counts. The host's other disks are taken as at their normal (no host slowdown): the replay can only raise more
than the daemon did, not less. A window's histogram is its mean's bucket: the rule decides on means; only the
p99 it reports differs. No root.
"""
import argparse
import json
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from iowarden.daemon.passive.service import ServiceParams, ServiceRule  # noqa: E402
from iowarden.probes.blocktrace import CgroupCounts, StageHistogram, bucket_of_ns  # noqa: E402

STEP_SECONDS = 15.0
MAX_RESPONSE_BYTES = 256 << 20


def query_range(url: str, expr: str, start: float, end: float) -> list[dict]:
    out, t0 = [], start
    while t0 < end:   # Prometheus answers at most 11,000 points a series: two-hour chunks
        t1 = min(end, t0 + 7200)
        q = urllib.parse.urlencode({"query": expr, "start": t0, "end": t1, "step": STEP_SECONDS})
        with urllib.request.urlopen(f"{url}/api/v1/query_range?{q}", timeout=120) as r:
            raw = r.read(MAX_RESPONSE_BYTES + 1)
        if len(raw) > MAX_RESPONSE_BYTES:
            raise SystemExit(f"{url}: an answer over {MAX_RESPONSE_BYTES >> 20} MiB for {expr}: give a shorter "
                             "--start/--end")
        body = json.loads(raw)
        out += body["data"]["result"]
        t0 = t1 + STEP_SECONDS
    return out


def series(url, expr, start, end, keys) -> dict:
    """{(label values...): {unix time: value}}"""
    out: dict = {}
    for s in query_range(url, expr, start, end):
        key = tuple(s["metric"].get(k, "") for k in keys)
        out.setdefault(key, {}).update({float(t): float(v) for t, v in s["values"]})
    return out


def windows(url: str, start: float, end: float):
    """(unix time, seconds, {device: {(cgroup, direction): CgroupCounts}}, frozenset(limited cgroups)). A scrape
    that brought no new counts (the tracer prints every 15 s on a clock of its own) is no window: the next one
    covers both, as the daemon's part judges the counts over the time between the tracer's prints."""
    keys = ("device", "cgroup", "direction")
    req = series(url, "iowarden_cgroup_io_requests_total", start, end, keys)
    nbytes = series(url, "iowarden_cgroup_io_bytes_total", start, end, keys)
    secs = series(url, "iowarden_cgroup_io_latency_seconds_sum", start, end, keys)
    limits: dict = {}
    for name in ("iowarden_cgroup_io_limit_iops", "iowarden_cgroup_io_limit_bytes_per_second"):
        for (cgroup,), at in series(url, name, start, end, ("cgroup",)).items():
            for t in at:
                if cgroup != "/":
                    limits.setdefault(t, set()).add(cgroup)
    times = sorted({t for s in req.values() for t in s})
    before = times[0] if times else None
    for t in times[1:]:
        per: dict = {}
        for key, at in req.items():
            if t not in at or before not in at:
                continue
            n = int(at[t] - at[before])
            b = nbytes.get(key, {}).get(t, 0) - nbytes.get(key, {}).get(before, 0)
            ns = int((secs.get(key, {}).get(t, 0) - secs.get(key, {}).get(before, 0)) * 1e9)
            if n <= 0 or ns < 0 or b < 0:
                continue   # idle, or the counters started over (a restart)
            device, cgroup, direction = key
            hist = StageHistogram(((bucket_of_ns(ns // n), n),))
            per.setdefault(device, {})[(cgroup, direction)] = CgroupCounts(n, int(b), ns, hist)
        if not per and t - before < 4 * STEP_SECONDS:
            continue   # nothing new yet: the next scrape's window covers this one
        yield t, t - before, per, frozenset(limits.get(t, ()))
        before = t


def _share(c: CgroupCounts, k: int) -> CgroupCounts:
    """One k-th of a window's counts."""
    n = max(1, c.requests // k)
    return CgroupCounts(n, c.bytes // k, c.ns // k, StageHistogram(((bucket_of_ns(c.ns // c.requests), n),)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--start", type=float, default=None, help="unix seconds (default: 3 hours before --end)")
    ap.add_argument("--end", type=float, default=None, help="unix seconds (default: now)")
    a = ap.parse_args()
    end = a.end or time.time()
    start = a.start or end - 3 * 3600
    rules = {"as the daemon (limited set aside)": ServiceRule(ServiceParams.for_windows_of(STEP_SECONDS)),
             "reference (none set aside)": ServiceRule(ServiceParams.for_windows_of(STEP_SECONDS))}
    said = {name: [] for name in rules}
    steps, first = 0, None
    for t, seconds, per, limited in windows(a.prometheus.rstrip("/"), start, end):
        # two of the tracer's prints between two scrapes were two of the daemon's windows: judged as two halves
        k = max(1, round(seconds / STEP_SECONDS))
        first = first or t - seconds
        part = {d: {key: _share(c, k) for key, c in counts.items()} for d, counts in per.items()}
        for i in range(k):
            steps += 1
            at = t - (k - 1 - i) * STEP_SECONDS
            for name, rule in rules.items():
                lim = limited if name.startswith("as the daemon") else frozenset()
                for device in sorted(set(part) | set(rule.flagged)):
                    for tr in rule.judge(device, part.get(device, {}), seconds / k, at, limited=lim):
                        said[name].append((at, tr))
    print(f"{steps} windows of about {STEP_SECONDS:.0f} s from {time.strftime('%H:%M', time.gmtime(first or start))} "
          f"to {time.strftime('%H:%M', time.gmtime(end))} UTC")
    for name, got in said.items():
        raised = sum(1 for _, tr in got if tr.state == "raised")
        print(f"{name}: {raised} raised")
        for t, tr in got:
            print(f"  {time.strftime('%H:%M:%S', time.gmtime(t))} {tr.state} {tr.summary[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
