"""What a verdict changed, as values: the health verdicts return these, and one place on the core's thread
(core/effects.py) acts on them (the state database, the journal, the outputs' alert events).

So the alert logic is tested by what it returns, with no database and no core, and a new kind of effect is
one more value here and one more branch there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class ProbeStored:
    """A probe's result as it is kept: its row in the database and the record the outputs are told."""
    identity: str
    record: Mapping


@dataclass(frozen=True)
class DriftFound:
    """A watched setting changed since the last poll (drift), whether or not it hurt."""
    device: str
    identity: str | None
    setting: str
    old: str
    new: str
    undone: bool = False    # back to what it was before its open drift: that drift is over, and this is none


@dataclass(frozen=True)
class SettingsSeen:
    """The settings as last polled, kept so a change made while the daemon was down is still found."""
    settings: Mapping


@dataclass(frozen=True)
class PinChanged:
    """A target held to the volume it was first probed on (None: released)."""
    target: str
    identity: str | None


@dataclass(frozen=True)
class BaselineSaved:
    identity: str
    profile: str
    metric: str
    learned_at: float
    state: Mapping


@dataclass(frozen=True)
class BaselinesDropped:
    """An operator's reset: every baseline of the volume's profile forgotten."""
    identity: str
    profile: str


@dataclass(frozen=True)
class AlertRaised:
    id: int
    alert: str
    identity: str
    target: str
    profile: str
    metric: str | None
    severity: str
    evidence: Mapping
    causes: tuple[str, ...]
    raised_at: float
    sentence: str            # what the page says: the journal's line, status and the outputs' event
    advice: str = ""         # what to do, for a passive verdict whose device is known


@dataclass(frozen=True)
class AlertUpdated:
    """New figures (and, when given, causes) of an open alert."""
    id: int
    severity: str
    evidence: Mapping
    causes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class AlertClosed:
    id: int
    alert: str
    identity: str
    profile: str
    target: str
    severity: str
    why: str
    lasted_seconds: float


@dataclass(frozen=True)
class Said:
    """A line for the journal that changes nothing else (a new normal accepted, an operator's request taken)."""
    level: int
    message: str
    args: tuple = ()
    fields: Mapping = field(default_factory=dict)


def transitions(changes) -> list[str]:
    """The alert transitions among changes, as "<alert> raised" / "<alert> cleared", in order."""
    return [f"{c.alert} raised" if isinstance(c, AlertRaised) else f"{c.alert} cleared"
            for c in changes if isinstance(c, (AlertRaised, AlertClosed))]
