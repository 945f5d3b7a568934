"""Configuration: every mistake reported at once with file, line and key; the example documents it all."""
import difflib
import re
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from iowarden.daemon import config
from iowarden.daemon.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config.example.toml"

A_DOZEN_MISTAKES = """\
[daemon]
log_level = "loud"
stat_dir = "/tmp"

[limits]
max_probe_size = "huge"
min_free_ratio = -1

[sampler]
interval_seconds = "fast"

[xfs]
interval_seconds = 5

[profiles.r]
rw = "scribble"
iodepth = 0
bs = 4096
size = "1000"

[profiles.j]
job_file = "/nonexistent/job.fio"

[[targets]]
name = "a"
path = "relative/dir"
profiles = ["r", "missing"]

[[targets]]
name = "a"
profiles = "r"

[alerts]
x = 1
"""


def test_a_dozen_mistakes_all_reported_with_lines():
    with pytest.raises(config.ConfigError) as e:
        config.parse(A_DOZEN_MISTAKES, "bad.toml")
    errors = e.value.errors
    expect = [
        ("bad.toml:2: daemon.log_level:", "must be one of"),
        ("bad.toml:3: daemon.stat_dir:", "unknown key (did you mean 'state_dir'?)"),
        ("bad.toml:6: limits.max_probe_size:", "not a size"),
        ("bad.toml:7: limits.min_free_ratio:", "at least 0"),
        ("bad.toml:10: sampler.interval_seconds:", "expected a number"),
        ("bad.toml:13: xfs.interval_seconds:", "at least 60"),
        ("bad.toml:16: profiles.r.rw:", "must be one of"),
        ("bad.toml:17: profiles.r.iodepth:", "at least 1"),
        ("bad.toml:22: profiles.j.job_file:", "cannot read job file"),
        ("bad.toml:26: targets[0].path:", "absolute path"),
        ("bad.toml:27: targets[0].profiles:", "no profile named 'missing'"),
        ("bad.toml:30: targets[1].name:", "used twice"),
        ("bad.toml:29: targets[1].path:", "required key is missing"),
        ("bad.toml:31: targets[1].profiles:", "list of strings"),
        ("bad.toml:33: alerts:", "unknown section"),
    ]
    for prefix, fragment in expect:
        assert any(err.startswith(prefix) and fragment in err for err in errors), (prefix, fragment, errors)


def test_size_not_multiple_of_block_size_is_named():
    text = '[profiles.r]\nbs = "4k"\nsize = "1000"\n'
    with pytest.raises(config.ConfigError, match=r"x.toml:1: profiles.r: .*multiple of bs"):
        config.parse(text, "x.toml")


def test_syntax_error_names_the_line():
    with pytest.raises(config.ConfigError) as e:
        config.parse("[daemon]\nlog_level = \n", "s.toml")
    assert e.value.errors[0].startswith("s.toml:2: syntax:")


def test_example_config_is_valid_and_uses_defaults():
    cfg = config.load(EXAMPLE)
    assert cfg.targets and cfg.profiles
    for section, keys in config.SECTIONS.items():
        for key, spec in keys.items():
            want = config._check(spec.default, spec)[0]
            got = getattr(cfg.section(section), key)
            assert got == (tuple(want) if isinstance(want, list) else want), (section, key)


def test_example_config_documents_every_key():
    text = EXAMPLE.read_text()
    raw = tomllib.loads(text)
    for section, keys in config.SECTIONS.items():
        assert set(raw[section]) == set(keys), f"[{section}] in the example must set every key"
    for keys in (config.PROFILE_KEYS, config.TARGET_KEYS, config.DISCOVER_KEYS):
        for key in keys:
            assert re.search(rf"^#?\s*{key}\s*=", text, re.M), f"{key} is not documented in the example"


