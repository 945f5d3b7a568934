"""The Prometheus collector over a snapshot made from fixtures, the web config, and line protocol."""
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from iowarden.daemon.outputs import influx, line_protocol
from iowarden.daemon.config_schema import parse_listen_address
from iowarden.daemon.outputs.web_config import WebConfigError, load_web_config
from iowarden.daemon.core.latency import LATENCY_BUCKETS_SECONDS, LatencyTotal, add_probe, rebucket
from iowarden.daemon.outputs.prometheus import SnapshotCollector
from iowarden.daemon.registry import PartStats
from iowarden.daemon.sources.sampler import SamplerReading
from iowarden.daemon.probing.budget import BudgetStatus
from iowarden.daemon.snapshot import AlertView, BaselineView, ProbeView, Snapshot
from iowarden.probes import blockqueue, cpupower, diskstats, fio, xfs
from iowarden.probes.fio_run import ProbeResult
from tests.conftest import FIXTURES


from iowarden.daemon.passive.detector import PassiveDetector
from iowarden.daemon.passive.values import PassiveParams, Window
from iowarden.daemon.passive.part import peer_groups  # noqa: E402

def snapshot(tree):
    rep = fio.parse((FIXTURES / "fio" / "fio-3.33-randrw-json+.json").read_text())
    ok = ProbeResult("db", "/srv", "sdb", "randrw", True, None, 1.7e9, 2.1, rep)
    bad = ProbeResult("db", "/srv", "sdb", "seq", False, "fio exited with 1: engine", 1.7e9, 0.1)
    devices = blockqueue.read_sysfs_and_superblocks(tree("storage-md-dm.tree"))
    power = cpupower.read_power_settings(tree("cpu-bare-metal.tree"), run_tuned_adm_verify=False)
    ds = diskstats.parse((FIXTURES / "diskstats" / "linux-4.14-14-fields.txt").read_text())
    ds2 = {n: diskstats.DiskCounters(c.major, c.minor, n, reads=c.reads + 500, sectors_read=c.sectors_read + 8000,
                                     read_ms=c.read_ms + 250, io_ms=c.io_ms + 400,
                                     weighted_io_ms=c.weighted_io_ms + 900) for n, c in ds.items()}
    rates = diskstats.rates_between(diskstats.DiskSample(0, ds), diskstats.DiskSample(1.0, ds2))
    report = xfs.XfsReport("/srv", "/dev/md0", xfs.parse_frag((FIXTURES / "xfs" / "xfs_db-frag-fragmented.txt")
                                                             .read_text()),
                           xfs.parse_freesp((FIXTURES / "xfs" / "xfs_spaceman-freesp.txt").read_text()),
                           "xfs_spaceman", xfs.parse_xfs_info((FIXTURES / "xfs" / "xfs_info.txt").read_text()), (),
                           "md0")
    latency = {}
    add_probe(latency, "db", "randrw", rep)
    add_probe(latency, "db", "randrw", rep)   # two probes: every bucket twice
    # the passive detector fed the same window a few times: curves learned, a verdict per device
    ident = {n: devices[n].identity if n in devices else f"kernel:{n}" for n in rates}
    det = PassiveDetector(PassiveParams(bin_min_windows=3))
    det.capability = {ident["sda"]: (20000.0, 200e6)}   # as `iowarden characterize -c` stores it
    groups = [tuple(ident.get(m, m) for m in g) for g in peer_groups(devices)]
    for i in range(5):
        det.observe([Window.from_rates(ident[n], 1.7e9 + 15 * i, r) for n, r in sorted(rates.items())], groups)
    name_of = {v: k for k, v in ident.items()}
    passive = tuple((name_of[v.device], v.device, v) for v in det.views())
    return Snapshot(
        passive=passive,
        taken_at=1.7e9, version="0.1.0",
        probes=(ProbeView("db", "randrw", "wwn:0x5000c500a1b2c3d4", ok, 1.7e9),
                ProbeView("db", "seq", "wwn:0x5000c500a1b2c3d4", bad, None)),
        skipped_total={("db", "busy"): 3},
        baselines=(BaselineView("wwn:0x5000c500a1b2c3d4", "randrw", "read_iops", 38000.0, 0.05, -0.4, 50, False),),
        alerts=(AlertView("VolumeDegraded", "wwn:0x5000c500a1b2c3d4", "randrw", "db", "critical", 1.7e9, 1),),
        disk_reading=SamplerReading(diskstats.DiskSample(1.0, ds2), rates, frozenset(rates), None), devices=devices,
        power=power,
        probe_latency=latency,
        drift_total={("sdb", "wwn:0x5000c500a1b2c3d4", "scheduler"): 1},
        xfs={"/srv": (report, 1.7e9)},
        budget={"sdb": BudgetStatus(2.0, 36.0, 10, 100)},
        parts={"sampler": PartStats(runs_total=5, last_duration_seconds=0.001, last_success_timestamp_seconds=1.7e9)},
        probe_intervals={("db", "randrw"): 300.0, ("db", "seq"): 300.0},
        influx={"written": 10, "spooled": 2, "dropped": 1, "errors": 3, "spool_bytes": 100, "rejected": 4},
        state={"writable": False, "pending_writes": 7, "write_errors": 2, "writes_dropped": 0},
        sources={"smart": smart_reading(), "cgroups": cgroup_reading()},
    )


