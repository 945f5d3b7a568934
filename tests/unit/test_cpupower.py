"""C-states, PM QoS, cpufreq and tuned from a bare-metal fixture tree, and absent sources."""
import pytest

from iowarden.probes import cpupower
from iowarden.probes.common import ParseError, Roots


def test_bare_metal_intel(tree):
    p = cpupower.read_power_settings(tree("cpu-bare-metal.tree"), run_tuned_adm_verify=False)
    assert (p.idle_driver, p.idle_governor) == ("intel_idle", "menu")
    states = p.cpus[0].states
    assert [s.name for s in states] == ["POLL", "C1", "C1E", "C6"]
    c6 = states[3]
    assert (c6.exit_latency_usec, c6.target_residency_usec, c6.disabled) == (133, 400, True)
    shares = p.cpus[0].residency_shares()
    assert shares["C6"] == pytest.approx(0.7) and sum(shares.values()) == pytest.approx(1.0)
    assert p.pm_qos_cpu_dma_latency_usec == 1 and p.c_states_limited is True
    assert p.cpufreq_governors == {0: "performance", 1: "powersave"}
    assert p.intel_pstate["status"] == "active" and p.intel_pstate["min_perf_pct"] == "100"
    assert p.tuned.active_profile == "latency-performance" and p.tuned.profile_mode == "manual"


def test_absent_sources_are_none_not_zero(tmp_path):
    roots = Roots.under(tmp_path)
    p = cpupower.read_power_settings(roots, run_tuned_adm_verify=False)
    assert p.idle_driver is None and p.pm_qos_cpu_dma_latency_usec is None and p.c_states_limited is None
    assert p.intel_pstate is None and p.cpufreq_governors == {} and p.tuned.active_profile is None


def test_cpu_dma_latency_bytes():
    assert cpupower.parse_cpu_dma_latency((2_000_000_000).to_bytes(4, "little")) == cpupower.PM_QOS_DEFAULT_USEC
    with pytest.raises(ParseError):
        cpupower.parse_cpu_dma_latency(b"\x00\x00")


def test_tuned_verify_result():
    assert cpupower.parse_tuned_verify(0, "Verification succeeded, current system settings match the preset profile.\n")[0]
    ok, msg = cpupower.parse_tuned_verify(1, "Verification failed, current system settings differ from the preset "
                                             "profile.\nYou can mostly fix this by restarting the TuneD daemon.\n")
    assert ok is False and "restarting" in msg
    assert cpupower.parse_tuned_verify(None, "") == (None, None)


def test_this_machine_reads_without_error():
    p = cpupower.read_power_settings(run_tuned_adm_verify=True)
    assert p.cpus, "every Linux machine has /sys/devices/system/cpu/cpuN"


def test_io_pressure():
    from iowarden.probes import pressure
    p = pressure.parse("some avg10=1.50 avg60=0.20 avg300=0.05 total=1234\n"
                       "full avg10=0.75 avg60=0.10 avg300=0.01 total=999\n")
    assert (p.some_avg10_percent, p.full_avg10_percent) == (1.5, 0.75)
    assert pressure.parse("some avg10=3.00 avg60=2.00 avg300=1.00 total=5\n").full_avg10_percent is None
    with pytest.raises(ParseError):
        pressure.parse("some avg10=x\n")
    with pytest.raises(ParseError):
        pressure.parse("")


def test_io_pressure_absent(tmp_path):
    from iowarden.probes import pressure
    assert pressure.read(Roots.under(tmp_path)) is None


def test_cpu_pressure_read_from_its_own_file(tmp_path):
    from iowarden.probes import pressure
    (tmp_path / "proc" / "pressure").mkdir(parents=True)
    (tmp_path / "proc" / "pressure" / "cpu").write_text("some avg10=92.50 avg60=88.00 avg300=40.00 total=7\n"
                                                        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    (tmp_path / "proc" / "pressure" / "io").write_text("some avg10=1.00 avg60=1.00 avg300=1.00 total=7\n")
    assert pressure.read(Roots.under(tmp_path), "cpu").some_avg10_percent == 92.5
    assert pressure.read(Roots.under(tmp_path)).some_avg10_percent == 1.0
    with pytest.raises(ValueError):
        pressure.read(Roots.under(tmp_path), "../../etc/passwd")
