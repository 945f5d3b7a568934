"""The open alerts on /metrics: the state a rule pages on, and the sentence its annotations say.

- `iowarden_alert_active` (1 per open alert): what the rules fire on. Its labels are the alert's identity
  and never change while it is open: Prometheus and Alertmanager take a changed label for a new alert, so
  its severity is the alert kind's one (daemon/alert_kinds.py), never a grade that moves with the figures.
- `iowarden_alert_info` (1 per open alert): the sentence, as labels (where, what moved with its numbers,
  the likely cause and the others, what to do about the device by what it is (verdicts/advice.py), the
  runbook). The rules' annotations *query* it
  (`query` in the annotation template) instead of joining it into the alert with `group_left`: joined,
  its labels would become the alert's own, and every new figure would be a new alert. Queried, the page
  carries the figures of the last evaluation and the alert stays one episode. Each value is cut at
  sentence.MAX_TEXT_CHARS; there is one series per open alert.
- `iowarden_alert_acknowledged` (1 per acknowledged open alert, with who): the rules page `unless` it.
- `iowarden_alert_folded` (1 per open alert said on an earlier alert's page of the same volume,
  verdicts/pages.py): the rules page `unless` it too, and the page's "Also" says it with its figures.
"""
from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from iowarden.daemon.sources import smart
from iowarden.daemon.sources.xfs import mount_of
from iowarden.daemon.snapshot import PASSIVE_PROFILE
from iowarden.daemon.verdicts.advice import advice_of, device_facts
from iowarden.daemon.verdicts.sentence import alert_text, cut

DEFAULT_RUNBOOK_URL = "https://github.com/iowarden/iowarden/blob/main/docs/runbook.md"
ALERT_LABELS = ["alert", "severity", "volume", "target", "device", "profile"]
INFO_LABELS = ["alert", "volume", "target", "device", "profile", "mountpoint", "where", "what", "cause",
               "more_causes", "advice", "runbook_url", "alert_id"]
DAY_SECONDS = 86400.0


def places(s) -> tuple[dict, dict]:
    """target -> (device of its last probe, mount point of its path); device -> mount point (of a target on it)."""
    by_target, by_device = {}, {}
    for p in s.probes:
        path = getattr(p.result, "path", "") or ""
        mount = mount_of(path, s.xfs) or path
        by_target[p.target] = (p.result.device or "", mount)
        if p.result.device:
            by_device.setdefault(p.result.device, mount)
    return by_target, by_device


def device_advice(s, alert) -> str:
    """The do-line of a device-side alert: by what its device is, what its drive says now, how long it is open."""
    name = alert.target or ""
    facts = device_facts(name, s.devices, lambda disks: smart.causes(s.sources.get(smart.SPEC.name), disks))
    return advice_of(alert.alert, name, facts, max(0.0, s.taken_at - alert.raised_at) / DAY_SECONDS)


def alert_families(s, runbook_url: str = DEFAULT_RUNBOOK_URL):
    active = GaugeMetricFamily("iowarden_alert_active", "1 for each open iowarden alert", labels=ALERT_LABELS)
    since = GaugeMetricFamily("iowarden_alert_raised_timestamp_seconds", "When the open alert was raised",
                              labels=ALERT_LABELS)
    info = GaugeMetricFamily("iowarden_alert_info", "1 for each open alert; its labels are the sentence the page "
                             "says: where, what moved (now vs normal), the likely cause, the others, what to do "
                             "about the device",
                             labels=INFO_LABELS)
    acked = GaugeMetricFamily("iowarden_alert_acknowledged", "1 for each open alert acknowledged with `iowarden "
                              "ack` (the shipped rules stop paging it)", labels=["alert", "volume", "profile", "by",
                                                                                  "note"])
    folded = GaugeMetricFamily("iowarden_alert_folded", "1 for each open alert said on the page of an earlier "
                               "alert of the same volume (the shipped rules do not page it on its own)",
                               labels=["alert", "volume", "profile", "into_alert", "into_id"])
    by_target, by_device = places(s)
    fold_of = s.folds
    texts = {}
    for a in s.alerts:
        passive = a.profile == PASSIVE_PROFILE
        # where it was raised (the journal's sentence), else where its target is now
        if passive:
            target, device, mount = "", a.target or "", a.mountpoint or by_device.get(a.target or "", "")
        else:
            target = a.target or ""
            device, mount = by_target.get(target, ("", ""))
            device, mount = ",".join(a.devices) or device, a.mountpoint or mount
        metrics = {m: {"value": now, "baseline": normal} for m, now, normal in a.moved}
        texts[a.id] = (target, device, mount, alert_text(a.alert, target or None, mount or None,
                                                         (device,) if device else (), a.volume, a.profile,
                                                         metrics, a.causes))
    by_id = {a.id: a for a in s.alerts}
    # what rides on each page, said on every profile's series of the page's alert (the rule reads the first's)
    riders: dict[tuple[str, str], list] = {}
    for r in sorted(s.alerts, key=lambda r: (r.raised_at, r.id)):
        into = by_id.get(fold_of[r.id].into) if r.id in fold_of else None
        if into is not None:
            riders.setdefault((into.alert, into.volume), []).append(r)
    for a in s.alerts:
        target, device, mount, text = texts[a.id]
        lab = [a.alert, a.severity, a.volume, target, device, a.profile]
        active.add_metric(lab, 1)
        since.add_metric(lab, a.raised_at)
        more = text.more_causes
        on_it = riders.get((a.alert, a.volume))
        if on_it:
            said = "; ".join(f"{r.alert} #{r.id} on this volume ({texts[r.id][1] or r.target}): {texts[r.id][3].what}"
                             for r in on_it)
            # the page's own further causes first (who does the other I/O, and how much), the alerts riding on
            # it after: a long rider (a ceiling and its history) cut the culprit's cgroup from a page's end
            more = cut((f"{more}; " if more else "") + said)
        if a.id in fold_of:   # its page may have closed moments ago (pages.RIDER_GRACE_SECONDS): still not paged
            f = fold_of[a.id]
            folded.add_metric([a.alert, a.volume, a.profile, f.into_alert, str(f.into)], 1)
        info.add_metric([a.alert, a.volume, target, device, a.profile, cut(mount), text.where, text.what,
                         text.cause, more, cut(device_advice(s, a) if a.profile == PASSIVE_PROFILE else ""),
                         f"{runbook_url}#{text.runbook_anchor}", str(a.id)], 1)
        if a.acked_by is not None:
            acked.add_metric([a.alert, a.volume, a.profile, cut(a.acked_by, 64), cut(a.ack_note or "", 200)], 1)
    return active, since, info, acked, folded