def test_check_config_exit_codes(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(A_DOZEN_MISTAKES)
    assert main(["check-config", "-c", str(bad)]) == 78
    err = capsys.readouterr().err
    assert err.count(str(bad) + ":") >= 12
    # valid; 1 says its target (/var/lib/iowarden) is missing on this host, as on a machine without the package
    assert main(["check-config", "-c", str(EXAMPLE)]) == (0 if os.path.isdir("/var/lib/iowarden") else 1)
    assert main(["check-config", "-c", str(tmp_path / "absent.toml")]) == 78


def test_check_config_as_a_command(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\nlog_level = 3\n")
    r = subprocess.run([sys.executable, "-m", "iowarden.daemon.cli", "check-config", "-c", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 78 and f"{bad}:2: daemon.log_level: expected a string" in r.stderr
    assert "Traceback" not in r.stderr


def test_values_the_daemon_cannot_use_are_refused_with_their_ranges(tmp_path):
    """Each of these passed check-config and then failed or misbehaved in `run`."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    link = tmp_path / "etc-link"
    link.symlink_to("/etc")
    text = f"""\
[prometheus]
listen_address = "127.0.0.1:99999"
[scheduling]
jitter_ratio = 5
[limits]
min_free_ratio = 5
max_runtime_seconds = nan
[profiles.r]
rw = "randread"
[[targets]]
name = "proc"
path = "/proc"
profiles = ["r"]
[[targets]]
name = "file"
path = "{afile}"
profiles = ["r"]
[[targets]]
name = "link"
path = "{link}"
profiles = ["r"]
[[targets]]
name = "root"
path = "/"
profiles = ["r"]
"""
    with pytest.raises(config.ConfigError) as e:
        config.parse(text, "c.toml")
    errors = "\n".join(e.value.errors)
    assert "c.toml:2: prometheus.listen_address: listen address '127.0.0.1:99999': the port must be 1-65535" in errors
    assert "c.toml:4: scheduling.jitter_ratio: must be at most 0.5, got 5" in errors
    assert "c.toml:6: limits.min_free_ratio: must be at most 0.9, got 5" in errors
    assert "c.toml:7: limits.max_runtime_seconds: must be a finite number" in errors
    assert re.search(r"c.toml:12: targets\[0\].path: /proc is in a system tree", errors)
    assert re.search(r"c.toml:16: targets\[1\].path: .*afile is neither a directory nor a block device", errors)
    assert re.search(r"c.toml:20: targets\[2\].path: .*etc-link is a symlink \(to /etc\)", errors)
    assert re.search(r"c.toml:24: targets\[3\].path: / is the root directory", errors)
    assert len(e.value.errors) == 8


def test_the_example_is_generated_from_the_schema_line_by_line():
    """config.example.toml is the schema rendered: every key, its default and its doc, so none can drift.
    After a change to the schema: python -m iowarden.daemon.config_example > config.example.toml"""
    from iowarden.daemon.config_example import render
    want = render()
    got = EXAMPLE.read_text()
    diff = "".join(difflib.unified_diff(got.splitlines(True), want.splitlines(True), "config.example.toml",
                                        "generated"))
    assert got == want, diff[:4000]


def test_every_number_in_the_schema_has_a_range():
    """`[sampler] interval_seconds = 1e10` was valid and killed the sampler.
    Every int and float key has a minimum and a maximum; every size key is bounded (its own or 1 PiB)."""
    schemas = {**{f"[{s}]": k for s, k in config.SECTIONS.items()}, "[profiles.*]": config.PROFILE_KEYS,
               "[[targets]]": config.TARGET_KEYS, "[[discover]]": config.DISCOVER_KEYS}
    for where, keys in schemas.items():
        for key, spec in keys.items():
            if spec.kind in ("int", "float"):
                assert spec.minimum is not None and spec.maximum is not None, f"{where} {key} has no range"
                assert config._check(spec.maximum * 10 + 1, spec)[1], f"{where} {key}: over the maximum accepted"
            if spec.kind == "size":
                assert config._check("2PiB", spec)[1], f"{where} {key}: 2 PiB accepted"


def test_each_section_is_a_frozen_dataclass_built_from_the_schema():
    import dataclasses
    cfg = config.parse("")
    for name, keys in config.SECTIONS.items():
        sec = cfg.section(name)
        assert dataclasses.is_dataclass(sec) and [f.name for f in dataclasses.fields(sec)] == list(keys), name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(sec, next(iter(keys)), None)


def test_every_detector_and_passive_parameter_is_a_config_key_or_plainly_internal():
    import dataclasses

    from iowarden.daemon.passive.values import PASSIVE_DERIVED, PASSIVE_KEYS, PassiveParams
    from iowarden.daemon.verdicts.detect import DETECTOR_INTERNAL, DETECTOR_KEYS, DetectorParams
    det_fields = {f.name for f in dataclasses.fields(DetectorParams)}
    assert set(DETECTOR_KEYS.values()) | DETECTOR_INTERNAL == det_fields
    assert not set(DETECTOR_KEYS.values()) & DETECTOR_INTERNAL
    assert set(DETECTOR_KEYS) == set(config.SECTIONS["detector"])       # every key reaches a field
    passive_keys = set(config.SECTIONS["passive"]) - {"enabled"}
    assert set(PASSIVE_KEYS) == passive_keys
    assert set(PASSIVE_KEYS) | PASSIVE_DERIVED <= {f.name for f in dataclasses.fields(PassiveParams)}
    for section, keys in (("detector", DETECTOR_KEYS), ("passive", PASSIVE_KEYS)):   # with a range, each
        for key in keys:
            spec = config.SECTIONS[section][key]
            assert spec.minimum is not None and spec.maximum is not None, (section, key)
    # and the values reach the detectors
    cfg = config.parse("[detector]\nwindow_probes = 100\n[passive]\nevidence_threshold = 9.5\nwindow_seconds = 30.0\n")
    assert DetectorParams.from_config(cfg.section("detector")).window == 100
    p = PassiveParams.from_config(cfg.section("passive"))
    assert (p.evidence_threshold, p.window_seconds, p.evidence_block_windows) == (9.5, 30.0, 120)


def test_a_burst_bucket_needs_all_three_keys_and_a_baseline_below_its_burst(tmp_path):
    base = f'[profiles.r]\nrw = "randread"\n[[targets]]\nname = "db"\npath = "{tmp_path}"\nprofiles = ["r"]\n'
    with pytest.raises(config.ConfigError) as e:
        config.parse(base + "burst_iops = 3000.0\nburst_baseline_iops = 300.0\n", "b.toml")
    assert re.match(r"b\.toml:7: targets\[0\]\.burst_iops: a burst bucket needs all three", e.value.errors[0]), e.value.errors
    with pytest.raises(config.ConfigError) as e:
        config.parse(base + "burst_iops = 300.0\nburst_baseline_iops = 3000.0\nburst_capacity_ios = 5.4e6\n", "b.toml")
    assert re.match(r"b\.toml:8: targets\[0\]\.burst_baseline_iops: the baseline \(3000 IOPS\) must be below",
                    e.value.errors[0]), e.value.errors
    ok = config.parse(base + "burst_iops = 3000.0\nburst_baseline_iops = 300.0\nburst_capacity_ios = 5.4e6\n", "b.toml")
    assert ok.targets[0].bucket == (3000.0, 300.0, 5.4e6)
    assert config.parse(base, "b.toml").targets[0].bucket is None
