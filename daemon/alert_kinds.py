"""The alerts iowarden raises, each with its one severity and the hold its shipped rule waits before paging.

The journal, /metrics (`iowarden_alert_active{severity}`), InfluxDB, `iowarden status`, `replay` and the shipped
Prometheus rules all say this one (tests/unit/test_alert_kinds.py holds the rules file to it). It is fixed per
kind, never graded by how far a figure moved: Alertmanager routes on it, and a severity that changed while a
fault lasted would end one alert and start another; how bad it is, the page's numbers say.
"""
from __future__ import annotations

SEVERITY = {
    "VolumeDegraded": "critical",   # a volume's own probes far from its learned normal
    "DeviceSlow": "critical",       # a device slower than its own normal at the load it carries
    "SlowMember": "warning",        # one member slower than its peers over hours: replace it before it fails
    "VolumeAtLimit": "warning",     # a volume held at a ceiling (a cgroup limit, a provisioned or burst rate)
    "VolumeContended": "warning",   # other work floods a healthy device: its users wait many times their usual
    "ServiceContended": "critical",  # a service waits many times its own normal while another cgroup floods its device
    "ProbeFailing": "warning",      # the probes of a target fail: iowarden cannot judge it
    "BurstCreditsLow": "warning",   # ahead of the fault: a burst bucket's credits run out within the horizon
}


def severity_of(alert: str) -> str:
    """The severity every output gives this alert (KeyError for a name iowarden does not raise)."""
    return SEVERITY[alert]


# The shipped rule's `for`: how long an alert is open before it pages. A verdict that a short burst of other work
# can also make (a ceiling, a flood) waits; the others page at once (the detectors already demanded a sustained
# deviation). verdicts/pages.py folds by when each would be sent; test_alert_kinds.py holds the rules to this.
HOLD_SECONDS = {"VolumeAtLimit": 600.0, "VolumeContended": 300.0}


def hold_of(alert: str) -> float:
    """Seconds the shipped rule waits before this alert pages (0: at once)."""
    return HOLD_SECONDS.get(alert, 0.0)
