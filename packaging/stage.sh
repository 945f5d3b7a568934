#!/usr/bin/env bash
# Lays out iowarden as installed, under DESTDIR, for the .deb and the RPM alike:
#   /usr/lib/iowarden/venv     a virtualenv of Debian's/the distro's python3 with iowarden and the
#                              exact library versions it is tested with (Debian's are older or absent)
#   /usr/bin/iowarden          -> the venv's console script
#   UNITDIR/iowarden.service   (/lib/systemd/system on Debian, /usr/lib/systemd/system on RPM systems)
#   /etc/iowarden/config.toml  the example configuration: probes only /var/lib/iowarden
#   /usr/share/iowarden/       Prometheus rules (and their tests), the Grafana dashboard
#   /usr/share/man/man8/iowarden.8.gz   generated from the command line's parser (packaging/manpage.py)
#   /usr/lib/iowarden/blockstage.bpf.o  the compiled tracer, a CO-RE object built here (scripts/build-bpf.sh)
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
# pip builds in the tree it is given (build/, *.egg-info): it gets a copy of what the package is made of, so two
# builds at once (the test suite's lab and packaging tests) and the developer's own tree never share a build
pkgsrc=$(mktemp -d)
trap 'rm -rf "$pkgsrc"' EXIT
cp -a "$src/pyproject.toml" "$src/README.md" "$src/daemon" "$src/probes" "$pkgsrc/"
find "$pkgsrc" -name __pycache__ -prune -exec rm -rf {} +
"$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check "$pkgsrc"
# Installed in isolation (so what the package holds never depends on the build machine's python3-*
# packages), then allowed to see the system's site-packages after its own: the distro's
# python3-matplotlib (suggested) draws `iowarden characterize`'s plots.
sed -i 's/^include-system-site-packages = false$/include-system-site-packages = true/' "$venv/pyvenv.cfg"
grep -qx 'include-system-site-packages = true' "$venv/pyvenv.cfg"
# The venv was made under DESTDIR: its scripts must name the path it is installed at.
grep -rlI -- "$venv" "$venv/bin" | xargs -r sed -i "s|$venv|$final|g"
rm -rf "$venv"/bin/Activate.ps1
# pip and setuptools built the venv; the installed program never runs them
"$venv/bin/python" -m pip uninstall -q -y --disable-pip-version-check pip setuptools >/dev/null
find "$venv" -name __pycache__ -prune -exec rm -rf {} +
# the libraries' own test suites (systemd-python's systemd/test, psutil's psutil/tests): nothing runs them here
find "$venv"/lib/python3*/site-packages -mindepth 2 -maxdepth 2 -type d \( -name test -o -name tests \) \
    -prune -exec rm -rf {} +
# the libraries' compiled extensions without their symbols (as dh_strip and RPM's brp-strip do)
find "$venv" -name '*.so' -type f -exec strip --strip-unneeded {} +
# nothing in site-packages is run as a program: no execute bits (a wheel's tests sometimes carry them)
find "$venv/lib" -type f -perm /111 ! -name '*.so' -exec chmod a-x {} +
if [ "${BYTECOMPILE:-1}" = 1 ]; then
    # byte-compile now, as root at run time would otherwise leave unpackaged .pyc files behind (the RPM);
    # the .deb compiles in postinst instead, as Debian's policy asks
    "$venv/bin/python" -m compileall -q -d "$final" "$venv/lib" >/dev/null
fi

# the tracer's compiled engine ([tracer] engine): built from its source, not taken from the tree, whose
# object may be stale; it is data for the kernel's verifier, loaded through libbpf (recommended)
bash "$src/scripts/build-bpf.sh" "$dest/usr/lib/iowarden/blockstage.bpf.o" >/dev/null

install -d "$dest/usr/share/man/man8"
"$venv/bin/python" "$src/packaging/manpage.py" | gzip -9n > "$dest/usr/share/man/man8/iowarden.8.gz"

install -d "$dest/usr/bin"
ln -sf ../lib/iowarden/venv/bin/iowarden "$dest/usr/bin/iowarden"
install -D -m 0644 "$src/systemd/iowarden.service" "$dest$unitdir/iowarden.service"
install -D -m 0640 "$src/config.example.toml" "$dest/etc/iowarden/config.toml"
install -D -m 0644 "$src/packaging/prometheus/iowarden.rules.yml" "$dest/usr/share/iowarden/prometheus/iowarden.rules.yml"
install -D -m 0644 "$src/packaging/prometheus/tests/iowarden.rules.test.yml" \
    "$dest/usr/share/iowarden/prometheus/tests/iowarden.rules.test.yml"
install -D -m 0644 "$src/packaging/prometheus/iowarden.fleet.rules.yml" \
    "$dest/usr/share/iowarden/prometheus/iowarden.fleet.rules.yml"
install -D -m 0644 "$src/packaging/prometheus/tests/iowarden.fleet.rules.test.yml" \
    "$dest/usr/share/iowarden/prometheus/tests/iowarden.fleet.rules.test.yml"
install -D -m 0644 "$src/packaging/grafana/iowarden-dashboard.json" "$dest/usr/share/iowarden/grafana/iowarden-dashboard.json"
install -D -m 0644 "$src/README.md" "$dest/usr/share/doc/iowarden/README.md"
install -D -m 0644 "$src/docs/measurements.md" "$dest/usr/share/doc/iowarden/measurements.md"
install -D -m 0644 "$src/docs/detector.md" "$dest/usr/share/doc/iowarden/detector.md"
install -D -m 0644 "$src/docs/runbook.md" "$dest/usr/share/doc/iowarden/runbook.md"
install -D -m 0644 "$src/packaging/copyright" "$dest/usr/share/doc/iowarden/copyright"
# a native package's changelog (Debian policy 12.7), from the version and the last commit's date
version=${VERSION:-$(/usr/bin/python3 -c "import tomllib; print(tomllib.load(open('$src/pyproject.toml', 'rb'))['project']['version'])")}
when=$(git -C "$src" log -1 --format=%cD 2>/dev/null || date -R)
printf 'iowarden (%s) unstable; urgency=medium\n\n  * Release %s: see README.md.\n\n -- %s  %s\n' \
    "$version" "$version" "${MAINTAINER:-iowarden developers <iowarden@iowarden.invalid>}" "$when" \
    | gzip -9n > "$dest/usr/share/doc/iowarden/changelog.gz"
