"""The alerting content shipped in packaging/: rules that promtool accepts and whose unit tests pass,
and a dashboard whose every query is PromQL (run against a real Prometheus in test_outputs.py)."""
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "packaging" / "prometheus"


def test_rules_pass_promtool_check():
    r = subprocess.run(["promtool", "check", "rules", str(PROM / "iowarden.rules.yml")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_rules_unit_tests():
    r = subprocess.run(["promtool", "test", "rules", "iowarden.rules.test.yml"], cwd=PROM / "tests",
                       capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_the_fleet_rules_pass_promtool_and_their_unit_tests_and_each_alert_has_its_runbook_section():
    """The fleet's own file (a rule group of its own: a fleet's engine loads it, a host's Prometheus need not)."""
    import re
    import yaml
    r = subprocess.run(["promtool", "check", "rules", str(PROM / "iowarden.fleet.rules.yml")], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(["promtool", "test", "rules", "iowarden.fleet.rules.test.yml"], cwd=PROM / "tests",
                       capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    rules = yaml.safe_load((PROM / "iowarden.fleet.rules.yml").read_text())
    tests = (PROM / "tests" / "iowarden.fleet.rules.test.yml").read_text()
    anchors = {h.strip().lower() for h in re.findall(r"^## (.+)$", (ROOT / "docs" / "runbook.md").read_text(), re.M)}
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} == {"IowardenFleetOutlier", "IowardenFleetClassShift"}
    for a in alerts:
        assert f"alertname: {a['alert']}" in tests, f"{a['alert']} has no promtool unit test"
        assert a["annotations"]["runbook_url"].endswith("#" + a["alert"].lower())
        assert a["alert"].lower() in anchors, f"docs/runbook.md has no section {a['alert']}"


def test_every_alert_has_a_unit_test_and_annotations():
    import yaml
    rules = yaml.safe_load((PROM / "iowarden.rules.yml").read_text())
    tests = (PROM / "tests" / "iowarden.rules.test.yml").read_text()
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 8
    for a in alerts:
        assert f"alertname: {a['alert']}" in tests, f"{a['alert']} has no promtool unit test"
        assert a["annotations"]["summary"] and a["annotations"]["description"]


def test_every_alert_fires_on_its_first_event_from_an_empty_series():
    """A rule that needs a second event (increase() over a series born at its first count) misses
    the first; the promtool group "from an empty series" must name every alert."""
    import yaml
    rules = yaml.safe_load((PROM / "iowarden.rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((PROM / "tests" / "iowarden.rules.test.yml").read_text())["tests"]
    group = next(t for t in tests if "from an empty series" in t.get("name", ""))
    assert all(s["values"].startswith("_ _ ") for s in group["input_series"]), "a series exists from the start"
    fired = {s["labels"].split('"')[1] for e in group["promql_expr_test"] for s in e["exp_samples"]}
    assert fired == alerts, f"not shown firing from an empty series: {sorted(alerts - fired)}"


def test_every_alert_links_its_own_section_of_the_runbook_and_waits_or_says_why_not():
    import re
    import yaml
    text = (PROM / "iowarden.rules.yml").read_text()
    rules = yaml.safe_load(text)
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    # GitHub's and most renderers' anchors: the heading lower-cased
    anchors = {h.strip().lower() for h in re.findall(r"^## (.+)$", runbook, re.M)}
    for a in [r for g in rules["groups"] for r in g["rules"] if "alert" in r]:
        url = a["annotations"].get("runbook_url", "")
        # an https link a pager opens: the daemon's [prometheus] runbook_url (iowarden_alert_info) for the alerts
        # it raises, the published copy when that series is absent and for every other rule
        published = f"https://github.com/iowarden/iowarden/blob/main/docs/runbook.md#{a['alert'].lower()}"
        assert url == published or (url.startswith('{{ with printf "iowarden_alert_info{')
                                    and url.endswith('| query }}{{ . | first | label "runbook_url" }}{{ else }}'
                                                     + published + "{{ end }}")), a["alert"]
        assert a["alert"].lower() in anchors, f"docs/runbook.md has no section {a['alert']}"
        if "for" not in a:
            # without a `for`, the rule's comment says why the alert's own persistence is enough
            block = text[text.index(f"- alert: {a['alert']}"):].split("\n      - ", 1)[0]
            assert re.search(r"#.*(No `for`|no `for` is needed)", block), f"{a['alert']}: no `for` and no reason"


def test_dashboard_structure():
    doc = json.loads((ROOT / "packaging" / "grafana" / "iowarden-dashboard.json").read_text())
    assert doc["uid"] == "iowarden"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    kinds = {p["type"] for p in doc["panels"]}
    assert {"timeseries", "heatmap", "table", "row"} <= kinds
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert any("iowarden_baseline_band_lower_iops" in e for e in exprs)      # IOPS against the baseline band
    assert any("histogram_quantile" in e for e in exprs)
    # a heatmap of cumulative buckets is drawn per bucket only when its query is formatted as one (Grafana
    # de-accumulates `le` then); the tracer's real I/O has one beside the probes'
    heatmaps = [t for p in doc["panels"] if p["type"] == "heatmap" for t in p["targets"]]
    assert heatmaps and all(t.get("format") == "heatmap" and "_bucket" in t["expr"] for t in heatmaps)
    assert any("iowarden_io_latency_seconds_bucket" in t["expr"] for t in heatmaps)
    assert {a["name"] for a in doc["annotations"]["list"]} == {"settings drift", "iowarden alerts"}


def _manpage_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("manpage", ROOT / "packaging" / "manpage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_man_page_matches_help_and_renders_without_warnings():
    import argparse
    from iowarden.daemon.cli import build_parser
    page = _manpage_module().manpage("9.9.9")
    rendered = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-P-cbou"], input=page, capture_output=True,
                              text=True)
    assert rendered.returncode == 0 and rendered.stderr == "", rendered.stderr
    text = " ".join(rendered.stdout.replace("\u2010", "-").replace("\u2212", "-").split())
    assert "iowarden 9.9.9" in text and "EXIT STATUS" in text and "SIGHUP" in text
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert len(subparsers.choices) >= 10
    for name, sub in subparsers.choices.items():
        assert " ".join(sub.format_usage().split())[len("usage: "):] in text, name
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert option in text, (name, option)
            assert action.help and action.help in text, (name, action.dest, action.help)


def test_help_and_the_man_page_say_each_default_once_and_the_same():
    """--help showed no defaults where the man page printed each twice ("(default: /etc/iowarden/config.toml,
    as the package installs it) (default: /etc/iowarden/config.toml)")."""
    import argparse
    import re
    from iowarden.daemon.cli import build_parser
    page = _manpage_module().manpage("9.9.9")
    rendered = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-P-cbou"], input=page, capture_output=True,
                              text=True).stdout
    text = " ".join(rendered.replace("\u2010", "-").replace("\u2212", "-").split())
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    shown, configs = 0, 0
    for name, sub in subparsers.choices.items():
        helped = " ".join(sub.format_help().split())
        for action in sub._actions:
            if action.default in (None, False, argparse.SUPPRESS, []) or not action.option_strings:
                continue
            said = f"(default: {action.default})"
            if said in (action.help or "") or "default" in (action.help or ""):
                continue   # the help says it in its own words
            assert helped.count(said) >= 1, (name, action.dest, said)
            shown += 1
            configs += action.dest == "config"
        assert not re.search(r"\(default: [^)]*\) \(default: ", helped), name
    assert shown >= 20, shown
    assert configs >= 6 and text.count("(default: /etc/iowarden/config.toml)") == configs
    assert not re.search(r"\(default: [^)]*\) \(default: ", text)
    assert "Iostat" not in text and "iostat -x from /proc/diskstats" in text
    assert re.search(r"\b75 run: another iowarden daemon holds the state directory", text), "EXIT STATUS lacks 75"


def unit_of_query(expr: str) -> str:
    """The Grafana unit a query's values are in, from the metric it reads and what is done to it."""
    import re
    e = expr.replace(" ", "")
    if e.startswith("histogram_quantile(") or re.match(r"sumby\(le\)\(increase\(iowarden_\w+_seconds_bucket", e):
        return "s"                                       # a quantile; a heatmap's axis is the buckets' seconds
    if re.match(r"rate\(iowarden_disk_\w+_time_seconds_total.*\)/rate\(iowarden_disk_\w+_completed_total", e):
        return "s"                                       # r_await, w_await
    if e.startswith("rate(iowarden_disk_io_time_seconds_total"):
        return "percentunit"                             # seconds busy per second: %util
    if e.startswith("rate(iowarden_disk_io_time_weighted_seconds_total"):
        return "none"                                    # aqu-sz, a number of requests
    if re.match(r"rate\(iowarden_disk_\w+_completed_total", e):
        return "iops"
    if re.match(r"rate\(iowarden_disk_\w+_bytes_total", e):
        return "Bps"
    name = re.match(r"(?:sumby\([\w,]+\)\()?(?:increase\()?([a-z_:]+)", e).group(1)
    if "_used_seconds" in name and "/" in e:
        return "percentunit"                             # used / allowed
    for suffix, unit in (("_bytes_per_second", "Bps"), ("_iops", "iops"), ("_seconds", "s"), ("_ratio", "ratio"),
                         ("_bytes", "bytes")):
        if name.endswith(suffix):
            return unit
    return "none"


def test_every_panel_unit_is_the_unit_of_its_queries_and_every_panel_says_what_it_shows():
    doc = json.loads((ROOT / "packaging" / "grafana" / "iowarden-dashboard.json").read_text())
    wrong = []
    for p in doc["panels"]:
        assert p.get("description"), f"panel {p.get('title')} has no description"
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        for t in p.get("targets", []):
            if p["type"] == "table" or "skipped_total" in t["expr"] or "_success" in t["expr"] or "contended" in t["expr"]:
                continue                                 # tables of labels; 0/1 flags and counts share "none"
            # a ratio is a share (percentunit) or a multiple (slowdown 2.0 = twice the normal: none)
            if unit_of_query(t["expr"]) != unit and not (unit_of_query(t["expr"]) == "ratio"
                                                         and unit in ("percentunit", "none")):
                wrong.append((p["title"], unit, unit_of_query(t["expr"]), t["expr"]))
    assert wrong == []


def test_the_unit_check_catches_what_issue_22_found():
    assert unit_of_query('rate(iowarden_disk_io_time_weighted_seconds_total{device=~"$device"}[5m])') != "percentunit"
    assert unit_of_query('iowarden_cpu_idle_state_disabled_cpus{instance=~"$instance"}') != "s"
    assert unit_of_query('iowarden_probe_bandwidth_bytes_per_second{target="db"}') == "Bps"


# the module each runtime dependency is imported as
IMPORTED_AS = {"prometheus_client": "prometheus_client", "psutil": "psutil", "pyudev": "pyudev",
               "systemd-python": "systemd", "bcrypt": "bcrypt", "PyYAML": "yaml"}


def test_every_runtime_dependency_is_imported_by_the_daemon():
    """The package ships its dependencies in its own venv, run as root: one the daemon never imports is code on
    every host for nothing, and files dpkg unpacks and byte-compiles at every install (influxdb-client and
    its reactivex, tzdata and urllib3 were 70 % of the venv's modules after the InfluxDB writer moved to
    http.client)."""
    import re
    import tomllib
    declared = [re.split(r"[<>=!~; \[]", d, maxsplit=1)[0]
                for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    assert set(declared) == set(IMPORTED_AS), f"a dependency without its module here: {declared}"
    source = "\n".join(p.read_text() for top in ("daemon", "probes") for p in (ROOT / top).rglob("*.py"))
    for dist in declared:
        module = IMPORTED_AS[dist]
        assert re.search(rf"^\s*(import|from) {module}\b", source, re.M), f"{dist} is declared and never imported"
