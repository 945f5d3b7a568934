"""The configuration: one schema, every error at once as FILE:LINE: key.path: message.

TOML (tomllib) keeps no line numbers, so `_KeyLines` scans the text for table
headers and keys to point each error at its line. Unknown keys are errors: a
misspelt `interval_secnds` silently ignored is a probe that never runs when
the user thinks it does.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from iowarden.probes import pathstat
from iowarden.probes.common import ParseError, parse_size_bytes, printable, read_bounded
from iowarden.probes.fio_job import DEFAULT_MAX_BUFFER_BYTES, ProbeProfile, profile_from_job_file
from iowarden.probes.fio_run import ProbeLimits

from iowarden.daemon.config_schema import (BASE_SECTIONS, DISCOVER_KEYS, MAX_SIZE_BYTES, PROFILE_KEYS,
                                           TARGET_KEYS, Key, listen_address_problem, target_path_problem)
from iowarden.daemon.sources.registry import SOURCES

log = logging.getLogger("iowarden")

EX_CONFIG = 78  # sysexits.h: configuration error
CONFIG_MAX_BYTES = 1 << 20       # a configuration is a few KiB; a larger file is not one
# the built-in sections, and each registered source's own (its `enabled` and `interval_seconds` at least)
SECTIONS: dict[str, dict[str, Key]] = {**BASE_SECTIONS, **{spec.name: spec.config for spec in SOURCES}}


class ConfigError(Exception):
    def __init__(self, errors: list[str]):
        errors = sorted(errors, key=_line_of)   # in the file's order, as a person reads it and fixes it
        super().__init__("\n".join(errors))
        self.errors = errors


def _line_of(error: str) -> tuple[str, int]:
    """("FILE", LINE) of a "FILE:LINE: key: message" error; a message with no line goes last, in its order."""
    m = re.match(r"(.*?):(\d+): ", error)
    return (m.group(1), int(m.group(2))) if m else ("\U0010ffff", 0)


@dataclass(frozen=True)
class Target:
    name: str
    path: str
    profiles: tuple[str, ...]
    interval_seconds: float
    # Set for a target found by a [[discover]] rule: the st_dev of the filesystem it was
    # found mounted at. A probe refuses when the path is on another one (unmounted since).
    found_on_dev: int | None = None
    bucket: tuple[float, float, float] | None = None   # (burst IOPS, baseline IOPS, capacity I/Os) when configured
    volume_class: str = ""   # the volume's fleet class as the config says it (`class`); "": derived


@dataclass(frozen=True)
class DiscoveryRule:
    name: str
    mountpoints: tuple[str, ...]
    fstypes: tuple[str, ...]
    profiles: tuple[str, ...]
    interval_seconds: float
    volume_class: str = ""   # the fleet class of the volumes it finds (`class`); "": derived


@dataclass(frozen=True)
class Config:
    path: str
    sections: dict[str, Any]             # section name -> its frozen dataclass (SECTION_TYPES)
    limits: ProbeLimits
    profiles: dict[str, ProbeProfile] = field(default_factory=dict)
    targets: tuple[Target, ...] = ()
    discover: tuple[DiscoveryRule, ...] = ()

    def section(self, name: str):
        """The section as a frozen dataclass: `cfg.section("sampler").interval_seconds`."""
        return self.sections[name]

    def with_section(self, name: str, value) -> "Config":
        """This configuration with one section replaced (a reload that refuses one section keeps the old)."""
        return dataclasses.replace(self, sections={**self.sections, name: value})


_PYTHON_TYPE = {"int": int, "float": float, "str": str, "bool": bool, "size": int, "strlist": tuple}


def _section_type(name: str, keys: dict[str, Key]) -> type:
    """A frozen dataclass for one section, built once from the schema: one field per key, typed by its kind."""
    cls_name = "".join(part.capitalize() for part in name.split("_")) + "Section"
    return dataclasses.make_dataclass(cls_name, [(k, _PYTHON_TYPE[spec.kind]) for k, spec in keys.items()],
                                      frozen=True)


SECTION_TYPES: dict[str, type] = {name: _section_type(name, keys) for name, keys in SECTIONS.items()}


def _typed(name: str, values: dict[str, Any]):
    return SECTION_TYPES[name](**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


class _KeyLines:
    """Line numbers of tables and keys in a TOML text, keyed by path tuples."""
    _HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
    _KEY = re.compile(r"^\s*([A-Za-z0-9_\-.\"']+)\s*=")

    def __init__(self, text: str):
        self.lines: dict[tuple, int] = {}
        table: tuple = ()
        array_counts: dict[tuple, int] = {}
        for n, line in enumerate(text.splitlines(), 1):
            m = self._HEADER.match(line)
            if m:
                parts = tuple(p.strip().strip("\"'") for p in m.group(2).split("."))
                if m.group(1) == "[[":
                    idx = array_counts.get(parts, 0)
                    array_counts[parts] = idx + 1
                    table = parts + (idx,)
                else:
                    table = parts
                self.lines.setdefault(table, n)
                continue
            m = self._KEY.match(line)
            if m:
                key = tuple(p.strip("\"'") for p in m.group(1).split("."))
                self.lines.setdefault(table + key, n)

    def line(self, path: tuple) -> int:
        """The line of the key, else of the nearest enclosing table, else 1."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return 1


