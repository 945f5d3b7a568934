"""The knee the daemon learns from a volume's own traffic, against the one `iowarden characterize` measures on it.

A volume with a provisioned ceiling, as a cloud volume's: a loop XFS whose image lives on another loop device
capped by a cgroup v1 blkio limit (soak_mix.stacked_volumes). The throttle holds requests before the lower
device counts them, so only the upper device, whose requests wait for the lower's, shows the queue: its await
is flat below the ceiling and rises at it, as a provisioned volume's does to its owner.
"""
import json
import re
import sqlite3
import subprocess
import sys
import urllib.request
from contextlib import ExitStack

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.helpers import blkio_cap, config_text, free_port, wait_for
from tests.integration.soak_mix import fio, job, stacked_volumes

# alone: a volume's await at light load is mostly the CPU's (a loop device completes on a worker thread), and
# beside a busy lane it wandered two-fold between levels, reading as a knee at 300 IOPS; a host's own light
# load does not change under it that way
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.alone]

CEILING_IOPS = 2400
# A day of load, compressed: each level held for its seconds of one-second windows (a load bin learns after 20,
# and a level's first and last windows straddle two), up to the ceiling (0: as fast as four requests at a time
# go: a queue of four at it, 1.7 ms) and down again. The levels are half an octave and more apart and the
# ceiling lies in a bin of its own (2,048-2,896), so the bins around the knee are both learned: the ceiling's
# once, those below it twice.
LEVELS = ((150, 22), (300, 22), (600, 22), (1200, 22), (1800, 22), (0, 40), (1800, 22), (1200, 22), (600, 22),
          (300, 22), (150, 22))


