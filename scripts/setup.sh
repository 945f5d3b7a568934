#!/usr/bin/env bash
# Installs what iowarden needs on a Debian machine: system tools and a venv in .venv.
# Usage: scripts/setup.sh [--test]   (--test adds the reference tools and pytest)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "iowarden setup needs root: it installs Debian packages (fio, xfsprogs, libsystemd-dev, ...)." >&2
    echo "Run it with sudo." >&2
    exit 77
fi

packages=(fio xfsprogs util-linux libsystemd-dev pkg-config gcc python3-venv python3-dev
          bpftrace    # the block-layer tracer ([tracer]); the daemon runs without it
          libbpf1 libbpf-dev bpftool clang-14 llvm-14)   # its compiled engine: scripts/build-bpf.sh
if [ "${1:-}" = "--test" ]; then
    packages+=(sysstat ioping e2fsprogs prometheus prometheus-alertmanager victoria-metrics openssl debootstrap rpm systemd groff-base
               iproute2    # the fleet test's hosts: network namespaces and veth
               libfuse3-3  # the tail test's disk with a weak region (tests/integration/weakfuse.py)
               libfaketime # the clock-step test: a wall clock stepped under the daemon (tests/integration/test_state_dir_and_clock.py)
               libbpf-tools  # bench/tracer_overhead.py: biolatency, the reference for the tracer's cost
               lintian rpmlint binutils)   # the packages' checks; strip
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The lab (tests/lab): QEMU boots Debian's kernel under TCG. Without recommends, which would
# bring a desktop's worth of audio and video libraries for the GUI this never opens.
if [ "${1:-}" = "--test" ]; then
    lab=()
    for p in qemu-system-x86 qemu-utils; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || lab+=("$p")
    done
    if [ ${#lab[@]} -gt 0 ]; then
        echo "installing Debian packages for the lab: ${lab[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${lab[@]}" >/dev/null
    fi
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# the plots extra always: `iowarden characterize` draws its PNGs with matplotlib on the first run
extra="[plots]"
[ "${1:-}" = "--test" ] && extra="[test,plots]"
.venv/bin/pip install -q --disable-pip-version-check -e ".${extra}"
# the compiled tracer's object ([tracer] engine = "compiled"), for this tree
bash scripts/build-bpf.sh
