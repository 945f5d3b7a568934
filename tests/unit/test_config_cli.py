"""The configuration as the command line takes it: `run --web.listen-address`, the exporters' flag, stands in
for [prometheus] listen_address, is checked as that key is, and holds across a reload (config.load takes it
each time); `check-config` says the file's mistakes in the file's order. No root."""
import pytest

from iowarden.daemon import config as configmod
from iowarden.daemon.cli import parse_command_line


def test_the_flag_is_taken_in_any_order_and_replaces_the_configured_address(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[prometheus]\nlisten_address = "127.0.0.1:29110"\n')
    for argv in (["run", "--web.listen-address", "127.0.0.1:9", "-c", str(path)],
                 ["run", "-c", str(path), "--web.listen-address=127.0.0.1:9"]):
        args = parse_command_line(argv)
        assert args.listen_address == "127.0.0.1:9" and args.config == str(path)
    assert configmod.load(path, "127.0.0.1:9").section("prometheus").listen_address == "127.0.0.1:9"
    assert configmod.load(path).section("prometheus").listen_address == "127.0.0.1:29110"


def test_a_bad_address_is_refused_naming_the_flag(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("")
    with pytest.raises(configmod.ConfigError) as e:
        configmod.load(path, "localhost:99999")
    assert "--web.listen-address 'localhost:99999'" in str(e.value.errors), e.value.errors


def test_check_config_says_the_mistakes_in_the_files_order(tmp_path):
    """Sections were checked in the schema's order: line 7's mistake came before line 3's."""
    path = tmp_path / "c.toml"
    path.write_text('[[targets]]\nname = "a"\npath = "relative/path"\nprofiles = ["nope"]\n\n'
                    '[daemon]\nlog_level = "loud"\n\n[profiles.x]\nrw = "randwhat"\n')
    with pytest.raises(configmod.ConfigError) as e:
        configmod.load(path)
    lines = [int(x.split(":")[1]) for x in e.value.errors]
    assert lines == sorted(lines) and lines[0] == 3 and len(lines) >= 4, e.value.errors


def test_probe_with_a_target_or_profile_that_names_nothing_lists_what_it_could_name():
    from types import SimpleNamespace
    from iowarden.daemon.cli import nothing_matches
    targets = [SimpleNamespace(name="db", profiles=("randread-4k",)), SimpleNamespace(name="logs", profiles=())]
    cfg = SimpleNamespace(profiles={"randread-4k": None, "read-1m": None})
    assert nothing_matches("nope", None, targets, cfg) == "no target named 'nope' (known: db, logs)"
    assert nothing_matches(None, "x", targets, cfg) == "no profile named 'x' (configured: randread-4k, read-1m)"
    assert nothing_matches("db", "read-1m", targets, cfg) == "target 'db' does not run 'read-1m' (it runs: randread-4k)"
