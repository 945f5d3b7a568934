"""Drive health from SMART: every whole disk, at a slow cadence, exported and used as a cause.

The first source written against the seam (sources/registry.py): this module, its line in SOURCES,
probes/smart.py (the parser), its fixtures and tests. A reading is one immutable SmartReading; the
core keeps the latest and hands it to `families` (its /metrics section) and `causes` (what an alert
on a volume over these disks says). Media errors are judged against the first reading this run
saw: a drive that came with 12 old reallocated sectors is not news, the 13th is.
"""
from __future__ import annotations

import fnmatch
import logging
import time
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from iowarden.probes import smart
from iowarden.probes.blockqueue import identity_of
from iowarden.probes.common import Roots

from iowarden.daemon.config_schema import Key
from iowarden.daemon.sources.spec import SourceSpec

log = logging.getLogger("iowarden")

# Whole devices with no SMART to ask: loop, RAM and compressed-RAM disks, md and dm (their members
# are asked), optical, network block devices, virtio and Xen disks (no pass-through to a drive).
NOT_DRIVES = ("loop*", "ram*", "zram*", "md*", "dm-*", "sr*", "nbd*", "vd*", "xvd*", "rbd*")
CRITICAL_WARNING_BITS = ("available spare below its threshold", "temperature beyond its threshold",
                         "reliability degraded by media or internal errors", "media placed in read-only mode",
                         "volatile memory backup failed", "persistent memory region read-only")

CONFIG = {
    "enabled": Key("bool", True, "Read drive health with smartctl (smartmontools); off when it is not installed."),
    "interval_seconds": Key("float", 600.0, "How often every drive is asked. smartd's default is 30 minutes; "
                            "asking does not wake a drive in standby.", minimum=60.0, maximum=86400.0),
    "timeout_seconds": Key("float", 20.0, "smartctl is killed after this, per drive.", minimum=1.0, maximum=300.0),
    "smartctl_path": Key("str", "smartctl", "The smartctl binary."),
    "devices": Key("strlist", [], "Glob patterns of kernel names to ask (empty: [sampler] devices when set, else "
                   "every whole disk that has SMART)."),
}


@dataclass(frozen=True)
class SmartReading:
    """One pass over the drives: their health, and the media errors each had when first read this run."""
    unix_time: float
    drives: tuple[smart.DriveHealth, ...]
    media_errors_at_start: MappingProxyType     # kernel name -> count at the first reading


def drives_to_ask(roots: Roots, globs: list[str]) -> list[str]:
    names = sorted(p.name for p in (roots.sys / "block").iterdir()) if (roots.sys / "block").is_dir() else []
    if globs:
        return [n for n in names if any(fnmatch.fnmatch(n, g) for g in globs)]
    return [n for n in names if not any(fnmatch.fnmatch(n, g) for g in NOT_DRIVES)]


def start(section: dict, roots: Roots, disk_reading=None):
    at_start: dict[str, int] = {}
    said: set[tuple[str, str]] = set()

    def read() -> SmartReading:
        drives = []
        for name in drives_to_ask(roots, section.devices):
            h = smart.read(name, str(roots.dev), section.smartctl_path, section.timeout_seconds)
            if h.error and (name, h.error) not in said:   # once per drive and reason, not every pass
                said.add((name, h.error))
                log.info("SMART: %s not read: %s", name, h.error, extra={"DEVICE": name})
            if h.media_errors is not None:
                at_start.setdefault(name, h.media_errors)
            drives.append(h)
        return SmartReading(time.time(), tuple(drives), MappingProxyType(dict(at_start)))
    return read


