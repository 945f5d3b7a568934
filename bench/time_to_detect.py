"""Time to detect a volume slowed 10x, 3x and 1.5x, at the shipped example's schedule, under the week's workload.

    .venv/bin/python bench/time_to_detect.py [--factors 10,3,1.5] [--give-up-minutes 30]

Four stacked loop XFS volumes of one size carry the compressed week's mix (tests/integration/soak_mix.py:
a database mix on a daily cycle, backups and compactions at full speed, moving writes, fsync-heavy writes,
page-cache reads, fstrim). One daemon runs the shipped example's configuration as it is (probes every
300 s, a warm-up every 60 s until 12 probes are learned, 15 s passive windows); only where it looks is
changed. Volume 0 learns its normal before the mix starts (see main: a volume busy from its first minute
does not arm); once it is armed and the mix is under way, volume 0 is slowed by each factor in turn (a
cgroup v1 limit on the device under it, at the mix's peak IOPS per volume divided by the factor, reads and
writes), until the daemon raises an alert for it that pages when raised (VolumeAtLimit waits 10 minutes in
the shipped rules: its time is printed, and the bench watches on) or the give-up time passes; then the limit
is lifted and the bench waits for the alerts to clear. The reference, printed beside each figure, is the probe interval: a detector that
needs k probes takes about k intervals. Needs root; about an hour.
"""
import argparse
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.integration.helpers import DaemonProc, blkio_cap, free_port  # noqa: E402
from tests.integration.soak_mix import Mix, mix_config, stacked_volumes  # noqa: E402

INTERVAL_S = 300.0
# the shipped rule waits 10 minutes (`for: 10m`) before it pages: raised first, it is a warning on /metrics,
# and the bench watches on for an alert that pages when raised
PAGES_LATER = {"VolumeAtLimit"}


