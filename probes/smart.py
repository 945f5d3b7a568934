"""Drive health from smartctl's JSON (smartmontools 7.0+): one `parse()` for SATA, SAS and NVMe alike.

What a storage operator acts on, in one shape whatever the protocol:
- NVMe: the SMART / Health Information log page (NVMe base spec, log page 02h): critical warning bits,
  media and data integrity errors, error log entries, composite temperature and the minutes spent above
  the warning threshold, percentage used, available spare and its threshold;
- ATA: the overall self-assessment, attributes 5 (reallocated), 197 (pending) and 198 (offline
  uncorrectable) as media errors, the error log's count, attribute 194's temperature;
- SCSI/SAS: the self-assessment, uncorrected read/write errors from the error counter log pages,
  the grown defect list, the endurance indicator.

`read()` runs smartctl with `-n standby`, so a spun-down disk is not woken to be asked: that reading
says "standby" and carries no figures. Exit status bits 3-7 are findings, not failures: the JSON is
read whatever they say (smartctl(8), RETURN VALUES).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from .common import ParseError, run_tool

SMARTCTL_OUTPUT_MAX_BYTES = 1 << 20    # a full -x report of a SAS disk is ~100 KiB
SMARTCTL_TIMEOUT_SECONDS = 20.0
# smartctl exit status bits (smartctl(8)): 0 command line, 1 open failed, 2 a SMART command failed
EXIT_COULD_NOT_ASK = 0b111
EXIT_DISK_FAILING = 1 << 3


@dataclass(frozen=True, slots=True)
class DriveHealth:
    """One disk's health as smartctl reported it; None where the protocol has no such figure."""
    device: str                              # kernel name (sda, nvme0n1)
    protocol: str | None = None              # NVMe, ATA, SCSI
    model: str | None = None
    passed: bool | None = None               # the drive's own overall assessment
    critical_warning: int | None = None      # NVMe bitfield (spare, temperature, reliability, read-only, backup)
    media_errors: int | None = None          # unrecovered media/integrity errors (NVMe) or bad sectors (ATA)
    error_log_entries: int | None = None
    temperature_celsius: float | None = None
    warning_temperature_seconds: float | None = None   # NVMe: time above the warning threshold
    percentage_used: float | None = None     # endurance used, vendor estimate (may pass 100)
    available_spare_ratio: float | None = None
    available_spare_threshold_ratio: float | None = None
    standby: bool = False                    # spun down: not woken, no figures
    error: str | None = None                 # why there is no reading


SMART_VALUE_MAX = 1 << 63   # a counter no drive reaches; 1e999 (JSON for infinity) and the like are no value


