"""The fleet, on one machine: three daemons as three hosts, each probing a volume of the same class, scraped by
one real Prometheus with the shipped recording rules. One host's volume is throttled: the fleet rules single it
out, and the others stay unremarked (the lab issue's fleet scenario).

The three share this machine's kernel, so each sees the others' disks in /proc/diskstats; what makes them hosts
to Prometheus is what makes them hosts in a fleet: an instance each, with its own volume, state and probes.
"""
import os
import time

import pytest

from tests.conftest import LoopXfs
from tests.integration import servers
from tests.integration.helpers import DaemonProc, config_text, free_port, read_iops_cap, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]
RULES = os.path.join(os.path.dirname(__file__), "..", "..", "packaging", "prometheus", "iowarden.rules.yml")
RATIO = 'iowarden:probe_iops:ratio_to_fleet_median{direction="read",profile="rr"}'


def _ratios(pport) -> dict[str, float]:
    res = servers.query(pport, RATIO)["data"]["result"]
    return {r["metric"]["instance"]: float(r["value"][1]) for r in res}


def test_the_fleet_rules_single_out_the_one_throttled_volume(tmp_path):
    volumes = [LoopXfs("512M", direct_io=True) for _ in range(3)]
    prom, daemons = None, []
    try:
        ports = [free_port() for _ in volumes]
        for i, (fs, port) in enumerate(zip(volumes, ports)):
            host = tmp_path / f"host{i}"
            host.mkdir()
            daemons.append(DaemonProc(host, config_text(fs.mountpoint, host / "state", runtime=0.5, interval=3.0,
                                                        port=port)))
        for d in daemons:
            d.wait_message("READY=1")
        prom, pport = servers.prometheus(tmp_path, ports, rule_files=[os.path.abspath(RULES)])
        before = wait_for(lambda: (lambda r: r if len(r) == 3 else None)(_ratios(pport)), timeout=90,
                          what="a fleet ratio for each of the three hosts")
        slow = f"127.0.0.1:{ports[2]}"
        with read_iops_cap(volumes[2].major_minor, 300):
            capped_at = time.time()
            # a probe of the capped volume, seen by Prometheus and put through the rules
            after = wait_for(lambda: (lambda r: r if len(r) == 3 and r[slow] < 0.2 else None)(_ratios(pport)),
                             timeout=60, what=f"{slow}'s ratio to the fleet median under 0.2")
            print(f"ratio to the fleet median before: {before}; {time.time() - capped_at:.0f} s after the cap: {after}")
            for instance, ratio in after.items():
                if instance != slow:
                    assert 0.5 < ratio < 2.0, (instance, after)   # the healthy hosts: unremarked
            # the rule's view from the fleet's side: the slow one is the only host far below the median
            far = servers.query(pport, f"{RATIO} < 0.5")["data"]["result"]
            assert [r["metric"]["instance"] for r in far] == [slow], far
        for d in daemons:
            assert "Traceback" not in d.output()
    finally:
        if prom is not None:
            prom.stop()
        for d in daemons:
            d.close()
        for fs in volumes:
            fs.close()
