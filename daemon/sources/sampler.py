"""The 1 Hz diskstats sampler: iostat -x rates per device, and the recent busy-ness the scheduler defers on.

Each step reads /proc/diskstats and PSI once and posts the reading to the core (DisksSampled), with each
device's mean %util over the last few seconds. The core publishes it in its snapshot as one frozen
SamplerReading: the passive part, the scheduler and the registered sources read it there, never the
sampler (its partition cache and %util history are the sampler thread's alone).
"""
from __future__ import annotations

import fnmatch
import threading
import time
from array import array
from dataclasses import dataclass, field
from types import MappingProxyType

from iowarden.probes import diskstats, pressure
from iowarden.probes.common import Roots

from iowarden.daemon import config_schema
from iowarden.daemon.events import DisksSampled


@dataclass(frozen=True)
class SamplerReading:
    """One sample as the sampler published it: raw counters, rates since the last one, the names sampled."""
    sample: diskstats.DiskSample
    rates: MappingProxyType            # kernel name -> DiskRates (sampled devices only)
    sampled: frozenset                 # the kernel names the sampler watches (its globs, or whole devices)
    io_pressure: object | None
    # kernel name -> mean %util over the last RECENT_UTIL_SECONDS samples: the scheduler defers a probe on it
    recent_util_percent: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    cpu_pressure: object | None = None   # /proc/pressure/cpu: a starved CPU stretches a probe's latency


# Devices nobody asked about, left out unless [sampler] devices names them (node_exporter's default
# also leaves out ram and zram disks); [sampler] exclude_devices overrides it. The configuration's default.
DEFAULT_EXCLUDE = config_schema.DEFAULT_EXCLUDE


def selected(name: str, device_globs, exclude_globs) -> bool:
    """The one device filter, by name alone: the configured globs ([sampler] devices), else every name but
    the excluded ones (exclude_devices). The sampler also leaves out partitions and empty loop devices;
    the hotplug log asks this of a device that just arrived (no diskstats line yet)."""
    if device_globs:
        return any(fnmatch.fnmatch(name, g) for g in device_globs)
    return not any(fnmatch.fnmatch(name, g) for g in exclude_globs)


RECENT_UTIL_SECONDS = 5   # the busy-ness a probe is deferred on: a mean over this many 1 s samples


class Sampler:
    HISTORY_TICKS = RECENT_UTIL_SECONDS   # seconds of %util kept per device

    def __init__(self, roots: Roots, device_globs: list[str], post=lambda event: None,
                 exclude_globs: tuple[str, ...] = DEFAULT_EXCLUDE):
        self.roots = roots
        self.device_globs = device_globs
        self.exclude_globs = tuple(exclude_globs)
        self.post = post
        self._prev: diskstats.DiskSample | None = None
        self._partition: dict[str, bool] = {}     # the sampler thread's own cache: read and written only there
        self._lock = threading.Lock()
        self._util: dict[str, array] = {}   # kernel name -> its last HISTORY_TICKS %util, oldest first
        self.first_sample_done = threading.Event()
        self.reading: SamplerReading | None = None   # the last reading, replaced whole

    @property
    def rates(self):
        r = self.reading
        return r.rates if r is not None else MappingProxyType({})

    @property
    def io_pressure(self):
        r = self.reading
        return r.io_pressure if r is not None else None

    def _wanted(self, name: str) -> bool:
        """Is this device sampled (sampler thread only)?

        The configured globs, else every whole device; less the excluded globs (ram and zram disks
        by default, as node_exporter leaves them out) and loop devices with nothing attached, which
        can do no I/O. A glob that names a device explicitly wins over both exclusions.
        """
        if not selected(name, self.device_globs, self.exclude_globs):
            return False
        if self.device_globs:
            return True   # named by a glob: sampled whatever its kind
        # one stat() per device per tick adds up at 1000 devices: a name's kind is asked once
        if name not in self._partition:
            self._partition[name] = diskstats.is_partition(name, self.roots)
        if self._partition[name]:
            return False
        # attaching and detaching sends no diskstats change: asked every tick, one stat() per loop device
        return not name.startswith("loop") or diskstats.loop_attached(name, self.roots)

    def step(self) -> None:
        cur = diskstats.read(self.roots)
        try:
            io_pressure = pressure.read(self.roots)
        except Exception:  # PSI is a secondary signal: a garbled file must not stop the sampler
            io_pressure = None
        try:
            cpu_pressure = pressure.read(self.roots, "cpu")
        except Exception:
            cpu_pressure = None
        prev, self._prev = self._prev, cur
        if set(self._partition) - set(cur.counters):  # devices went away: names may be reused
            self._partition = {n: p for n, p in self._partition.items() if n in cur.counters}
        sampled = frozenset(n for n in cur.counters if self._wanted(n))
        rates = MappingProxyType({}) if prev is None or cur.monotonic_seconds <= prev.monotonic_seconds \
            else diskstats.RatesBetween(prev, cur, sampled)
        recent = self._recent_util(rates) if prev is not None else MappingProxyType({})
        self.reading = SamplerReading(cur, rates, sampled, io_pressure, recent, cpu_pressure)
        self.post(DisksSampled(cur, rates, io_pressure, time.time(), sampled, recent, cpu_pressure))
        if prev is not None:
            self.first_sample_done.set()

    def _recent_util(self, rates) -> MappingProxyType:
        """Each sampled device's mean %util over its last HISTORY_TICKS samples, this one's included."""
        with self._lock:
            for name in rates:
                # an array of doubles, not a deque of float objects: 0.2 KiB a device where the deque was 1.3
                hist = self._util.get(name)
                if hist is None:
                    hist = self._util[name] = array("d")
                elif len(hist) >= self.HISTORY_TICKS:
                    del hist[0]
                hist.append(rates.util_percent(name))
            for gone in set(self._util) - set(rates):
                del self._util[gone]
            return MappingProxyType({name: sum(hist) / len(hist) for name, hist in self._util.items() if hist})
