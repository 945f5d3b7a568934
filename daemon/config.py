"""The configuration: one schema, every error at once as FILE:LINE: key.path: message.

TOML (tomllib) keeps no line numbers, so `_KeyLines` scans the text for table
headers and keys to point each error at its line. Unknown keys are errors: a
misspelt `interval_secnds` silently ignored is a probe that never runs when
the user thinks it does.
"""
from __future__ import annotations

import math
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from iowarden.probes.common import parse_size_bytes, printable, read_bounded
from iowarden.probes.fio_job import DEFAULT_MAX_BUFFER_BYTES, PROFILE_RW, ProbeProfile, profile_from_job_file
from iowarden.probes.common import ParseError
from iowarden.probes.fio_run import ProbeLimits, directory_target_problem

EX_CONFIG = 78  # sysexits.h: configuration error
CONFIG_MAX_BYTES = 1 << 20       # a configuration is a few KiB; a larger file is not one
MAX_SIZE_BYTES = 1 << 50         # a size key's bound unless it names a smaller one (1 PiB)


class ConfigError(Exception):
    def __init__(self, errors: list[str]):
        super().__init__("\n".join(errors))
        self.errors = errors


def listen_address_problem(text: str) -> str | None:
    from iowarden.daemon.outputs.http import parse_listen_address
    try:
        parse_listen_address(text)
    except ValueError as exc:
        return str(exc)
    return None


def influx_url_problem(text: str) -> str | None:
    import urllib.parse
    try:
        u = urllib.parse.urlsplit(text)
        u.port
    except ValueError as exc:
        return f"not a URL: {exc}"
    if u.scheme not in ("http", "https") or not u.hostname:
        return f"expected http://HOST[:PORT] or https://HOST[:PORT], got {text!r}"
    return None


def target_path_problem(path: str) -> str | None:
    """A target is a block device (read-only probes) or a directory iowarden may write its probe file in."""
    try:
        st = os.stat(path)
    except OSError:
        st = None   # not there yet (a mount point made later): checked again at every probe
    if st is not None and stat.S_ISBLK(st.st_mode):
        return None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return f"{path} is neither a directory nor a block device"
    return directory_target_problem(path)


@dataclass(frozen=True)
class Key:
    kind: str            # int, float, str, bool, size, strlist
    default: Any
    doc: str
    required: bool = False
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    check: Callable[[Any], str | None] | None = None   # a further rule: the error message, or None