def _int(v) -> int | None:
    """A figure smartctl printed, or None where it is not one a drive can have (a bool, a string,
    infinity, NaN, a number past 2**63): that one field is missing, never the drive's reading."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return int(v) if -SMART_VALUE_MAX < v < SMART_VALUE_MAX else None


def _attr_raw(table: list, attr_id: int) -> int | None:
    for a in table:
        if isinstance(a, dict) and a.get("id") == attr_id:
            return _int((a.get("raw") or {}).get("value"))
    return None


def parse(device: str, text: str) -> DriveHealth:
    """smartctl --json output of one device -> DriveHealth. Raises ParseError on what is not that: any
    shape or value this cannot represent is that one drive's parse error, never another drive's loss."""
    if len(text) > SMARTCTL_OUTPUT_MAX_BYTES:
        raise ParseError(f"smartctl output for {device} is over {SMARTCTL_OUTPUT_MAX_BYTES} bytes")
    try:
        j = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"smartctl output for {device} is not JSON: {str(exc)[:200]}") from None
    try:
        return _health(device, j)
    except ParseError:
        raise
    except (AttributeError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise ParseError(f"smartctl output for {device} has a value of an unexpected shape: "
                         f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _health(device: str, j) -> DriveHealth:
    if not isinstance(j, dict) or "smartctl" not in j:
        raise ParseError(f"smartctl output for {device} has no 'smartctl' object")
    exit_status = _int((j.get("smartctl") or {}).get("exit_status")) or 0
    messages = [m.get("string", "") for m in (j.get("smartctl") or {}).get("messages", []) if isinstance(m, dict)]
    if exit_status & EXIT_COULD_NOT_ASK and "nvme_smart_health_information_log" not in j \
            and "ata_smart_attributes" not in j and "smart_status" not in j:
        if any("STANDBY" in s.upper() for s in messages):
            return DriveHealth(device, standby=True)
        return DriveHealth(device, error=(messages[-1] if messages else f"smartctl exit status {exit_status}")[:300])
    proto = (j.get("device") or {}).get("protocol")
    status = j.get("smart_status") or {}
    passed = status.get("passed") if isinstance(status.get("passed"), bool) else None
    temp = _int((j.get("temperature") or {}).get("current"))
    h = dict(device=device, protocol=proto, model=str(j.get("model_name") or j.get("scsi_model_name") or "")[:100]
             or None, passed=passed, temperature_celsius=temp)
    nv = j.get("nvme_smart_health_information_log")
    if isinstance(nv, dict):
        spare, spare_min = _int(nv.get("available_spare")), _int(nv.get("available_spare_threshold"))
        minutes = _int(nv.get("warning_temp_time"))
        used = _int(nv.get("percentage_used"))
        h.update(critical_warning=_int(nv.get("critical_warning")), media_errors=_int(nv.get("media_errors")),
                 error_log_entries=_int(nv.get("num_err_log_entries")),
                 temperature_celsius=temp if temp is not None else _int(nv.get("temperature")),
                 warning_temperature_seconds=None if minutes is None else minutes * 60.0,
                 percentage_used=None if used is None else float(used),
                 available_spare_ratio=None if spare is None else spare / 100.0,
                 available_spare_threshold_ratio=None if spare_min is None else spare_min / 100.0)
    table = (j.get("ata_smart_attributes") or {}).get("table")
    if isinstance(table, list):
        bad = [_attr_raw(table, i) for i in (5, 197, 198)]
        h["media_errors"] = sum(b for b in bad if b is not None) if any(b is not None for b in bad) else None
        h["error_log_entries"] = _int(((j.get("ata_smart_error_log") or {}).get("summary") or {}).get("count"))
        if temp is None:
            raw = _attr_raw(table, 194)
            h["temperature_celsius"] = None if raw is None else raw & 0xFF   # the low byte is the current value
    counters = j.get("scsi_error_counter_log")
    if isinstance(counters, dict):
        unc = [_int((counters.get(d) or {}).get("total_uncorrected_errors")) for d in ("read", "write", "verify")]
        h["media_errors"] = sum(u for u in unc if u is not None)
        used = _int((j.get("scsi_percentage_used_endurance_indicator")))
        if used is not None:
            h["percentage_used"] = float(used)
    return DriveHealth(**h)


def read(device: str, dev_root: str = "/dev", smartctl: str = "smartctl",
         timeout_seconds: float = SMARTCTL_TIMEOUT_SECONDS) -> DriveHealth:
    """Ask smartctl about /dev/DEVICE (read-only: identify and log pages, no self-test, no standby wake)."""
    run = run_tool([smartctl, "--json=c", "--info", "--health", "--attributes", "--log=error",
                    "--nocheck=standby", f"{dev_root}/{device}"], timeout_seconds,
                   max_output_bytes=SMARTCTL_OUTPUT_MAX_BYTES)
    if run.cut_short or not run.stdout.strip():
        return DriveHealth(device, error=(run.error or "smartctl gave no output")[:300])
    try:
        return parse(device, run.stdout)
    except ParseError as exc:
        return DriveHealth(device, error=str(exc)[:300])
