"""The flow is a rule a tool checks: lint-imports against the contracts in pyproject.toml.

Sources read the machine and post events; the core owns the state and runs the verdicts' policy; outputs
render what it publishes; commands and the CLI sit on top. A module that imports a layer above its own
(a source reaching into the core, the core's policy into an output) fails here, not in a review.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert r.returncode == 0 and "4 kept, 0 broken" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


# (file to change, text appended or None for a new file, the contracts that break, what the report says)
FLOW, VERDICTS, SOURCES = "one flow", "verdicts decide", "each source reads its own"
WRONG = {
    # the core reads the sources, so through it xfs would reach every other source as well
    "a source calls the core": ("sources/xfs.py", "from iowarden.daemon.core import knowledge", {FLOW, SOURCES},
                                "iowarden.daemon.sources.xfs -> iowarden.daemon.core.knowledge"),
    "a module nobody placed": ("stray.py", None, {FLOW}, "iowarden.daemon.stray"),
    "a verdict writes to an output": ("verdicts/causes.py", "from iowarden.daemon.outputs import influx",
                                      {FLOW, VERDICTS}, "iowarden.daemon.verdicts.causes -> iowarden.daemon.outputs"),
    "a source reads another": ("sources/smart.py", "from iowarden.daemon.sources import xfs", {SOURCES},
                               "iowarden.daemon.sources.smart -> iowarden.daemon.sources.xfs"),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_each_contract_fails_on_its_wrong_import_and_says_where(tmp_path, case):
    """The same check on a copy with one deliberately wrong change: broken, the contract named, and the
    import (or the unplaced module) shown."""
    import shutil
    path, text, contracts, said = WRONG[case]
    pkg = tmp_path / "iowarden"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copytree(ROOT / "daemon", pkg / "daemon", ignore=shutil.ignore_patterns("__pycache__"))
    os.symlink(ROOT / "probes", pkg / "probes")
    with open(pkg / "daemon" / path, "a") as f:
        f.write("" if text is None else f"\n{text}  # noqa: E402,F401\n")
    r = lint(tmp_path)
    assert r.returncode != 0 and f"{4 - len(contracts)} kept, {len(contracts)} broken" in r.stdout, r.stdout[-3000:]
    broken = [line for line in r.stdout.splitlines() if line.endswith("BROKEN")]
    assert {c for c in contracts for line in broken if line.startswith(c)} == contracts, broken
    assert said in r.stdout, r.stdout[-3000:]