def device_metric(port: int, name: str, device: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for fam in text_string_to_metric_families(r.read().decode()):
            for s in fam.samples:
                if s.name == name and s.labels.get("device") == device and s.labels.get("direction") == "read":
                    return s.value
    return None


def learned_curve(state, device: str) -> str:
    """The upper device's saved read curve, bin by bin, and what its knee reads (for a failure's message)."""
    from iowarden.daemon.passive.curve import LatencyCurve
    from iowarden.daemon.passive.headroom import knee_of
    with sqlite3.connect(state / "state.db") as db:
        rows = db.execute("SELECT identity, state FROM baselines WHERE metric = 'curve:read:iops'").fetchall()
    said = []
    for identity, st in rows:
        c = LatencyCurve.from_state(json.loads(st))
        said.append(f"{identity}: " + ", ".join(f"{c.bin_load(b):.0f} IOPS {c.totals[b]:.0f} windows "
                                                f"{c.bin_median(b):.3f} ms" for b in sorted(c.bins))
                    + f"; {knee_of(c, 'iops', 20)}")
    return f"{device}: " + " | ".join(said)


def characterize_knee_iops(mount, cfg) -> tuple[float, dict]:
    """The IOPS at the knee of characterize's queue-depth sweep: the shallowest depth within a tenth of the
    saturation IOPS."""
    r = subprocess.run([sys.executable, "-m", "iowarden.daemon.cli", "characterize", "--path", str(mount),
                        "--sweep", "qd", "--size", "64MiB", "--step-seconds", "2", "--ramp-seconds", "0.5", "--json",
                        "--min-free-bytes", "1MiB", "--min-free-ratio", "0", "-c", str(cfg)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout
    doc = json.loads(r.stdout)
    found = doc["findings"]["qd"]
    points = {p["value"]: p for p in doc["points"]}
    return points[found["knee_depth"]]["iops"], {q: round(p["iops"]) for q, p in points.items()}


def test_the_knee_learned_from_a_walk_of_load_lies_near_characterizes_and_half_of_it_reads_a_headroom_of_two(
        tmp_path, daemon_factory):
    with ExitStack() as stack:
        lowers, uppers = stacked_volumes(stack, tmp_path, 1, in_ram=True)
        lower, upper = lowers[0], uppers[0]
        data = upper.mountpoint / "load.dat"
        subprocess.run(fio(*job("layout", data, "--rw=write", "--bs=1M", "--direct=1", "--size=64M")), check=True,
                       timeout=120)
        stack.enter_context(blkio_cap("read_iops_device", lower.major_minor, CEILING_IOPS))
        port = free_port()
        # the daemon's own probes go to the lower volume (a target must exist), so none of the upper's windows
        # carries them: its curve and its peak are the walk's alone
        text = config_text(lower.mountpoint, tmp_path / "state", interval=86400.0, port=port,
                           extra=f'[passive]\nwindow_seconds = 1.0\n[sampler]\ndevices = ["{upper.name}", '
                                 f'"{lower.name}"]\n')
        cfg = tmp_path / "config.toml"
        cfg.write_text(text)
        char_knee, sweep = characterize_knee_iops(upper.mountpoint, cfg)
        assert abs(char_knee - CEILING_IOPS) <= 0.1 * CEILING_IOPS, sweep   # the sweep found the ceiling

        d = daemon_factory(text)
        d.wait_message("READY=1", timeout=60)
        for rate, seconds in LEVELS:
            subprocess.run(fio(*job("walk", data, "--rw=randread", "--bs=4k", "--direct=1", "--size=64M",
                                    "--iodepth=4" if rate == 0 else "--iodepth=1", *([f"--rate_iops={rate}"]
                                                                                     if rate else []),
                                    "--time_based", f"--runtime={seconds}")), check=True, timeout=seconds + 60)
        try:
            knee = wait_for(lambda: device_metric(port, "iowarden_device_knee_iops", upper.name), timeout=30,
                            what="the learned knee")
        except AssertionError:
            d.close()
            raise AssertionError(f"no knee learned: {learned_curve(tmp_path / 'state', upper.name)}") from None
        print(f"learned knee {knee:,.0f} IOPS; characterize's {char_knee:,.0f} IOPS (sweep {sweep})")
        d.close()   # its curves are saved at the stop; the peak load is the running daemon's own
        curve = learned_curve(tmp_path / "state", upper.name)
        print(curve)
        assert abs(knee - char_knee) <= 0.25 * char_knee, (knee, char_knee, sweep, curve)

        again = daemon_factory(text)
        again.wait_message("READY=1", timeout=60)
        half = round(knee / 2)
        subprocess.run(fio(*job("half", data, "--rw=randread", "--bs=4k", "--direct=1", "--size=64M",
                                f"--rate_iops={half}", "--time_based", "--runtime=20")), check=True, timeout=90)
        ratio = wait_for(lambda: device_metric(port, "iowarden_device_headroom_ratio", upper.name), timeout=30,
                         what="the headroom of a load at half the knee")
        knee_now = device_metric(port, "iowarden_device_knee_iops", upper.name)
        print(f"at {half:,} IOPS the headroom reads {ratio:.2f} (the knee now {knee_now:,.0f} IOPS, so the peak "
              f"{knee_now / ratio:,.0f})")
        assert 1.6 <= ratio <= 2.4, ratio
        again.close()   # the views `status` reads are saved at the stop too
        status = subprocess.run([sys.executable, "-m", "iowarden.daemon.cli", "status", "-c", str(cfg)],
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        # both knees in one place: characterize's ceiling and depth, and the learned knee with the headroom
        assert "capability " in status.stdout and "knee at queue depth" in status.stdout, status.stdout
        # the upper device's line: the lower one, whose throttle holds requests before it counts them, may show a
        # knee of its own where the walk's bins happened to rise (1.0x at 1,041 IOPS once), and is listed first
        line = next((l for l in status.stdout.splitlines() if l.startswith(f"{upper.name} ")), "")
        said = re.search(r"(\d+\.\d)x \(knee ([\d,]+) IOPS read\)", line)
        assert said and abs(float(said[1]) - ratio) <= 0.1, status.stdout
