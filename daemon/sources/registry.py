"""The seam a new source plugs into: a SourceSpec, registered once in SOURCES below.

A source is a part that reads something on a thread of its own, at its own cadence, and hands the
core one immutable value per reading (events.SourceRead). Everything else about it is a pure function
of that value, called where the daemon needs it:

- `config`: its section of the configuration (every source has `enabled` and `interval_seconds`);
- `start(section, roots)`: builds the reader; the runtime makes it a supervised part
  (cadence `interval_seconds`, deadline `deadline_seconds(section)`), posting what it returns; a
  reader with a `stop` attribute (one that keeps a process running) is stopped with the daemon;
- `families(value, snapshot)`: its section of /metrics;
- `causes(value, disks)`: sentences for an alert on a volume over those kernel disks (its likely causes);
- `summary(value)` (optional): what `iowarden status` shows of it, saved by the core at most every 15 s.
- `status_text(summary, table)` (optional): its lines in `iowarden status`, from that saved summary.

Adding a source is one module that defines a spec, one line in SOURCES, its fixture and its tests.
The built-in sources that came before the seam (the diskstats sampler, the settings poller, the XFS
poller, the passive detector) post typed events of their own (daemon/events.py): their values feed
other subsystems (the scheduler, the passive detector, drift), not only /metrics and causes.
"""
from __future__ import annotations

from iowarden.daemon.sources.cgroups import SPEC as CGROUPS
from iowarden.daemon.sources.smart import SPEC as SMART
from iowarden.daemon.sources.spec import SourceSpec
from iowarden.daemon.sources.tracer import SPEC as TRACER

SOURCES: tuple[SourceSpec, ...] = (SMART, TRACER, CGROUPS)
# the source whose reading carries the tails of real I/O (a TraceReading), for the passive tail rule
TAILS_SOURCE: str = TRACER.name