SECTIONS: dict[str, dict[str, Key]] = {
    "daemon": {
        "state_dir": Key("str", "/var/lib/iowarden", 'State database, spool and (by default) the probe directory.'),
        "log_level": Key("str", "info", 'debug, info, warning or error.', choices=("debug", "info", "warning", "error")),
        "fio_path": Key("str", "fio", 'The fio binary (looked up in PATH unless absolute).'),
    },
    "limits": {
        "max_probe_size": Key("size", "1GiB", 'Largest probe file any profile may use.'),
        "max_runtime_seconds": Key("float", 60.0, 'Longest a single probe may run.', minimum=0.1, maximum=3600.0),
        "min_free_bytes": Key("size", "1GiB", 'A probe never leaves less free space than this ...'),
        "min_free_ratio": Key("float", 0.10, '... nor less than this share of the filesystem.', minimum=0.0,
                              maximum=0.9),
        "timeout_margin_seconds": Key("float", 30.0, 'fio is killed (with all its job processes) this long after its runtime.', minimum=1.0,
                                      maximum=600.0),
        "max_job_buffers": Key("size", "256MiB", 'Most memory a probe may ask fio for as I/O buffers: the largest block size x iodepth '
                                                 'x numjobs, over all its jobs (bs=64m iodepth=16 numjobs=4 would be 4 GiB).'),
    },
    "scheduling": {
        "defer_util_percent": Key("float", 50.0, 'Defer a probe while its disk is busier than this (%util) with other I/O, or while '
                                                 '/proc/pressure/io shows every task stalled on I/O ...',
                                  minimum=0.0, maximum=100.0),
        "max_deferral_seconds": Key("float", 600.0, '... for at most this long; then it runs and its result is marked contended (contended '
                                                    'results are kept but neither learned nor judged).', minimum=0.0, maximum=86400.0),
        "jitter_ratio": Key("float", 0.1, 'Random spread of each interval, so a fleet does not probe in step.',
                            minimum=0.0, maximum=0.5),
        "discover_interval_seconds": Key("float", 10.0, 'How often [[discover]] rules are matched against the mount table (mounting sends no '
                                                        'event); they are matched at every block device event too.', minimum=1.0, maximum=3600.0),
    },
    "budget": {
        "device_time_ratio": Key("float", 0.01, 'Probe device-time as a share of wall time, over window_seconds. The example profiles take '
                                                '4 x (3 s + 1 s ramp) = 16 s every 1800 s: 0.9 %.',
                                 minimum=0.0, maximum=1.0),
        "window_seconds": Key("float", 3600.0, "The window that share is measured over", minimum=60.0, maximum=7 * 86400.0),
        "write_bytes_per_day": Key("size", "10GiB", 'Bytes probes may write per disk per day (cloud volumes bill per request).'),
    },
    "prometheus": {
        "enabled": Key("bool", True, "Serve /metrics. Port 29110: the exporters' range 9100-9999 of Prometheus' default port "
                                     "allocations is used up; 29110 is outside it and below the kernel's ephemeral range "
                                     '(32768-60999), so no outgoing connection takes it.'),
        "listen_address": Key("str", ":29110", '":29110" listens on every interface, IPv4 and IPv6, as node_exporter does, because '
                                               'Prometheus usually scrapes from another host. Use "127.0.0.1:29110" to keep it local, and '
                                               'web_config_file for TLS and basic auth.',
                              check=listen_address_problem),
        "web_config_file": Key("str", "", 'A Prometheus exporter web-config file (YAML): tls_server_config (cert_file, key_file, '
                                          'client_auth_type, client_ca_file, min_version) and basic_auth_users (user: bcrypt hash). '
                                          'Empty: plain HTTP, no auth.'),
    },
    "influxdb": {
        "enabled": Key("bool", False, 'Write probe results, iostat summaries, settings changes and alert transitions to InfluxDB '
                                      '2/3 or any server with the v2 write API.'),
        "url": Key("str", "http://127.0.0.1:8086", "Server URL (http:// or https://)", check=influx_url_problem),
        "org": Key("str", "iowarden", "Organisation"),
        "bucket": Key("str", "iowarden", "Bucket"),
        "token_file": Key("str", "", 'The API token: from this file (preferred) ...'),
        "token_env": Key("str", "IOWARDEN_INFLUXDB_TOKEN", '... or from this environment variable. It is never logged.'),
        "flush_interval_seconds": Key("float", 10.0, "How often points are sent", minimum=1.0, maximum=3600.0),
        "iostat_interval_seconds": Key("float", 10.0, 'Interval of the iostat -x summaries written.', minimum=1.0, maximum=3600.0),
        "spool_max_bytes": Key("size", "64MiB", 'While the server is unreachable, points wait on disk (state_dir/influx-spool), up to this '
                                                'size; beyond it new points are dropped and counted.'),
        "timeout_seconds": Key("float", 5.0, "A write that takes longer fails (and is spooled)", minimum=0.5, maximum=3600.0),
    },
    "detector": {
        "warmup_probes": Key("int", 12, 'Probes learned before a volume can alert.', minimum=3, maximum=10000),
        "window_probes": Key("int", 288, 'Probes the baseline (median and MAD) is computed over: about a day at 5 min.',
                             minimum=10, maximum=100000),
        "drift_ratio": Key("float", 1.5, 'Alert when the baseline creeps this far from where it was learned (slow drift).',
                           minimum=1.05, maximum=100.0),
        "auto_accept_probes": Key("int", 0, 'Accept a stable new level as normal after this many probes; 0: only `iowarden baseline '
                                            'accept` does (every change of baseline is logged).', minimum=0, maximum=100000),
    },
    "passive": {
        "enabled": Key("bool", True, 'Judge every sampled disk from the traffic it carries.'),
        "window_seconds": Key("float", 15.0, 'The 1 Hz samples are judged in windows this long.', minimum=1.0,
                              maximum=600.0),
        "self_ratio": Key("float", 2.5, "A window is slow at this many times the device's normal at that load.",
                          minimum=1.2, maximum=100.0),
        "peer_ratio": Key("float", 2.0, "A member is slow at this many times its peers' latency (median of recent windows).", minimum=1.2, maximum=100.0),
        "peer_windows": Key("int", 480, 'Windows with traffic the peer comparison is the median of (2 h at 15 s).', minimum=10, maximum=100000),
        "evidence_allowance": Key("float", 4.0, "Evidence against the peers (groups of three or more): how many of the "
                                                 "group's own strays an hour a drive may sit above its peers for free.",
                                  minimum=0.5, maximum=50.0),
        "evidence_threshold": Key("float", 8.8, "... and the accumulated strays past the allowance that name it "
                                                "(SlowMember). bench/passive_perseus.py tunes both.",
                                  minimum=1.0, maximum=1000.0),
        "saturation_windows": Key("int", 6, 'Windows in a row held flat at a ceiling before a volume is at its limit.', minimum=2, maximum=10000),
        "floor_ms": Key("float", 0.02, 'Latency excess below this is never evidence (noise on fast flash).',
                        minimum=0.0, maximum=10000.0),
    },
    "sampler": {
        "interval_seconds": Key("float", 1.0, '/proc/diskstats sampling interval (the iostat -x stream).', minimum=0.1, maximum=60.0),
        "devices": Key("strlist", [], 'Kernel-name globs to sample, e.g. ["sd*", "nvme*n1"]; empty: every whole device.'),
    },
    "settings": {
        "interval_seconds": Key("float", 30.0, 'Block queue, md, C-state / PM QoS and tuned poll interval.', minimum=1.0, maximum=3600.0),
    },
    "xfs": {
        "interval_seconds": Key("float", 3600.0, 'Fragmentation report interval: xfs_db walks every inode, so keep it rare.',
                                minimum=60.0, maximum=7 * 86400.0),
        "timeout_seconds": Key("float", 120.0, 'xfs_db / xfs_spaceman are killed after this.', minimum=1.0, maximum=3600.0),
    },
}

