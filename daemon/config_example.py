"""config.example.toml, generated from the one schema (daemon/config.py), so its comments and
defaults cannot drift from what the daemon does:

    python -m iowarden.daemon.config_example > config.example.toml

tests/unit/test_config.py checks that the checked-in file is exactly this output.
"""
from __future__ import annotations

import json
import sys
import textwrap

from iowarden.daemon.config import DISCOVER_KEYS, PROFILE_KEYS, SECTIONS, TARGET_KEYS, Key

HEADER = """\
# iowarden configuration. Every key is shown with its default value.
# Check a file with:  iowarden check-config -c /etc/iowarden/config.toml
# Sizes take binary suffixes as fio does: 4k = 4096 bytes, 256MiB, 1G.
"""

SECTION_DOCS = {
    "limits": "Safety caps applied to every probe, whatever a profile or job file asks for.",
    "budget": "What probes may cost each physical disk. A probe that would exceed it waits (counted as skipped, "
              "reason budget_time / budget_bytes); status shows what is left.",
    "passive": "Judge every sampled disk from the traffic it carries (no I/O of its own): against its own "
               "latency-vs-load curve, its peers (md/LVM members, else disks of one model and size) and a "
               "ceiling (a volume at its limit).",
}

PROFILES_EXAMPLES = """\
# Short probes, often: 1 s measured after 0.5 s of ramp, every 300 s (about 7.6 s of device time per round
# with fio's start, 2.5 % of the hour, inside the 4 % budget with room). A new volume is probed every minute until 12 probes have taught iowarden its normal
# ([scheduling] warmup_interval_seconds): it can page within about 15 minutes of its first probe.
[profiles.randread-4k]
rw = "randread"
bs = "4k"
iodepth = 32
size = "256MiB"
runtime_seconds = 1.0
ramp_time_seconds = 0.5

[profiles.randwrite-4k]
# Writes at a fixed 2,000 IOPS (the latency at that load is what is judged): at most 12 MiB a round, 3.4 GiB
# a day at 288 rounds, inside the 10 GiB write budget. Unlimited, a fast NVMe would take 1.25 GiB a round.
rw = "randwrite"
bs = "4k"
iodepth = 32
size = "256MiB"
runtime_seconds = 1.0
ramp_time_seconds = 0.5
rate_iops = 2000

[profiles.read-1m]
rw = "read"
bs = "1MiB"
iodepth = 8
size = "256MiB"
runtime_seconds = 1.0
ramp_time_seconds = 0.5

[profiles.randread-4k-qd1]
# Queue depth 1: the latency one synchronous database read sees.
rw = "randread"
bs = "4k"
iodepth = 1
size = "256MiB"
runtime_seconds = 1.0
ramp_time_seconds = 0.5
"""

TARGETS_INTRO = """\
Targets: where probes run. A directory is probed through a file in <path>/.iowarden/ (created 0700, laid
out once with real data, reused); a block device is only ever read."""

TARGETS_EXAMPLE = """\
# Out of the box iowarden probes only its own state directory's filesystem.
[[targets]]
name = "state"
path = "/var/lib/iowarden"
profiles = ["randread-4k", "randwrite-4k", "read-1m", "randread-4k-qd1"]
interval_seconds = 300.0
"""

DISCOVER_INTRO = """\
Discovery rules: volumes mounted while iowarden runs (or before) become targets when a rule matches their
mount point, and stop being targets when they are unmounted or removed; baselines follow the volume's
identity, so a disk that comes back keeps its history. Each match is the target "NAME:MOUNTPOINT", probed
through MOUNTPOINT/.iowarden/. Read-only mounts and mount points a [[targets]] entry already names are
skipped."""

DISCOVER_EXAMPLE = """\
# None by default: probing writes a file on the volume, which is the
# operator's decision. Under systemd, allow the writes with ReadWritePaths= for
# the directory the mount points live under (see the unit); a matching mount
# that is read-only to the daemon is logged, not probed. For example:
#
# [[discover]]
# name = "data"
# mountpoints = ["/srv/*", "/var/lib/postgresql"]
# fstypes = ["xfs", "ext4"]
# profiles = ["randread-4k", "randread-4k-qd1"]
# interval_seconds = 900.0
"""


def toml_value(kind: str, value) -> str:
    if kind == "bool":
        return "true" if value else "false"
    if kind in ("str", "size"):
        return json.dumps(value)
    if kind == "strlist":
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    if kind == "float":
        return repr(float(value))
    return str(value)


def sentence(doc: str) -> str:
    doc = doc.strip()
    return doc if doc.endswith(".") else doc + "."


def comment(text: str) -> str:
    return "".join(f"# {line}\n" for line in textwrap.wrap(text, 76, break_on_hyphens=False))


def key_table(keys: dict[str, Key]) -> str:
    """The keys of a table the user writes many of ([profiles.X], [[targets]]), as a commented list."""
    out = []
    for name, key in keys.items():
        shown = f"{name} = " + ("..." if key.required else toml_value(key.kind, key.default))
        doc = key.doc + (" (required)" if key.required else "")
        wrapped = textwrap.wrap(doc, 76 - 30, break_on_hyphens=False)
        out.append(f"#   {shown:<30}{wrapped[0]}\n")
        out += [f"#   {'':<30}{w}\n" for w in wrapped[1:]]
    return "".join(out)


def render() -> str:
    out = [HEADER]
    for section, keys in SECTIONS.items():
        out.append(f"\n[{section}]\n")
        if section in SECTION_DOCS:
            out.append(comment(SECTION_DOCS[section]))
        for name, key in keys.items():
            out.append(comment(sentence(key.doc)))
            out.append(f"{name} = {toml_value(key.kind, key.default)}\n")
    out.append("\n# Probe profiles. Keys and defaults:\n")
    out.append(key_table(PROFILE_KEYS))
    out.append("\n" + PROFILES_EXAMPLES)
    out.append("\n" + comment(TARGETS_INTRO + " Keys:") + key_table(TARGET_KEYS) + TARGETS_EXAMPLE)
    out.append("\n" + comment(DISCOVER_INTRO + " Keys:") + key_table(DISCOVER_KEYS) + DISCOVER_EXAMPLE)
    return "".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
