"""Every file a command writes for a person is created, never followed (characterize --out, --compare --out).

Landed code: in a directory a user owns, `characterize.txt -> /some/root/file` and `qd.png -> /elsewhere`
had root overwrite the file with the result table and create a root-owned PNG where the user pointed; only
characterize.json was looked at first, and --overwrite followed that one too. No root needed: the caller's
own directory is the one planted here, and a directory of another user is one whose owner is not the caller.
"""
import json
import os
import subprocess
import sys

import pytest

from iowarden.daemon.commands import characterize as ch
from iowarden.daemon.commands.characterize_cmd import earlier_run, write_out
from iowarden.daemon.commands.characterize_report import findings
from iowarden.daemon.commands.outdir import OutDir, OutDirRefused

NAMES = ("characterize.json", "characterize.txt", "qd.png", "qd.svg", "bs.png", "bs.svg", "compare.png")


def _planted(tmp_path):
    """An output directory with every name the commands write planted as a link to a file outside it (half of
    them existing files, half names that do not exist yet)."""
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    for i, name in enumerate(NAMES):
        target = outside / f"victim-{name}"
        if i % 2 == 0:
            target.write_text("precious\n")
        (out / name).symlink_to(target)
    return out, outside


def _outside_unchanged(outside):
    for p in outside.iterdir():
        assert p.read_text() == "precious\n", p
    assert sorted(p.name for p in outside.iterdir()) == sorted(f"victim-{n}" for i, n in enumerate(NAMES) if i % 2 == 0)


def _points():
    pts = [ch.Point("qd", d, 1000.0 * d, 4096.0 * 1000 * d, 1e-4, 2e-4, 3e-4) for d in (1, 2, 4, 8)]
    pts += [ch.Point("bs", b, 1000.0, 1000.0 * b, 1e-3, 2e-3, 3e-3) for b in ch.BS_STEPS]
    return pts


def test_characterize_out_replaces_planted_links_and_writes_nothing_outside(tmp_path):
    out_dir, outside = _planted(tmp_path)
    said = []
    with OutDir(str(out_dir)) as out:
        assert earlier_run(out).endswith("unreadable")   # a link is not read through, and not taken as a run
        write_out(out, {"points": [], "started_at": 1.0}, _points(), findings(_points()), "t", said.append)
    _outside_unchanged(outside)
    for name in ("characterize.json", "characterize.txt", "qd.png", "qd.svg", "bs.png", "bs.svg"):
        assert (out_dir / name).is_file() and not (out_dir / name).is_symlink(), name
    assert json.loads((out_dir / "characterize.json").read_text())["started_at"] == 1.0
    assert not [p for p in out_dir.iterdir() if p.name.endswith(".tmp")]


def test_compare_out_replaces_a_planted_link(tmp_path):
    out_dir, outside = _planted(tmp_path)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path, k in ((a, 1.0), (b, 2.0)):
        path.write_text(json.dumps({"path": "/x", "points": [{**p.__dict__, "iops": p.iops * k} for p in _points()]}))
    r = subprocess.run([sys.executable, "-m", "iowarden.daemon.cli", "characterize", "--compare", str(a), str(b),
                        "--out", str(out_dir)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    _outside_unchanged(outside)
    assert (out_dir / "compare.png").is_file() and not (out_dir / "compare.png").is_symlink()


def test_an_out_directory_that_is_a_link_or_another_users_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(OutDirRefused, match="symbolic link"):
        OutDir(str(tmp_path / "link"))
    if os.geteuid() == 0:           # root gives the directory to another user
        os.chown(real, 12345, 12345)
        owner, caller = 12345, None
    else:                           # the directory is this user's; the caller is someone else
        owner, caller = os.geteuid(), os.geteuid() + 1000
    with pytest.raises(OutDirRefused, match=f"belongs to uid {owner}"):
        OutDir(str(real), euid=caller)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(OutDirRefused, match="every user"):
        OutDir(str(shared))
    shared.chmod(0o1777)            # sticky, as /tmp: others cannot replace what the caller creates
    OutDir(str(shared)).close()
