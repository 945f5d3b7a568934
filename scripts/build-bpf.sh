#!/usr/bin/env bash
# Builds the compiled tracer ([tracer] engine = "compiled"): probes/bpf/blockstage.bpf.o from blockstage.bpf.c.
# CO-RE: the object is relocated by libbpf at load against the running kernel's BTF, so one build serves every
# kernel with BTF; vmlinux.h (the kernel's types) comes from this machine's and is not kept.
# Needs clang-14, llvm-14 (llvm-strip), libbpf-dev and bpftool (scripts/setup.sh installs them), and a build
# machine whose kernel has BTF (its types are the ones CO-RE relocates from, not a bound on where it loads).
# Usage: build-bpf.sh [OUTPUT]   (default probes/bpf/blockstage.bpf.o; the packages give /usr/lib/iowarden's)
set -euo pipefail
out=$(realpath -m "${1:-$(dirname "$0")/../probes/bpf/blockstage.bpf.o}")
cd "$(dirname "$0")/.."
case "$(uname -m)" in
    x86_64) arch=x86 ;;
    aarch64) arch=arm64 ;;
    *) echo "build-bpf: no BPF target for $(uname -m)" >&2; exit 1 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bpftool btf dump file /sys/kernel/btf/vmlinux format c > "$work/vmlinux.h"
clang-14 -O2 -g -target bpf -D__TARGET_ARCH_$arch -I"$work" -c probes/bpf/blockstage.bpf.c -o "$work/blockstage.bpf.o"
llvm-strip-14 -g "$work/blockstage.bpf.o"   # the DWARF only: the BTF that CO-RE needs stays
install -D -m 0644 "$work/blockstage.bpf.o" "$out"
echo "built $out"
