"""The shipped fleet rules, run by the engines a fleet runs them on: five hosts, each one daemon with one volume of
one class, scraped by vmagent into VictoriaMetrics with vmalert evaluating iowarden.fleet.rules.yml, and by a
Prometheus evaluating the same file; both notify one Alertmanager, whose webhook is the test's.

- one volume throttled to a third of its load: IowardenFleetOutlier for that host alone, from each engine; it
  clears when the throttle goes;
- all five throttled: one IowardenFleetClassShift from each engine and no outlier; it clears when they go.

Each host is a network namespace with an address of its own (tests/integration/netns.py), its daemon on the port
the package ships, as a fleet's are. Each volume is a loop XFS whose image lives on a loop device of its own, in
RAM (soak_mix.stacked_volumes): the throttle holds the lower device's reads, so the volume's own requests wait, as
a provisioned volume's do; a database's reads (600 a second, four at a time) run on each throughout.

Time-scaled, the logic unchanged: the file's minute is 2 s here (its hour of evidence 2 minutes, its half hour
one; time_scaled), the daemons judge one-second windows and their fleet signal is the median of 10 s of them
([passive] fleet_seconds). What is scaled is said by the file's durations alone; every expression, threshold,
share and count is the shipped file's.
"""
import os
import re
import subprocess
import time
from contextlib import ExitStack

import pytest

from tests.integration import netns, servers
from tests.integration.helpers import DaemonProc, blkio_cap, config_text, wait_for
from tests.integration.scenarios import end_sessions
from tests.integration.soak_mix import fio, job, stacked_volumes

# alone: five daemons, five databases and five servers fill this machine's two cores; beside a lane, the
# healthy volumes' probes would stray with whatever else runs, which is the lane's doing, not theirs
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.alone]
RULES = os.path.join(os.path.dirname(__file__), "..", "..", "packaging", "prometheus", "iowarden.fleet.rules.yml")
PORT = 29110
HOSTS = 5
CLASS = "iowarden-test-1g"
LOAD_IOPS = 600
MINUTE_S = 2          # the rules' minute, here
UNITS = {"s": 1, "m": 60, "h": 3600}


def time_scaled(text: str, minute_seconds: int) -> str:
    """The rule file with every duration (a group's interval, a subquery's range and step, a range, an alert's
    `for`) at minute_seconds for each minute. A duration that does not scale to whole seconds is an error, not
    rounded."""
    def scaled(amount: str, unit: str) -> str:
        seconds = int(amount) * UNITS[unit] * minute_seconds
        if seconds % 60:
            raise ValueError(f"{amount}{unit} does not scale to whole seconds at a minute of {minute_seconds} s")
        return f"{seconds // 60}s"
    text, subqueries = re.subn(r"\[(\d+)([smh]):(\d+)([smh])\]",
                               lambda m: f"[{scaled(m[1], m[2])}:{scaled(m[3], m[4])}]", text)
    text, ranges = re.subn(r"\[(\d+)([smh])\]", lambda m: f"[{scaled(m[1], m[2])}]", text)
    text, intervals = re.subn(r"(?m)^(\s+(?:interval|for)): (\d+)([smh])\s*$",
                              lambda m: f"{m[1]}: {scaled(m[2], m[3])}", text)
    assert subqueries and ranges and intervals, "the fleet rule file has no subquery, range or interval to scale"
    return text


def _alerts(hook: servers.Webhook, name: str, status: str | None = None) -> list[dict]:
    return [a for p in list(hook.payloads) for a in p["alerts"]
            if a["labels"].get("alertname") == name and (status is None or a["status"] == status)]


def _engines_fired(hook, name: str, want: set) -> set | None:
    """The (engine, instance) pairs that sent `name` firing, once every pair of `want` is among them."""
    got = {(a["labels"].get("engine"), a["labels"].get("instance")) for a in _alerts(hook, name, "firing")}
    return got if want <= got else None


def _print_pages(hook, name: str) -> None:
    """Each engine's first page of `name`, as the webhook got it."""
    for engine in ("prometheus", "vmalert"):
        said = [a for a in _alerts(hook, name, "firing") if a["labels"]["engine"] == engine]
        print(f"  {engine}: {said[0]['annotations'].get('summary')}")


def _raised(hook, name: str) -> set:
    """Every raising of `name` sent so far: (engine, instance, when it started)."""
    return {(a["labels"].get("engine"), a["labels"].get("instance"), a["startsAt"]) for a in _alerts(hook, name, "firing")}


def _resolved_by_both(hook, name: str, since_payload: int) -> bool:
    resolved = {a["labels"].get("engine") for p in list(hook.payloads)[since_payload:] for a in p["alerts"]
                if a["labels"].get("alertname") == name and a["status"] == "resolved"}
    return resolved >= {"prometheus", "vmalert"}