PROFILE_KEYS: dict[str, Key] = {
    "rw": Key("str", "randread", "read, write, randread, randwrite or randrw", choices=PROFILE_RW),
    "bs": Key("size", "4k", "block size"),
    "iodepth": Key("int", 32, "I/Os in flight per job", minimum=1, maximum=4096),
    "numjobs": Key("int", 1, "parallel jobs (reported as one group)", minimum=1, maximum=128),
    "ioengine": Key("str", "libaio", "fio I/O engine: libaio, io_uring, psync, sync or pvsync2", choices=("libaio", "io_uring", "psync", "sync", "pvsync2")),
    "direct": Key("bool", True, "O_DIRECT: bypass the page cache"),
    "size": Key("size", "256MiB", "probe file size (capped by limits.max_probe_size)"),
    "runtime_seconds": Key("float", 5.0, "measured time", minimum=0.1, maximum=3600.0),
    "ramp_time_seconds": Key("float", 1.0, "warm-up excluded from the results", minimum=0.0, maximum=3600.0),
    "rate_iops": Key("int", 0, "cap on IOPS, 0 for none", minimum=0, maximum=10**9),
    "job_file": Key("str", "", "an existing fio job file ([global] + job sections) instead of the keys "
                             "above; iowarden still picks the probe file and applies the limits"),
}

