"""CPU power settings that change storage latency: C-states, PM QoS, cpufreq, tuned.

Sources (Documentation/admin-guide/pm/cpuidle.rst, pm_qos_interface.rst, cpufreq.rst, intel_pstate.rst):
  /sys/devices/system/cpu/cpuidle/{current_driver,current_governor}
  /sys/devices/system/cpu/cpuN/cpuidle/stateK/{name,desc,latency,residency,disable,usage,time}
  /dev/cpu_dma_latency   4 bytes: the aggregate PM QoS request, signed 32-bit, in microseconds
  /sys/devices/system/cpu/cpuN/cpufreq/{scaling_governor,scaling_driver}
  /sys/devices/system/cpu/intel_pstate/{status,no_turbo,min_perf_pct,max_perf_pct}
  /etc/tuned/{active_profile,profile_mode}, and `tuned-adm verify` where tuned is installed
A source that is absent is None, never 0: "no C-state limit" and "C-states
limited to 0 us" are opposite findings.
"""
from __future__ import annotations

import re
import shutil
import struct
from dataclasses import dataclass
from types import MappingProxyType

from .common import ParseError, Roots, read_int, read_str, run_tool

# The kernel's "no request" value for cpu_dma_latency (PM_QOS_CPU_LATENCY_DEFAULT_VALUE).
PM_QOS_DEFAULT_USEC = 2_000_000_000


@dataclass(frozen=True)
class IdleState:
    index: int
    name: str
    desc: str | None
    exit_latency_usec: int | None
    target_residency_usec: int | None
    disabled: bool
    usage: int | None
    time_usec: int | None


@dataclass(frozen=True)
class CpuIdle:
    cpu: int
    states: tuple[IdleState, ...]

    def residency_shares(self) -> dict[str, float]:
        """Share of idle time spent in each state (time-weighted), for this CPU since boot."""
        total = sum(s.time_usec or 0 for s in self.states)
        return {s.name: (s.time_usec or 0) / total for s in self.states} if total else {}


@dataclass(frozen=True)
class TunedState:
    active_profile: str | None  # None: tuned not configured on this host
    profile_mode: str | None
    verify_ok: bool | None      # None: tuned-adm not installed or not run
    verify_message: str | None


@dataclass(frozen=True)
class PowerSettings:
    idle_driver: str | None
    idle_governor: str | None
    cpus: tuple[CpuIdle, ...]
    pm_qos_cpu_dma_latency_usec: int | None
    cpufreq_governors: MappingProxyType[int, str]
    cpufreq_drivers: MappingProxyType[int, str]
    intel_pstate: MappingProxyType[str, str] | None
    tuned: TunedState

    def __post_init__(self):
        for name in ("cpufreq_governors", "cpufreq_drivers", "intel_pstate"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, MappingProxyType(dict(value)))

    @property
    def c_states_limited(self) -> bool | None:
        """True when a PM QoS request holds the CPUs out of deep idle states."""
        if self.pm_qos_cpu_dma_latency_usec is None:
            return None
        return self.pm_qos_cpu_dma_latency_usec < PM_QOS_DEFAULT_USEC


def parse_cpu_dma_latency(data: bytes) -> int:
    if len(data) != 4:
        raise ParseError(f"/dev/cpu_dma_latency gave {len(data)} bytes, expected 4")
    return struct.unpack("=i", data)[0]


def parse_tuned_verify(returncode: int | None, output: str) -> tuple[bool | None, str | None]:
    """`tuned-adm verify` exits 0 when the system matches the profile."""
    if returncode is None:
        return None, None
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return returncode == 0, (lines[-1] if lines else None)


_CPU_DIR = re.compile(r"^cpu(\d+)$")


def _cpu_dirs(roots: Roots):
    base = roots.sys / "devices" / "system" / "cpu"
    try:
        entries = sorted(base.iterdir(), key=lambda p: p.name)
    except OSError:
        return []
    return [(int(m.group(1)), p) for p in entries if (m := _CPU_DIR.match(p.name))]


def _idle_states(cpudir) -> tuple[IdleState, ...]:
    d = cpudir / "cpuidle"
    if not d.is_dir():
        return ()
    states = []
    for entry in sorted(d.iterdir(), key=lambda p: p.name):
        if not entry.name.startswith("state") or not entry.name[5:].isdigit():
            continue
        states.append(IdleState(
            index=int(entry.name[5:]), name=read_str(entry / "name") or entry.name,
            desc=read_str(entry / "desc"), exit_latency_usec=read_int(entry / "latency"),
            target_residency_usec=read_int(entry / "residency"),
            disabled=(read_int(entry / "disable") or 0) != 0,
            usage=read_int(entry / "usage"), time_usec=read_int(entry / "time")))
    return tuple(sorted(states, key=lambda s: s.index))


def read_tuned(roots: Roots, run_tuned_adm_verify: bool) -> TunedState:
    """tuned's active profile from /etc; with run_tuned_adm_verify, also runs `tuned-adm verify` (up to 30 s)."""
    profile = read_str(roots.etc / "tuned" / "active_profile")
    mode = read_str(roots.etc / "tuned" / "profile_mode")
    ok = msg = None
    if run_tuned_adm_verify and profile and shutil.which("tuned-adm"):
        run = run_tool(["tuned-adm", "verify"], timeout_seconds=30)
        ok, msg = parse_tuned_verify(run.returncode, run.stdout + run.stderr)
    return TunedState(profile or None, mode or None, ok, msg)


def read_power_settings(roots: Roots = Roots(), *, run_tuned_adm_verify: bool) -> PowerSettings:
    """C-states, PM QoS, cpufreq and tuned from sysfs and /etc. Runs a command, `tuned-adm verify`, only when
    asked (the settings poller does, every 30 s; its stuck threshold allows for the 30 s timeout)."""
    cpu_base = roots.sys / "devices" / "system" / "cpu"
    cpus, governors, drivers = [], {}, {}
    for n, d in _cpu_dirs(roots):
        cpus.append(CpuIdle(n, _idle_states(d)))
        gov = read_str(d / "cpufreq" / "scaling_governor")
        drv = read_str(d / "cpufreq" / "scaling_driver")
        if gov:
            governors[n] = gov
        if drv:
            drivers[n] = drv
    qos = None
    try:
        with open(roots.dev / "cpu_dma_latency", "rb") as f:
            qos = parse_cpu_dma_latency(f.read(4))
    except (OSError, ParseError):
        qos = None
    pstate_dir = cpu_base / "intel_pstate"
    pstate = None
    if pstate_dir.is_dir():
        pstate = {k: v for k in ("status", "no_turbo", "min_perf_pct", "max_perf_pct", "hwp_dynamic_boost")
                  if (v := read_str(pstate_dir / k)) is not None}
    return PowerSettings(
        idle_driver=read_str(cpu_base / "cpuidle" / "current_driver"),
        idle_governor=read_str(cpu_base / "cpuidle" / "current_governor")
        or read_str(cpu_base / "cpuidle" / "current_governor_ro"),
        cpus=tuple(cpus), pm_qos_cpu_dma_latency_usec=qos,
        cpufreq_governors=governors, cpufreq_drivers=drivers, intel_pstate=pstate,
        tuned=read_tuned(roots, run_tuned_adm_verify))
