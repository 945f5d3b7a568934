"""Scenario 4: a disk hot-removed under a running probe, and re-added on another slot under
another kernel name: the failure is a recorded result, the daemon runs on, the disk's series
leave /metrics, and the identity and its baselines are the same afterwards."""
from __future__ import annotations

from tests.integration.helpers import wait_for

from .scrape import samples
from .vm import Disk

HOT_WWN = "0x5000c50000002a01"
# takes the freed kernel name (sd_mod reuses the lowest free index), so the disk comes back as another
FILLER_WWN = "0x5000c50000003a01"
FILLER = Disk("fill", "scsi", 64, serial="lab-fill", wwn=FILLER_WWN)


def _rows(lab, since: float) -> list[list]:
    return lab.sql("SELECT started_at, device, identity, ok, error FROM probe_results "
                   "WHERE target = 'hot' AND started_at >= ? ORDER BY id", since)


def test_hot_removed_disk_fails_its_probe_and_returns_with_its_identity(lab):
    g = lab.guest
    old_name = lab.dev(f"wwn-{HOT_WWN}")
    lab.configure({"hot": 2.0}, profiles={"hot": "long"})
    t0 = lab.guest_clock()
    # the warm-up of the disk's baseline (4 probes), learned under its wwn. Each probe is 6 s of fio, but under
    # TCG on a busy host fio's start and the daemon's own restart take as long again or more: the wait is the
    # run's, not the product's, so it is generous and says what it saw when it ends
    try:
        wait_for(lambda: len([r for r in _rows(lab, t0) if r[3] == 1]) >= 5, timeout=480, what="probes of /srv/hot")
    except AssertionError as e:
        raise AssertionError(f"{e}; probe results since the restart: {_rows(lab, t0)}; the journal's last lines:\n"
                             + "\n".join(lab.journal().splitlines()[-40:])) from None
    identity = f"wwn:{HOT_WWN}"
    learned = lab.sql("SELECT metric, learned_at FROM baselines WHERE identity = ? AND profile = 'long'", identity)
    assert learned, lab.sql("SELECT identity, profile FROM baselines")
    pid = g.run(["systemctl", "show", "-p", "MainPID", "--value", "iowarden"]).strip()

    # unplug while a probe runs (each runs 6 s of every 8)
    wait_for(lambda: "fio" in g.run(["ps", "-eo", "comm"]), timeout=60, what="a probe running")
    unplugged = lab.guest_clock()
    g.unplug("hp1")
    failed = wait_for(lambda: [r for r in _rows(lab, unplugged - 8) if r[3] == 0], timeout=120,
                      what="the interrupted probe recorded as failed")
    assert failed[0][4], failed   # with its error
    wait_for(lambda: not [l for l, _ in samples(lab.metrics(), "iowarden_disk_reads_completed_total")
                          if l.get("device") == old_name], timeout=60, what=f"{old_name}'s series to leave /metrics")
    wait_for(lambda: not [l for l, _ in samples(lab.metrics(), "iowarden_block_queue_info")
                          if l.get("device") == old_name], timeout=90, what=f"{old_name}'s queue settings to leave")
    assert g.run(["systemctl", "is-active", "iowarden"]).strip() == "active"
    assert g.run(["systemctl", "show", "-p", "MainPID", "--value", "iowarden"]).strip() == pid, "the daemon restarted"

    # back, on another slot and under another name
    g.sh("umount -l /srv/hot")
    g.plug(FILLER, **{"scsi-id": 5})
    # the filler named before the disk is plugged: the kernel names disks as their scans end, and on a busy
    # machine the second scan can end first and take the name the filler was plugged to take
    wait_for(lambda: g.agent.run(["test", "-e", f"/dev/disk/by-id/wwn-{FILLER_WWN}"])[0] == 0, timeout=60,
             what="udev's link for the filler")
    g.plug(Disk("hp1", "scsi", 320, serial="lab-hp1", wwn=HOT_WWN), **{"scsi-id": 6})
    wait_for(lambda: g.agent.run(["test", "-e", f"/dev/disk/by-id/wwn-{HOT_WWN}"])[0] == 0, timeout=60,
             what="udev's link for the disk")
    new_name = lab.dev(f"wwn-{HOT_WWN}")
    assert new_name != old_name, f"the kernel gave it the same name {new_name}"
    back = lab.guest_clock()
    g.sh(f"mount /dev/disk/by-id/wwn-{HOT_WWN} /srv/hot")
    rows = wait_for(lambda: [r for r in _rows(lab, back) if r[3] == 1], timeout=180,
                    what=f"a probe of the disk back as {new_name}")
    assert rows[0][1] == new_name and rows[0][2] == identity, rows[0]
    # the same baselines: not relearned from scratch under a new key
    after = lab.sql("SELECT metric, learned_at FROM baselines WHERE identity = ? AND profile = 'long'", identity)
    assert dict(map(tuple, after)) == dict(map(tuple, learned))
    assert not lab.sql("SELECT identity FROM baselines WHERE identity LIKE ?", f"%{new_name}%")
    assert g.run(["systemctl", "show", "-p", "MainPID", "--value", "iowarden"]).strip() == pid
    text = lab.metrics()
    assert [l for l, _ in samples(text, "iowarden_probe_success", target="hot") if l["device"] == new_name
            and l["volume"] == identity]
    print(f"hotplug: {old_name} -> {new_name}, identity {identity}, failed probe: {failed[0][4][:120]}")
