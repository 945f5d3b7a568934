#!/usr/bin/env bash
# Installs the test needs and runs the whole test suite (slow end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh needs root: it installs Debian packages (fio, xfsprogs, sysstat, ioping)," >&2
    echo "and the tests attach loop devices and mount XFS images. Run: sudo bash scripts/test.sh" >&2
    exit 77
fi
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest "$@"