def cgroup_reading():
    from iowarden.daemon.sources import cgroups
    from iowarden.probes.common import Roots
    return cgroups.start(type("S", (), {"max_cgroups": 100})(), Roots.under(FIXTURES / "cgroup" / "v2"))()


def smart_reading():
    """The SMART source's reading of the md fixture's sdb (the NVMe fixture's figures) and sdc (SATA's)."""
    from types import MappingProxyType

    from iowarden.daemon.sources.smart import SmartReading
    from iowarden.probes import smart
    nvme = smart.parse("sdb", (FIXTURES / "smart" / "nvme-critical.json").read_text())
    sata = smart.parse("sdc", (FIXTURES / "smart" / "sata-healthy.json").read_text())
    return SmartReading(1.7e9, (nvme, sata, smart.DriveHealth("sdd", error="smartctl exited with 2: open failed")),
                        MappingProxyType({"sdb": 0, "sdc": 10}))


# the sources the golden scrapes were made with: a source registered later brings its own tests, and
# leaves these files as they are
GOLDEN_SOURCES = ("smart", "tracer", "cgroups")


def scrape(snap) -> str:
    from iowarden.daemon.sources.registry import SOURCES
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(lambda: snap, sources=[s for s in SOURCES if s.name in GOLDEN_SOURCES]))
    return generate_latest(reg).decode()


def test_full_scrape_passes_promtool(tree):
    text = scrape(snapshot(tree))
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", r.stdout + r.stderr
    for family in ("iowarden_probe_iops", "iowarden_probe_bandwidth_bytes_per_second",
                   "iowarden_probe_latency_seconds_bucket", "iowarden_probe_last_latency_seconds",
                   "iowarden_probe_success", "iowarden_probe_skipped_total",
                   "iowarden_probe_last_success_timestamp_seconds", "iowarden_baseline_iops",
                   "iowarden_deviation_score", "iowarden_alert_active", "iowarden_disk_reads_completed_total",
                   "iowarden_disk_io_time_seconds_total", "iowarden_disk_io_time_weighted_seconds_total",
                   "iowarden_disk_read_bytes_total", "iowarden_disk_read_time_seconds_total", "iowarden_disk_io_now",
                   "iowarden_block_queue_info", "iowarden_cpu_idle_state_exit_latency_seconds",
                   "iowarden_pm_qos_cpu_dma_latency_seconds", "iowarden_pm_qos_cpu_dma_latency_requested",
                   "iowarden_tuned_profile_info", "iowarden_settings_drift_total", "iowarden_xfs_extents_per_file",
                   "iowarden_xfs_fragmentation_ratio", "iowarden_xfs_free_space_extents", "iowarden_xfs_free_space_bytes",
                   "iowarden_md_degraded_devices", "iowarden_md_member_faulty",
                   "iowarden_budget_device_time_used_seconds", "iowarden_budget_written_allowed_bytes",
                   "iowarden_part_success", "iowarden_build_info", "iowarden_influxdb_points_dropped_total",
                   "iowarden_influxdb_points_rejected_total", "iowarden_state_writable", "iowarden_state_pending_writes",
                   "iowarden_state_write_errors_total"):
        assert f"\n{family}" in text, family


