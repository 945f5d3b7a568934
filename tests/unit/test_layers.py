"""The flow is a rule a tool checks (issue 35): lint-imports against the layers in pyproject.toml.

Sources read the machine and post events; the core owns the state and runs the verdicts' policy; outputs
render what it publishes; commands and the CLI sit on top. A module that imports a layer above its own
(a source reaching into the core, the core's policy into an output) fails here, not in a review.
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def shadow_package(where: Path) -> Path:
    """daemon/ and probes/ install as iowarden.daemon and iowarden.probes (pyproject's package-dir); the
    editable install's import hook is not a directory grimp can walk, so the tree is linked as installed."""
    pkg = where / "iowarden"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    os.symlink(ROOT / "daemon", pkg / "daemon")
    os.symlink(ROOT / "probes", pkg / "probes")
    return where


def lint(where: Path) -> subprocess.CompletedProcess:
    linter = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(linter), str(ROOT / "pyproject.toml"), "--no-cache"], cwd=where,
                          env={**os.environ, "PYTHONPATH": str(where)}, capture_output=True, text=True, timeout=120)


def test_no_module_imports_a_layer_above_its_own(tmp_path):
    r = lint(shadow_package(tmp_path))
    assert r.returncode == 0 and "2 kept, 0 broken" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


def test_the_check_fails_on_a_call_back_up(tmp_path):
    """The same check on a copy where a source imports the core: broken, and it says where."""
    import shutil
    pkg = tmp_path / "iowarden"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copytree(ROOT / "daemon", pkg / "daemon", ignore=shutil.ignore_patterns("__pycache__"))
    os.symlink(ROOT / "probes", pkg / "probes")
    with open(pkg / "daemon" / "sources" / "xfs.py", "a") as f:
        f.write("\nfrom iowarden.daemon.core import knowledge  # noqa: E402,F401\n")
    r = lint(tmp_path)
    assert r.returncode != 0, r.stdout[-2000:]
    assert "iowarden.daemon.sources is not allowed to import iowarden.daemon.core" in r.stdout, r.stdout[-2000:]
    assert "iowarden.daemon.sources.xfs -> iowarden.daemon.core.knowledge" in r.stdout


def test_no_file_of_the_daemon_is_over_400_lines():
    """The house's rule (issue 35): a file that grows past 400 lines is split where its parts are."""
    long = {str(p.relative_to(ROOT)): n for p in [*ROOT.glob("daemon/**/*.py"), *ROOT.glob("probes/*.py")]
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
