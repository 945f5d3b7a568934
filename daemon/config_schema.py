"""The configuration's schema: every section and key with its kind, default, range and meaning.

One table drives the parser (config.py), `iowarden check-config`, config.example.toml (config_example.py)
and the docs. A registered source (sources/registry.py) brings its own section; config.py adds them.
"""
from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass
from typing import Any, Callable

from iowarden.probes.fio_job import PROFILE_RW
from iowarden.probes.probe_dir import directory_target_problem

MAX_SIZE_BYTES = 1 << 50         # a size key's bound unless it names a smaller one (1 PiB)
# [sampler] exclude_devices when none is given: ram and zram disks are memory, not storage (node_exporter
# leaves them out too)
DEFAULT_EXCLUDE = ("ram*", "zram*")


def parse_listen_address(text: str) -> tuple[tuple, int]:
    """':29110' (all interfaces), '127.0.0.1:29110', '[::1]:29110' -> (bind address, family)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {text!r} is not HOST:PORT")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"listen address {text!r}: the port must be 1-65535")
    host = host.strip("[]")
    if host in ("", "::"):
        return ("::", int(port)), socket.AF_INET6
    return (host, int(port)), socket.AF_INET6 if ":" in host else socket.AF_INET


def listen_address_problem(text: str) -> str | None:
    try:
        parse_listen_address(text)
    except ValueError as exc:
        return str(exc)
    return None


def runbook_url_problem(text: str) -> str | None:
    import urllib.parse
    u = urllib.parse.urlsplit(text)
    if u.scheme not in ("http", "https") or not u.netloc:
        return f"{text!r} is not an http(s) URL: a pager opens links, not files"
    if any(ord(c) < 33 or c in '"\\' for c in text):
        return f"{text!r} has spaces, quotes or control characters"
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


def target_path_problem(path: str, answer=None) -> str | None:
    """A target is a block device (read-only probes) or a directory iowarden may write its probe file in.

    answer: the path's stat as a child made it (probes/pathstat.py). A path that did not answer in time is
    not a mistake in the file: nothing more of it is touched here (its walk would hang too), and the daemon
    records its probes as failures that say so until it answers."""
    if answer is not None and answer.hung:
        return None
    mode = answer.st_mode if answer is not None else _mode_of(path)
    if mode is not None and stat.S_ISBLK(mode):
        return None
    if mode is not None and not stat.S_ISDIR(mode):
        return f"{path} is neither a directory nor a block device"
    return directory_target_problem(path)


def _mode_of(path: str) -> int | None:
    try:
        return os.stat(path).st_mode
    except OSError:
        return None   # not there yet (a mount point made later): checked again at every probe


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


BASE_SECTIONS: dict[str, dict[str, Key]] = {
    "daemon": {
        "state_dir": Key("str", "/var/lib/iowarden", 'State database, spool and (by default) the probe directory.'),
        "log_level": Key("str", "info", 'debug, info, warning or error.', choices=("debug", "info", "warning", "error")),
        "fio_path": Key("str", "fio", 'The fio binary (looked up in PATH unless absolute).'),
    },
    "limits": {
        "max_probe_size": Key("size", "1GiB", 'Largest probe file any profile may use.'),
        "max_runtime_seconds": Key("float", 60.0, 'Longest a single probe may run.', minimum=0.1, maximum=3600.0),
        "min_free_bytes": Key("size", "1GiB", 'A probe never leaves less free space than this (but never asks more '
                                               'than 5 % of a small filesystem) ...'),
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
                                                    'results are kept but neither learned nor judged). A volume of '
                                                    'several profiles is still measured once its interval (as '
                                                    'configured, not as a tight budget spaces each profile): when '
                                                    'waiting would leave it unmeasured longer, the profile due '
                                                    'runs, contended.',
                                    minimum=0.0, maximum=86400.0),
        "warmup_interval_seconds": Key("float", 60.0, 'A volume new to iowarden (fewer than [detector] warmup_probes '
                                                      'measured probes of a profile) is probed this often, not at its '
                                                      "target's interval, until its normal is learned: armed in minutes. "
                                                      'Within [budget] warmup_device_time_ratio.', minimum=1.0,
                                       maximum=86400.0),
        "jitter_ratio": Key("float", 0.1, 'Random spread of each interval, so a fleet does not probe in step.',
                            minimum=0.0, maximum=0.5),
        "discover_interval_seconds": Key("float", 10.0, 'How often [[discover]] rules are matched against the mount table (mounting sends no '
                                                        'event); they are matched at every block device event too.', minimum=1.0, maximum=3600.0),
        "max_discovered_targets": Key("int", 1000, 'The most targets [[discover]] rules make; mount points past it (in the mount '
                                                   "table's order) are passed over, counted "
                                                   '(iowarden_discovery_targets_over_limit) and logged once.',
                                      minimum=1, maximum=100000),
    },
    "budget": {
        "device_time_ratio": Key("float", 0.04, 'Probe device-time as a share of wall time, over window_seconds. A '
                                                'probe costs its runtime, its ramp and fio\'s start: the example '
                                                'profiles measured 1.8-2.0 s each for 1 s + 0.5 s ramp, 4 x 1.9 s '
                                                'every 300 s = 91 s an hour, 63 % of this 144 s. Routine probes '
                                                'that would ask more than 90 % of it are spread out (their intervals '
                                                'stretched, and the journal and check-config say so), not run until '
                                                'the budget is spent.',
                                 minimum=0.0, maximum=1.0),
        "warmup_device_time_ratio": Key("float", 0.15, "The share a volume may use while it learns its normal "
                                        "([scheduling] warmup_interval_seconds): the example's 7.6 s a minute is 13 %, "
                                        "and its whole warm-up (12 rounds) 91 s of device time. It counts every probe "
                                        "on the disk; device_time_ratio counts only the probes of armed volumes, so "
                                        "a warm-up just done leaves their budget whole.",
                                        minimum=0.0, maximum=1.0),
        "reserve_device_time_ratio": Key("float", 0.02, "A share beside device_time_ratio that only the probes "
                                         "confirming a suspected fault, or its end, may use: a fault found never "
                                         "spends the budget its alert needs to clear, and no routine probe spends "
                                         "it.", minimum=0.0, maximum=1.0),
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
        "runbook_url": Key("str", "https://github.com/iowarden/iowarden/blob/main/docs/runbook.md",
                           "Where the runbook is published (http or https): each alert's page links its section "
                           "(iowarden_alert_info's runbook_url label, which the shipped rules' runbook_url reads). "
                           "Point it at your wiki's copy.", check=runbook_url_problem),
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
        "evidence_threshold": Key("float", 4.8, "... and the accumulated strays past the allowance that name it "
                                                "(SlowMember). bench/passive_perseus.py tunes both.",
                                  minimum=1.0, maximum=1000.0),
        "tail_ratio": Key("float", 4.0, "With the tracer on: a member whose p99.9 of real I/O is this many times its "
                                        "peers' median p99.9 in three blocks in a row is slow on its tail "
                                        "(SlowMember), however little its mean moved ...", minimum=1.5, maximum=1000.0),
        "tail_block_seconds": Key("float", 60.0, "The tail is judged per block of this many seconds (of whole "
                                                 "windows).", minimum=10.0, maximum=3600.0),
        "tail_floor_ms": Key("float", 20.0, "... and at least this many milliseconds above it (fast flash's tail "
                                            "wanders by milliseconds).", minimum=0.0, maximum=100000.0),
        "loop_peers": Key("strlist", [], "Loop devices are nobody's peers unless said here: patterns (fnmatch) of their "
                                         "backing files, e.g. [\"/srv/images/db-*.img\"]; the loop devices of one size "
                                         "whose files match one pattern are peers (SlowMember). Disks are peers by model "
                                         "and size, and the members of an array by the array.",
                          minimum=0, maximum=64),
        "saturation_windows": Key("int", 6, 'Windows in a row held flat at a ceiling before a volume is at its limit.', minimum=2, maximum=10000),
        "floor_ms": Key("float", 0.02, 'Latency excess below this is never evidence (noise on fast flash).',
                        minimum=0.0, maximum=10000.0),
        "burst_horizon_seconds": Key("float", 1800.0, "BurstCreditsLow when a volume's burst bucket (learned, or "
                                                      "given per target) runs out of credits within this many seconds "
                                                      "at its current draw.", minimum=60.0, maximum=7 * 86400.0),
        "service_learn_seconds": Key("float", 300.0, "With the compiled tracer's counts per cgroup: how long a "
                                     "service's own requests are learned (its normal latency at its rate) before "
                                     "ServiceContended judges it.", minimum=10.0, maximum=86400.0),
        "fleet_seconds": Key("float", 300.0, "The fleet signal (iowarden_fleet_slowdown_ratio) is the median of "
                                             "this many seconds of judged windows: a few of the fleet rules' "
                                             "evaluation intervals (a minute as shipped), so one odd window is not "
                                             "a deviation.", minimum=10.0, maximum=3600.0),
        "knee_multiple": Key("float", 2.0, "The knee of a device's learned latency-vs-load curve: the load at which "
                                           "its median await reaches this many times its unloaded await; the "
                                           "headroom is the knee over the recent peak load.",
                             minimum=1.1, maximum=100.0),
    },
    "sampler": {
        "interval_seconds": Key("float", 1.0, '/proc/diskstats sampling interval (the iostat -x stream).', minimum=0.1, maximum=60.0),
        "devices": Key("strlist", [], 'Kernel-name globs to sample, e.g. ["sd*", "nvme*n1"]; empty: every whole device '
                                      '(less exclude_devices, and loop devices with nothing attached).'),
        "exclude_devices": Key("strlist", list(DEFAULT_EXCLUDE), 'Kernel-name globs left out when devices is empty '
                                                              '(node_exporter leaves ram and zram disks out too).'),
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
    # a burst bucket the provider documents (gp2: a burst of 3,000 IOPS, a baseline of 3 IOPS per GiB, 5.4 million
    # credits): used from the first window, where a learned one waits for a fall and a recovery. All three or none
    "burst_iops": Key("float", 0.0, "the volume's burst rate (IOPS) while its bucket holds credits; 0: none "
                                    "configured (learned from a fall and a recovery)", minimum=0.0, maximum=1e9),
    "burst_baseline_iops": Key("float", 0.0, "the rate (IOPS) it falls to when the credits are spent",
                               minimum=0.0, maximum=1e9),
    "burst_capacity_ios": Key("float", 0.0, "the I/Os above the baseline a full bucket lets through (gp2: 5.4 "
                                            "million)", minimum=0.0, maximum=1e15),
    "class": Key("str", "", "the volume's class across the fleet (what the fleet rules compare it with on other "
                            "hosts, iowarden_volume_class_info); empty: derived from its model, firmware and size or "
                            "its layout (docs/fleet.md)"),
}


DISCOVER_KEYS: dict[str, Key] = {
    "name": Key("str", None, "rule name; a volume it finds is the target NAME:MOUNTPOINT", required=True),
    "mountpoints": Key("strlist", None, "glob patterns of mount points to probe, e.g. \"/srv/*\" (* also matches /)", required=True),
    "fstypes": Key("strlist", ["xfs", "ext4"], "filesystem types the rule accepts"),
    "profiles": Key("strlist", None, "profile names to run", required=True),
    "interval_seconds": Key("float", 300.0, "how often each profile runs", minimum=1.0, maximum=30 * 86400.0),
    "class": Key("str", "", "the fleet class of the volumes it finds (see [[targets]] class)"),
}