def families(r: SmartReading | None, snap):
    if r is None:
        return
    labels = ["device", "volume"]

    def gauge(name, doc):
        return GaugeMetricFamily(name, doc, labels=labels)

    up = gauge("iowarden_smart_up", "1 if smartctl answered for the drive at the last pass, 0 if not (logged)")
    info = GaugeMetricFamily("iowarden_smart_info", "The drive's protocol and model (value 1)",
                             labels=labels + ["protocol", "model"])
    passed = gauge("iowarden_smart_passed", "The drive's own overall assessment: 1 passed, 0 failing")
    warning = gauge("iowarden_smart_critical_warning", "NVMe critical warning bits (0 = none; 1 spare, 2 "
                    "temperature, 4 reliability, 8 read-only, 16 backup, 32 PMR)")
    media = CounterMetricFamily("iowarden_smart_media_errors", "Unrecovered media and integrity errors (NVMe), "
                                "reallocated, pending and uncorrectable sectors (ATA), uncorrected errors (SCSI)",
                                labels=labels)
    errlog = CounterMetricFamily("iowarden_smart_error_log_entries", "Entries in the drive's error log",
                                 labels=labels)
    temp = gauge("iowarden_smart_temperature_celsius", "The drive's temperature")
    hot = CounterMetricFamily("iowarden_smart_warning_temperature_seconds", "Time the drive spent above its "
                              "warning temperature (NVMe)", labels=labels)
    used = gauge("iowarden_smart_endurance_used_ratio", "Endurance used, the vendor's estimate (1 = rated life; "
                 "may pass 1)")
    spare = gauge("iowarden_smart_available_spare_ratio", "Spare capacity left (NVMe)")
    spare_min = gauge("iowarden_smart_available_spare_threshold_ratio", "The spare below which the drive "
                      "raises a critical warning (NVMe)")
    read_at = GaugeMetricFamily("iowarden_smart_last_read_timestamp_seconds", "When the drives were last asked")
    read_at.add_metric([], r.unix_time)
    for h in r.drives:
        lv = [h.device, identity_of(h.device, snap.devices)]
        up.add_metric(lv, 0 if h.error else 1)
        if h.error or h.standby:
            continue
        info.add_metric(lv + [h.protocol or "", h.model or ""], 1)
        for fam, value in ((passed, None if h.passed is None else int(h.passed)), (warning, h.critical_warning),
                           (media, h.media_errors), (errlog, h.error_log_entries), (temp, h.temperature_celsius),
                           (hot, h.warning_temperature_seconds),
                           (used, None if h.percentage_used is None else h.percentage_used / 100.0),
                           (spare, h.available_spare_ratio), (spare_min, h.available_spare_threshold_ratio)):
            if value is not None:
                fam.add_metric(lv, value)
    yield from (up, info, passed, warning, media, errlog, temp, hot, used, spare, spare_min, read_at)


def causes(r: SmartReading | None, disks: set[str]) -> list[str]:
    """What the drives under a slow volume say about themselves, worst first."""
    if r is None:
        return []
    out = []
    for h in r.drives:
        if h.device not in disks or h.error or h.standby:
            continue
        if h.critical_warning:
            bits = [w for i, w in enumerate(CRITICAL_WARNING_BITS) if h.critical_warning >> i & 1]
            out.append(f"SMART critical warning on {h.device} (0x{h.critical_warning:02x}): "
                       + ("; ".join(bits) or "unknown bits"))
        if h.passed is False:
            out.append(f"drive {h.device} fails its own SMART assessment")
        first = r.media_errors_at_start.get(h.device)
        if h.media_errors is not None and first is not None and h.media_errors > first:
            out.append(f"{h.media_errors - first} new media errors on {h.device} since iowarden started "
                       f"({h.media_errors} in all): the drive is remapping or failing reads")
        if h.available_spare_ratio is not None and h.available_spare_threshold_ratio is not None \
                and h.available_spare_ratio < h.available_spare_threshold_ratio and not h.critical_warning:
            out.append(f"{h.device}: spare at {h.available_spare_ratio:.0%}, below its threshold")
    return out


SPEC = SourceSpec("smart", CONFIG, start,
                  # every drive asked in turn, each bounded by the timeout; a pass over 64 drives is no hang
                  deadline_seconds=lambda c: c.timeout_seconds * 64 + 30,
                  families=families, causes=causes)
