"""Scenarios 1, 2 and 6 on real md arrays: settings drift of a member and of the array, a RAID1
member failed, removed, re-added and resynced under a real Prometheus with the shipped rules,
and a RAID0 member slowed by QEMU while a workload runs."""
from __future__ import annotations

import time
from pathlib import Path

from tests.integration.helpers import wait_for
from tests.integration.servers import prometheus, query

from .scrape import alerts, samples, value

RULES = Path(__file__).resolve().parents[2] / "packaging/prometheus/iowarden.rules.yml"
M1A, M1B = "wwn-0x5000c50000001a01", "wwn-0x5000c50000001b01"


def _open_alerts(lab, alert: str, target: str) -> list[list]:
    return lab.sql("SELECT identity, causes, raised_at FROM alerts WHERE alert = ? AND target = ? "
                   "AND cleared_at IS NULL", alert, target)


def _ok_probes(lab, target: str, since: float) -> int:
    return len(lab.sql("SELECT id FROM probe_results WHERE target = ? AND ok = 1 AND started_at >= ?", target, since))


def _armed(lab, target: str) -> bool:
    """Every baseline of the target's volume is armed (none still warming up)."""
    text = lab.metrics()
    volumes = {labels.get("volume") for labels, _ in samples(text, "iowarden_probe_iops", target=target)}
    flags = [v for labels, v in samples(text, "iowarden_baseline_learning") if labels.get("volume") in volumes]
    return bool(flags) and all(v == 0 for v in flags)


def _band_lower_read_iops(lab, target: str) -> float | None:
    text = lab.metrics()
    volumes = {labels.get("volume") for labels, _ in samples(text, "iowarden_probe_iops", target=target)}
    edges = [v for labels, v in samples(text, "iowarden_baseline_band_lower_iops")
             if labels.get("volume") in volumes and labels.get("metric") == "read_iops"]
    return min(edges) if edges else None


def test_drifted_member_scheduler_and_array_readahead_are_recorded_and_named_when_the_mirror_slows(lab):
    g = lab.guest
    member, md = lab.dev(M1A), "md1"
    lab.configure({"mirror": 3.0})
    t0 = lab.guest_clock()
    wait_for(lambda: _ok_probes(lab, "mirror", t0) >= 6, timeout=240, what="the mirror's warm-up probes")
    # armed, not only six probes run: warm-up probes that scatter (a loaded host: 206 to 1,191 IOPS beside the
    # week lane) keep it learning, and a cap applied then is learned as the mirror's normal, never raised
    wait_for(lambda: _armed(lab, "mirror"), timeout=300, what="the mirror's baselines armed")
    sched = f"/sys/block/{member}/queue/scheduler"
    before = g.run(["cat", sched]).split("[")[1].split("]")[0]
    other = "mq-deadline" if before != "mq-deadline" else "none"
    ra_before = g.run(["cat", f"/sys/block/{md}/queue/read_ahead_kb"]).strip()
    g.sh(f"echo {other} > {sched}; echo 4096 > /sys/block/{md}/queue/read_ahead_kb")
    try:
        drift = wait_for(lambda: (lambda rows: rows if len(rows) >= 2 else None)(lab.sql(
            "SELECT device, setting, old_value, new_value FROM drift_events WHERE at >= ? AND "
            "setting IN ('scheduler', 'read_ahead_kb') ORDER BY id", t0)), timeout=60, what="both drifts recorded")
        assert [member, "scheduler", before, other] in drift, drift
        assert [md, "read_ahead_kb", ra_before, "4096"] in drift, drift
        assert _open_alerts(lab, "VolumeDegraded", "mirror") == []

        # then the mirror slows (both members capped, as a host's neighbour would): the alert names the drift.
        # The cap is set from the normal the daemon learned, not from the last probes: the mirror's normal is
        # learned across the lab's scenarios (its baseline is kept by identity), beside a busy suite at 206 to
        # 2,527 IOPS, and a cap of a fraction of its last fast probes (80 IOPS against 1,500) still left it
        # within a normal learned lower. Two members' reads at a sixth of the band's lower edge each: the
        # mirror at a third of the slowest it was ever normal.
        lower = _band_lower_read_iops(lab, "mirror")
        cap = min(40, max(3, int(lower / 6))) if lower else 40
        print(f"the mirror's normal band's lower edge: {lower} read IOPS; a cap of {cap} IOPS a member")
        slowed = lab.guest_clock()
        for disk in ("m1a", "m1b"):
            g.throttle(disk, cap)
        try:
            degraded = wait_for(lambda: _open_alerts(lab, "VolumeDegraded", "mirror"), timeout=180,
                                what="VolumeDegraded on /srv/mirror")[0]
        except AssertionError:
            rows = lab.sql("SELECT started_at, ok, error, contended, read_iops FROM probe_results "
                           "WHERE target = 'mirror' AND started_at >= ? ORDER BY id", slowed - 30)
            print("mirror probes around the cap:", rows)
            print("baselines:", [line for line in lab.metrics().splitlines()
                                 if line.startswith(("iowarden_baseline", "iowarden_deviation_score"))])
            print(lab.journal()[-6000:])
            raise
        causes = degraded[1]
        assert f"{member}" in causes and "scheduler" in causes and other in causes, causes
        assert "read_ahead_kb" in causes and "4096" in causes, causes
        # md marking the array active for a write and clean again is its own doing, not a drift
        assert "array_state" not in causes and "array_mode" not in causes, causes
        print(f"VolumeDegraded on the mirror {lab.guest_clock() - slowed:.0f} s after the cap; causes: {causes[:400]}")
    finally:
        for disk in ("m1a", "m1b"):
            g.throttle(disk, 0)
        g.sh(f"echo {before} > {sched}; echo {ra_before} > /sys/block/{md}/queue/read_ahead_kb")


