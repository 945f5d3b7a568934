"""How often the daemon's own cgroup has refused it a task (a process or thread) at its pids limit.

A probe whose fio cannot start its job threads waits until its deadline and reads as "fio timed out"; the
kernel counts each refusal in the cgroup's pids.events ("max N"), so a probe that failed while the count grew
can say the daemon's task limit (the unit's TasksMax) is why. cgroup v2 and v1's pids hierarchy alike.
"""
from __future__ import annotations

from pathlib import Path

from .common import Roots, lines_of, read_text

CGROUP_FILE_MAX_BYTES = 64 << 10   # /proc/self/cgroup and pids.events: a few lines


def parse_cgroup(text: str) -> str | None:
    """The path of the pids cgroup a process is in, from its /proc/PID/cgroup: v1's pids line, else v2's."""
    unified = None
    for line in lines_of(text):
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "pids" in parts[1].split(","):
            return parts[2]
        if parts[0] == "0" and parts[1] == "":
            unified = parts[2]
    return unified


def parse_events(text: str) -> int | None:
    """pids.events' count of refused forks ("max N"), or None without one."""
    for line in lines_of(text):
        key, _, value = line.partition(" ")
        if key == "max" and value.strip().isdigit():
            return int(value)
    return None


def refusals(roots: Roots = Roots(), pid: str = "self") -> int | None:
    """How many tasks the pids cgroup of `pid` has refused so far; None where that cannot be read."""
    cgroup_text = read_text(roots.proc / pid / "cgroup", CGROUP_FILE_MAX_BYTES)
    path = parse_cgroup(cgroup_text) if cgroup_text is not None else None
    if path is None or ".." in Path(path).parts:
        return None
    relative = path.lstrip("/")
    for base in (roots.sys / "fs" / "cgroup" / "pids", roots.sys / "fs" / "cgroup"):   # v1's hierarchy, then v2
        text = read_text(base / relative / "pids.events", CGROUP_FILE_MAX_BYTES)
        if text is not None:
            return parse_events(text)
    return None
