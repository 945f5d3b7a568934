"""Synthetic probe traces for the detector: realistic noise, and the shapes a real volume takes.

Noise is log-normal with AR(1) correlation (consecutive probes of a volume are
alike: caches, neighbours, time of day) plus rare heavy-tailed spikes (a GC
pause, a noisy neighbour), always in the bad direction. Generated from seeds, so
every figure is reproducible.
"""
from __future__ import annotations

import math
import random

NOISE_LEVELS = {"low": 0.05, "high": 0.15}   # sigma of log(value)
AR_PHI = 0.5
SPIKE_RATE = 0.005


def noise(n: int, sigma: float, rng: random.Random, phi: float = AR_PHI) -> list[float]:
    out, e = [], 0.0
    for _ in range(n):
        e = phi * e + math.sqrt(1 - phi * phi) * sigma * rng.gauss(0, 1)
        out.append(e)
    return out


def spike_factor(rng: random.Random) -> float:
    """Heavy-tailed: Pareto(alpha 1.5) above 2x, so a 10x or 50x spike happens."""
    return 2.0 * rng.paretovariate(1.5)


def stable(n: int, level: str, seed: int, base: float = 10000.0, worse_is_higher: bool = False,
           spike_rate: float = SPIKE_RATE) -> list[float]:
    rng = random.Random(seed)
    out = []
    for e in noise(n, NOISE_LEVELS[level], rng):
        v = base * math.exp(e)
        if rng.random() < spike_rate:
            f = spike_factor(rng)
            v = v * f if worse_is_higher else v / f
        out.append(v)
    return out


def step(n_before: int, n_after: int, factor: float, level: str, seed: int, base: float = 10000.0,
         worse_is_higher: bool = False) -> list[float]:
    """Stable, then every value multiplied by `factor` (0.5: IOPS halve; 3: p99 triples)."""
    vals = stable(n_before + n_after, level, seed, base, worse_is_higher)
    return vals[:n_before] + [v * factor for v in vals[n_before:]]


def halve_then_recover(level: str, seed: int, back_to: float, n_before: int = 300, n_halved: int = 60,
                       n_after: int = 200, base: float = 10000.0) -> list[float]:
    """IOPS: stable, halved for n_halved probes, then back at `back_to` of normal (1.0: fully)."""
    vals = stable(n_before + n_halved + n_after, level, seed, base)
    recovered = n_before + n_halved
    return vals[:n_before] + [v * 0.5 for v in vals[n_before:recovered]] + [v * back_to for v in vals[recovered:]]


def drift(n_before: int, n_ramp: int, n_after: int, factor: float, level: str, seed: int,
          base: float = 0.001) -> list[float]:
    """Latency (higher is worse) rising smoothly to `factor` times over n_ramp probes."""
    vals = stable(n_before + n_ramp + n_after, level, seed, base, worse_is_higher=True)
    out = []
    for i, v in enumerate(vals):
        progress = min(1.0, max(0.0, (i - n_before) / n_ramp))
        out.append(v * factor ** progress)
    return out


def burst_credits(n: int, level: str, seed: int, burst_iops: float = 3000.0, baseline_iops: float = 300.0,
                  bucket: float = 60.0, drain_per_probe: float = 1.0, refill_per_probe: float = 0.35,
                  busy_pattern: tuple[int, int] = (200, 120)) -> tuple[list[float], int]:
    """An EBS-like volume: burst speed while its credit bucket lasts, then the baseline rate.

    The workload alternates busy and idle stretches (busy_pattern = busy probes,
    idle probes). While busy, each probe drains credits; while idle they refill.
    Returns the IOPS seen by the probes and the index of the first exhaustion.
    """
    rng = random.Random(seed)
    credits, out, first_empty = bucket, [], None
    e = noise(n, NOISE_LEVELS[level], rng)
    busy, idle = busy_pattern
    for i in range(n):
        in_busy = (i % (busy + idle)) < busy
        credits = credits - drain_per_probe if in_busy else min(bucket, credits + refill_per_probe)
        if credits <= 0:
            credits = 0.0
            if first_empty is None:
                first_empty = i
        rate = burst_iops if credits > 0 else baseline_iops
        out.append(rate * math.exp(e[i]))
    return out, first_empty
