"""The tracer's kernel side: which block tracepoints and disks this kernel has, the bpftrace process that
runs the program, and reading what it printed without blocking. sources/tracer.py keeps it running."""
from __future__ import annotations

import ctypes.util
import fnmatch
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from iowarden.probes import blocktrace, blockstage, diskstats
from iowarden.probes.common import Roots

log = logging.getLogger("iowarden")

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


def _in_memory(name: str, text: str) -> int:
    """A file in memory holding `text`, at its start (nothing written to disk): a process's program or input."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        data = memoryview(text.encode())
        while data:
            data = data[os.write(fd, data):]
        os.lseek(fd, 0, os.SEEK_SET)
        return fd
    except OSError:
        os.close(fd)
        raise


def mount_tracefs(roots) -> None:
    """bpftrace's classic tracepoints are found in tracefs, which a minimal host may not have mounted."""
    if str(roots.sys) != "/sys":
        return   # a test's fake tree: nothing to mount
    r = subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], capture_output=True,
                       text=True, timeout=10)
    if r.returncode:
        log.info("tracer: tracefs is not mounted and mounting it failed: %s", r.stderr.strip()[:200])


def _env(**more: str) -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LC_ALL": "C", **more}


def bpftrace_process(binary: str, program_text: str, **popen) -> subprocess.Popen:
    """bpftrace running `program_text` with JSON output. The program is a file it reads at its start, not an
    `-e` argument, which holds at most 128 KiB."""
    fd = _in_memory("iowarden-blocktrace.bt", program_text)
    try:
        return subprocess.Popen([binary, "-f", "json", f"/proc/self/fd/{fd}"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(fd,),
                                env=_env(BPFTRACE_MAP_KEYS_MAX=str(blocktrace.START_MAP_ENTRIES)),
                                start_new_session=True, **popen)
    finally:
        os.close(fd)


def compiled_object() -> Path | None:
    """The compiled engine's object: beside its loader in a source tree (scripts/build-bpf.sh builds it), or
    where the packages install it."""
    for path in (Path(blockstage.__file__).parent / "bpf" / blockstage.OBJECT_NAME,
                 Path("/usr/lib/iowarden") / blockstage.OBJECT_NAME):
        if path.is_file():
            return path
    return None


@functools.lru_cache(maxsize=1)
def _libbpf_installed() -> bool:
    """Asked once: find_library runs ldconfig, and the reader asks every window."""
    return ctypes.util.find_library("bpf") is not None


def compiled_missing(roots) -> str | None:
    """Why the compiled engine cannot run here, or None: its object, libbpf, the kernel's BTF (CO-RE)."""
    path = compiled_object()
    if path is None:
        return f"the compiled tracer ({blockstage.OBJECT_NAME}) is not built (scripts/build-bpf.sh)"
    try:
        with open(path, "rb") as f:
            problem = blockstage.object_problem(f.read(64), os.fstat(f.fileno()).st_size)
    except OSError as exc:
        problem = exc.strerror or str(exc)
    if problem:
        return f"the compiled tracer's object {path} is damaged ({problem}): rebuild it (scripts/build-bpf.sh) or " \
               "reinstall the package"
    if not _libbpf_installed():
        return "libbpf is not installed (apt install libbpf1)"
    if not (roots.sys / "kernel" / "btf" / "vmlinux").is_file():
        return "the kernel has no BTF (/sys/kernel/btf/vmlinux): the compiled tracer cannot relocate"
    return None


def choose_engine(wanted: str, bpftrace_path: str, roots) -> tuple[str | None, str | None, str | None]:
    """([tracer] engine: auto, compiled or bpftrace) -> (the engine to run, bpftrace's binary for it, why the
    compiled one is not chosen), or (None, None, why none can run)."""
    missing = compiled_missing(roots) if wanted != "bpftrace" else None
    if wanted != "bpftrace" and missing is None:
        return "compiled", None, None
    if wanted == "compiled":
        return None, None, missing
    binary = shutil.which(bpftrace_path)
    if binary is None:
        return None, None, "; ".join(x for x in (f"{bpftrace_path} is not installed (apt install bpftrace)", missing)
                                     if x)
    return "bpftrace", binary, missing


def compiled_process(skip_by_dev: dict[int, int], interval_seconds: float, issue_map: bool = False,
                     max_cgroups: int = 0, **popen) -> subprocess.Popen:
    """The compiled engine's loader (probes/blockstage.py) for these disks. They are its standard input, a file in
    memory (a pipe of 8,192 disks would block the writer). issue_map: every disk timed from the issue program's
    map, the path of a queue that does not stamp its requests (its tests). max_cgroups: the entries of its map of
    (disk, cgroup) counts; 0 keeps none."""
    fd = _in_memory("iowarden-blockstage-disks", json.dumps({str(dev): skip for dev, skip in skip_by_dev.items()}))
    try:
        return subprocess.Popen([sys.executable, "-m", "iowarden.probes.blockstage", "--object",
                                 str(compiled_object()), "--interval-ms", str(max(100, int(interval_seconds * 1000))),
                                 "--max-cgroups", str(max_cgroups),
                                 *(["--issue-map"] if issue_map else [])],
                                stdin=fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=_env(PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
                                start_new_session=True, **popen)
    finally:
        os.close(fd)


def read_available(stream, limit: int) -> bytes:
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