def samples(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return {f.name: f.samples for f in text_string_to_metric_families(r.read().decode())}


def alerts_for(fams: dict, target: str, devices: set[str]) -> list[str]:
    return sorted({f"{s.labels['alert']}({s.labels.get('profile') or s.labels.get('device')})"
                   for s in fams.get("iowarden_alert_active", [])
                   if s.value == 1 and (s.labels.get("target") == target or s.labels.get("device") in devices)})


def wait(fn, timeout: float, every: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(every)
    return None


def main() -> None:
    # SIGTERM ends the bench through its exit handlers: its daemon, fio jobs, mounts and loop devices go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--factors", default="10,3,1.5")
    ap.add_argument("--give-up-minutes", type=float, default=30.0)
    ap.add_argument("--clear-minutes", type=float, default=30.0, help="how long to wait for the alert to clear")
    ap.add_argument("--base-iops", type=int, default=1200, help="the database mix's peak per volume")
    ap.add_argument("--benign-minutes", type=float, default=0.0,
                    help="after the last factor, the mix alone for this long: alerts raised for healthy volumes")
    ap.add_argument("--keep-log", type=Path, default=None, help="copy the daemon's log here at the end")
    args = ap.parse_args()
    factors = [float(f) for f in args.factors.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="iowarden-bench-ttd-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, True)
        lowers, uppers = stacked_volumes(stack, tmp)
        mix = Mix([u.mountpoint for u in uppers], args.base_iops)
        mix.lay_out()
        port = free_port()
        daemon = DaemonProc(tmp, mix_config(tmp / "state", port, [u.mountpoint for u in uppers],
                                            [v.name for v in lowers + uppers], compressed=False))
        if args.keep_log is not None:   # runs before the cleanup above: callbacks run last first
            stack.callback(lambda: shutil.copyfile(daemon.log.name, args.keep_log))
        stack.callback(daemon.close)
        daemon.wait_message("READY=1", timeout=60)
        t0 = time.monotonic()
        # the volume to be slowed learns its normal before the mix starts: a warm-up probe that waited out
        # max_deferral_seconds on a busy device runs contended and is not learned, so a volume busy from its
        # first minute does not arm (one run: not armed after 53 min, 1,591 busy deferrals)
        volume = f"fs-uuid:{uppers[0].fs_uuid}"

        def armed_now():
            learning = [s for s in samples(port).get("iowarden_baseline_learning", [])
                        if s.labels.get("volume") == volume]
            return learning and not [s for s in learning if s.value == 1]
        armed = wait(armed_now, 3600, every=15)
        print(f"{uppers[0].mountpoint.name} armed after {time.monotonic() - t0:.0f} s (warm-up: a probe per profile "
              f"every 60 s until 12 are learned)" if armed else "NOT armed within an hour", flush=True)
        if not armed:
            raise SystemExit(1)
        mix.start()
        stack.callback(mix.stop)
        time.sleep(120)   # the mix is under way (its daily cycle, a backup, a compaction) before any slowdown
        target, devices = uppers[0].mountpoint.name, {uppers[0].name, lowers[0].name}
        print(f"\n{'slowdown':>9} {'limit IOPS':>10} {'time to detect':>15} {'in intervals':>12} "
              f"{'time to page':>13} {'time to clear':>14}  alerts, at seconds after the limit")
        settle_alerts: list[str] = []
        for factor in factors:
            # each factor starts from a quiet volume: no alert for it for a minute (an alert left open, or
            # raised again while it settled, would be counted as this factor's detection)
            quiet_since = None
            settle_end = time.monotonic() + 600
            while time.monotonic() < settle_end:
                open_now = alerts_for(samples(port), target, devices)
                if open_now:
                    settle_alerts.append(f"before {factor:g}x: {', '.join(open_now)}")
                    quiet_since = None
                elif quiet_since is None:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= 60:
                    break
                time.sleep(5)
            # the volume's load divided by the factor, as the soak does (a third of its load): a cap at the
            # probe's 4k IOPS over 10 (one run: 4,000 of 40,000) left the upper volume's reads to the lower
            # file system's page cache and held nothing; no alert in 20 minutes, and no fault either
            cap = max(20, int(args.base_iops / factor))
            start = time.monotonic()
            with blkio_cap("read_iops_device", lowers[0].major_minor, cap), \
                    blkio_cap("write_iops_device", lowers[0].major_minor, cap):
                first: dict[str, float] = {}

                def paged():
                    now = alerts_for(samples(port), target, devices)
                    for a in now:
                        first.setdefault(a, time.monotonic() - start)
                    return [a for a in now if a.split("(")[0] not in PAGES_LATER]
                page = wait(paged, args.give_up_minutes * 60)
                page_s = time.monotonic() - start
                raised = sorted(first, key=first.get)
                took = first[raised[0]] if raised else page_s
            lifted = time.monotonic()
            cleared = wait(lambda: not alerts_for(samples(port), target, devices),
                           args.clear_minutes * 60) if raised else True
            clear_s = time.monotonic() - lifted
            cleared_said = "-" if not raised else f"> {args.clear_minutes:g} min"
            print(f"{factor:>8g}x {cap:>10d} "
                  f"{(f'{took:.0f} s' if raised else f'> {args.give_up_minutes:g} min'):>15} "
                  f"{(f'{took / INTERVAL_S:.1f}' if raised else '-'):>12} "
                  f"{(f'{page_s:.0f} s' if page else '-'):>13} "
                  f"{(f'{clear_s:.0f} s' if raised and cleared else cleared_said):>14}  "
                  f"{', '.join(f'{a} {first[a]:.0f}' for a in raised) if raised else 'none'}", flush=True)
        if args.benign_minutes:
            print(f"\nthe mix alone for {args.benign_minutes:g} min more, no limit anywhere", flush=True)
            time.sleep(args.benign_minutes * 60)
        others = [a for u, lo in zip(uppers[1:], lowers[1:])
                  for a in alerts_for(samples(port), u.mountpoint.name, {u.name, lo.name})]
        print(f"\nalerts open for the volume with no limit on it (while settling): "
              f"{sorted(set(settle_alerts)) or 'none'}")
        print("the daemon's alert lines:")
        for line in daemon.output().splitlines():
            if "ALERT" in line:
                print("  " + line[:300])
        print(f"\nreference: the probe interval is {INTERVAL_S:.0f} s; alerts open on the three healthy volumes at "
              f"the end: {others or 'none'}")


if __name__ == "__main__":
    main()
