"""The host's metric families, built from a Snapshot: block queue settings, md arrays, settings drift, the
CPU's idle states, PM QoS, cpufreq and tuned (the settings section), and each XFS mount's report."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from iowarden.probes.blockqueue import identity_of

from iowarden.daemon.verdicts.sentence import cut


def settings_families(s):
    """Block queue settings, md arrays, drift, C-states, PM QoS, cpufreq and the tuned profile."""
    qinfo = GaugeMetricFamily("iowarden_block_queue_info", "Block queue settings that are words",
                              labels=["device", "volume", "kind", "scheduler", "write_cache"])
    nums = {k: GaugeMetricFamily(f"iowarden_block_queue_{name}", help_, labels=["device", "volume"])
            for k, name, help_ in (("nr_requests", "nr_requests", "Requests the queue holds"),
                                   ("read_ahead_kb", "read_ahead_bytes", "Read-ahead size"),
                                   ("max_sectors_kb", "max_request_bytes", "Largest request size"),
                                   ("rotational", "rotational", "1 if the kernel thinks it spins"),
                                   ("wbt_lat_usec", "wbt_latency_target_seconds",
                                    "Writeback throttling latency target (0: off)"))}
    scale = {"read_ahead_kb": 1024, "max_sectors_kb": 1024, "wbt_lat_usec": 1e-6}
    md_degraded = GaugeMetricFamily("iowarden_md_degraded_devices", "Members missing from the md array",
                                    labels=["device", "volume", "level"])
    md_faulty = GaugeMetricFamily("iowarden_md_member_faulty", "1 if the md member is marked faulty",
                                  labels=["device", "member"])
    md_info = GaugeMetricFamily("iowarden_md_info", "md array state", labels=["device", "level", "array_state",
                                                                              "sync_action"])
    for name, d in sorted(s.devices.items()):
        if d.kind == "partition" or (d.kind == "loop" and not d.size_bytes):
            continue
        if d.queue is not None:
            qinfo.add_metric([name, d.identity, d.kind, d.queue.scheduler or "", d.queue.write_cache or ""], 1)
            for k, fam in nums.items():
                v = getattr(d.queue, k)
                if v is not None:
                    fam.add_metric([name, d.identity], v * scale.get(k, 1))
        if d.md is not None:
            md_info.add_metric([name, d.md.level or "", d.md.array_state or "", d.md.sync_action or ""], 1)
            if d.md.degraded is not None:
                md_degraded.add_metric([name, d.identity, d.md.level or ""], d.md.degraded)
            for m in d.md.members:
                md_faulty.add_metric([name, m.name], 1 if m.faulty else 0)
    yield qinfo
    yield from nums.values()
    yield from (md_degraded, md_faulty, md_info)
    drift = CounterMetricFamily("iowarden_settings_drift", "Changes of watched settings seen while running",
                                labels=["device", "volume", "setting"])
    for (device, volume, setting), n in sorted(s.drift_total.items()):
        drift.add_metric([device, volume, setting], n)
    yield drift
    # what the drift alert reads: a series that appears with its first change fires at once (increase()
    # over a counter's first sample is 0, so the counter alone could not fire on the first change)
    last = GaugeMetricFamily("iowarden_settings_drift_last_timestamp_seconds", "When the watched setting last "
                             "changed (Unix time)", labels=["device", "volume", "setting"])
    for (device, volume, setting), at in sorted(s.drift_last_at.items()):
        last.add_metric([device, volume, setting], at)
    yield last
    # what the drift page says: each setting's last change, from what to what (the rule lists those of the
    # last ten minutes in one alert per device)
    change = GaugeMetricFamily("iowarden_settings_drift_last_info", "The watched setting's last change, its old "
                               "and new values and the XFS mounted on or over the device as labels",
                               labels=["device", "volume", "setting", "old", "new", "mountpoint"])
    for (device, volume, setting), (old, new, mounts) in sorted(s.drift_last_change.items()):
        change.add_metric([device, volume, setting, cut(old, 200), cut(new, 200), cut(mounts, 200)], 1)
    yield change
    p = s.power
    if p is None:
        return
    if p.idle_driver:
        idle = GaugeMetricFamily("iowarden_cpu_idle_info", "cpuidle driver and governor",
                                 labels=["driver", "governor"])
        idle.add_metric([p.idle_driver, p.idle_governor or ""], 1)
        yield idle
    lat = GaugeMetricFamily("iowarden_cpu_idle_state_exit_latency_seconds", "Exit latency of the C-state",
                            labels=["state"])
    dis = GaugeMetricFamily("iowarden_cpu_idle_state_disabled_cpus", "CPUs on which the C-state is disabled",
                            labels=["state"])
    tim = CounterMetricFamily("iowarden_cpu_idle_state_time_seconds", "Time all CPUs spent in the C-state",
                              labels=["state"])
    states: dict[str, list] = {}
    for cpu in p.cpus:
        for st in cpu.states:
            states.setdefault(st.name, []).append(st)
    for name, sts in sorted(states.items()):
        if sts[0].exit_latency_usec is not None:
            lat.add_metric([name], sts[0].exit_latency_usec * 1e-6)
        dis.add_metric([name], sum(1 for x in sts if x.disabled))
        tim.add_metric([name], sum(x.time_usec or 0 for x in sts) * 1e-6)
    yield from (lat, dis, tim)
    if p.pm_qos_cpu_dma_latency_usec is not None:
        # the kernel's "no request" is a sentinel (2000 s), not a latency: it gets no value, only requested=0
        requested = GaugeMetricFamily("iowarden_pm_qos_cpu_dma_latency_requested",
                                      "1 if a process holds a PM QoS CPU wake-up latency request")
        requested.add_metric([], 1 if p.c_states_limited else 0)
        yield requested
        if p.c_states_limited:
            qos = GaugeMetricFamily("iowarden_pm_qos_cpu_dma_latency_seconds",
                                    "The CPU wake-up latency the PM QoS requests allow")
            qos.add_metric([], p.pm_qos_cpu_dma_latency_usec * 1e-6)
            yield qos
    if p.cpufreq_governors:
        gov = GaugeMetricFamily("iowarden_cpufreq_governor_cpus", "CPUs per cpufreq governor",
                                labels=["governor"])
        for g in sorted(set(p.cpufreq_governors.values())):
            gov.add_metric([g], sum(1 for x in p.cpufreq_governors.values() if x == g))
        yield gov
    if p.tuned.active_profile:
        tuned = GaugeMetricFamily("iowarden_tuned_profile_info", "The active tuned profile",
                                  labels=["profile", "mode"])
        tuned.add_metric([p.tuned.active_profile, p.tuned.profile_mode or ""], 1)
        yield tuned
        if p.tuned.verify_ok is not None:
            ver = GaugeMetricFamily("iowarden_tuned_verify_success", "1 if `tuned-adm verify` passed")
            ver.add_metric([], 1 if p.tuned.verify_ok else 0)
            yield ver

# -- XFS ----------------------------------------------------------------------------------
def xfs_families(s):
    """Each XFS mount's fragmentation and free space, from its last report."""
    labels = ["mountpoint", "device", "volume"]
    epf = GaugeMetricFamily("iowarden_xfs_extents_per_file", "Extents per file (xfs_db frag: actual/ideal)",
                            labels=labels)
    frag = GaugeMetricFamily("iowarden_xfs_fragmentation_ratio", "(actual - ideal) / actual extents (xfs_db frag)",
                             labels=labels)
    ranges = labels + ["from_bytes", "to_bytes"]
    free_ext = GaugeMetricFamily("iowarden_xfs_free_space_extents", "Free extents by extent size range (freesp -s)",
                                 labels=ranges)
    free_bytes = GaugeMetricFamily("iowarden_xfs_free_space_bytes", "Free space by extent size range (freesp -s)",
                                   labels=ranges)
    when = GaugeMetricFamily("iowarden_xfs_report_timestamp_seconds", "When the XFS report was taken",
                             labels=labels)
    for mnt, (r, at) in sorted(s.xfs.items()):
        # the kernel name, as on every other family (device="dm-3", not "/dev/mapper/vg-lv")
        name = r.kernel_name or r.device
        lab = [mnt, name, identity_of(name, s.devices)]
        when.add_metric(lab, at)
        if r.frag:
            epf.add_metric(lab, r.frag.extents_per_file)
            frag.add_metric(lab, r.frag.fragmentation_ratio)
        # freesp counts filesystem blocks: bytes need the block size, which xfs_info gave (or not)
        if r.free_space and r.geometry:
            bs = r.geometry.block_size_bytes
            for b in r.free_space.buckets:
                rng = lab + [str(b.from_blocks * bs), str(b.to_blocks * bs)]
                free_ext.add_metric(rng, b.extents)
                free_bytes.add_metric(rng, b.blocks * bs)
    yield from (epf, frag, free_ext, free_bytes, when)
