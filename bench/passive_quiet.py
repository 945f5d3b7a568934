"""A healthy busy volume for an hour: how many passive alerts does the daemon raise? (It should be none.)

    sudo .venv/bin/python bench/passive_quiet.py [--minutes 60]

The integration test's scenario, longer: a stacked loop volume (tests/integration/test_passive.py),
the daemon probing it every 10 s with 5 s passive windows, and a foreign random read/write
workload at half the probe's IOPS, bursting fourfold every few seconds. Prints the windows judged,
the passive alerts raised (and VolumeDegraded), and the peak slowdown ratio seen.
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.helpers import DaemonProc, config_text, free_port  # noqa: E402
from tests.integration.test_passive import (PASSIVE, metric, passive_alerts, scrape, stacked_volume,  # noqa: E402
                                            workload)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60.0)
    args = ap.parse_args()
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="iowarden-quiet-"))
    with stacked_volume() as (lower, upper):
        d = DaemonProc(tmp, config_text(upper.mountpoint, tmp / "state", interval=10.0, port=port, extra=PASSIVE))
        try:
            d.wait_message("READY=1")
            time.sleep(30)
            probe_iops = metric(scrape(port), "iowarden_probe_iops", target="loop", direction="read") or 2000
            seen, peak, scrapes = set(), 0.0, 0
            t0 = time.monotonic()
            with workload(upper.mountpoint, rate_iops=int(probe_iops / 2), seconds=int(args.minutes * 60) + 30,
                          bursts=True):
                while time.monotonic() - t0 < args.minutes * 60:
                    time.sleep(15)
                    text = scrape(port)
                    scrapes += 1
                    seen.update(passive_alerts(text))
                    r = metric(text, "iowarden_passive_slowdown_ratio", device=upper.name, direction="read")
                    peak = max(peak, r or 0.0)
            text = scrape(port)
            windows = metric(text, "iowarden_passive_learned_windows", device=upper.name, direction="read")
            degraded = d.output().count("ALERT VolumeDegraded")
            print(f"{args.minutes:g} min of a bursty healthy workload on {upper.name} (probe {probe_iops:,.0f} IOPS, "
                  f"workload {probe_iops / 2:,.0f} IOPS bursting fourfold)")
            print(f"windows in the read curve: {windows:.0f}; scrapes: {scrapes}; peak read slowdown ratio seen "
                  f"in a scrape: {peak:.2f}")
            print(f"passive alerts raised: {sorted(seen) or 'none'}; VolumeDegraded raised: {degraded}")
        finally:
            d.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
