"""Scrapes racing probe workers, pollers and the sampler, for a minute: every scrape answered 200, no traceback, and what
/metrics says agrees with the database."""
import re
import threading
import time
import urllib.request

import pytest

from tests.conftest import LoopXfs
from tests.integration.helpers import free_port, rows, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]
SECONDS = 60


def test_three_targets_probing_every_second_under_four_scrapers_at_20_hz(loop_xfs, shared_loop_xfs, tmp_path,
                                                                         daemon_factory):
    third = LoopXfs("512M")
    try:
        mounts = {"a": loop_xfs, "b": shared_loop_xfs, "c": third}
        state = tmp_path / "state"
        port = free_port()
        targets = "".join(f'[[targets]]\nname = "{n}"\npath = "{fs.mountpoint}"\nprofiles = ["rr"]\n'
                          "interval_seconds = 1.0\n" for n, fs in mounts.items())
        d = daemon_factory(f"""
[prometheus]
listen_address = "127.0.0.1:{port}"
[daemon]
state_dir = "{state}"
[limits]
min_free_bytes = "1MiB"
min_free_ratio = 0.0
[budget]
device_time_ratio = 1.0
[settings]
interval_seconds = 1.0
[profiles.rr]
rw = "randread"
size = "8MiB"
runtime_seconds = 0.3
ramp_time_seconds = 0.0
{targets}""")
        d.wait_message("READY=1")
        db = str(state / "state.db")
        wait_for(lambda: len({r[0] for r in rows(db, "SELECT target FROM probe_results")}) == 3, timeout=90,
                 what="a result from each target")
        url = f"http://127.0.0.1:{port}/metrics"
        statuses: list[int] = []
        errors: list[str] = []
        stop = time.monotonic() + SECONDS

        def scraper():
            next_at = time.monotonic()
            while time.monotonic() < stop:
                try:
                    with urllib.request.urlopen(url, timeout=5) as r:
                        r.read()
                        statuses.append(r.status)
                except Exception as exc:   # noqa: BLE001 - any failure is the finding
                    errors.append(f"{type(exc).__name__}: {exc}")
                next_at += 0.05
                time.sleep(max(0.0, next_at - time.monotonic()))

        threads = [threading.Thread(target=scraper) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and set(statuses) == {200}, (errors[:5], set(statuses))
        print(f"{len(statuses)} scrapes in {SECONDS} s by 4 clients")
        assert len(statuses) >= 4 * 20 * SECONDS * 0.25         # they did scrape, at up to 20 Hz each
        # what /metrics says lies between two reads of the database around it
        # (the database keeps durations to the millisecond: half of one per result is rounding)
        sql = "SELECT device, sum(duration_seconds), count(*) FROM probe_results GROUP BY device"
        read_at = time.time()
        before = {dev: (total, n) for dev, total, n in rows(db, sql)}

        def scrape_of_a_snapshot_taken_after(t0):
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            taken = float(re.search(r"^iowarden_snapshot_timestamp_seconds (\S+)$", text, re.M).group(1))
            return text if taken > t0 else None

        # the core publishes every second: the first scrape of a snapshot taken after the first read
        text = wait_for(lambda: scrape_of_a_snapshot_taken_after(read_at), timeout=10, what="a newer snapshot")
        after = {dev: (total, n) for dev, total, n in rows(db, sql)}
        for fs in mounts.values():
            used = float(re.search(rf'^iowarden_budget_device_time_used_seconds{{device="{fs.name}"}} (\S+)$', text,
                                   re.M).group(1))
            slack = 0.0005 * after[fs.name][1] + 1e-6
            assert before[fs.name][0] - slack <= used <= after[fs.name][0] + slack, (fs.name, before, used, after)
        n = len(rows(db, "SELECT id FROM probe_results"))
        print(f"{n} probe results")
        assert n >= SECONDS / 2, f"only {n} probes in {SECONDS} s"
        out = d.output()
        assert "Traceback" not in out and "crashed" not in out, out[-3000:]
    finally:
        third.close()
