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


def import_leaks(root: Path) -> list[str]:
    """A module's private name imported by another (its seam is in the wrong place), and a name imported only
    to be imported from here again (a re-export shim: a reader of the importer finds the wrong home)."""
    import ast
    leaks = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        exported = {e.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
                    for e in getattr(n.value, "elts", ()) if isinstance(e, ast.Constant)}
        for n in tree.body:
            if not isinstance(n, ast.ImportFrom) or n.module == "__future__":
                continue
            ours = n.level > 0 or (n.module or "").startswith("iowarden")
            for a in n.names:
                name = a.asname or a.name
                if ours and a.name.startswith("_") and not a.name.startswith("__"):
                    leaks.append(f"{path.relative_to(root.parent)}:{n.lineno} imports the private {a.name}")
                if ours and name not in used and name not in exported and not any(
                        isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id == name
                        for x in ast.walk(tree)):
                    leaks.append(f"{path.relative_to(root.parent)}:{n.lineno} imports {name} and never uses it")
    return leaks


def test_no_module_imports_anothers_private_name_or_passes_a_name_on():
    assert import_leaks(ROOT / "daemon") + import_leaks(ROOT / "probes") == []


def test_the_leak_check_finds_a_shim_and_a_private_import(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("from iowarden.daemon.passive.values import Window, _hidden  # noqa\n"
                                          "x = _hidden\n")
    assert sorted(import_leaks(tmp_path / "pkg")) == ["pkg/a.py:1 imports Window and never uses it",
                                                      "pkg/a.py:1 imports the private _hidden"]
