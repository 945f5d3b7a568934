"""One severity per alert, in the daemon and in the shipped rules alike (daemon/alert_kinds.py)."""
import re
from pathlib import Path

import yaml

from iowarden.daemon.alert_kinds import SEVERITY, hold_of
from iowarden.daemon.passive.values import ALERT_OF_KIND

RULES = Path(__file__).resolve().parents[2] / "packaging/prometheus/iowarden.rules.yml"


def _alert_rules():
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_each_alert_the_daemon_raises_has_its_rule_with_the_same_severity():
    rules = _alert_rules()
    for alert, severity in SEVERITY.items():
        rule = rules.get(f"Iowarden{alert}")
        assert rule is not None, f"no shipped rule pages on {alert}"
        assert f'alert="{alert}"' in rule["expr"], rule["expr"]
        assert rule["labels"]["severity"] == severity, (alert, rule["labels"], severity)


def test_every_alert_a_rule_reads_from_the_daemon_is_in_the_table_and_no_text_grades_it_otherwise():
    for name, rule in _alert_rules().items():
        for alert in re.findall(r'iowarden_alert_active\{alert="(\w+)"', rule["expr"]):
            assert alert in SEVERITY, (name, alert)
        said = " ".join(rule.get("annotations", {}).values())
        assert 'label "grade"' not in said and "grades it" not in said, name   # no severity of its own
    assert set(ALERT_OF_KIND.values()) <= set(SEVERITY)


def test_each_rules_hold_is_the_one_the_daemon_folds_by():
    """verdicts/pages.py decides which alert of a volume pages by when each would be sent: its rule's `for`."""
    def seconds(text):
        m = re.fullmatch(r"(\d+)([smh])", text)
        return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]
    rules = _alert_rules()
    for alert in SEVERITY:
        rule = rules[f"Iowarden{alert}"]
        assert (seconds(rule["for"]) if "for" in rule else 0.0) == hold_of(alert), (alert, rule.get("for"))
