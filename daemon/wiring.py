"""Which part reads what and posts what: the daemon's wiring, declared.

Every supervised part is one row here. A part reads its own corner of the machine and, of the rest of the
daemon, only the core's published snapshot (the fields named); it hands the core what it found by posting
events (the types named), and calls no other part. runtime.py registers a part only under a name declared
here; tests/unit/test_wiring.py checks each row against the code (the events its module posts, the snapshot's
fields), and docs/architecture.md's wiring table is this table rendered (`render()`), so neither can drift.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PartWiring:
    name: str                     # the part's name in the registry (iowarden_part_* {part="..."})
    modules: tuple[str, ...]      # where its step lives (under iowarden.daemon)
    machine: str                  # what it reads of the host
    snapshot: tuple[str, ...]     # the fields of the core's published snapshot it reads
    posts: tuple[str, ...]        # the event types it posts to the core (daemon/events.py)
    calls: tuple[str, ...] = ()   # another part's method it calls directly, and why (each one an exception)


# one row per kind of part: each registered source (sources/registry.py SOURCES) is a "source:NAME" part
PARTS: tuple[PartWiring, ...] = (
    PartWiring("sampler", ("sources.sampler",), "/proc/diskstats, /proc/pressure/io, /proc/pressure/cpu", (), ("DisksSampled",)),
    PartWiring("settings", ("sources.settings",), "/sys/block, cpufreq, cpuidle, PM QoS, tuned-adm", (),
               ("SettingsRead",)),
    PartWiring("uevents", ("sources.inventory", "runtime"), "udev's netlink events, then /sys/block", (),
               ("DevicesRead", "TargetsChanged"),
               calls=("settings.read_devices: the device reader and its cache, shared with the poll",
                      "scheduler.abort_on: a removed disk's probe killed at once, not at the next step")),
    PartWiring("xfs", ("sources.xfs",), "xfs_db, xfs_spaceman, the mount table", ("devices",), ("XfsRead",)),
    PartWiring("source", ("runtime",), "its own (smart: smartctl; cgroups: /sys/fs/cgroup; tracer: eBPF)",
               ("disk_reading",), ("SourceRead",)),
    PartWiring("scheduler", ("probing.scheduler", "probing.published", "probing.suspicion"),
               "the target's path (in a child), fio",
               ("disk_reading", "devices", "alerts", "baselines", "probes", "pins"),
               ("ProbeStarted", "ProbeFinished", "ProbesCounted", "IntervalsFitted")),
    PartWiring("passive", ("passive.part",), "the curves it saved (read once, at start)",
               ("disk_reading", "devices", "own_probes", "sources", "pins"), ("PassiveJudged",)),
    PartWiring("discovery", ("runtime",), "the mount table", (), ("TargetsChanged",),
               calls=("scheduler.configure: the new targets, planned from the next step",)),
    PartWiring("retention", ("runtime",), "nothing (a timer)", (), ("Housekeeping",)),
    PartWiring("state", ("runtime",), "nothing (a timer)", (), ("Housekeeping",)),
    PartWiring("state-check", ("runtime",), "the state database, read-only", (), ()),
    PartWiring("influxdb", ("outputs.wiring",), "the InfluxDB server's answers",
               ("told", "disk_sample", "disk_rates", "devices"), ("InfluxCounted",)),
    PartWiring("metrics-endpoint", ("runtime",), "its HTTP server's thread", (), ()),
)
# the supervising loop (runtime.Daemon.run) posts PartsChecked every second: the parts' stats, the requests' tick
SUPERVISOR_POSTS = ("PartsChecked",)


def part_named(name: str, sources=()) -> PartWiring:
    """The declared row of a registered part; a source's own name finds the "source" row."""
    for p in PARTS:
        if p.name == name:
            return p
    if name in sources:
        return next(p for p in PARTS if p.name == "source")
    raise KeyError(f"part {name!r} is not declared in daemon/wiring.py PARTS: declare what it reads and posts")


def render() -> str:
    """The wiring as docs/architecture.md shows it (a markdown table)."""
    rows = ["| part | reads of the host | reads of the snapshot | posts | calls another part |",
            "|---|---|---|---|---|"]
    for p in PARTS:
        rows.append(f"| {p.name} | {p.machine} | {', '.join(f'`{f}`' for f in p.snapshot) or 'nothing'} | "
                    f"{', '.join(f'`{e}`' for e in p.posts) or 'nothing'} | {'; '.join(p.calls) or 'no'} |")
    return "\n".join(rows)
