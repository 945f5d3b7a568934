"""`iowarden status` and `iowarden baseline`: read the daemon's state database, running or not.

Baseline changes asked for here are queued in the database; the daemon applies
them before it judges the next probe of that volume (and at its next start when
it is not running), and logs each one.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time

from iowarden.probes import blockqueue
from iowarden.probes.common import Roots, printable

from iowarden.daemon.config import Config
from iowarden.daemon.verdicts.detect import Detector, DetectorParams
from iowarden.daemon.outputs.prometheus import BAND_SPREADS
from iowarden.daemon.snapshot import CAPABILITY_PROFILE, NOT_PROBE_PROFILES, PASSIVE_PROFILE, SOURCE_PROFILE
from iowarden.daemon.commands.tables import dumps
from iowarden.daemon.wording import duration_said, human_metric, human_seconds, latency_columns, metric_label
from iowarden.daemon.probing.budget import Budget
from iowarden.daemon.core.state import State
from iowarden.daemon.sources.registry import SOURCES
from iowarden.daemon.verdicts.advice import advice_of
from iowarden.daemon.verdicts.sentence import alert_text


def open_state(cfg: Config) -> State:
    path = os.path.join(cfg.section("daemon").state_dir, "state.db")
    if not os.path.exists(path):
        raise SystemExit(f"iowarden: no state database at {path}: has `iowarden run -c {cfg.path}` run yet?")
    return State(path, repair=False)   # the daemon owns the file: a CLI never moves it aside


def baseline_rows(state: State, params: DetectorParams = DetectorParams()) -> list[dict]:
    """Each baseline as the detector sees it: None (and `learning`) until warm-up is done."""
    rows = []
    for identity, profile, metric, learned_at, st in state.load_baselines():
        if profile in NOT_PROBE_PROFILES:
            continue
        det = Detector.from_state(st, params)
        base = det.baseline()
        last = det.recent[-1] if det.recent else None
        row = {"identity": identity, "profile": profile, "metric": metric, "learned_at": learned_at,
               "samples": len(det.values), "warmup": params.warmup_probes, "learning": base is None,
               "baseline": None, "band_lower": None, "band_upper": None, "last": last,
               "cusum": round(st["cusum"], 2), "alerting": det.alerting}
        if base is not None:
            centre, spread = base
            row.update(baseline=math.exp(centre), band_lower=math.exp(centre - BAND_SPREADS * spread),
                       band_upper=math.exp(centre + BAND_SPREADS * spread))
        rows.append(row)
    return rows


def detector_params(cfg: Config) -> DetectorParams:
    return DetectorParams.from_config(cfg.section("detector"))


def collect(cfg: Config, roots: Roots = Roots()) -> dict:
    state = open_state(cfg)
    try:
        latest = {}
        for rec in reversed(state.probe_results(limit=2000)):
            latest[(rec["target"], rec["profile"])] = rec
        b = cfg.section("budget")
        budget = Budget(b.device_time_ratio, b.window_seconds, b.write_bytes_per_day)
        budget.warmup_time_ratio = b.warmup_device_time_ratio
        devices = blockqueue.read_sysfs_and_superblocks(roots)
        budget.replay(state.probe_results(limit=5000), devices, cfg.section("detector").warmup_probes)
        return {
            "probes": [latest[k] for k in sorted(latest)],
            "baselines": baseline_rows(state, detector_params(cfg)),
            "alerts": state.alerts(open_only=True),
            "drift": [{"at": at, "device": d, "identity": i, "setting": s, "old": o, "new": n}
                      for at, d, i, s, o, n in state.drift_events(limit=20)],
            "budget": {disk: dataclasses.asdict(budget.status(disk)) for disk in budget.disks()},
            "capability": {i: st for i, p, m, at, st in state.load_baselines() if p == CAPABILITY_PROFILE},
            "passive": present_views([{"identity": i, "at": at, **st} for i, p, m, at, st in state.load_baselines()
                                      if p == PASSIVE_PROFILE and m == "view"], devices),
            "sources": {i: {"at": at, **st} for i, p, m, at, st in state.load_baselines() if p == SOURCE_PROFILE},
            "next_probes": next_probes(latest, {t.name: t.interval_seconds for t in cfg.targets}),
        }
    finally:
        state.close()


def next_probes(latest: dict, intervals: dict) -> dict:
    """"target/profile" -> when its next routine probe is due: its last probe and its configured interval (the
    daemon may stretch it to fit its budget, and a probe confirming an alert comes sooner)."""
    return {f"{t}/{p}": rec["started_at"] + intervals[t] for (t, p), rec in latest.items() if t in intervals}


def verdict_of(b: dict, fired_by: str | None) -> str:
    """One baseline's line in `status`: learning; the detector that fired on it; else where its last probe is
    against the band, said as "26x lower" (a latency higher is worse, a throughput lower) and whether that is
    worse (outside the band, not yet confirmed: the detector waits for probes that agree) or better."""
    if b["learning"]:
        return "learning"
    moved, worse = "", False
    if b["last"] and b["baseline"] and not (b["band_lower"] <= b["last"] <= b["band_upper"]):
        r = b["last"] / b["baseline"]
        moved = f"{max(r, 1 / r):,.2g}x {'higher' if r > 1 else 'lower'}"
        worse = (r > 1) == b["metric"].endswith("_seconds")
    if fired_by:
        return f"FIRED ({fired_by})" + (f", {moved}" if moved else "")
    if b["alerting"]:
        return "FIRED" + (f", {moved}" if moved else "")
    if moved:
        return (f"{moved}: outside its band, not yet confirmed (the next probes decide)" if worse
                else f"{moved}: better than its normal")
    return "normal"


def _p(text, max_chars: int = 120) -> str:
    """A name or text from outside (a target, a device, a cause), safe for a terminal: see common.printable."""
    return printable(text, max_chars)


def render(st: dict, table) -> str:
    out = []
    lat_headers, lat_rows = latency_columns({"p99": [p["clat_p99_seconds"] for p in st["probes"]]})
    out.append(table(["target", "profile", "device", "last probe", "ok", "r IOPS", "w IOPS", *lat_headers],
                     [[p["target"], p["profile"], p["device"], time.strftime("%H:%M:%S", time.localtime(
                         p["started_at"])), p["ok"], round(p["read_iops"]), round(p["write_iops"]), *lat]
                      for p, lat in zip(st["probes"], lat_rows)]))
    out.append("")

    def normal(b):
        if b["learning"]:
            return f"learning {b['samples']}/{b['warmup']}"
        return (f"{human_metric(b['metric'], b['baseline'])} "
                f"({human_metric(b['metric'], b['band_lower'])} .. {human_metric(b['metric'], b['band_upper'])})")
    fired = {(a["identity"], a["profile"], m): v["reason"]
             for a in st["alerts"] for m, v in ((a.get("evidence") or {}).get("metrics") or {}).items() if v.get("reason")}
    out.append(table(["volume", "profile", "metric", "last", "normal (band)", "verdict"],
                     [[b["identity"], b["profile"], metric_label(b["metric"]), human_metric(b["metric"], b["last"]), normal(b),
                       verdict_of(b, fired.get((b["identity"], b["profile"], b["metric"])))] for b in st["baselines"]]))
    out.append("")
    if st.get("passive"):
        out.append(render_passive(st["passive"], table))
        out.append("")
    for spec in SOURCES:   # each source's own lines (the tracer: where the time of real I/O goes)
        saved = (st.get("sources") or {}).get(spec.name)
        if saved and spec.status_text is not None:
            out.append(spec.status_text(saved, table))
            out.append("")
    for identity, cap in sorted((st.get("capability") or {}).items()):
        bw = f", {cap['bandwidth_bytes'] / 2 ** 20:,.0f} MiB/s" if cap.get("bandwidth_bytes") else ""
        out.append(f"capability {_p(identity)} ({_p(cap.get('device'))}): {cap['saturation_iops']:,.0f} IOPS{bw}, knee at "
                   f"queue depth {cap.get('knee_depth')} (characterized "
                   f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(cap['measured_at'] or 0))})")
    if st["alerts"]:
        for a in st["alerts"]:
            ack = (f" (acknowledged by {_p(a.get('ack_by') or 'unknown')}: {_p(a['ack_note'] or 'no note')})"
                   if a.get("acked_at") else "")
            out.append(f"ALERT #{a['id']} {_p(a['alert'])} {_p(a['severity'])}: {_p(a['target'])}/{_p(a['profile'])} "
                       f"({_p(a['identity'])}) since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(a['raised_at']))}"
                       + ack)
            text = sentence_of(a)
            out.append(f"  {_p(text.where, 400)}: {_p(text.what, 600)}")
            causes = [text.cause] if text.cause else []
            causes += [c for c in (a["causes"] or []) if c and c != text.cause and c != text.what]
            for c in causes:
                out.append(f"  likely cause: {_p(c, 600)}")
            facts = (a.get("evidence") or {}).get("device_facts")
            do = advice_of(a["alert"], a["target"] or "", facts, max(0.0, time.time() - a["raised_at"]) / 86400.0) \
                if isinstance(facts, dict) else ""
            if do:
                out.append(f"  do: {_p(do, 600)}")
            due = (st.get("next_probes") or {}).get(f"{a['target']}/{a['profile']}")
            if due is not None:   # what it waits on to clear: the volume's own probes back within its band
                out.append(f"  clears on probes back within the band: the next {_p(a['profile'])} probe of "
                           f"{_p(a['target'])} is due by about {time.strftime('%H:%M:%S', time.localtime(due))} "
                           "(its interval; a confirming probe may come sooner)")
    else:
        out.append("no open alerts")
    for disk, b in st["budget"].items():
        warmup = b["device_seconds_used"] - b.get("routine_seconds_used", b["device_seconds_used"])
        out.append(f"budget {_p(disk)}: {b['device_seconds_used'] - warmup:.0f} of {b['device_seconds_allowed']:.0f} "
                   f"device-seconds used" + (f" (and {warmup:.0f} by warm-ups, of their "
                                             f"{b['warmup_seconds_allowed']:.0f})" if warmup > 0.5 else "") +
                   f", {b['written_bytes_24h'] >> 20} of {b['written_bytes_allowed'] >> 20} MiB written in 24 h")
    for d in st["drift"][-5:]:
        out.append(f"drift {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(d['at']))} {_p(d['device'])} "
                   f"{_p(d['setting'])}: {_p(d['old'])} -> {_p(d['new'])}")
    return "\n".join(out)


def present_views(views: list[dict], devices: dict) -> list[dict]:
    """The passive table of the devices there now, each name once: its newest view. A loop device detached
    and attached to another image left a row per image it ever held (three `loop10` rows)."""
    newest: dict[str, dict] = {}
    for v in views:
        name = v.get("device")
        if name in devices and (name not in newest or v["at"] > newest[name]["at"]):
            newest[name] = v
    return [newest[name] for name in sorted(newest)]


def render_passive(views: list[dict], table) -> str:
    """Every sampled disk as the passive detector last judged it."""
    def direction(v, d):
        if d not in v["slowdown_ratio"]:
            n = v["learned_windows"].get(d, 0)
            return f"learning ({n} windows)" if n else "-"
        return (f"{v['slowdown_ratio'][d]:.2f}x of {human_seconds(v['expected_await_ms'][d] / 1000)}")

    def verdict(v):
        if not v["flagged"]:
            return "ok"
        return ", ".join(f"at its limit ({v['ceiling']})" if k == "saturation" else
                         {"self": "slower than its normal", "peers": "slower than its peers",
                          "contention": "flooded by other work", "burst": "burst credits low"}.get(k, k)
                         for k in v["flagged"])

    def credits(v):
        """Its burst bucket's balance and time left at the draw, where a bucket is known."""
        b = v.get("burst")
        if not b:
            return "-"
        said = f"{b['balance_ratio']:.0%}" if b.get("balance_ratio") is not None else "?"
        if b.get("seconds_left") is not None:
            said += f", {duration_said(b['seconds_left'])} left"
        return f"{said} (to {b['baseline_iops']:,.0f} IOPS, {b['source']})"

    def headroom(v):
        """The least headroom of its directions, with the knee it is read against; a view saved before the
        knee was learned has none."""
        ratios = v.get("headroom_ratio") or {}
        if not ratios:
            return "-"
        d = min(ratios, key=ratios.get)
        k = (v.get("knee") or {}).get(d) or {}
        at = f" (knee {k['load']:,.0f} {'IOPS' if k.get('unit') == 'iops' else 'KiB/s'} {d})" if k.get("load") else ""
        return f"{ratios[d]:.1f}x{at}"
    return table(["device", "volume", "read (latency vs normal)", "write", "vs peers", "headroom", "burst credits",
                  "passive", "as of"],
                 [[v["device"], v["identity"], direction(v, "read"), direction(v, "write"),
                   f"{v['peer_ratio']:.2f}x" if v["peer_ratio"] is not None else "-", headroom(v), credits(v),
                   verdict(v),
                   time.strftime("%H:%M:%S", time.localtime(v["at"]))] for v in views])


