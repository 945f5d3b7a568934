"""daemon/wiring.py is the daemon's wiring as the code has it: each part posts the events its row names and
reads only the snapshot fields its row names; another part's method is called only where a row says why; and
docs/architecture.md shows the table as it is."""
import ast
import dataclasses
from pathlib import Path

from iowarden.daemon import events, wiring
from iowarden.daemon.snapshot import Snapshot

ROOT = Path(__file__).resolve().parents[2]
DAEMON = ROOT / "daemon"
# the functions of runtime.Daemon that are a part's step, and the part
RUNTIME_STEPS = {"rediscover": "discovery", "_on_device_change": "uevents", "_check_state": "state-check",
                 "_watch_http": "metrics-endpoint"}
PART_OBJECTS = {"scheduler", "settings", "sampler", "xfs", "passive", "influx", "inventory", "registry"}
SNAPSHOT_NAMES = {"snap", "snapshot"}


def _tree(module: str) -> ast.AST:
    return ast.parse((DAEMON / (module.replace(".", "/") + ".py")).read_text())


def _posted(node: ast.AST) -> set[str]:
    """The event types constructed as the argument of a post(...) call under `node`."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and n.args and ((isinstance(n.func, ast.Name) and n.func.id == "post") or
                                                  (isinstance(n.func, ast.Attribute) and n.func.attr == "post")):
            arg = n.args[0]
            if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name):
                out.add(arg.func.id)
    return out


def _snapshot_fields(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id in SNAPSHOT_NAMES}


def _part_calls(node: ast.AST) -> set[str]:
    """self.<part>.<method>(...) calls: one part reaching into another."""
    return {f"{n.func.value.attr}.{n.func.attr}" for n in ast.walk(node)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Attribute)
            and isinstance(n.func.value.value, ast.Name) and n.func.value.value.id == "self"
            and n.func.value.attr in PART_OBJECTS}


def wiring_errors(parts) -> list[str]:
    errors = []
    fields = {f.name for f in dataclasses.fields(Snapshot)} | {
        n for n, v in vars(Snapshot).items() if isinstance(v, property)}
    event_types = {n for n, v in vars(events).items() if isinstance(v, type) and dataclasses.is_dataclass(v)
                   and v.__module__ == events.__name__}
    runtime = _tree("runtime")
    steps = {f.name: f for f in ast.walk(runtime) if isinstance(f, ast.FunctionDef) and f.name in RUNTIME_STEPS}
    for p in parts:
        errors += [f"{p.name} reads snapshot.{f}, which the Snapshot has not" for f in p.snapshot if f not in fields]
        errors += [f"{p.name} posts {e}, which is no event" for e in p.posts if e not in event_types]
        own = [m for m in p.modules if m != "runtime"]
        if own:
            posted = set().union(*(_posted(_tree(m)) for m in own))
            read = set().union(*(_snapshot_fields(_tree(m)) for m in own))
            if "runtime" not in p.modules and posted != set(p.posts):
                errors.append(f"{p.name} posts {sorted(posted)} in its code but declares {sorted(p.posts)}")
            errors += [f"{p.name} reads snapshot.{f} undeclared" for f in sorted(read - set(p.snapshot))]
    runtime_posts = set().union(*(set(p.posts) for p in parts if "runtime" in p.modules)) | set(wiring.SUPERVISOR_POSTS)
    errors += [f"runtime posts {e}, which no part running there declares" for e in sorted(_posted(runtime) -
                                                                                          runtime_posts)]
    for fn, part in RUNTIME_STEPS.items():
        declared = {c.split(":")[0] for p in parts if p.name == part for c in p.calls}
        called = _part_calls(steps[fn])
        if called != declared:
            errors.append(f"{part} ({fn}) calls {sorted(called)} but declares {sorted(declared)}")
    registered = {n.args[0].value for n in ast.walk(runtime) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Attribute) and n.func.attr == "_add" and n.args
                  and isinstance(n.args[0], ast.Constant)}
    names = {p.name for p in parts}
    errors += [f"runtime registers {n}, which is not declared" for n in sorted(registered - names)]
    errors += [f"{n} is declared but never registered" for n in sorted(names - registered - {"source"})]
    return errors


def test_the_declared_wiring_is_the_codes():
    assert wiring_errors(wiring.PARTS) == []


def test_a_wrong_declaration_is_found():
    def changed(name, **kw):
        return tuple(dataclasses.replace(p, **kw) if p.name == name else p for p in wiring.PARTS)
    assert "scheduler posts ['IntervalsFitted', 'ProbeFinished', 'ProbeStarted', 'ProbesCounted'] in its code but " \
        "declares ['ProbeFinished', 'ProbeStarted', 'ProbesCounted']" in wiring_errors(
            changed("scheduler", posts=("ProbeStarted", "ProbeFinished", "ProbesCounted")))
    assert "passive reads snapshot.own_probes undeclared" in wiring_errors(
        changed("passive", snapshot=("disk_reading", "devices", "sources")))
    assert "uevents (_on_device_change) calls ['scheduler.abort_on', 'settings.read_devices'] but declares " \
        "['settings.read_devices']" in wiring_errors(changed("uevents", calls=("settings.read_devices: x",)))
    assert "runtime registers discovery, which is not declared" in wiring_errors(
        tuple(p for p in wiring.PARTS if p.name != "discovery"))


def test_the_architecture_doc_shows_the_wiring_as_declared():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert wiring.render() in doc, "docs/architecture.md: paste daemon.wiring.render() under 'Who reads and posts what'"


def test_an_undeclared_part_is_refused_at_registration():
    import pytest
    with pytest.raises(KeyError, match="not declared in daemon/wiring.py"):
        wiring.part_named("inflight")
    assert wiring.part_named("smart", {"smart"}).name == "source"
