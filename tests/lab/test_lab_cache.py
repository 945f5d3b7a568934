"""A real cache knee (issue 13): a guest with little RAM, so its page cache is small, in front of a
disk QEMU holds to a few hundred IOPS. `iowarden characterize --sweep working-set --buffered`, run
as a user runs it from the installed package, finds where IOPS fall as the file outgrows the cache,
and that size is within a factor of two of the memory the guest's page cache can use.

This guest is its own, not the lab's: the lab needs 1 GiB for its stacks and daemon, and a page
cache that large would take files of several GiB (minutes of layout under TCG) to outgrow."""
from __future__ import annotations

import json

import pytest

from .image import ensure_image
from .vm import Disk, Guest

MEMORY_MIB = 384
CAP_IOPS = 200
DISK = Disk("wsd", "virtio", 900, serial="lab-wsd")


@pytest.fixture(scope="module")
def small_guest(tmp_path_factory, lab_deb):
    guest = Guest(ensure_image(), tmp_path_factory.mktemp("lab-small"), [DISK], memory_mib=MEMORY_MIB,
                  share=lab_deb.parent)
    try:
        guest.install(lab_deb)
        # the shipped service probes its own file system; this guest only characterises
        guest.run(["systemctl", "disable", "--now", "iowarden"])
        guest.sh("udevadm settle; dev=$(readlink -f /dev/disk/by-id/virtio-lab-wsd); mkfs.xfs -q -f $dev; "
                 "mkdir -p /srv/ws; mount $dev /srv/ws")
        yield guest
    finally:
        guest.stop()


def _meminfo_bytes(guest: Guest, field: str) -> int:
    line = next(l for l in guest.run(["cat", "/proc/meminfo"]).splitlines() if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def test_working_set_sweep_finds_the_page_cache_of_a_guest_with_little_ram(small_guest):
    g = small_guest
    g.throttle(DISK.id, CAP_IOPS)
    try:
        # what the page cache can hold: the memory the kernel would give it without swapping
        g.sh("sync; echo 3 > /proc/sys/vm/drop_caches")
        cache_bytes = _meminfo_bytes(g, "MemAvailable")
        out = g.run(["iowarden", "characterize", "--path", "/srv/ws", "--sweep", "working-set", "--buffered",
                     "--max-working-set", "512MiB", "--step-seconds", "4", "--ramp-seconds", "2", "--json",
                     "--min-free-bytes", "1MiB", "--min-free-ratio", "0", "--out", "/root/ws"], timeout=900)
    finally:
        g.throttle(DISK.id, 0)
    doc = json.loads(out)
    points = {p["value"]: p["iops"] for p in doc["points"] if p["sweep"] == "working-set" and p["ok"]}
    knee = doc["findings"]["working-set"]["cache_knee_bytes"]
    print(f"guest of {MEMORY_MIB} MiB, page cache up to {cache_bytes >> 20} MiB, disk capped at {CAP_IOPS} IOPS: "
          f"{ {ws >> 20: round(iops) for ws, iops in sorted(points.items())} } (MiB: IOPS), "
          f"cache knee {knee >> 20 if knee else None} MiB")
    assert knee is not None, points
    # the cache's edge lies between the knee (the largest size still cached) and the next size measured;
    # that bracket meets the page cache's size within a factor of two (a file read at random keeps about
    # the inactive list's share of it: 128 or 160 MiB of 262 here, by where the narrowing steps fell)
    above = min((ws for ws in points if ws > knee), default=knee)
    assert above >= cache_bytes / 2 and knee <= cache_bytes * 2, (knee, above, cache_bytes, points)
    # inside the cache the reads never reach the disk; well past it they are the disk's, near its cap
    assert points[knee] > 5 * CAP_IOPS, points
    largest = max(points)
    assert largest >= 2 * knee and points[largest] < 3 * CAP_IOPS, points
    # the plot a person reads at a glance, written in the guest by the installed package
    assert g.run(["od", "-An", "-tx1", "-N8", "/root/ws/working-set.png"]).split() == \
        ["89", "50", "4e", "47", "0d", "0a", "1a", "0a"]
