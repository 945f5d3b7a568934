"""The passive detector's verdicts as metric families (one section of the scrape)."""
from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from iowarden.daemon.passive.classes import volume_class
from iowarden.daemon.passive.values import KINDS


def passive_families(s):
    labels = ["device", "volume"]
    ratio = GaugeMetricFamily("iowarden_passive_slowdown_ratio", "Latency in the last judged window over the "
                              "device's normal at the load it carried (1 = normal)", labels=labels + ["direction"])
    expected = GaugeMetricFamily("iowarden_passive_expected_await_seconds", "The device's normal latency at the "
                                 "load of the last judged window (its learned curve)", labels=labels + ["direction"])
    learned = GaugeMetricFamily("iowarden_passive_learned_windows", "Windows the device's latency-vs-load curve "
                                "holds", labels=labels + ["direction"])
    peer = GaugeMetricFamily("iowarden_passive_peer_ratio", "Latency over the peers' median at comparable load "
                             "(median of recent windows)", labels=labels)
    tail = GaugeMetricFamily("iowarden_passive_tail_ratio", "With the tracer on: the p99.9 of real I/O over its "
                             "peers' median p99.9 in the last one-minute block (the worse direction); "
                             "SlowMember at [passive] tail_ratio for three blocks in a row", labels=labels + ["direction"])
    state = GaugeMetricFamily("iowarden_passive_state", "1 while the passive detector holds this kind of "
                              "verdict open on the device (self, peers, saturation, contention)", labels=labels + ["kind"])
    cap_iops = GaugeMetricFamily("iowarden_passive_capability_iops", "Saturation IOPS `iowarden characterize` "
                                 "measured on the volume", labels=labels)
    cap_bw = GaugeMetricFamily("iowarden_passive_capability_bytes_per_second", "Best bandwidth (bytes per second) `iowarden "
                               "characterize` measured on the volume", labels=labels)
    load = GaugeMetricFamily("iowarden_passive_load_ratio", "The last window's load over the volume's characterized "
                             "capability (1 = at it; the headroom is what is left)", labels=labels + ["resource"])
    evidence = GaugeMetricFamily("iowarden_passive_peer_evidence", "Accumulated evidence that the drive is slower "
                                 "than its peers (groups of three or more): hours above them, in units of how far "
                                 "healthy drives of the group stray, past the allowance; SlowMember at the threshold",
                                 labels=labels)
    evidence_threshold = GaugeMetricFamily("iowarden_passive_peer_evidence_threshold", "The evidence that names a "
                                           "drive slower than its peers (passive.evidence_threshold)")
    slow_at = GaugeMetricFamily("iowarden_passive_slow_threshold_ratio", "A window is slow at this many times "
                                "the device's normal latency at its load ([passive] self_ratio)")
    headroom = GaugeMetricFamily("iowarden_device_headroom_ratio", "The knee of the device's learned latency-vs-load "
                                 "curve over its peak load of the last half hour to hour: how many times the peak "
                                 "could grow before its latency reaches [passive] knee_multiple times the unloaded; "
                                 "absent where the curve has not seen loads near the knee", labels=labels + ["direction"])
    knee_iops = GaugeMetricFamily("iowarden_device_knee_iops", "The load (IOPS) at which the device's learned "
                                  "await reaches [passive] knee_multiple times its unloaded await",
                                  labels=labels + ["direction"])
    knee_bw = GaugeMetricFamily("iowarden_device_knee_bytes_per_second", "The same in bytes per second, where the "
                                "curve is by bytes (no request counts)", labels=labels + ["direction"])
    balance = GaugeMetricFamily("iowarden_volume_burst_balance_ratio", "The burst credits iowarden estimates the "
                                "volume's bucket holds, over its capacity (1 = full); absent where no bucket is known "
                                "(learned from a fall and a recovery, or configured) or the balance cannot be",
                                labels=labels + ["bucket"])
    left = GaugeMetricFamily("iowarden_volume_burst_left_seconds", "How long the volume's burst credits last at its "
                             "current draw; absent when it draws no more than its baseline; BurstCreditsLow under "
                             "[passive] burst_horizon_seconds", labels=labels + ["bucket"])
    baseline = GaugeMetricFamily("iowarden_volume_burst_baseline_iops", "The rate the volume falls to when its burst "
                                 "credits are spent (the bucket's baseline, learned or configured)",
                                 labels=labels + ["bucket"])
    klass = GaugeMetricFamily("iowarden_volume_class_info", "The volume's class across the fleet (value 1): what the "
                              "fleet rules compare it with on other hosts; source: config (a target's or discover "
                              "rule's `class`), model (model, firmware, size), layout (md or dm over members), size",
                              labels=labels + ["class", "source"])
    fleet = GaugeMetricFamily("iowarden_fleet_slowdown_ratio", "The median over the last [passive] fleet_seconds "
                              "(five minutes) of judged windows of the volume's latency over its own normal at the "
                              "load it carried (1 = normal): comparable across hosts under different loads, for the "
                              "fleet rules",
                              labels=labels)
    normal = GaugeMetricFamily("iowarden_fleet_normal_latency_seconds", "The volume's own normal: the median "
                               "latency it learned in one octave of its load (2^load_octave to 2^(load_octave+1), "
                               "load_unit iops, or kib for KiB/s), for the octaves it carries most, once learned "
                               "(20 minutes of windows): the fleet rules compare it with its class's at the same "
                               "load", labels=labels + ["direction", "load_unit", "load_octave"])
    service = GaugeMetricFamily("iowarden_service_normal_latency_seconds", "With the tracer counting per cgroup: "
                                "the latency a service's own requests usually see at its recent rate, once learned "
                                "([passive] service_learn_seconds); what IowardenServiceContended compares it with "
                                "(stat: mean or p99)", labels=labels + ["cgroup", "direction", "stat"])
    configured = getattr(s, "classes", None) or {}
    devices = getattr(s, "devices", None) or {}
    threshold = slow_ratio = None
    for name, ident, v in s.passive:
        klass_name, source = volume_class(name, devices, configured.get(ident))
        if klass_name:
            klass.add_metric([name, ident, klass_name, source], 1)
        if v.fleet_ratio is not None:
            fleet.add_metric([name, ident], v.fleet_ratio)
        for fn in v.fleet_normal:
            normal.add_metric([name, ident, fn.direction, fn.load_unit, str(fn.octave)], fn.median_ms / 1e3)
        for sv in v.services:
            service.add_metric([name, ident, sv.cgroup, sv.direction, "mean"], sv.usual_mean_ms / 1e3)
            service.add_metric([name, ident, sv.cgroup, sv.direction, "p99"], sv.usual_p99_ms / 1e3)
        slow_ratio = v.self_ratio if v.self_ratio is not None else slow_ratio
        if v.evidence is not None:
            evidence.add_metric([name, ident], v.evidence.score)
            threshold = v.evidence_threshold
        lab = [name, ident]
        if v.capability[0]:
            cap_iops.add_metric(lab, v.capability[0])
        if v.capability[1]:
            cap_bw.add_metric(lab, v.capability[1])
        for resource, r in sorted(v.load_ratio.items()):
            load.add_metric(lab + [resource], r)
        lab = [name, ident]
        for direction, r in sorted(v.slowdown_ratio.items()):
            ratio.add_metric(lab + [direction], r)
        for direction, ms in sorted(v.expected_await_ms.items()):
            expected.add_metric(lab + [direction], ms / 1000)
        for direction, n in sorted(v.learned_windows.items()):
            learned.add_metric(lab + [direction], n)
        if v.peer_ratio is not None:
            peer.add_metric(lab, v.peer_ratio)
        if v.tail is not None and v.tail.ratio is not None:
            tail.add_metric(lab + [v.tail.direction], v.tail.ratio)
        for kind in KINDS:
            state.add_metric(lab + [kind], 1 if kind in v.flagged else 0)
        for direction, k in sorted(v.knee.items()):
            if k.load is not None:
                (knee_iops if k.unit == "iops" else knee_bw).add_metric(
                    lab + [direction], k.load if k.unit == "iops" else k.load * 1024)
        for direction, r in sorted(v.headroom_ratio.items()):
            headroom.add_metric(lab + [direction], r)
        f = v.burst
        if f is not None:
            baseline.add_metric(lab + [f.bucket.source], f.bucket.baseline_iops)
            if f.balance_ratio is not None:
                balance.add_metric(lab + [f.bucket.source], f.balance_ratio)
            if f.seconds_left is not None:
                left.add_metric(lab + [f.bucket.source], f.seconds_left)
    if threshold is not None:
        evidence_threshold.add_metric([], threshold)
    if slow_ratio is not None:
        slow_at.add_metric([], slow_ratio)
    host = GaugeMetricFamily("iowarden_passive_host_slowdown_ratio", "The median over the host's judged disks of "
                             "their latency over their own normal at their load, last window: a slowdown most of "
                             "them share is the host's, and names no device (1 = normal; three or more disks)")
    if getattr(s, "passive_host_ratio", None) is not None:   # a snapshot, or a replay's views without a host
        host.add_metric([], s.passive_host_ratio)
    yield from (ratio, expected, learned, peer, tail, evidence, evidence_threshold, slow_at, state, cap_iops, cap_bw,
                load, host, headroom, knee_iops, knee_bw, balance, left, baseline, klass, fleet, normal, service)
