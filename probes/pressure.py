"""Pressure stall information for I/O and CPU (/proc/pressure/io and /proc/pressure/cpu,
Documentation/accounting/psi.rst).

  some avg10=0.00 avg60=0.00 avg300=0.00 total=0
  full avg10=0.00 avg60=0.00 avg300=0.00 total=0
"some" is the share of time at least one task waited on I/O (or for a CPU), "full" the share
all non-idle tasks did (cpu's "full" is 0 or absent outside cgroups). Kernels before 4.20, or with
psi=0, have no file: None.
"""
from __future__ import annotations

from dataclasses import dataclass

from .common import ParseError, Roots, read_text


@dataclass(frozen=True)
class IoPressure:
    some_avg10_percent: float
    some_avg60_percent: float
    full_avg10_percent: float | None   # 4.20 had no "full" line for io
    full_avg60_percent: float | None


def parse(text: str) -> IoPressure:
    lines = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            lines[parts[0]] = {k: float(v) for k, v in (p.split("=", 1) for p in parts[1:])}
        except ValueError:
            raise ParseError(f"unexpected pressure line: {line.strip()[:80]!r}") from None
    if "some" not in lines or "avg10" not in lines["some"] or "avg60" not in lines["some"]:
        raise ParseError("pressure file has no 'some avg10=... avg60=...' line")
    full = lines.get("full", {})
    return IoPressure(lines["some"]["avg10"], lines["some"]["avg60"], full.get("avg10"), full.get("avg60"))


def read(roots: Roots = Roots(), resource: str = "io") -> IoPressure | None:
    """resource: "io" or "cpu" (the same format)."""
    if resource not in ("io", "cpu"):
        raise ValueError(f"no pressure file for {resource!r}")
    text = read_text(roots.proc / "pressure" / resource)
    return parse(text) if text else None
