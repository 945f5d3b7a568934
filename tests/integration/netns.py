"""Hosts on one machine: network namespaces joined to this one by veth pairs, each with an address
of its own, so that Prometheus scrapes every host at the same port on a different address, as it
scrapes a fleet. Only the network is separate (nsenter --net): the hosts share this machine's disks,
/proc and /sys, which `ip netns exec` would remount.

Everything is named after this process's id and removed by that name: deleting a namespace deletes
the veth pair in it."""
from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass

SUBNET = "10.213"    # 10.213.N.0/30 per host: .1 on this side, .2 in the host


@dataclass(frozen=True)
class Host:
    name: str         # the namespace
    address: str      # the host's own address, reachable from here

    def argv(self, argv: list[str]) -> list[str]:
        """argv run on this host (in its network namespace)."""
        return ["nsenter", f"--net=/run/netns/{self.name}", "--", *argv]


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@contextmanager
def hosts(count: int):
    tag = os.getpid() % 100000
    made: list[str] = []
    try:
        out = []
        for i in range(count):
            name, veth = f"iowarden-test-{tag}-{i}", f"iwt{tag}h{i}"
            _ip("netns", "add", name)
            made.append(name)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("addr", "add", f"{SUBNET}.{i}.1/30", "dev", veth)
            _ip("link", "set", veth, "up")
            _ip("-n", name, "addr", "add", f"{SUBNET}.{i}.2/30", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
            out.append(Host(name, f"{SUBNET}.{i}.2"))
        yield out
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
