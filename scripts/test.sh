#!/usr/bin/env bash
# Installs the test needs and runs the whole test suite (slow end-to-end tests included).
#
# With no arguments: everything but the tests marked `alone` on IOWARDEN_TEST_WORKERS (default 4) pytest-xdist
# workers at once (most of the suite's time is waiting on daemons, probes, windows and the lab's guest, which runs
# side by side for free), then the `alone` tests by themselves. With arguments: pytest with exactly those, on the
# machine's cores (`bash scripts/test.sh tests/unit`; `-n 0` for one process).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh needs root: it installs Debian packages (fio, xfsprogs, sysstat, ioping)," >&2
    echo "and the tests attach loop devices and mount XFS images. Run: sudo bash scripts/test.sh" >&2
    exit 77
fi
began=$(date +%s)
bash scripts/setup.sh --test
echo "== setup: $(( $(date +%s) - began )) s"
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
# one run id for both invocations: what either leaves behind is named by it (tests/conftest.py RUN_ID)
export IOWARDEN_TEST_RUN="${IOWARDEN_TEST_RUN:-$(date +%m%d-%H%M%S)-$$}"
side_by_side=0
t0=$(date +%s)
# pyproject's addopts: loadgroup (the lab's tests share one guest, so one worker runs them all: tests/conftest.py),
# in the suite's own order (longest first), not xdist's reordering by group size
.venv/bin/python -m pytest -n "${IOWARDEN_TEST_WORKERS:-4}" -m "not alone" || side_by_side=$?
t1=$(date +%s)
alone=0
if [ "$side_by_side" -le 1 ]; then   # 2 and above: interrupted, or the run itself broke
    .venv/bin/python -m pytest -n 0 -m alone || alone=$?
fi
t2=$(date +%s)
echo "== side by side: $(( t1 - t0 )) s (exit $side_by_side); alone: $(( t2 - t1 )) s (exit $alone);" \
     "the whole command: $(( t2 - began )) s"
[ "$side_by_side" = 0 ] && [ "$alone" = 0 ]
