"""The knee the daemon learns from a lab disk's own traffic, against the one `iowarden characterize` measures on
it: the lab's `wsd` disk (/srv/ws) capped by QEMU's throttle, as a provisioned cloud volume is capped by its
hypervisor. The throttle holds requests outside the guest, so the guest's await is flat below the cap and rises
at it, as a provisioned volume's does to its owner. (tests/integration/test_headroom_knee.py holds the same on a
host loop volume capped by a cgroup limit.)"""
from __future__ import annotations

import json
import re

import pytest

from tests.integration.helpers import wait_for

from .scrape import samples
from .sweep import characterize

# alone: under TCG a disk's await at light load is the emulated CPU's, and beside a busy lane it wanders
# (tests/integration/test_headroom_knee.py saw a loop volume's wander two-fold and read as a knee)
pytestmark = pytest.mark.alone

# In the middle of a load bin of its own (bins are half an octave: 181-256 IOPS), so the windows at the cap and
# those of the level below it (161, in 128-181) learn two neighbouring bins around the knee
CAP_IOPS = 215
# A day of load, compressed: a light level (27 IOPS: three octaves under the cap, the unloaded await), three
# quarters of the cap, and as fast as four requests at a time go (a queue of four at the cap: 19 ms), each held
# for its seconds of the lab's 2 s windows (a load bin learns after 20). Each is held half again as long as its
# 20 windows: on a busy host the emulated guest's fio strays from its rate, and of 30 windows at a level as few
# as 15 stayed in its bin
LEVELS = ((27, 90), (161, 100), (0, 80))
CONFIG = "/etc/iowarden/config.toml"
LOAD = "/srv/ws/walk.dat"


def _read_metric(lab, name: str, device: str) -> float | None:
    found = [v for labels, v in samples(lab.metrics(), name) if labels.get("device") == device
             and labels.get("direction") == "read"]
    return found[0] if found else None


def _fio(g, iops: int, seconds: int) -> None:
    g.run(["fio", "--name=walk", f"--filename={LOAD}", "--rw=randread", "--bs=4k", "--size=64M", "--direct=1",
           "--ioengine=libaio", "--iodepth=4" if iops == 0 else "--iodepth=1",
           *([f"--rate_iops={iops}"] if iops else []), "--time_based", f"--runtime={seconds}",
           "--output=/dev/null"], timeout=seconds + 180)


def _curve(lab) -> str:
    """The saved read curves, for a failure's message (saved at the daemon's stop)."""
    lab.guest.run(["systemctl", "stop", "iowarden"], timeout=180)
    rows = lab.sql("SELECT identity, state FROM baselines WHERE metric = 'curve:read:iops'")
    return " | ".join(f"{identity}: {json.dumps(json.loads(state))[:600]}" for identity, state in rows)


def test_a_lab_disk_capped_by_its_hypervisor_learns_a_knee_near_characterizes(lab):
    g = lab.guest
    disk = lab.dev("virtio-lab-wsd")
    lab.configure({"nvme": 3600.0})   # the daemon probes elsewhere: the disk's curve is the walk's alone
    g.run(["fio", "--name=layout", f"--filename={LOAD}", "--rw=write", "--bs=1M", "--size=64M", "--direct=1",
           "--output=/dev/null"], timeout=300)
    g.throttle("wsd", CAP_IOPS)
    try:
        # characterize beside a stopped daemon, so its sweep (every depth at the cap) is not in the curve learned
        # below; -c stores its result as the volume's capability, which `status` shows beside the learned knee
        g.run(["systemctl", "stop", "iowarden"], timeout=180)
        doc = characterize(lab, "/srv/ws", "-c", CONFIG)
        points = {p["value"]: p for p in doc["points"] if p["sweep"] == "qd"}
        char_knee = points[doc["findings"]["qd"]["knee_depth"]]["iops"]
        sweep = {q: round(p["iops"]) for q, p in points.items()}
        assert abs(char_knee - CAP_IOPS) <= 0.15 * CAP_IOPS, sweep   # the sweep found the cap
        g.run(["systemctl", "start", "iowarden"], timeout=180)
        wait_for(lambda: samples(lab.metrics(), "iowarden_disk_reads_completed_total", device=disk), timeout=60,
                 what=f"the daemon sampling {disk}")
        for iops, seconds in LEVELS:
            _fio(g, iops, seconds)
        try:
            knee = wait_for(lambda: _read_metric(lab, "iowarden_device_knee_iops", disk), timeout=60,
                            what="the learned knee")
        except AssertionError:
            raise AssertionError(f"no knee learned on {disk}: {_curve(lab)}") from None
        print(f"learned knee {knee:,.0f} IOPS; characterize's {char_knee:,.0f} IOPS (sweep {sweep}; cap {CAP_IOPS})")
        assert abs(knee - char_knee) <= 0.25 * char_knee, (knee, char_knee, sweep)

        # the curve is saved at the stop and read back at the start; the peak load is the running daemon's own
        g.run(["systemctl", "restart", "iowarden"], timeout=180)
        half = round(knee / 2)
        _fio(g, half, 24)
        ratio = wait_for(lambda: _read_metric(lab, "iowarden_device_headroom_ratio", disk), timeout=60,
                         what="the headroom of a load at half the knee")
        print(f"at {half:,} IOPS the headroom reads {ratio:.2f}")
        assert 1.6 <= ratio <= 2.4, ratio
        # both knees in one place: characterize's cap and depth, and the learned knee with the headroom
        g.run(["systemctl", "stop", "iowarden"], timeout=180)   # the views `status` reads are saved at the stop
        status = g.run(["iowarden", "status"], timeout=120)
        assert "capability " in status and "knee at queue depth" in status, status
        row = next((line for line in status.splitlines() if line.split()[:1] == [disk]), "")
        said = re.search(r"(\d+\.\d)x \(knee ([\d,]+) IOPS read\)", row)
        assert said and abs(float(said[1]) - ratio) <= 0.1, status
    finally:
        g.throttle("wsd", 0)
        g.run(["rm", "-f", LOAD], check=False)
        g.run(["systemctl", "start", "iowarden"], timeout=180, check=False)
