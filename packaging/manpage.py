"""Writes iowarden(8) to standard output, from the command line's own parser.

Generated, not written by hand, so that the man page and `--help` cannot disagree: every
subcommand, argument and help text comes from iowarden.daemon.cli.build_parser(). The
sections argparse knows nothing of (files, signals, exit status) are written out below.
Usage (packaging/stage.sh does this): python3 packaging/manpage.py [VERSION] | gzip -9n > iowarden.8.gz
VERSION defaults to the installed iowarden's.
"""
import argparse
import importlib.metadata
import os
import sys
import time

from iowarden.daemon.cli import build_parser
from iowarden.daemon.commands.args import help_with_default
from iowarden.daemon.config import EX_CONFIG

DESCRIPTION = r"""
iowarden is a storage-health daemon. It runs small, safe fio probes on a schedule
within a per-device budget, samples /proc/diskstats every second and computes what
\fBiostat \-x\fR shows, tracks XFS fragmentation, block-queue settings, CPU C-states,
PM QoS and the tuned profile, learns each volume's normal (keyed by its stable identity)
and alerts when IOPS falls or latency rises against it, naming the likely cause.
It exports to Prometheus (port 29110 by default) and InfluxDB 2 and logs to the journal.
.PP
Probe files live only in a \fI.iowarden\fR directory under each configured target; a raw
block device is only ever probed read-only.
"""

PROGRAM_NAMES = ("iostat", "fio", "iowarden", "xfs_db", "smartctl", "bpftrace")

TAIL = r"""
.SH FILES
.TP
.I /etc/iowarden/config.toml
The configuration (a conffile). \fBiowarden check-config\fR validates it; every key is
documented in the example the package installs.
.TP
.I /var/lib/iowarden
The state directory: the SQLite state database (probe history, baselines, alerts,
acknowledgements) and the InfluxDB spool. Removed on purge.
.TP
.I /usr/share/iowarden
Prometheus alerting and recording rules (with promtool unit tests) and a Grafana dashboard.
.TP
.I /usr/share/doc/iowarden
The README, how the figures were checked against fio, iostat, ioping and xfs_db, and the detector.
.SH SIGNALS
.TP
.B SIGTERM
Stops within 5 seconds: a running fio is killed with its job processes, the interrupted
probe is recorded as failed, the state database is closed.
.TP
.B SIGHUP
Reloads the configuration atomically; an invalid one is logged and the running one is kept
(\fBsystemctl reload iowarden\fR).
.SH ENVIRONMENT
.TP
.B IOWARDEN_INFLUXDB_TOKEN
The InfluxDB API token, when \fIinfluxdb.token_file\fR is not set (the variable's name
is \fIinfluxdb.token_env\fR). The token is never logged.
.SH EXIT STATUS
.TP
.B 0
Success.
.TP
.B 1
A probe or an XFS report failed, or nothing matched what was asked for (the reason is printed).
.TP
.B 2
A usage error or unreadable input.
.TP
.B 75
\fBrun\fR: another iowarden daemon holds the state directory (its lock); try again when it has stopped.
.TP
.B 77
Permission denied: the command needs root (or read access to the block devices).
.TP
.B {ex_config}
The configuration is invalid; each mistake is printed as FILE:LINE: key.path: message. Also \fBrun\fR
refusing a state directory that is not the daemon's own (a symbolic link, another owner, files of other
names where its own belong).
.TP
.B 130
Interrupted.
.SH SEE ALSO
.BR fio (1),
.BR iostat (1),
.BR ioping (1),
.BR xfs_db (8),
.BR tuned-adm (8),
.BR systemd.service (5)
"""


def roff(text: str) -> str:
    """Plain text as roff: backslashes and hyphens escaped, no line taken for a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in text.splitlines())


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help or "" for c in action._choices_actions}
    return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]


def argument(action: argparse.Action) -> str:
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    if action.choices and not action.option_strings:
        metavar = "|".join(action.choices)
    takes_value = action.nargs != 0
    if action.option_strings:
        names = ", ".join(f"\\fB{roff(o)}\\fR" for o in action.option_strings)
        return names + (f" \\fI{roff(metavar)}\\fR" if takes_value else "")
    return f"\\fI{roff(metavar)}\\fR"


def describe(action: argparse.Action) -> str:
    """The option's help as --help says it (its default once), and its choices."""
    text = help_with_default(action) % dict(vars(action), prog="iowarden")
    if action.choices and action.option_strings:
        text += f" (one of: {', '.join(action.choices)})"
    return roff(text.strip())


def sentence(summary: str) -> str:
    """A command's summary as a sentence; a program's name that opens it keeps its case (iostat, not Iostat)."""
    first = summary.split(" ", 1)[0]
    keep = first in PROGRAM_NAMES or first.startswith("`")
    return (summary if keep else summary[0].upper() + summary[1:]) + "."


def manpage(version: str) -> str:
    parser = build_parser()
    # the build's date, or SOURCE_DATE_EPOCH's for a reproducible package
    date = time.strftime("%Y-%m-%d", time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))))
    out = [f'.TH IOWARDEN 8 "{date}" "iowarden {version}" "System Administration"',
           ".nh",  # no hyphenation: option names and paths are copied from the page
           ".SH NAME", "iowarden \\- " + roff(parser.description.rstrip(".").lower()),
           ".SH SYNOPSIS", ".B iowarden", "\\fICOMMAND\\fR [\\fIOPTIONS\\fR]", ".SH DESCRIPTION",
           DESCRIPTION.strip(), ".SH COMMANDS"]
    for name, summary, sub in subcommands(parser):
        usage = " ".join(sub.format_usage().split())[len("usage: "):]
        out += [f".SS {roff(name)}", roff(sentence(summary)), ".PP", ".nf", roff(usage), ".fi"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            out += [".TP", argument(action), describe(action)]
    out.append(TAIL.strip().replace("{ex_config}", str(EX_CONFIG)))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(manpage(sys.argv[1] if len(sys.argv) > 1 else importlib.metadata.version("iowarden")))
