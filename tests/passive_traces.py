"""Synthetic iostat windows for the passive detector: a day of load varying tenfold, latency on a
device curve with heavy-tailed noise, and the faults it must find or ignore. Shared by the unit
tests and bench/passive_synthetic.py.
"""
from __future__ import annotations

import math
import random

from iowarden.daemon.passive.values import Flow, Window

WINDOW_SECONDS = 15.0
DAY_WINDOWS = 5760


def load_at(i: int, rng: random.Random, surge: tuple[int, int] | None = None) -> float:
    """IOPS: a daily cycle from 200 to 2,000, with a little jitter; `surge` (start, end) triples it."""
    phase = 2 * math.pi * (i % DAY_WINDOWS) / DAY_WINDOWS
    load = 200 * 10 ** ((1 - math.cos(phase)) / 2) * math.exp(rng.gauss(0, 0.1))
    if surge and surge[0] <= i < surge[1]:
        load *= 3
    return load


def curve_ms(load: float) -> float:
    """The device's normal: 0.5 ms unqueued, growing with load (a queue builds towards 5,000 IOPS)."""
    return 0.5 * (1 + (load / 5000) ** 1.5 * 4)


def noisy(ms: float, rng: random.Random, sigma: float = 0.15) -> float:
    """Log-normal noise plus rare heavy-tailed spikes (one window in 200 up to 8x)."""
    x = ms * math.exp(rng.gauss(0, sigma))
    if rng.random() < 0.005:
        x *= rng.uniform(2, 8)
    return x


def window(device: str, i: int, iops: float, await_ms: float, queue: float | None = None,
           util: float | None = None) -> Window:
    flows = {"read": Flow(iops, iops * 4, await_ms)}
    if queue is None:
        queue = iops * await_ms / 1000
    if util is None:
        util = min(100.0, iops * 0.5 / 10)
    return Window(device, 1.7e9 + i * WINDOW_SECONDS, WINDOW_SECONDS, flows, queue, util)


def device_trace(seed: int, windows: int, slow_from: int | None = None, factor: float = 1.0,
                 surge: tuple[int, int] | None = None, device: str = "sda"):
    """One device's windows; from `slow_from` on, latency is `factor` times the curve at equal load."""
    rng = random.Random(seed)
    for i in range(windows):
        load = load_at(i, rng, surge)
        ms = noisy(curve_ms(load), rng)
        if slow_from is not None and i >= slow_from:
            ms *= factor
        yield window(device, i, load, ms)


def peer_trace(seed: int, windows: int, members: int = 4, slow: dict | None = None, slow_from: int = 0,
               shift: tuple[int, int, float] | None = None):
    """Members of one array carrying the same load; `slow` maps member index -> latency factor; `shift`
    (start, end, factor) moves every member's latency together, as a change of workload does."""
    rng = random.Random(seed)
    for i in range(windows):
        load = load_at(i, rng)
        batch = []
        for m in range(members):
            ms = noisy(curve_ms(load), rng)
            if slow and i >= slow_from:
                ms *= slow.get(m, 1.0)
            if shift and shift[0] <= i < shift[1]:
                ms *= shift[2]
            batch.append(window(f"sd{chr(97 + m)}", i, load * math.exp(rng.gauss(0, 0.05)), ms))
        yield batch