def _check(value: Any, spec: Key) -> tuple[Any, str | None]:
    """The converted value, or an error message."""
    kind = spec.kind
    if kind == "bool":
        return (value, None) if isinstance(value, bool) else (None, f"expected true or false, got {value!r}")
    if kind in ("int", "float"):
        ok = isinstance(value, int) and not isinstance(value, bool) or (kind == "float" and isinstance(value, float))
        if not ok:
            return None, f"expected {'a whole number' if kind == 'int' else 'a number'}, got {value!r}"
        if not math.isfinite(value):
            return None, f"must be a finite number, got {value!r}"
        if spec.minimum is not None and value < spec.minimum:
            return None, f"must be at least {spec.minimum:g}, got {value!r}"
        if spec.maximum is not None and value > spec.maximum:
            return None, f"must be at most {spec.maximum:g}, got {value!r}"
        return (float(value) if kind == "float" else value), None
    if kind == "str":
        if not isinstance(value, str):
            return None, f"expected a string, got {value!r}"
        if spec.choices and value not in spec.choices:
            return None, f"must be one of {', '.join(spec.choices)}, got {value!r}"
        problem = spec.check(value) if spec.check else None
        return (None, problem) if problem else (value, None)
    if kind == "size":
        try:
            size = parse_size_bytes(value)
        except ValueError as exc:
            return None, str(exc)
        top = spec.maximum if spec.maximum is not None else MAX_SIZE_BYTES
        if size > top:
            return None, f"must be at most {int(top)} bytes, got {value!r}"
        return size, None
    if kind == "strlist":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return None, f"expected a list of strings, got {value!r}"
        if spec.maximum is not None and len(value) > spec.maximum:
            return None, f"at most {int(spec.maximum)} entries, got {len(value)}"
        return list(value), None
    raise AssertionError(kind)


def _table(raw: Any, schema: dict[str, Key], path: tuple, errors: list, where: Callable) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not isinstance(raw, dict):
        errors.append(where(path, "expected a table"))
        return out
    for key, value in raw.items():
        if key not in schema:
            close = [k for k in schema if k[:4] == key[:4]]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            errors.append(where(path + (key,), f"unknown key{hint}"))
    for key, spec in schema.items():
        if key not in raw:
            if spec.required:
                errors.append(where(path + (key,), "required key is missing"))
            elif spec.default is not None:
                out[key] = _check(spec.default, spec)[0]
            continue
        value, err = _check(raw[key], spec)
        if err:
            errors.append(where(path + (key,), err))
        else:
            out[key] = value
    return out


def _dotted(path: tuple) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")


