"""The tracer's kernel side: which block tracepoints and disks this kernel has, the bpftrace process that
runs the program, and reading what it printed without blocking. sources/tracer.py keeps it running."""
from __future__ import annotations

import fnmatch
import os
import subprocess

from iowarden.probes import blocktrace, diskstats
from iowarden.probes.common import Roots

NOT_TRACED = ("ram*", "zram*")


def block_tracepoints(roots: Roots) -> frozenset[str]:
    """The block tracepoints this kernel has (tracefs events/block/), looked up before the program is
    compiled: bpftrace refuses a whole program that names one the kernel lacks."""
    base = roots.sys / "kernel" / "tracing" / "events" / "block"
    wanted = blocktrace.REQUIRED_TRACEPOINTS + blocktrace.MERGE_TRACEPOINTS
    return frozenset(tp for tp in wanted if (base / tp).is_dir())


def missing_tracepoints(present: frozenset[str]) -> str | None:
    """Why the program cannot time requests on this kernel (a stage's edge is missing), or None."""
    lacking = [tp for tp in blocktrace.REQUIRED_TRACEPOINTS if tp not in present]
    return f"the kernel has no tracepoint {', '.join(lacking)} (tracefs events/block)" if lacking else None


def traceable_disks(roots: Roots, globs: list[str]) -> dict[str, int]:
    """Request-based disks (they have /sys/block/X/mq) by kernel name -> dev_t."""
    out = {}
    base = roots.sys / "block"
    for entry in sorted(os.listdir(base)) if base.is_dir() else []:
        if globs:
            if not any(fnmatch.fnmatch(entry, g) for g in globs):
                continue
        elif any(fnmatch.fnmatch(entry, g) for g in NOT_TRACED) or (
                entry.startswith("loop") and not diskstats.loop_attached(entry, roots)):
            continue
        if not (base / entry / "mq").is_dir():
            continue   # bio-based (dm, md): its members are traced
        try:
            major, minor = (int(x) for x in (base / entry / "dev").read_text().split(":"))
        except (OSError, ValueError):
            continue
        out[entry] = blocktrace.dev_t(major, minor)
    return out


def bpftrace_process(binary: str, program_text: str, **popen) -> subprocess.Popen:
    """bpftrace running `program_text` with JSON output. The program is a file it reads at its start (in memory:
    nothing written to disk), not an `-e` argument, which holds at most 128 KiB."""
    fd = os.memfd_create("iowarden-blocktrace.bt", os.MFD_CLOEXEC)
    try:
        data = memoryview(program_text.encode())
        while data:
            data = data[os.write(fd, data):]
        os.lseek(fd, 0, os.SEEK_SET)
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LC_ALL": "C",
               "BPFTRACE_MAP_KEYS_MAX": str(blocktrace.START_MAP_ENTRIES)}
        return subprocess.Popen([binary, "-f", "json", f"/proc/self/fd/{fd}"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, pass_fds=(fd,),
                                start_new_session=True, **popen)
    finally:
        os.close(fd)


def _read_available(stream, limit: int) -> bytes:
    chunks, got = [], 0
    while got < limit:
        try:
            chunk = os.read(stream.fileno(), min(1 << 16, limit - got))
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