def _firing(prom_port: int) -> list[dict]:
    res = query(prom_port, 'ALERTS{alertname="IowardenMdArrayDegraded", alertstate="firing"}')
    return [r["metric"] for r in res.get("data", {}).get("result", [])]


def test_raid1_member_failed_is_alerted_by_the_shipped_rule_and_clears_after_the_resync(lab, tmp_path):
    g = lab.guest
    lab.configure({"mirror": 30.0})
    failed = lab.dev(M1B)
    prom, prom_port = prometheus(tmp_path, lab.guest.metrics_port, rule_files=[str(RULES)])
    try:
        wait_for(lambda: query(prom_port, "iowarden_md_degraded_devices").get("data", {}).get("result"),
                 timeout=120, what="Prometheus scraping the guest")
        assert _firing(prom_port) == []
        t0 = lab.guest_clock()
        g.run(["mdadm", "/dev/md1", "--fail", f"/dev/{failed}"])
        firing = wait_for(lambda: _firing(prom_port), timeout=90, what="IowardenMdArrayDegraded firing")
        assert {f["device"] for f in firing} == {"md1"}
        text = lab.metrics()
        assert value(text, "iowarden_md_member_faulty", device="md1", member=failed) == 1
        # the faulty member by name, in the record of what changed on the array
        drift = wait_for(lambda: lab.sql("SELECT new_value FROM drift_events WHERE device = 'md1' AND "
                                         "setting = 'md.faulty_members' AND at >= ?", t0), what="the drift")
        assert drift[-1][0] == failed

        # removed and added back: the array rebuilds (slowed, so the resync is seen), then is whole
        g.sh("echo 2000 > /proc/sys/dev/raid/speed_limit_max")
        g.run(["mdadm", "/dev/md1", "--remove", f"/dev/{failed}"])
        g.run(["mdadm", "--zero-superblock", f"/dev/{failed}"])
        g.run(["mdadm", "/dev/md1", "--add", f"/dev/{failed}"])
        wait_for(lambda: [l for l, _ in samples(lab.metrics(), "iowarden_md_info", device="md1")
                          if l["sync_action"] == "recover"], timeout=60, what="the resync seen as sync_action recover")
        assert _firing(prom_port), "the array is not whole while it rebuilds"
        g.sh("echo 200000 > /proc/sys/dev/raid/speed_limit_max")
        g.run(["mdadm", "--wait", "/dev/md1"], check=False, timeout=300)
        wait_for(lambda: value(lab.metrics(), "iowarden_md_degraded_devices", device="md1") == 0, timeout=60,
                 what="md1 whole again")
        wait_for(lambda: _firing(prom_port) == [], timeout=60, what="the alert to clear")
    finally:
        prom.stop()
        g.sh("echo 200000 > /proc/sys/dev/raid/speed_limit_max", check=False)


LOAD = ["systemd-run", "--unit", "lab-load", "fio", "--name=load", "--directory=/srv/raid0", "--rw=randread",
        "--bs=4k", "--size=64M", "--direct=1", "--ioengine=libaio", "--iodepth=2", "--time_based",
        "--runtime=900", "--rate_iops=150", "--output=/dev/null"]


