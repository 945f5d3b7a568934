"""Every command takes its options and operands in any order a person types them, and a usage error prints that
command's usage, not the top level's (`iowarden iostat loop0 --json 1 2` exited 2 with the top-level usage)."""
import pytest

from iowarden.daemon.cli import build_parser, parse_command_line


@pytest.mark.parametrize("argv", [
    ["iostat", "loop0", "--json", "1", "2"],       # as sysstat takes them
    ["iostat", "-x", "loop0", "--json", "1", "2"],
    ["iostat", "1", "2", "-x", "--json", "loop0"],
    ["iostat", "--json", "loop0", "1", "2"],
])
def test_iostat_takes_its_operands_and_options_in_any_order(argv):
    args = parse_command_line(argv)
    assert (args.command, args.devices, args.interval, args.count, args.json) == ("iostat", ["loop0"], 1.0, 2, True)


# each command's options given before and after its operands: the same namespace either way
ORDERS = [
    (["xfs", "--json", "/srv", "/data"], ["xfs", "/srv", "--json", "/data"]),
    (["baseline", "--target", "db", "show"], ["baseline", "show", "--target", "db"]),
    (["ack", "--note", "planned", "7"], ["ack", "7", "--note", "planned"]),
    (["replay", "--metric", "latency", "probes.csv"], ["replay", "probes.csv", "--metric", "latency"]),
    (["status", "-c", "/etc/x.toml", "--json"], ["status", "--json", "-c", "/etc/x.toml"]),
    (["probe", "--json", "--path", "/srv"], ["probe", "--path", "/srv", "--json"]),
    (["settings", "-p", "--json"], ["settings", "--json", "-p"]),
    (["run", "--web.listen-address", ":9", "-c", "/etc/x.toml"], ["run", "-c", "/etc/x.toml", "--web.listen-address", ":9"]),
    (["check-config", "-c", "/etc/x.toml"], ["check-config", "--config=/etc/x.toml"]),
    (["cleanup", "-c", "/etc/x.toml"], ["cleanup", "--config", "/etc/x.toml"]),
    (["characterize", "--sweep", "qd", "--path", "/srv", "--dry-run"],
     ["characterize", "--dry-run", "--path", "/srv", "--sweep", "qd"]),
    (["iostat", "--utc", "-x", "loop0", "1", "2"], ["iostat", "1", "-x", "2", "loop0", "--utc"]),
]


@pytest.mark.parametrize("first, second", ORDERS, ids=[o[0][0] for o in ORDERS])
def test_every_command_takes_options_before_or_after_its_operands(first, second):
    a, b = parse_command_line(first), parse_command_line(second)
    assert {k: v for k, v in vars(a).items() if k != "func"} == {k: v for k, v in vars(b).items() if k != "func"}


def test_every_command_is_parsed_its_own_way(capsys):
    """No command is left to the top-level parser (whose usage a mistake would print): each one's --help is its
    own, wherever it stands among the arguments."""
    for name in build_parser().subcommands:
        with pytest.raises(SystemExit) as exc:
            parse_command_line([name, "--json", "--help"] if name in ("iostat", "status") else [name, "--help"])
        assert exc.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: iowarden {name}"), name


@pytest.mark.parametrize("argv, usage", [
    (["iostat", "loop0", "--bogus"], "usage: iowarden iostat"),
    (["xfs", "--timeout", "-3"], "usage: iowarden xfs"),
    (["ack", "seven"], "usage: iowarden ack"),
])
def test_a_usage_error_prints_that_commands_usage(argv, usage, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_command_line(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err


def test_the_top_level_still_answers_help_and_version(capsys):
    for argv in (["--version"], ["-V"]):
        with pytest.raises(SystemExit) as exc:
            parse_command_line(argv)
        assert exc.value.code == 0
    assert "iowarden" in capsys.readouterr().out


def test_check_config_counts_in_words_a_person_reads(tmp_path, capsys):
    from iowarden.daemon.cli import main
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[profiles.rr]\nrw = "randread"\n'
                   f'[[targets]]\nname = "t"\npath = "{tmp_path}"\nprofiles = ["rr"]\n')
    main(["check-config", "-c", str(cfg)])
    out = capsys.readouterr().out
    assert "(1 profile, 1 target, 0 discovery rules)" in out, out
