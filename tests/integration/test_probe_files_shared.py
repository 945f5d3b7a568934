"""Two users of one probe directory: the daemon probes a volume while `characterize` runs on the
same filesystem with --cleanup. Each keeps its own files: characterize's run does not delete the daemon's
file, the daemon's probes do not delete characterize's, --cleanup removes characterize's only, and the
daemon's next probe reuses its layout (the same file, not a new one)."""
import json
import os
import subprocess
import sys
import time

import pytest

from tests.integration.helpers import config_text, rows, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_the_daemon_and_characterize_keep_their_own_files_and_cleanup_takes_only_its_own(loop_xfs, tmp_path,
                                                                                          daemon_factory):
    state = tmp_path / "state"
    db = str(state / "state.db")
    d = daemon_factory(config_text(loop_xfs.mountpoint, state, runtime=0.5, interval=1.0,
                                   extra="[budget]\ndevice_time_ratio = 1.0\n"))
    d.wait_message("READY=1")
    wait_for(lambda: rows(db, "SELECT id FROM probe_results WHERE ok = 1"), what="the daemon's first probe")
    pdir = loop_xfs.mountpoint / ".iowarden"
    daemons = [n for n in os.listdir(pdir) if n.startswith("probe-") and n.endswith(".dat")]
    assert len(daemons) == 1, os.listdir(pdir)
    inode = os.stat(pdir / daemons[0]).st_ino
    last = rows(db, "SELECT max(id) FROM probe_results")[0][0]
    seen_beside = set()

    r = subprocess.Popen([sys.executable, "-m", "iowarden.daemon.cli", "characterize", "--path",
                          str(loop_xfs.mountpoint), "--sweep", "qd", "--size", "48MiB", "--step-seconds", "1",
                          "--ramp-seconds", "0", "--budget-seconds", "8", "--json", "--min-free-bytes", "1MiB",
                          "--min-free-ratio", "0", "--cleanup",
                          # the daemon's own probes keep the device busy half of each second: without --force
                          # characterize refuses a busy device, as it should for a user's
                          "--force"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        while r.poll() is None:   # what the directory holds while both work in it
            try:
                seen_beside.update(os.listdir(pdir))
            except FileNotFoundError:
                seen_beside.add("<the directory was removed>")
            time.sleep(0.2)   # a poll of the directory, not a wait for an outcome
        out, err = r.communicate(timeout=300)
    finally:
        if r.poll() is None:
            r.kill()
            r.wait()
    assert r.returncode == 0, err
    doc = json.loads(out)
    assert doc["points"] and all(p["ok"] for p in doc["points"]), doc["points"]   # no step lost its file
    assert "characterize-50331648.dat" in seen_beside and daemons[0] in seen_beside, seen_beside
    assert "<the directory was removed>" not in seen_beside
    # --cleanup took characterize's file and left the daemon's, the same one
    assert "removed the probe files" in err and "characterize-50331648.dat" in err, err
    left = os.listdir(pdir)
    assert daemons[0] in left and not [n for n in left if n.startswith("characterize-")], left
    assert os.stat(pdir / daemons[0]).st_ino == inode
    # the daemon's next probes reuse its layout
    wait_for(lambda: rows(db, f"SELECT id FROM probe_results WHERE ok = 1 AND id > {last + 2}"),
             what="the daemon's probes after characterize")
    assert os.stat(pdir / daemons[0]).st_ino == inode
    records = [json.loads(rec) for (rec,) in rows(db, f"SELECT record FROM probe_results WHERE id > {last}")]
    assert all(rec.get("layout_bytes", 0) == 0 for rec in records), [rec.get("layout_bytes") for rec in records]
    assert d.proc.poll() is None
