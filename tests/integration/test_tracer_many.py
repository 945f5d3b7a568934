"""The tracer on a host of many disks: with 64 and with 1,024 loop devices attached and every one
of them traced, the program loads, the reading says up only once it runs, and a traced disk's latencies
appear. The program used to filter with one comparison per disk: the verifier refused it from about ten
disks, and above some 700 its text no longer fitted bpftrace's one -e argument.

The devices are the test's own (loop devices over 8 MiB sparse files), named one by one to the tracer.
"""
import fcntl
import os
import subprocess
import types
from contextlib import contextmanager

import pytest

from iowarden.daemon.sources import tracer
from iowarden.probes.common import Roots
from tests.integration.helpers import wait_for

# alone: a thousand devices attached and removed are a storm of uevents, and diskstats lines, for every daemon
# running beside it (the lane's timed scenarios, another test's): it runs last, when none is
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.alone]   # bpftrace: scripts/setup.sh installs it
LOOP_CTL_REMOVE = 0x4C81   # linux/loop.h


@contextmanager
def loop_devices(count: int, directory):
    """`count` loop devices of the test's own, detached on the way out (only these, by name), and those the
    kernel made for them removed (LOOP_CTL_REMOVE): a thousand idle loop devices left in /sys/block and
    /proc/diskstats would be every later test's daemon's to read."""
    existed = set(os.listdir("/sys/block"))
    attached = []
    try:
        for i in range(count):
            image = directory / f"d{i}.img"
            image.touch()
            os.truncate(image, 8 << 20)
            attached.append(subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True,
                                           text=True, check=True, timeout=60).stdout.strip())
        yield attached
    finally:
        for dev in attached:
            subprocess.run(["losetup", "-d", dev], capture_output=True, timeout=60)
        control = os.open("/dev/loop-control", os.O_RDWR)
        try:
            for dev in attached:
                if os.path.basename(dev) not in existed:
                    try:
                        fcntl.ioctl(control, LOOP_CTL_REMOVE, int(dev.removeprefix("/dev/loop")))
                    except OSError:
                        pass   # busy a moment longer (udev): an idle device, harmless
        finally:
            os.close(control)


@pytest.mark.parametrize("count", [64, 1024])
def test_the_program_loads_with_every_disk_traced_and_times_one_of_them(tmp_path, count):
    """Both engines ([tracer] engine), one after the other on the same devices."""
    with loop_devices(count, tmp_path) as devices:
        for engine in ("bpftrace", "compiled"):
            _loads_and_times(devices, engine)


def _loads_and_times(devices: list[str], engine: str) -> None:
    names = [os.path.basename(d) for d in devices]
    section = types.SimpleNamespace(**{k: v.default for k, v in tracer.CONFIG.items()})
    section.interval_seconds, section.devices, section.engine = 2.0, names, engine
    # what the tracepoints may cost is test_tracer.py's to test; here a host busy with others' I/O (136,000 requests
    # a second beside this test once) must not pause the program before it is seen to time a disk
    section.max_cpu_cores = 8.0
    read = tracer.start(section, Roots())
    try:
        first = read()
        assert not first.up and first.reason == "compiling the program", (engine, first.reason)
        last = []
        wait_for(lambda: last.append(read()) or last[-1].up or last[-1].reason != "compiling the program",
                 timeout=300, what=f"the {engine} program loaded")
        assert last[-1].up, (engine, last[-1].reason)   # loaded and attached, not refused
        assert set(last[-1].sampled_share) == set(names)   # every disk traced
        target = devices[-1]
        subprocess.run(["fio", "--name=t", f"--filename={target}", "--readonly", "--rw=randread", "--bs=4k",
                        "--direct=1", "--ioengine=psync", "--runtime=2", "--time_based", "--output=/dev/null"],
                       check=True, timeout=120)
        key = (os.path.basename(target), "read", "total")
        reading = wait_for(lambda: (lambda r: r if key in r.total and r.total[key].total > 100 else None)(read()),
                           timeout=60, what=f"{key[0]}'s read latencies ({engine})")
        assert reading.up and reading.total[key].quantile_seconds(0.5) > 0
    finally:
        read.stop()
