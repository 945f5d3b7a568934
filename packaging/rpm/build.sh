#!/usr/bin/env bash
# Builds dist/iowarden-VERSION-1.ARCH.rpm with rpmbuild (Debian's `rpm` package provides it).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$(realpath -m "${1:-$src/dist}")
top=$(mktemp -d)
trap 'rm -rf "$top"' EXIT
rpmbuild -bb --nodeps --quiet --define "_topdir $top" --define "srcdir $src" \
    --define "_build_id_links none" "$src/packaging/rpm/iowarden.spec" >/dev/null
mkdir -p "$out"
find "$top/RPMS" -name '*.rpm' -exec cp {} "$out/" \; -printf "$out/%f\n"
