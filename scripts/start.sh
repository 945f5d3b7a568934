#!/usr/bin/env bash
# Installs iowarden and its tools, then runs it on config.example.toml in the foreground.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "iowarden needs root: it installs Debian packages, reads block devices and /dev/cpu_dma_latency," >&2
    echo "and probes /var/lib/iowarden. Run: sudo bash scripts/start.sh" >&2
    exit 77
fi
bash scripts/setup.sh
mkdir -p /var/lib/iowarden
exec .venv/bin/iowarden run -c config.example.toml "$@"
