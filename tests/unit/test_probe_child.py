"""A probe in a process of its own (probes/probe_child.py): what the daemon reads back is what it would have
read of a probe it ran itself, and a process that does not answer in time is a failure on record that says
so. No root, no fio: a stand-in prints fio's JSON."""
import json
import os
import time
from pathlib import Path

from iowarden.probes import probe_child
from iowarden.probes.fio_job import ProbeProfile
from iowarden.probes.fio_run import ProbeLimits, run_probe

FIXTURE = Path(__file__).parents[1] / "fixtures" / "fio"


def _stand_in(tmp_path, body: str) -> str:
    fio = tmp_path / "fio"
    fio.write_text("#!/bin/sh\n" + body)
    fio.chmod(0o755)
    return str(fio)


def test_the_childs_result_is_the_one_run_probe_gives(tmp_path):
    out = next(p for p in sorted(FIXTURE.iterdir()) if p.suffix == ".json")
    fio = _stand_in(tmp_path, f"cat {out}\n")
    near, far = tmp_path / "near", tmp_path / "far"    # each lays its probe file out afresh
    near.mkdir()
    far.mkdir()
    profile = ProbeProfile("rr", size_bytes=1 << 20, runtime_seconds=1.0, ramp_time_seconds=0.0)
    limits = ProbeLimits(min_free_bytes=0, min_free_ratio=0.0)
    here = run_probe("t", str(near), profile, limits, fio_binary=fio)
    there = probe_child.run_isolated("t", str(far), profile, limits, fio_binary=fio, timeout_seconds=60)
    assert here.ok == there.ok and here.error == there.error, (here.error, there.error)
    keep = ("target", "device", "ok", "read_iops", "write_iops", "clat_p99_seconds", "layout_bytes")
    assert {k: there.to_json()[k] for k in keep} == {k: here.to_json()[k] for k in keep}
    # the same fio command, but for the file reached through the child's own open directory
    strip = lambda argv: [a for a in argv if not a.startswith("--filename=")]   # noqa: E731
    assert strip(there.argv) == strip(here.argv) and there.started_at > 0


def test_a_probe_that_does_not_end_is_left_and_said(tmp_path):
    fio = _stand_in(tmp_path, "exec sleep 60\n")
    target = tmp_path / "vol"
    target.mkdir()
    profile = ProbeProfile("rr", size_bytes=1 << 20, runtime_seconds=1.0, ramp_time_seconds=0.0)
    t0 = time.monotonic()
    r = probe_child.run_isolated("t", str(target), profile, ProbeLimits(min_free_bytes=0, min_free_ratio=0.0),
                                 fio_binary=fio, timeout_seconds=2)
    assert time.monotonic() - t0 < 15
    assert not r.ok and "did not finish its probe within 2 s" in r.error and r.started_at > 0


def test_the_request_round_trips_a_job_file_profile():
    profile = ProbeProfile("jf", jobs=(("a", (("rw", "randread"), ("bs", "4k"))),))
    req = json.loads(probe_child.request_text("t", "/x", profile, ProbeLimits(), probe_child.Roots(), "fio", {1},
                                              None, None, "daemon"))
    assert probe_child._profile_of(req["profile"]) == profile
    assert os.environ.get("IOWARDEN_PROBE_OWNER") is None
