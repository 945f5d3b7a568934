"""The one place that acts on what the health verdicts decided (verdicts/changes.py): the state database's
writes, the journal's line and the outputs' alert event, each change in the order it was decided.

The core calls apply() with what Health returned; Health itself holds no database handle and no callback.
StoredHealth does the same for a caller with no core (tests, a replay): the verdicts, then their effects.
"""
from __future__ import annotations

import logging
from types import MappingProxyType

from iowarden.daemon.verdicts.changes import (AlertClosed, AlertRaised, AlertUpdated, BaselineSaved, BaselinesDropped,
                                              DriftFound, PinChanged, ProbeStored, Said, SettingsSeen,
                                              transitions)
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.verdicts.health import NOWHERE, Health, Saved
from iowarden.daemon.wording import duration_said

log = logging.getLogger("iowarden")


def saved_health(state) -> Saved:
    """What the state database holds of health: pins, baselines, open alerts and the next alert id."""
    return Saved(MappingProxyType(state.pins()), tuple(state.load_baselines()), tuple(state.alerts(open_only=True)),
                 state.next_alert_id())


def health_from(state, params: DetectorParams = DetectorParams()) -> Health:
    return Health(params, saved_health(state))


def requests_of(state) -> list[tuple]:
    """Operators' queued requests, each taken once, an acknowledgement with who gave it and why."""
    out = []
    for action, target, profile in state.take_baseline_requests():
        aid = Health.acked_alert_id(target) if action == "ack" else None
        out.append((action, target, profile, state.alert_ack(aid) if aid is not None else None))
    return out


def apply(changes, state, tell=None) -> list[str]:
    """Act on each change in order; returns the alert transitions among them ("<alert> raised|cleared").
    `tell(what, fields)`: the outputs that keep records are told ("probe": a stored result, "event": an alert
    raised or cleared); None where nothing keeps them."""
    def on_event(**fields):
        if tell is not None:
            tell("event", fields)
    for c in changes:
        if isinstance(c, ProbeStored):
            record = dict(c.record)
            state.add_probe_result(record, c.identity)
            if tell is not None:
                tell("probe", {"record": record, "identity": c.identity})
        elif isinstance(c, DriftFound):
            state.add_drift(c.device, c.identity, c.setting, c.old, c.new)
            on_event(kind="drift", device=c.device, volume=c.identity or c.device, setting=c.setting, old=c.old,
                     new=c.new)
            log.warning("setting drift on %s: %s changed from %s to %s%s", c.device, c.setting, c.old, c.new,
                        " (put back: its drift is over)" if c.undone else "",
                        extra={"DEVICE": c.device, "SETTING": c.setting})
        elif isinstance(c, SettingsSeen):
            state.save_settings(dict(c.settings))
        elif isinstance(c, BaselineSaved):
            state.save_baseline(c.identity, c.profile, c.metric, c.learned_at, c.state)
        elif isinstance(c, AlertRaised):
            state.open_alert(c.alert, c.identity, c.target, c.profile, c.metric, c.severity, dict(c.evidence),
                             list(c.causes), alert_id=c.id, raised_at=c.raised_at)
            on_event(kind="alert", alert=c.alert, state="raised", severity=c.severity, volume=c.identity,
                     target=c.target, profile=c.profile, causes="; ".join(c.causes), sentence=c.sentence)
            log.error("ALERT %s %s #%d: %s", c.alert, c.severity, c.id, c.sentence + (f" {c.advice}" if c.advice else ""),
                      extra={"ALERT": c.alert, "TARGET": c.target, "PROBE": c.profile, "VOLUME": c.identity,
                             "SEVERITY": c.severity})
        elif isinstance(c, AlertUpdated):
            state.update_alert(c.id, c.severity, dict(c.evidence), None if c.causes is None else list(c.causes))
        elif isinstance(c, AlertClosed):
            state.close_alert(c.id)
            on_event(kind="alert", alert=c.alert, state="cleared", severity=c.severity, volume=c.identity,
                     target=c.target, profile=c.profile, causes=c.why, lasted_seconds=round(c.lasted_seconds))
            log.warning("ALERT %s #%d cleared for %s/%s after %s: %s", c.alert, c.id, c.identity, c.profile,
                        duration_said(c.lasted_seconds), c.why,
                        extra={"ALERT": c.alert, "VOLUME": c.identity, "PROBE": c.profile})
        elif isinstance(c, PinChanged):
            state.set_pin(c.target, c.identity)
        elif isinstance(c, BaselinesDropped):
            state.delete_baselines(c.identity, c.profile)
        elif isinstance(c, Said):
            log.log(c.level, c.message, *c.args, extra=dict(c.fields))
        else:
            raise TypeError(f"no effect for {type(c).__name__}")
    return transitions(changes)


class StoredHealth:
    """Health and the effects of what it decides, for a caller with no core: built from a state database,
    every judgement's changes written back to it. Reads (views, pins, open alerts) are the verdicts' own."""

    def __init__(self, state, params: DetectorParams = DetectorParams(), tell=None, place_of=None):
        self.verdicts = health_from(state, params)
        self.state, self.tell = state, tell
        self.place_of = place_of or (lambda name, passive: NOWHERE)

    def __getattr__(self, name):
        return getattr(self.verdicts, name)

    def on_result(self, record: dict, identity: str, causes_fn, context: dict | None = None) -> list[str]:
        return apply(self.verdicts.on_result(record, identity, causes_fn, context,
                                             self.place_of(record["target"], False)), self.state, self.tell)

    def on_passive(self, t, device: str, more_causes=(), device_facts: dict | None = None) -> str | None:
        said = apply(self.verdicts.on_passive(t, device, more_causes, device_facts, self.place_of(device, True)),
                     self.state, self.tell)
        return said[0] if said else None

    def apply_requests(self, identity_of_target) -> list[str]:
        return apply(self.verdicts.apply_requests(requests_of(self.state), identity_of_target), self.state,
                     self.tell)

    def target_dropped(self, target: str, why: str) -> list[str]:
        return apply(self.verdicts.target_dropped(target, why), self.state, self.tell)
