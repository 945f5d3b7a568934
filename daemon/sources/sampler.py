"""The 1 Hz diskstats sampler: iostat -x rates per device, and the recent busy-ness the scheduler defers on."""
from __future__ import annotations

import collections
import fnmatch
import threading
import time

from iowarden.probes import diskstats, pressure
from iowarden.probes.common import Roots


HISTORY_SAMPLES = 130


class Sampler:
    HISTORY_TICKS = 10  # seconds of %util kept per device for the contention check

    def __init__(self, roots: Roots, device_globs: list[str]):
        self.roots = roots
        self.device_globs = device_globs
        self._prev: diskstats.DiskSample | None = None
        self._partition: dict[str, bool] = {}
        self._lock = threading.Lock()
        self.rates: dict[str, diskstats.DiskRates] = {}
        self._util: dict[str, collections.deque] = {}
        self.first_sample_done = threading.Event()
        self.io_pressure: pressure.IoPressure | None = None
        self.last_sample: diskstats.DiskSample | None = None
        # (unix time, sample) of the last two minutes: what a disk did during a probe that just ended
        self.history: collections.deque = collections.deque(maxlen=HISTORY_SAMPLES)

    def wanted(self, name: str) -> bool:
        """Is this device sampled: the configured globs, else every whole device."""
        if self.device_globs:
            return any(fnmatch.fnmatch(name, g) for g in self.device_globs)
        # one stat() per device per tick adds up at 1000 devices: a name's kind is asked once
        if name not in self._partition:
            self._partition[name] = diskstats.is_partition(name, self.roots)
        return not self._partition[name]

    def step(self) -> None:
        cur = diskstats.read(self.roots)
        try:
            self.io_pressure = pressure.read(self.roots)
        except Exception:  # PSI is a secondary signal: a garbled file must not stop the sampler
            self.io_pressure = None
        prev, self._prev = self._prev, cur
        self.last_sample = cur
        with self._lock:
            self.history.append((time.time(), cur))
        if prev is None:
            return
        rates = {n: r for n, r in diskstats.rates_between(prev, cur).items() if self.wanted(n)}
        with self._lock:
            self.rates = rates  # replaced whole: readers never see a half-updated view
            for name, r in rates.items():
                self._util.setdefault(name, collections.deque(maxlen=self.HISTORY_TICKS)).append(r.util_percent)
            for gone in set(self._util) - set(rates):
                del self._util[gone]
            if set(self._partition) - set(cur.counters):  # devices went away: names may be reused
                self._partition = {n: p for n, p in self._partition.items() if n in cur.counters}
        self.first_sample_done.set()

    def delivered(self, device: str, start: float, end: float) -> diskstats.DiskRates | None:
        """iostat -x of one device between two Unix times (the samples nearest inside them), or None."""
        with self._lock:
            inside = [(t, smp) for t, smp in self.history if start - 0.5 <= t <= end + 1.5]
        if len(inside) < 2:
            return None
        (_, a), (_, b) = inside[0], inside[-1]
        if device not in a.counters or device not in b.counters or b.monotonic_seconds <= a.monotonic_seconds:
            return None
        return diskstats.compute_rates(a.counters[device], b.counters[device],
                                       b.monotonic_seconds - a.monotonic_seconds)

    def recent_util_percent(self, device: str, seconds: int = 5) -> float | None:
        """Mean %util of the device over the last few samples; None when it is not sampled."""
        with self._lock:
            hist = self._util.get(device)
            if not hist:
                return None
            recent = list(hist)[-seconds:]
        return sum(recent) / len(recent)