# Units a family may end in (base units, as the exporter guidelines ask), and words that are no unit.
UNITS = ("seconds", "bytes", "ratio", "celsius", "bytes_per_second", "iops")
NOT_UNITS = ("milliseconds", "ms", "usec", "us", "kb", "kib", "percent", "blocks", "sectors")


def family_problems(name: str, type_: str, help_: str) -> list[str]:
    """What is wrong with one family's name against its type and HELP (empty: nothing)."""
    problems = []
    base = name[:-len("_total")] if type_ == "counter" and name.endswith("_total") else name
    words = base.split("_")
    for unit in ("seconds", "bytes", "ratio", "celsius", "iops"):
        if unit in words and not base.endswith(tuple("_" + u for u in UNITS)):
            problems.append(f"{name}: the unit {unit} is not last")
    if set(words) & set(NOT_UNITS):
        problems.append(f"{name}: not a base unit ({sorted(set(words) & set(NOT_UNITS))})")
    per_second = "per second" in help_.lower()
    if per_second and not base.endswith(("_per_second", "_iops")):
        problems.append(f"{name}: HELP says per second, the name does not")
    if base.endswith("_per_second") and not per_second:
        problems.append(f"{name}: the name says per second, HELP does not")
    if base.endswith("_ratio") and ("percent" in help_.lower() or "%" in help_.replace("%util / 100", "")):
        problems.append(f"{name}: a ratio whose HELP speaks of percent")
    if not help_.strip():
        problems.append(f"{name}: no HELP")
    return problems


def test_every_family_has_its_unit_last_and_a_help_that_agrees(tree):
    families = list(text_string_to_metric_families(scrape(snapshot(tree))))
    problems = [p for f in families for p in family_problems(f.name + ("_total" if f.type == "counter" else ""),
                                                             f.type, f.documentation)]
    assert problems == []
    # one label vocabulary: the kernel name is `device` everywhere (never disk=, never a /dev path)
    for f in families:
        for sample in f.samples:
            assert "disk" not in sample.labels, (f.name, sample.labels)
            assert not sample.labels.get("device", "").startswith("/dev/"), (f.name, sample.labels)


@pytest.mark.parametrize("name,type_,help_", [
    ("iowarden_probe_bandwidth_bytes", "gauge", "Bytes per second moved in the last probe"),
    ("iowarden_budget_device_seconds_used", "gauge", "Probe device-time spent"),
    ("iowarden_xfs_free_space_blocks", "gauge", "Free blocks by extent size range"),
    ("iowarden_disk_read_await_ms", "gauge", "Mean time of a read"),
    ("iowarden_x_ratio", "gauge", "Share of time in percent"),
    ("iowarden_x_bytes_per_second", "gauge", "Bytes moved"),
])
def test_the_naming_check_catches_what_issue_22_found(name, type_, help_):
    assert family_problems(name, type_, help_)


