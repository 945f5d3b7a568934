#!/usr/bin/env bash
# Lays out iowarden as installed, under DESTDIR, for the .deb and the RPM alike:
#   /usr/lib/iowarden/venv     a virtualenv of Debian's/the distro's python3 with iowarden and the
#                              exact library versions it is tested with (Debian has no influxdb-client)
#   /usr/bin/iowarden          -> the venv's console script
#   UNITDIR/iowarden.service   (/lib/systemd/system on Debian, /usr/lib/systemd/system on RPM systems)
#   /etc/iowarden/config.toml  the example configuration: probes only /var/lib/iowarden
#   /usr/share/iowarden/       Prometheus rules (and their tests), the Grafana dashboard
#   /usr/share/man/man8/iowarden.8.gz   generated from the command line's parser (packaging/manpage.py)
# Usage: stage.sh DESTDIR [UNITDIR]
set -euo pipefail
dest=$(realpath -m "$1")
unitdir=${2:-/lib/systemd/system}
src=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-/usr/bin/python3}
final=/usr/lib/iowarden/venv
venv=$dest$final

rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check "$src"
# Installed in isolation (so what the package holds never depends on the build machine's python3-*
# packages), then allowed to see the system's site-packages after its own: the distro's
# python3-matplotlib (suggested) draws `iowarden characterize`'s plots.
sed -i 's/^include-system-site-packages = false$/include-system-site-packages = true/' "$venv/pyvenv.cfg"
grep -qx 'include-system-site-packages = true' "$venv/pyvenv.cfg"
# The venv was made under DESTDIR: its scripts must name the path it is installed at.
grep -rlI -- "$venv" "$venv/bin" | xargs -r sed -i "s|$venv|$final|g"
rm -rf "$venv"/bin/Activate.ps1
find "$venv" -name __pycache__ -prune -exec rm -rf {} +
# byte-compile now, as root at run time would otherwise leave unpackaged .pyc files behind
"$venv/bin/python" -m compileall -q -d "$final" "$venv/lib" >/dev/null

install -d "$dest/usr/share/man/man8"
"$venv/bin/python" "$src/packaging/manpage.py" | gzip -9n > "$dest/usr/share/man/man8/iowarden.8.gz"

install -d "$dest/usr/bin"
ln -sf ../lib/iowarden/venv/bin/iowarden "$dest/usr/bin/iowarden"
install -D -m 0644 "$src/systemd/iowarden.service" "$dest$unitdir/iowarden.service"
install -D -m 0640 "$src/config.example.toml" "$dest/etc/iowarden/config.toml"
install -D -m 0644 "$src/packaging/prometheus/iowarden.rules.yml" "$dest/usr/share/iowarden/prometheus/iowarden.rules.yml"
install -D -m 0644 "$src/packaging/prometheus/tests/iowarden.rules.test.yml" \
    "$dest/usr/share/iowarden/prometheus/tests/iowarden.rules.test.yml"
install -D -m 0644 "$src/packaging/grafana/iowarden-dashboard.json" "$dest/usr/share/iowarden/grafana/iowarden-dashboard.json"
install -D -m 0644 "$src/README.md" "$dest/usr/share/doc/iowarden/README.md"
install -D -m 0644 "$src/docs/measurements.md" "$dest/usr/share/doc/iowarden/measurements.md"
install -D -m 0644 "$src/docs/detector.md" "$dest/usr/share/doc/iowarden/detector.md"
install -D -m 0644 "$src/docs/runbook.md" "$dest/usr/share/doc/iowarden/runbook.md"
