#!/usr/bin/env bash
# Builds dist/iowarden_VERSION_ARCH.deb with dpkg-deb around packaging/stage.sh.
# Why not a debian/ directory and dpkg-buildpackage: the package carries its own
# venv (the exact library versions it is tested with), which debhelper would fight (dh_strip,
# dh_python3 rewriting shebangs); a plain dpkg-deb of a staged tree is honest about that.
# Usage: packaging/deb/build.sh [OUTDIR]
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$(realpath -m "${1:-$src/dist}")
version=${VERSION:-$(/usr/bin/python3 -c "import tomllib; print(tomllib.load(open('$src/pyproject.toml', 'rb'))['project']['version'])")}
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
chmod 0755 "$stage"   # it becomes /: mktemp made it 0700
trap 'rm -rf "$stage"' EXIT

# no byte-code in the package: postinst compiles it (Debian policy 6.6), prerm removes it
BYTECOMPILE=0 bash "$src/packaging/stage.sh" "$stage" /lib/systemd/system
install -D -m 0644 "$src/packaging/deb/lintian-overrides" "$stage/usr/share/lintian/overrides/iowarden"
install -d -m 0755 "$stage/DEBIAN"
for script in postinst prerm postrm; do
    install -m 0755 "$src/packaging/deb/$script" "$stage/DEBIAN/$script"
done
echo /etc/iowarden/config.toml > "$stage/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
pyver=$(/usr/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
cat > "$stage/DEBIAN/control" <<CONTROL
Package: iowarden
Version: $version
Architecture: $arch
Maintainer: ${MAINTAINER:-iowarden developers <iowarden@iowarden.invalid>}
Installed-Size: $size
Depends: python$pyver, python3 (>= $pyver), python3 (<< ${pyver%.*}.$((${pyver#*.} + 1))), libc6 (>= 2.17), fio, xfsprogs, procps, libsystemd0, init-system-helpers (>= 1.52)
Recommends: sysstat, smartmontools, libbpf1, bpftrace
Suggests: python3-matplotlib
Section: admin
Priority: optional
Description: storage health daemon: fio probes, iostat -x, XFS, settings drift, baselines
 iowarden runs small, safe fio probes on a schedule within a per-disk budget,
 samples /proc/diskstats every second and computes what iostat -x shows,
 tracks XFS fragmentation, block-queue settings, C-states, PM QoS and tuned,
 learns each volume's normal and alerts when it becomes slower, naming the
 likely cause. Prometheus metrics on port 29110, InfluxDB 2 writes, journal
 logs.
CONTROL
mkdir -p "$out"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$out/iowarden_${version}_${arch}.deb" >/dev/null
echo "$out/iowarden_${version}_${arch}.deb"