def parse(text: str, source: str = "<config>") -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        line = m.group(1) if m else "1"
        raise ConfigError([f"{source}:{line}: syntax: {str(exc).split(' (at line')[0]}"]) from None
    except RecursionError:
        raise ConfigError([f"{source}:1: syntax: arrays or tables nested too deeply to read"]) from None
    lines = _KeyLines(text)
    errors: list[str] = []

    def where(path: tuple, message: str) -> str:
        return f"{source}:{lines.line(path)}: {_dotted(path)}: {message}"

    known = set(SECTIONS) | {"profiles", "targets", "discover"}
    for key in raw:
        if key not in known:
            errors.append(where((key,), f"unknown section (expected one of {', '.join(sorted(known))})"))
    values = {name: _table(raw.get(name, {}), schema, (name,), errors, where) for name, schema in SECTIONS.items()}

    profiles: dict[str, ProbeProfile] = {}
    raw_profiles = raw.get("profiles", {})
    if not isinstance(raw_profiles, dict):
        errors.append(where(("profiles",), "expected tables [profiles.NAME]"))
        raw_profiles = {}
    for name, body in raw_profiles.items():
        path = ("profiles", name)
        if isinstance(body, dict) and body.get("job_file") and set(body) - {"job_file"}:
            errors.append(where(path, "job_file replaces the other profile keys; set one or the other"))
            continue
        v = _table(body, PROFILE_KEYS, path, errors, where)
        if not isinstance(body, dict) or len(v) != len(PROFILE_KEYS):
            continue
        max_buffers = values["limits"].get("max_job_buffers", DEFAULT_MAX_BUFFER_BYTES)
        try:
            if v["job_file"]:
                profiles[name] = profile_from_job_file(name, v["job_file"], max_buffers)
            else:
                profiles[name] = ProbeProfile(
                    name=name, rw=v["rw"], bs_bytes=v["bs"], iodepth=v["iodepth"], numjobs=v["numjobs"],
                    ioengine=v["ioengine"], direct=v["direct"], size_bytes=v["size"],
                    runtime_seconds=v["runtime_seconds"], ramp_time_seconds=v["ramp_time_seconds"],
                    rate_iops=v["rate_iops"])
                problem = profiles[name].buffer_problem(max_buffers)
                if problem:
                    del profiles[name]
                    errors.append(where(path + ("bs",), problem))
        except (ValueError, ParseError) as exc:
            errors.append(where(path + (("job_file",) if v["job_file"] else ()), str(exc)))

    names: set[str] = set()

    def entries(section: str, schema: dict[str, Key]):
        """Each [[section]] entry checked against its schema, with the checks targets and rules share."""
        raw_list = raw.get(section, [])
        if not isinstance(raw_list, list):
            errors.append(where((section,), f"expected [[{section}]] entries"))
            return
        for i, body in enumerate(raw_list):
            path = (section, i)
            v = _table(body, schema, path, errors, where)
            if "name" in v:
                if v["name"] in names:
                    errors.append(where(path + ("name",), f"name {v['name']!r} is used twice"))
                names.add(v["name"])
            for p in v.get("profiles", []):
                if p not in raw_profiles:
                    errors.append(where(path + ("profiles",), f"no profile named {p!r} (define [profiles.{p}])"))
            yield path, v

    targets: list[Target] = []
    listed = list(entries("targets", TARGET_KEYS))
    # every target's path asked at once by a child with a deadline: a hung filesystem is said, not waited on
    answers = pathstat.WATCH.check([v["path"] for _, v in listed if str(v.get("path", "")).startswith("/")])
    for path, v in listed:
        if "path" in v and not v["path"].startswith("/"):
            errors.append(where(path + ("path",), f"must be an absolute path, got {v['path']!r}"))
        elif "path" in v:
            answer = answers.get(v["path"])
            if answer is not None and answer.hung:
                log.warning("%s (its probes are failures on record until it answers)",
                            where(path + ("path",), answer.hung_text()))
            problem = target_path_problem(v["path"], answer)
            if problem:
                errors.append(where(path + ("path",), problem))
        bucket = tuple(v.get(k, 0.0) for k in ("burst_iops", "burst_baseline_iops", "burst_capacity_ios"))
        if any(bucket) and not all(bucket):
            errors.append(where(path + ("burst_iops",), "a burst bucket needs all three of burst_iops, "
                                                        "burst_baseline_iops and burst_capacity_ios (or none)"))
        elif all(bucket) and bucket[1] >= bucket[0]:
            errors.append(where(path + ("burst_baseline_iops",), f"the baseline ({bucket[1]:g} IOPS) must be below "
                                                                 f"the burst rate ({bucket[0]:g} IOPS)"))
        if len(v) == len(TARGET_KEYS):
            targets.append(Target(v["name"], v["path"], tuple(v["profiles"]), v["interval_seconds"],
                                  bucket=bucket if all(bucket) else None, volume_class=v["class"]))
    rules: list[DiscoveryRule] = []
    for path, v in entries("discover", DISCOVER_KEYS):
        for pattern in v.get("mountpoints", []):
            if not pattern.startswith("/"):
                errors.append(where(path + ("mountpoints",), f"must be absolute glob patterns, got {pattern!r}"))
        if "mountpoints" in v and not v["mountpoints"]:
            errors.append(where(path + ("mountpoints",), "must name at least one pattern"))
        if len(v) == len(DISCOVER_KEYS):
            rules.append(DiscoveryRule(v["name"], tuple(v["mountpoints"]), tuple(v["fstypes"]),
                                       tuple(v["profiles"]), v["interval_seconds"], v["class"]))

    if errors:
        raise ConfigError(errors)
    lim = values["limits"]
    limits = ProbeLimits(max_size_bytes=lim["max_probe_size"], max_runtime_seconds=lim["max_runtime_seconds"],
                         min_free_bytes=lim["min_free_bytes"], min_free_ratio=lim["min_free_ratio"],
                         timeout_margin_seconds=lim["timeout_margin_seconds"],
                         max_buffer_bytes=lim["max_job_buffers"])
    sections = {name: _typed(name, values[name]) for name in SECTIONS}
    return Config(source, sections, limits, profiles, tuple(targets), tuple(rules))