class NothingMatches(Exception):
    """A --target or --profile that names nothing this daemon knows: exit 1, nothing queued."""


def baseline_line(b: dict) -> str:
    """`baseline show`: the normal and since when it holds, or how far its learning is and since when."""
    since = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(b['learned_at']))
    return (f"{_p(b['identity'])} {_p(b['profile'])} {metric_label(b['metric'])}: "
            + (f"learning ({b['samples']} of {b['warmup']} probes, since {since})" if b["learning"] else
               f"{human_metric(b['metric'], b['baseline'])} over {b['samples']} probes, learned since {since}")
            + (" (ALERTING)" if b["alerting"] else ""))


def baseline_command(cfg: Config, action: str, target: str | None, profile: str | None,
                     as_json: bool = False) -> str:
    state = open_state(cfg)
    try:
        measured = state.target_identities()
        if target is not None and target not in measured and target not in {t.name for t in cfg.targets}:
            known = sorted(set(measured) | {t.name for t in cfg.targets})
            raise NothingMatches(f"no target named {target!r} (known: {', '.join(map(_p, known)) or 'none'})")
        if profile is not None and profile not in cfg.profiles:
            raise NothingMatches(f"no profile named {profile!r} (configured: {', '.join(sorted(cfg.profiles))})")
        if action == "show":
            volumes = measured.get(target, set()) if target is not None else None
            rows = [b for b in baseline_rows(state, detector_params(cfg)) if (not profile or b["profile"] == profile)
                    and (volumes is None or b["identity"] in volumes)]
            if as_json:
                return dumps(rows)
            return "\n".join(baseline_line(b) for b in rows) \
                or ("no baselines yet" if target is None and profile is None else
                    f"no baselines yet for {' '.join(x for x in (target and f'target {target}', profile and f'profile {profile}') if x)}")
        state.request_baseline(action, target, profile)
        what = " ".join(x for x in (target and f"target {target}", profile and f"profile {profile}") if x)
        return (f"baseline {action} queued for {what or 'every volume'}; the daemon applies it before "
                "judging the next probe")
    finally:
        state.close()


def who_acks() -> str:
    """The person behind `iowarden ack`: the sudo caller when there is one, else the login name, else the uid."""
    import pwd
    for name in (os.environ.get("SUDO_USER"), os.environ.get("LOGNAME"), os.environ.get("USER")):
        if name:
            return printable(name, 64)
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def sentence_of(a: dict):
    """The alert's sentence from its row, as the page and the journal say it (verdicts/sentence.py)."""
    ev = a.get("evidence") or {}
    where = ev.get("where") or {}
    passive = a["profile"] == PASSIVE_PROFILE
    return alert_text(a["alert"], None if passive else a["target"], where.get("mountpoint"),
                      tuple(where.get("devices") or ()), a["identity"], a["profile"], ev.get("metrics") or {},
                      a["causes"] or [], max_chars=2000)


def ack_command(cfg: Config, alert_id: int, note: str) -> str:
    state = open_state(cfg)
    try:
        if not state.ack_alert(alert_id, note, who_acks()):
            raise SystemExit(f"iowarden: no open alert #{alert_id} (see `iowarden status`)")
        return f"alert #{alert_id} acknowledged"
    finally:
        state.close()