def test_values_and_labels(tree):
    text = scrape(snapshot(tree))
    assert 'iowarden_probe_success{device="sdb",profile="seq",target="db",volume="wwn:0x5000c500a1b2c3d4"} 0.0' in text
    # a failed probe exports no measurement
    assert 'iowarden_probe_iops{device="sdb",direction="read",profile="seq"' not in text
    assert 'iowarden_md_member_faulty{device="md1",member="sde"} 1.0' in text
    assert 'iowarden_md_degraded_devices{device="md1",level="raid1",volume="sdd"}' not in text
    assert 'iowarden_pm_qos_cpu_dma_latency_seconds 1e-06' in text
    assert 'iowarden_pm_qos_cpu_dma_latency_requested 1.0' in text
    assert 'iowarden_cpu_idle_state_disabled_cpus{state="C6"} 1.0' in text
    # the kernel's counters, in base units: sectors as bytes, milliseconds as seconds
    sample = snapshot(tree).disk_sample.counters["sda"]
    values = {(s.name, s.labels.get("device")): s.value
              for f in text_string_to_metric_families(text) for s in f.samples}
    assert values[("iowarden_disk_read_bytes_total", "sda")] == sample.sectors_read * 512
    assert values[("iowarden_disk_io_time_seconds_total", "sda")] == pytest.approx(sample.io_ms / 1000)
    assert 'iowarden_probe_last_latency_seconds{' in text and 'percentile="99.9"' in text
    assert 'iowarden_probe_skipped_total{reason="busy",target="db"} 3.0' in text
    assert 'iowarden_probe_skipped_total{reason="budget_time",target="db"} 0.0' in text
    assert 'iowarden_budget_device_time_used_seconds{device="sdb"} 2.0' in text
    # the XFS report of /dev/md0 is labelled as every other family of md0 is
    assert 'iowarden_xfs_extents_per_file{device="md0",mountpoint="/srv",volume=' in text


def test_the_probe_histogram_is_cumulative_over_probes(tree):
    """Two probes: every bucket holds both probes' I/Os, so rate() over a window counts that window's probes."""
    snap = snapshot(tree)
    rep = snap.probes[0].result.report
    text = scrape(snap)
    fio_count = rep.directions["read"].clat_histogram[-1][1]
    assert (f'iowarden_probe_latency_seconds_count{{direction="read",profile="randrw",target="db"}} '
            f'{2 * fio_count:.1f}') in text
    one = LatencyTotal().plus(rep.directions["read"].clat_histogram, 1.0)
    assert one.plus(rep.directions["read"].clat_histogram, 1.0).buckets == tuple(2 * b for b in one.buckets)


def test_pm_qos_without_a_request_is_a_flag_not_a_latency(tree):
    snap = snapshot(tree)
    import dataclasses
    idle = dataclasses.replace(snap.power, pm_qos_cpu_dma_latency_usec=cpupower.PM_QOS_DEFAULT_USEC)
    text = scrape(dataclasses.replace(snap, power=idle))
    assert "iowarden_pm_qos_cpu_dma_latency_requested 0.0" in text
    assert "iowarden_pm_qos_cpu_dma_latency_seconds " not in text


def test_absent_sources_are_left_out(tree):
    snap = snapshot(tree)
    empty = Snapshot(taken_at=0, version="x", parts=snap.parts)
    text = scrape(empty)
    assert "iowarden_pm_qos_cpu_dma_latency_seconds " not in text and "iowarden_tuned_profile_info{" not in text
    assert "iowarden_part_success" in text


def test_rebucket_keeps_every_sample_at_or_above_its_fio_bucket():
    rep = fio.parse((FIXTURES / "fio" / "fio-3.33-randrw-json+.json").read_text())
    cum = rep.directions["read"].clat_histogram
    counts = list(rebucket(cum))
    assert counts == sorted(counts) and counts[-1] == cum[-1][1]
    assert len(counts) == len(LATENCY_BUCKETS_SECONDS) + 1
    for le, c in cum:  # every fio bucket's samples are counted by the first fixed bound >= its edge
        first = next(i for i, b in enumerate(LATENCY_BUCKETS_SECONDS) if b * (1 + 1e-9) >= le)
        assert counts[first] >= c


