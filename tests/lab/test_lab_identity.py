"""Scenarios 3 and 5: identities as the real udev gives them (virtio serial, SCSI WWN, NVMe),
an NVMe namespace's queue settings, and an LVM stripe mapped to both of its disks."""
from __future__ import annotations

from tests.integration.helpers import wait_for

from .scrape import samples, value


def _udev(lab, dev: str) -> dict:
    out = lab.guest.run(["udevadm", "info", "--query=property", f"/dev/{dev}"])
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_identities_and_nvme_queue_settings_as_udev_and_sysfs_give_them(lab):
    lab.configure({"nvme": 5.0})
    nvme = lab.dev("nvme-QEMU_NVMe_Ctrl_LABNVME1")
    assert nvme.startswith("nvme"), nvme
    wait_for(lambda: value(lab.metrics(), "iowarden_probe_success", target="nvme") == 1, timeout=180,
             what="a probe of the NVMe namespace")
    text = lab.metrics()
    volumes = {labels["device"]: labels["volume"] for labels, _ in samples(text, "iowarden_disk_reads_completed_total")}
    # NVMe: the WWID udev derives from the controller (vendor, serial "LABNVME1" in hex, model, nsid)
    props = _udev(lab, nvme)
    assert props.get("ID_WWN", "").startswith("nvme."), props
    assert volumes[nvme] == f"wwn:{props['ID_WWN']}"
    assert "LABNVME1".encode().hex() in volumes[nvme]
    assert props.get("ID_SERIAL_SHORT") == "LABNVME1"
    # SCSI: the WWN the disk was given; virtio: its serial
    assert volumes[lab.dev("wwn-0x5000c50000001a01")] == "wwn:0x5000c50000001a01"
    assert volumes[lab.dev("virtio-lab-r0a")] == "serial:lab-r0a"
    # the probe's volume is the namespace's identity too
    probe = [labels for labels, _ in samples(text, "iowarden_probe_success", target="nvme")][0]
    assert probe["device"] == nvme and probe["volume"] == volumes[nvme]
    # its class across the fleet: the model and firmware udev read from the controller, and its size
    classes = {labels["device"]: (labels["class"], labels["source"])
               for labels, _ in samples(text, "iowarden_volume_class_info")}
    size_gib = int(lab.guest.run(["cat", f"/sys/block/{nvme}/size"]).strip()) * 512 / (1 << 30)
    shown = f"{round(size_gib)}GiB" if size_gib >= 1 else f"{round(size_gib * 1024)}MiB"
    assert classes.get(nvme) == (f"{props['ID_MODEL'].replace('_', ' ').strip()}/{props['ID_REVISION']}/{shown}",
                                 "model"), (classes, props.get("ID_MODEL"), props.get("ID_REVISION"))
    print("classes:", classes)
    # the guest's floppy controller has no medium (a size of a few sectors): no class, not "disk/0MiB"
    assert not [d for d, (c, _) in classes.items() if c.endswith("/0MiB") or not c], classes

    # the namespace's queue settings, as sysfs in the guest has them
    q = f"/sys/block/{nvme}/queue"
    sysfs = dict(line.split("=", 1) for line in lab.guest.sh(
        f"for f in scheduler nr_requests read_ahead_kb max_sectors_kb write_cache rotational; do "
        f"echo $f=$(cat {q}/$f); done").splitlines())
    active = sysfs["scheduler"].split("[")[1].split("]")[0]
    info = [labels for labels, _ in samples(text, "iowarden_block_queue_info") if labels["device"] == nvme][0]
    assert info["scheduler"] == active and info["write_cache"] == sysfs["write_cache"], (info, sysfs)
    assert value(text, "iowarden_block_queue_nr_requests", device=nvme) == int(sysfs["nr_requests"])
    assert value(text, "iowarden_block_queue_read_ahead_bytes", device=nvme) == int(sysfs["read_ahead_kb"]) * 1024
    assert value(text, "iowarden_block_queue_max_request_bytes", device=nvme) == int(sysfs["max_sectors_kb"]) * 1024
    assert value(text, "iowarden_block_queue_rotational", device=nvme) == int(sysfs["rotational"])
    # a change of the namespace's scheduler is seen as it is
    other = "mq-deadline" if active != "mq-deadline" else "none"
    lab.guest.sh(f"echo {other} > {q}/scheduler")
    try:
        wait_for(lambda: [l for l, _ in samples(lab.metrics(), "iowarden_block_queue_info")
                          if l["device"] == nvme and l["scheduler"] == other], timeout=60,
                 what=f"{nvme}'s scheduler {other} in /metrics")
    finally:
        lab.guest.sh(f"echo {active} > {q}/scheduler")


def _overlaps(probes: list[list]) -> list[tuple]:
    spans = sorted((start, start + (dur or 0), target) for start, dur, target in probes)
    return [(a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1] - 0.05]


def test_lvm_stripe_maps_to_both_disks_one_probe_at_a_time_budget_on_both(lab):
    lab.guest.sh("mkdir -p /srv/stripe/a /srv/stripe/b")
    # two targets on the one striped LV, both due every 2 s: they share both disks
    lab.configure({"stripe-a": 2.0, "stripe-b": 2.0}, paths={"stripe-a": "/srv/stripe/a", "stripe-b": "/srv/stripe/b"})
    lva, lvb = lab.dev("virtio-lab-lva"), lab.dev("virtio-lab-lvb")
    t0 = lab.guest_clock()
    before = lab.metrics()
    used0 = {d: value(before, "iowarden_budget_device_time_used_seconds", device=d) or 0.0 for d in (lva, lvb)}
    probes = wait_for(lambda: (lambda rows: rows if min(sum(r[2] == t for r in rows) for t in ("stripe-a", "stripe-b"))
                               >= 4 else None)(lab.sql("SELECT started_at, duration_seconds, target FROM probe_results "
                                                       "WHERE target LIKE 'stripe-%' AND ok = 1 AND started_at >= ?", t0)),
                      timeout=240, what="four probes of each target on the stripe")
    assert not _overlaps(probes), f"probes of one disk set overlapped: {_overlaps(probes)}"
    text = lab.metrics()
    dm = {l["device"] for l, _ in samples(text, "iowarden_probe_success") if l["target"].startswith("stripe-")}
    assert len(dm) == 1 and dm.pop().startswith("dm-")
    used = {d: value(text, "iowarden_budget_device_time_used_seconds", device=d) for d in (lva, lvb)}
    # each probe's device time is charged to both physical disks of the stripe, and to them only
    assert used[lva] == used[lvb] and used[lva] > used0[lva], (used0, used)
    assert not [l for l, _ in samples(text, "iowarden_budget_device_time_used_seconds") if l["device"].startswith("dm-")]
    print(f"stripe: {len(probes)} probes, none overlapping; budget {lva} {used[lva]:.1f} s = {lvb} {used[lvb]:.1f} s")