DEFAULT_CONFIG_PATH = "/etc/iowarden/config.toml"   # where the packages install it; every command's default


def load(path: str | Path, listen_address: str | None = None) -> Config:
    """The configuration in a file: a regular file (not a FIFO or a device) of at most CONFIG_MAX_BYTES.
    Every failure is a ConfigError: a reload that fails keeps the running configuration. `listen_address`
    (`run --web.listen-address`) stands in for [prometheus] listen_address, at every reload too."""
    cfg = _load(Path(path))
    if listen_address is None:
        return cfg
    problem = listen_address_problem(listen_address)
    if problem:
        raise ConfigError([f"--web.listen-address {listen_address!r}: {problem}"])
    return cfg.with_section("prometheus", dataclasses.replace(cfg.section("prometheus"), listen_address=listen_address))


def _load(p: Path) -> Config:
    try:
        text = read_bounded(p, CONFIG_MAX_BYTES).decode("utf-8")
    except OSError as exc:
        hint = ""
        if isinstance(exc, FileNotFoundError) and str(p) == DEFAULT_CONFIG_PATH:
            hint = (" (the default configuration, which the iowarden package installs; name another with -c FILE, "
                    "or start from config.example.toml)")
        raise ConfigError([f"{p}: cannot read: {exc.strerror or exc}{hint}"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{p}:1: syntax: the file is not UTF-8 text"]) from None
    try:
        return parse(text, str(p))
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError([f"{p}:1: nested too deeply to read"]) from None
    except Exception as exc:   # noqa: BLE001 - a bug here must not take the daemon down on a reload
        raise ConfigError([f"{p}:1: cannot be read as a configuration: {type(exc).__name__}: "
                           f"{printable(exc, 200)}"]) from None