def test_web_config_errors(tmp_path):
    bad = tmp_path / "web.yml"
    bad.write_text("basic_auth_users:\n  alice: plaintext\n")
    with pytest.raises(WebConfigError, match="not a bcrypt hash"):
        load_web_config(str(bad))
    bad.write_text("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n")
    with pytest.raises(WebConfigError, match="tls_server_config"):
        load_web_config(str(bad))
    bad.write_text("tls_server_config: [\n")
    with pytest.raises(WebConfigError, match="web.yml:"):
        load_web_config(str(bad))
    bad.write_text("basic_auth: {}\n")
    with pytest.raises(WebConfigError, match="unknown keys"):
        load_web_config(str(bad))


@pytest.mark.parametrize("text,addr", [(":29110", ("::", 29110)), ("127.0.0.1:1", ("127.0.0.1", 1)),
                                       ("[::1]:9", ("::1", 9))])
def test_listen_addresses(text, addr):
    assert parse_listen_address(text)[0] == addr


def test_line_protocol_escaping():
    ln = line_protocol.line("iowarden_probe", {"target": "my db", "volume": "by-id:a,b=c"},
                     {"read_iops": 1.5, "ok": True, "n": 3, "error": 'say "hi"', "skip": None}, 1.5)
    assert ln == ('iowarden_probe,target=my\\ db,volume=by-id:a\\,b\\=c read_iops=1.5,ok=true,n=3i,'
                  'error="say \\"hi\\"" 1500000000')
    assert line_protocol.line("m", {}, {"x": None}, 0) is None


def test_spool_bounds_and_order(tmp_path):
    # room for exactly the three small batches below, each segment with its header and checksums
    bound = sum(len(influx.encode_segment(b)) for b in (["a 1", "b 2"], ["c 3"], ["d 4"]))
    sp = influx.Spool(str(tmp_path / "spool"), max_bytes=bound)
    assert sp.append(["a 1", "b 2"]) == (2, 0) and sp.append(["c 3"]) == (1, 0)
    assert sp.append(["x" * 100]) == (0, 1)                 # would exceed the bound: dropped, counted
    assert sp.append(["d 4", "y" * 100]) == (1, 1)           # what fits is kept, the rest counted
    assert [influx.decode_segment(open(p, "rb").read()) for p in sp.segments()] == \
        [(["a 1", "b 2"], 0), (["c 3"], 0), (["d 4"], 0)]
    assert sp.size_bytes() == bound
    (tmp_path / "spool" / "000000000009.lp.tmp").write_text("half")
    again = influx.Spool(str(tmp_path / "spool"), max_bytes=bound)   # a restart keeps whole batches, drops halves
    assert len(again.segments()) == 3 and not list((tmp_path / "spool").glob("*.tmp"))


def test_basic_auth_bounds_the_hashing_a_client_can_cause():
    import bcrypt
    from iowarden.daemon.outputs.auth import FAILED_AUTH_PER_SOURCE, FAILED_AUTH_WINDOW_SECONDS, BasicAuth
    now = [0.0]
    auth = BasicAuth({"prometheus": bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4))}, clock=lambda: now[0])
    assert not auth.remembered("prometheus", b"right")
    assert auth.verify("prometheus", b"right", "10.0.0.1") and auth.remembered("prometheus", b"right")
    assert not auth.verify("mallory", b"right", "10.0.0.2")       # unknown users are hashed too
    assert auth.hashes_total == 2
    for i in range(FAILED_AUTH_PER_SOURCE - 1):
        assert not auth.verify("prometheus", f"guess{i}".encode(), "10.0.0.2")
    assert auth.over_limit("10.0.0.2") and not auth.over_limit("10.0.0.3")
    assert not auth.verify("prometheus", b"x" * 100, "10.0.0.3")   # longer than bcrypt reads: denied, no error
    now[0] = FAILED_AUTH_WINDOW_SECONDS + 1
    assert not auth.over_limit("10.0.0.2")                        # the window passed
    # wrong passwords never evict a right one
    assert auth.remembered("prometheus", b"right")
