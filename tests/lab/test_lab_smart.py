"""Drive health through the source seam, on a real kernel: the guest's emulated NVMe controller, asked by
real smartctl in the guest, and a critical warning set by the hypervisor (QMP `qom-set` on the device's
`smart_critical_warning`, as a failing controller would raise it) is exported with the namespace's
stable identity within one SMART interval (60 s in the lab's configuration)."""
from __future__ import annotations

import time

from iowarden.probes import smart
from tests.integration.helpers import wait_for

from .scrape import samples, value

SMART_INTERVAL_SECONDS = 60.0


def _set_warning(lab, bits: int) -> None:
    lab.guest.qmp.execute("qom-set", path="/machine/peripheral/nv1", property="smart_critical_warning", value=bits)


def test_an_nvme_critical_warning_is_exported_with_its_identity_within_one_smart_interval(lab):
    lab.configure({"nvme": 600.0})
    nvme = lab.dev("nvme-QEMU_NVMe_Ctrl_LABNVME1")
    wait_for(lambda: value(lab.metrics(), "iowarden_smart_up", device=nvme) == 1, timeout=SMART_INTERVAL_SECONDS + 60,
             what="the first SMART pass over the NVMe namespace")
    text = lab.metrics()
    ((labels, _),) = samples(text, "iowarden_smart_up", device=nvme)
    assert labels["volume"].startswith("wwn:nvme.") and "LABNVME1".encode().hex() in labels["volume"], labels
    assert value(text, "iowarden_smart_critical_warning", device=nvme) == 0
    assert value(text, "iowarden_smart_info", device=nvme, protocol="NVMe") == 1
    # real smartctl output of a real (emulated) NVMe controller is what parse() reads
    raw = lab.guest.sh(f"smartctl --json=c --info --health --attributes --log=error /dev/{nvme} || true")
    health = smart.parse(nvme, raw)
    assert health.protocol == "NVMe" and health.critical_warning == 0 and health.error is None, health
    assert health.temperature_celsius is not None and health.available_spare_ratio is not None

    _set_warning(lab, 0x04)   # NVM subsystem reliability degraded
    try:
        set_at = time.monotonic()
        wait_for(lambda: value(lab.metrics(), "iowarden_smart_critical_warning", device=nvme) == 4,
                 timeout=SMART_INTERVAL_SECONDS + 30, what="the critical warning in /metrics")
        took = time.monotonic() - set_at
        assert took <= SMART_INTERVAL_SECONDS + 30, took
        text = lab.metrics()
        assert value(text, "iowarden_smart_critical_warning", device=nvme, volume=labels["volume"]) == 4
        # smartctl now says the drive is failing; the daemon exports its assessment as it is
        assert value(text, "iowarden_smart_passed", device=nvme) == 0
    finally:
        _set_warning(lab, 0)   # the next tests share the guest; its next pass reads 0 again
