"""docs/architecture.md kept true by the code: its module map names every module of the daemon and no module
that is gone, and the layers its prose lists are the ones lint-imports checks (pyproject.toml), in order.
A doc that lies fails here; the check is shown failing on a deliberately wrong claim."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def module_map(doc: str) -> dict[str, str]:
    """The map's sections: "sources" -> its text, "" -> the text naming the daemon's top-level modules."""
    block = doc.split("`ls daemon/` shows the flow:", 1)[1].split("```", 2)[1]
    sections, current = {"": ""}, ""
    for line in block.splitlines():
        m = re.match(r"^  (\w+)/ ", line)
        if m:
            current = m.group(1)
            sections[current] = line
        elif re.match(r"^  \S", line) or line.startswith("probes/"):
            current = ""
            sections[""] += "\n" + line
        else:
            sections[current] += "\n" + line
    return sections


def layers_said(pyproject: dict) -> str:
    """The layers as the prose lists them: pyproject's, top to bottom, then the probes below the daemon."""
    flow = next(c for c in pyproject["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return ", ".join(flow["layers"]) + ", probes"


def registered_sources(daemon: Path) -> set[str]:
    """The modules SOURCES registers (sources/registry.py imports each one's SPEC): that list is their map,
    so a new source is one module and one line there, not also a line here."""
    text = (daemon / "sources" / "registry.py").read_text()
    return {m + ".py" for m in re.findall(r"^from iowarden\.daemon\.sources\.(\w+) import SPEC\b", text, re.M)}


def doc_errors(doc: str, daemon: Path, pyproject: dict) -> list[str]:
    errors = []
    sections = module_map(doc)
    registered = registered_sources(daemon)
    for path in sorted(daemon.rglob("*.py")):
        rel = path.relative_to(daemon)
        if path.name == "__init__.py" or "__pycache__" in rel.parts:
            continue
        if rel.parts[0] == "sources" and len(rel.parts) == 2 and path.name in registered:
            continue
        where = rel.parts[0] if len(rel.parts) > 1 else ""
        if where not in sections:
            errors.append(f"daemon/{where}/ is not in the module map")
        elif not re.search(rf"(?<![\w.]){re.escape(path.name)}\b", sections[where]):
            errors.append(f"daemon/{rel} is not named in the module map")
    for where, text in sections.items():
        for name in re.findall(r"(?<![\w./])([a-z_]+\.py)\b", text):
            if not (daemon / where / name).exists() and not (where == "" and (daemon.parent / "probes" / name).exists()):
                errors.append(f"the module map names {where + '/' if where else ''}{name}, which does not exist")
    said = layers_said(pyproject)
    if f"lists them top to bottom ({said})" not in " ".join(doc.split()):
        errors.append(f"the layers are not listed as pyproject.toml has them: ({said})")
    return errors


def test_the_architecture_doc_agrees_with_the_code():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert doc_errors(DOC.read_text(), ROOT / "daemon", pyproject) == []


def test_the_check_fails_on_a_wrong_claim():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    doc = DOC.read_text()
    gone = doc.replace("curve.py", "slope.py", 1)                      # a module renamed in the doc only
    assert "daemon/passive/curve.py is not named in the module map" in doc_errors(gone, ROOT / "daemon", pyproject)
    assert "the module map names passive/slope.py, which does not exist" in doc_errors(gone, ROOT / "daemon", pyproject)
    # a module of sources/ that nothing registers is still the map's to name
    unnamed = doc.replace("inventory.py (uevents)", "(uevents)", 1)
    assert "daemon/sources/inventory.py is not named in the module map" in \
        doc_errors(unnamed, ROOT / "daemon", pyproject)
    swapped = doc.replace("outputs, core,", "core, outputs,", 1)       # two layers in the wrong order
    assert any(e.startswith("the layers are not listed") for e in doc_errors(swapped, ROOT / "daemon", pyproject))
