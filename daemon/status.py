"""`iowarden status` and `iowarden baseline`: read the daemon's state database, running or not.

Baseline changes asked for here are queued in the database; the daemon applies
them before it judges the next probe of that volume (and at its next start when
it is not running), and logs each one.
"""
from __future__ import annotations

import math
import os
import statistics
import time

from iowarden.probes import blockqueue
from iowarden.probes.common import Roots

from .config import Config
from .scheduler import Budget
from .state import State


def open_state(cfg: Config) -> State:
    path = os.path.join(cfg.section("daemon")["state_dir"], "state.db")
    if not os.path.exists(path):
        raise SystemExit(f"iowarden: no state database at {path}: has `iowarden run -c {cfg.path}` run yet?")
    return State(path, repair=False)   # the daemon owns the file: a CLI never moves it aside


def baseline_rows(state: State) -> list[dict]:
    rows = []
    for identity, profile, metric, learned_at, st in state.load_baselines():
        vals = st["values"]
        centre = math.exp(statistics.median(vals)) if vals else None
        rows.append({"identity": identity, "profile": profile, "metric": metric, "learned_at": learned_at,
                     "samples": len(vals), "baseline": centre, "cusum": round(st["cusum"], 2),
                     "alerting": st.get("shift_alerting", False) or st.get("drift_alerting", False)})
    return rows


def collect(cfg: Config, roots: Roots = Roots()) -> dict:
    state = open_state(cfg)
    try:
        latest = {}
        for rec in reversed(state.probe_results(limit=2000)):
            latest[(rec["target"], rec["profile"])] = rec
        b = cfg.section("budget")
        budget = Budget(b["device_time_ratio"], b["window_seconds"], b["write_bytes_per_day"])
        budget.replay(state.probe_results(limit=5000), blockqueue.read(roots))
        now = time.time()
        return {
            "probes": [latest[k] for k in sorted(latest)],
            "baselines": baseline_rows(state),
            "alerts": state.alerts(open_only=True),
            "drift": [{"at": at, "device": d, "identity": i, "setting": s, "old": o, "new": n}
                      for at, d, i, s, o, n in state.drift_events()[-20:]],
            "budget": {disk: budget.status(disk, now) for disk in budget.disks()},
        }
    finally:
        state.close()


def render(st: dict, table) -> str:
    out = []
    out.append(table(["target", "profile", "device", "last probe", "ok", "r IOPS", "w IOPS", "p99 ms"],
                     [[p["target"], p["profile"], p["device"], time.strftime("%H:%M:%S", time.localtime(
                         p["started_at"])), p["ok"], round(p["read_iops"]), round(p["write_iops"]),
                       p["clat_p99_seconds"] * 1000 if p["clat_p99_seconds"] else None] for p in st["probes"]]))
    out.append("")
    out.append(table(["volume", "profile", "metric", "baseline", "samples", "alerting"],
                     [[b["identity"], b["profile"], b["metric"], b["baseline"], b["samples"], b["alerting"]]
                      for b in st["baselines"]]))
    out.append("")
    if st["alerts"]:
        for a in st["alerts"]:
            ack = f" (acknowledged: {a['ack_note'] or 'no note'})" if a.get("acked_at") else ""
            out.append(f"ALERT #{a['id']} {a['alert']} {a['severity']}: {a['target']}/{a['profile']} "
                       f"({a['identity']}) since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(a['raised_at']))}"
                       + ack)
            for c in a["causes"] or ["no cause found"]:
                out.append(f"  likely cause: {c}")
    else:
        out.append("no open alerts")
    for disk, b in st["budget"].items():
        out.append(f"budget {disk}: {b['device_seconds_used']:.0f} of {b['device_seconds_allowed']:.0f} device-"
                   f"seconds used, {b['written_bytes_24h'] >> 20} of {b['written_bytes_allowed'] >> 20} MiB "
                   "written in 24 h")
    for d in st["drift"][-5:]:
        out.append(f"drift {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(d['at']))} {d['device']} "
                   f"{d['setting']}: {d['old']} -> {d['new']}")
    return "\n".join(out)


def baseline_command(cfg: Config, action: str, target: str | None, profile: str | None) -> str:
    state = open_state(cfg)
    try:
        if action == "show":
            return "\n".join(f"{b['identity']} {b['profile']} {b['metric']}: {b['baseline']:.6g} over "
                             f"{b['samples']} probes, learned since "
                             f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(b['learned_at']))}"
                             + (" (ALERTING)" if b["alerting"] else "")
                             for b in baseline_rows(state) if not profile or b["profile"] == profile) \
                or "no baselines yet"
        state.request_baseline(action, target, profile)
        what = " ".join(x for x in (target and f"target {target}", profile and f"profile {profile}") if x)
        return (f"baseline {action} queued for {what or 'every volume'}; the daemon applies it before "
                "judging the next probe")
    finally:
        state.close()


def ack_command(cfg: Config, alert_id: int, note: str) -> str:
    state = open_state(cfg)
    try:
        if not state.ack_alert(alert_id, note):
            raise SystemExit(f"iowarden: no open alert #{alert_id} (see `iowarden status`)")
        return f"alert #{alert_id} acknowledged"
    finally:
        state.close()