TARGET_KEYS: dict[str, Key] = {
    "name": Key("str", None, "name used in metrics and alerts", required=True),
    "path": Key("str", None, "a directory on the filesystem to probe, or a block device (read-only probes)",
                required=True),
    "profiles": Key("strlist", None, "profile names to run", required=True),
    "interval_seconds": Key("float", 300.0, "how often each profile runs", minimum=1.0, maximum=30 * 86400.0),
}


DISCOVER_KEYS: dict[str, Key] = {
    "name": Key("str", None, "rule name; a volume it finds is the target NAME:MOUNTPOINT", required=True),
    "mountpoints": Key("strlist", None, "glob patterns of mount points to probe, e.g. \"/srv/*\" (* also matches /)", required=True),
    "fstypes": Key("strlist", ["xfs", "ext4"], "filesystem types the rule accepts"),
    "profiles": Key("strlist", None, "profile names to run", required=True),
    "interval_seconds": Key("float", 300.0, "how often each profile runs", minimum=1.0, maximum=30 * 86400.0),
}


@dataclass(frozen=True)
class Target:
    name: str
    path: str
    profiles: tuple[str, ...]
    interval_seconds: float
    # Set for a target found by a [[discover]] rule: the st_dev of the filesystem it was
    # found mounted at. A probe refuses when the path is on another one (unmounted since).
    found_on_dev: int | None = None


@dataclass(frozen=True)
class DiscoveryRule:
    name: str
    mountpoints: tuple[str, ...]
    fstypes: tuple[str, ...]
    profiles: tuple[str, ...]
    interval_seconds: float


@dataclass(frozen=True)
class Config:
    path: str
    values: dict[str, dict[str, Any]]
    limits: ProbeLimits
    profiles: dict[str, ProbeProfile] = field(default_factory=dict)
    targets: tuple[Target, ...] = ()
    discover: tuple[DiscoveryRule, ...] = ()

    def section(self, name: str) -> dict[str, Any]:
        return self.values[name]


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
    for path, v in entries("targets", TARGET_KEYS):
        if "path" in v and not v["path"].startswith("/"):
            errors.append(where(path + ("path",), f"must be an absolute path, got {v['path']!r}"))
        elif "path" in v:
            problem = target_path_problem(v["path"])
            if problem:
                errors.append(where(path + ("path",), problem))
        if len(v) == len(TARGET_KEYS):
            targets.append(Target(v["name"], v["path"], tuple(v["profiles"]), v["interval_seconds"]))
    rules: list[DiscoveryRule] = []
    for path, v in entries("discover", DISCOVER_KEYS):
        for pattern in v.get("mountpoints", []):
            if not pattern.startswith("/"):
                errors.append(where(path + ("mountpoints",), f"must be absolute glob patterns, got {pattern!r}"))
        if "mountpoints" in v and not v["mountpoints"]:
            errors.append(where(path + ("mountpoints",), "must name at least one pattern"))
        if len(v) == len(DISCOVER_KEYS):
            rules.append(DiscoveryRule(v["name"], tuple(v["mountpoints"]), tuple(v["fstypes"]),
                                       tuple(v["profiles"]), v["interval_seconds"]))

    if errors:
        raise ConfigError(errors)
    lim = values["limits"]
    limits = ProbeLimits(max_size_bytes=lim["max_probe_size"], max_runtime_seconds=lim["max_runtime_seconds"],
                         min_free_bytes=lim["min_free_bytes"], min_free_ratio=lim["min_free_ratio"],
                         timeout_margin_seconds=lim["timeout_margin_seconds"],
                         max_buffer_bytes=lim["max_job_buffers"])
    return Config(source, values, limits, profiles, tuple(targets), tuple(rules))


def load(path: str | Path) -> Config:
    """The configuration in a file: a regular file (not a FIFO or a device) of at most CONFIG_MAX_BYTES.
    Every failure is a ConfigError: a reload that fails keeps the running configuration."""
    p = Path(path)
    try:
        text = read_bounded(p, CONFIG_MAX_BYTES).decode("utf-8")
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read: {exc.strerror or exc}"]) from None
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