def test_the_shipped_fleet_rules_name_one_slow_volume_and_one_class_shift_in_prometheus_and_vmalert(tmp_path):
    rules = tmp_path / "iowarden.fleet.rules.yml"
    rules.write_text(time_scaled(open(RULES).read(), MINUTE_S))
    hook = servers.Webhook()
    with ExitStack() as stack, netns.hosts(HOSTS) as hosts:
        stack.callback(hook.stop)
        lowers, uppers = stacked_volumes(stack, tmp_path, count=HOSTS, in_ram=True)
        db = []
        stack.callback(end_sessions, db)
        for upper in uppers:
            subprocess.run(fio(*job("layout", upper.mountpoint / "db.dat", "--rw=write", "--bs=1M", "--direct=1",
                                    "--size=128M")), check=True, timeout=300)
            db.append(subprocess.Popen(fio(*job("db", upper.mountpoint / "db.dat", "--rw=randread", "--bs=4k",
                                                "--direct=1", "--size=128M", "--iodepth=4",
                                                f"--rate_iops={LOAD_IOPS}", "--time_based", "--runtime=3600")),
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        daemons = []
        t0 = time.monotonic()
        for i, (upper, host) in enumerate(zip(uppers, hosts)):
            home = tmp_path / f"host{i}"
            home.mkdir()
            extra = (f'class = "{CLASS}"\n[passive]\nwindow_seconds = 1.0\nfleet_seconds = 10.0\n'
                     f'[sampler]\ndevices = ["{upper.name}"]\n[budget]\ndevice_time_ratio = 1.0\n')
            d = DaemonProc(home, config_text(upper.mountpoint, home / "state", runtime=0.5, interval=3.0,
                                             port=PORT, address=host.address, extra=extra), on_host=host.argv)
            stack.callback(d.close)
            daemons.append(d)
        for d in daemons:
            d.wait_message("READY=1")
        instances = [f"{h.address}:{PORT}" for h in hosts]
        am, am_port = servers.alertmanager(tmp_path, hook.port)
        stack.callback(am.stop)
        prom, pport = servers.prometheus(tmp_path, instances, rule_files=[str(rules)], alertmanager_port=am_port,
                                         external_labels={"engine": "prometheus"})
        stack.callback(prom.stop)
        vm_servers, vm_port = servers.victoria_stack(tmp_path, instances, [str(rules)], am_port,
                                                     external_labels={"engine": "vmalert"})
        for server in vm_servers:
            stack.callback(server.stop)
        engines = {"prometheus": pport, "vmalert": vm_port}

        def spreads_of_all(port, series):
            res = servers.query(port, series).get("data", {}).get("result", [])
            return res if len(res) == HOSTS else None
        for name, port in engines.items():
            for series in ("iowarden:fleet_slowdown:spreads", "iowarden:fleet_probe:spreads"):
                wait_for(lambda: spreads_of_all(port, series), timeout=240,
                         what=f"{series} for all {HOSTS} volumes in {name}")
        print(f"every volume in both engines' recordings {time.monotonic() - t0:.0f} s after the daemons started")

        slow = instances[2]
        started = time.monotonic()
        with blkio_cap("read_iops_device", lowers[2].major_minor, LOAD_IOPS // 3):
            fired = wait_for(lambda: _engines_fired(hook, "IowardenFleetOutlier",
                                                    {("prometheus", slow), ("vmalert", slow)}),
                             timeout=6 * 60, what=f"IowardenFleetOutlier for {slow} from both")
            print(f"IowardenFleetOutlier {time.monotonic() - started:.0f} s after {slow}'s volume was held at "
                  f"{LOAD_IOPS // 3} read IOPS")
            _print_pages(hook, "IowardenFleetOutlier")
            cleared_from = len(hook.payloads)
        cleared = time.monotonic()
        wait_for(lambda: _resolved_by_both(hook, "IowardenFleetOutlier", cleared_from), timeout=180,
                 what="IowardenFleetOutlier resolved by both engines once the throttle is gone")
        print(f"resolved {time.monotonic() - cleared:.0f} s after the throttle went")
        assert fired == {("prometheus", slow), ("vmalert", slow)}, f"only {slow} is out of its class: {fired}"

        # the class shifts within the hour after its outlier recovered, that volume's hour of evidence still
        # standing (three quarters of the hour's minutes): while the others' figures catch up with the shift it
        # stands out for a few of the file's minutes, and is not named again (twelve of the last fifteen needed)
        def evidence_stands(port):
            share = (f'max(iowarden:fleet_slowdown:out_share_1h{{instance="{slow}"}} or '
                     f'iowarden:fleet_probe:out_share_1h{{instance="{slow}"}} or '
                     f'iowarden:fleet_normal:out_share_1h{{instance="{slow}"}})')
            res = servers.query(port, share).get("data", {}).get("result", [])
            return bool(res) and float(res[0]["value"][1]) >= 0.75
        for name, port in engines.items():
            print(f"{slow}'s outlier evidence standing in {name} as its class shifts: {evidence_stands(port)}")
        outliers_before = _raised(hook, "IowardenFleetOutlier")
        started = time.monotonic()
        with ExitStack() as throttles:
            for lower in lowers:
                throttles.enter_context(blkio_cap("read_iops_device", lower.major_minor, LOAD_IOPS // 3))
            wait_for(lambda: _engines_fired(hook, "IowardenFleetClassShift", {("prometheus", None),
                                                                              ("vmalert", None)}),
                     timeout=8 * 60, what="IowardenFleetClassShift from both engines")
            print(f"IowardenFleetClassShift {time.monotonic() - started:.0f} s after all {HOSTS} were held")
            _print_pages(hook, "IowardenFleetClassShift")
            cleared_from = len(hook.payloads)
        cleared = time.monotonic()
        wait_for(lambda: _resolved_by_both(hook, "IowardenFleetClassShift", cleared_from), timeout=180,
                 what="IowardenFleetClassShift resolved by both engines once the throttles are gone")
        print(f"resolved {time.monotonic() - cleared:.0f} s after the throttles went")
        shifts = _alerts(hook, "IowardenFleetClassShift", "firing")
        assert {(a["labels"].get("engine"), a["labels"].get("class")) for a in shifts} == \
            {("prometheus", CLASS), ("vmalert", CLASS)}, "one class shift, for the class, from each engine"
        assert _raised(hook, "IowardenFleetOutlier") == outliers_before, \
            f"a class that moved together is no volume's outlier: {_raised(hook, 'IowardenFleetOutlier')}"
        for d in daemons:
            assert "Traceback" not in d.output()
