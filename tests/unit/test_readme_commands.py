"""The README's command table and the parser agree: every command it lists exists, and every
option it shows is one that command's --help describes. Run as a user would, through the CLI's module."""
import concurrent.futures
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _rows() -> list[tuple[str, list[str]]]:
    """(subcommand, its options as the README writes them) per `iowarden ...` cell of the command table."""
    out = []
    for line in README.read_text().splitlines():
        if not line.startswith("| `iowarden "):
            continue
        cell = line.split(" | ")[0]
        for usage in re.findall(r"`iowarden ([^`]+)`", cell):
            words = usage.split()
            out.append((words[0], sorted(set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", usage)))))
    return out


def _help(command: str) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "iowarden.daemon.cli", command, "--help"], capture_output=True,
                       text=True, timeout=60)
    return r.returncode, r.stdout


def test_every_command_and_option_in_the_readme_is_in_its_help():
    rows = _rows()
    assert len({c for c, _ in rows}) >= 11, rows   # the table was read (run, status, baseline, ack, replay, ...)
    # every command's --help at once: one after another, a dozen interpreter starts on a busy machine took
    # longer than a unit test's bound
    commands = sorted({c for c, _ in rows})
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(commands)) as pool:
        helps = dict(zip(commands, pool.map(_help, commands)))
    missing = []
    for command, options in rows:
        code, text = helps[command]
        assert code == 0, f"iowarden {command} --help exited {code}"
        missing += [f"{command} {o}" for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
    assert not missing, f"in the README, not in --help: {missing}"
