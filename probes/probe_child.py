"""A probe run in a process of its own: a filesystem that stops answering during a probe holds that process.

Everything a probe does on its target (the path's walk, the probe directory, the layout of its file, its
free space) reaches the target's filesystem, and a filesystem that hangs (a dead NFS server, a FUSE daemon
that blocks) holds the caller in the kernel beyond any signal. In a thread of the daemon that would be a part
stuck for the watchdog and a process that cannot exit on SIGTERM; in this child it is one process the daemon
walks away from at the probe's deadline, and the probe is a recorded failure that says so.

The daemon runs `python -m iowarden.probes.probe_child REQUEST` (the request: JSON of the probe's profile,
limits and target); the child runs fio_run.measure() and prints one JSON object: the result so far and
fio's own output, which the daemon reads as it reads a probe it ran itself. The kernel kills the child
when the daemon's thread that started it dies (kill -9 of the daemon included), and fio with the child.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from .common import Roots, run_tool
from .fio_job import ProbeProfile
from .fio_run import ProbeLimits, ProbeResult, interpret_output, measure

# fio's stdout is bounded by run_tool (16 MiB); the child's answer carries it JSON-escaped beside the result
ANSWER_MAX_BYTES = 40 << 20
RESULT_FIELDS = ("device", "error", "started_at", "duration_seconds", "layout_bytes", "ramp_seconds", "argv",
                 "needs_root", "space_used_ratio")


def _profile_of(d: dict) -> ProbeProfile:
    d = dict(d)
    d["jobs"] = tuple((name, tuple((k, v) for k, v in opts)) for name, opts in d.get("jobs", ()))
    return ProbeProfile(**d)


def request_text(target: str, path: str, profile: ProbeProfile, limits: ProbeLimits, roots: Roots,
                 fio_binary: str, keep_sizes: set[int] | None, expect_dev: int | None, owner: str | None,
                 files_of: str) -> str:
    return json.dumps({"target": target, "path": path, "profile": dataclasses.asdict(profile),
                       "limits": dataclasses.asdict(limits), "roots": {k: str(v) for k, v in vars(roots).items()},
                       "fio_binary": fio_binary, "keep_sizes": sorted(keep_sizes or ()), "expect_dev": expect_dev,
                       "owner": owner, "files_of": files_of})


def run_isolated(target: str, path: str, profile: ProbeProfile, limits: ProbeLimits = ProbeLimits(),
                 roots: Roots = Roots(), fio_binary: str = "fio", keep_sizes: set[int] | None = None,
                 on_start=None, expect_dev: int | None = None, owner: str | None = None,
                 files_of: str = "daemon", timeout_seconds: float = 120.0) -> ProbeResult:
    """fio_run.run_probe() in a child process with a deadline; never raises for the probe's failure."""
    argv = [sys.executable, "-m", "iowarden.probes.probe_child",
            request_text(target, path, profile, limits, roots, fio_binary, keep_sizes, expect_dev, owner, files_of)]
    started_wall = time.time()
    run = run_tool(argv, timeout_seconds=timeout_seconds, on_start=on_start, die_with_parent=True,
                   max_output_bytes=ANSWER_MAX_BYTES)
    def failed(error: str | None) -> ProbeResult:
        return ProbeResult(target, path, None, profile.name, False, error, started_wall, run.duration_seconds)
    if run.cut_short:
        return failed(f"{path} did not finish its probe within {timeout_seconds:g} s and was left: its "
                      "filesystem may be hung" if "timed out" in (run.error or "") else run.error)
    try:
        answer = json.loads(run.stdout)
        result = ProbeResult(target=target, path=path, profile=profile.name, ok=False,
                             **{name: answer["result"][name] for name in RESULT_FIELDS})
        used = result.space_used_ratio
        if used is not None and not (isinstance(used, (int, float)) and 0.0 <= used <= 1.0):
            raise ValueError(f"space_used_ratio out of range: {used!r}"[:120])
    except (ValueError, KeyError, TypeError) as exc:
        return failed(f"the probe's process failed: {run.error or exc}"[:500])
    if answer.get("stdout") is not None:
        return interpret_output(result, answer["stdout"], answer.get("run_error"))
    return result


def main(argv: list[str]) -> int:
    req = json.loads(argv[1])
    roots = Roots(**{k: Path(v) for k, v in req["roots"].items()})
    result, stdout, run_error = measure(
        req["target"], req["path"], _profile_of(req["profile"]), ProbeLimits(**req["limits"]), roots,
        req["fio_binary"], set(req["keep_sizes"]), None, req["expect_dev"], req["owner"], req["files_of"])
    answer = {"result": {name: getattr(result, name) for name in RESULT_FIELDS},
              "stdout": stdout, "run_error": run_error}
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