def test_raid0_slow_member_is_named_not_its_peers_nor_the_array(lab):
    g = lab.guest
    r0 = {c: lab.dev(f"virtio-lab-r0{c}") for c in "abcd"}
    slow = r0["c"]
    # the array is busy with the workload, so its probes run contended: the deep profile's total says what the
    # array delivers (a shallow probe's total is what the workload asks, and is not judged)
    lab.configure({"raid0": 10.0}, profiles={"raid0": "deep"})
    g.run(["systemctl", "stop", "lab-load"], check=False)
    g.run(LOAD)
    try:
        _slow_member_scenario(lab, r0, slow)
    except BaseException:
        # CI failed here once with nothing to read: what the daemon said and saw goes with the failure
        try:
            alerts_said = [x for x in lab.journal().splitlines() if "ALERT" in x]
            print("daemon's alerts:", *alerts_said[-30:], sep="\n  ")
            text = lab.metrics()
            print("peer ratios:", [l for l in text.splitlines() if l.startswith("iowarden_passive_peer_ratio")])
            print("baselines learning:", [l for l in text.splitlines() if l.startswith("iowarden_baseline_learning")])
            print("the array's last probes:", lab.sql("SELECT profile, ok, contended, read_iops, error FROM probe_results "
                                                      "WHERE target = 'raid0' ORDER BY id DESC LIMIT 12"))
        except Exception as exc:   # the failure itself is what the report must carry
            print(f"(no diagnostics: {exc})")
        raise
    finally:
        g.throttle("r0c", 0)
        g.run(["systemctl", "stop", "lab-load"], check=False)


def _slow_member_scenario(lab, r0: dict, slow: str) -> None:
    g = lab.guest
    t0 = lab.guest_clock()
    wait_for(lambda: _ok_probes(lab, "raid0", t0) >= 6, timeout=300, what="the array's warm-up probes")
    # armed, not only probed: a baseline still learning raises nothing, and the throttle would be learned as normal
    wait_for(lambda: _armed(lab, "raid0"), timeout=300, what="the array's baselines armed")
    text = lab.metrics()
    assert [a for a in alerts(text, "SlowMember")] == []
    # the fleet's class of each: the array by its layout over its members' one class, as the guest's kernel made it
    classes = {labels["device"]: (labels["class"], labels["source"])
               for labels, _ in samples(text, "iowarden_volume_class_info")}
    members = {classes[d] for d in r0.values()}
    assert len(members) == 1, classes
    (member_class, source), = members
    assert classes["md0"] == (f"md:raid0:4x{member_class}", "layout"), classes
    print("classes:", {d: classes[d] for d in ("md0", *r0.values())})
    throttled_at = time.monotonic()
    g.throttle("r0c", 30)
    # 63 s on an idle machine (a minute of 2 s windows for the severe rule); the guest is slower beside the suite
    found = wait_for(lambda: alerts(lab.metrics(), "SlowMember"), timeout=240, what="SlowMember")
    took = time.monotonic() - throttled_at
    assert {a["device"] for a in found} == {slow}, found
    assert found[0]["volume"] == "serial:lab-r0c"
    # the gauge is the median of the member's last few windows: a window of the deep probe (every 10 s, all four
    # members loaded at once) can bring it near its peers' for a moment; what holds is that it stands far out
    text = wait_for(lambda: (lambda t: t if (value(t, "iowarden_passive_peer_ratio", device=slow) or 0) > 4 else None)(
        lab.metrics()), timeout=120, what=f"{slow}'s peer ratio above 4")
    for name in set(r0.values()) - {slow}:
        assert value(text, "iowarden_passive_peer_ratio", device=name) < 2
    # the probes of the array see it slow; the cause names the member, not the array's own limit
    degraded = wait_for(lambda: _open_alerts(lab, "VolumeDegraded", "raid0"), timeout=240,
                        what="VolumeDegraded on /srv/raid0")[0]
    assert slow in degraded[1], degraded[1]
    time.sleep(10)   # the array's own verdicts had their chance
    text = lab.metrics()
    on_array = [a for kind in ("VolumeAtLimit", "DeviceSlow", "SlowMember") for a in alerts(text, kind)
                if a["device"] == "md0"]
    assert on_array == [], on_array
    assert not [a for kind in ("SlowMember", "DeviceSlow") for a in alerts(text, kind)
                if a["device"] in set(r0.values()) - {slow}]
    print(f"SlowMember {slow} after {took:.0f} s; VolumeDegraded causes: {degraded[1][:300]}")
