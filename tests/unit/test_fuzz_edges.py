"""Fuzzing at the edges, property-based, no root:
- random bytes as lines of the mount table and of /proc/diskstats, read through the real readers from a
  fixture tree: the reader never raises, and every well-formed line around the odd ones is read;
- random TOML documents through `iowarden check-config`: it never raises, and exits 0, 1 or 78 only;
- random request bytes against the real metrics server: it answers or closes, and a scrape from another
  source address stays fast.

IOWARDEN_FUZZ_EXAMPLES raises the number of examples (the suite's default is modest).
"""
import contextlib
import io
import math
import os
import socket
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st
from prometheus_client import CollectorRegistry, Gauge

from iowarden.daemon import cli
from iowarden.daemon import config
from iowarden.daemon.probing import discovery
from iowarden.daemon.outputs.http import serve
from iowarden.daemon.outputs.web_config import WebConfig
from iowarden.probes import diskstats
from iowarden.probes.common import Roots

EXAMPLES = int(os.environ.get("IOWARDEN_FUZZ_EXAMPLES", "200"))
junk_line = st.binary(max_size=120).map(lambda b: b.replace(b"\n", b" "))


def _tree(files: dict[str, bytes]) -> tempfile.TemporaryDirectory:
    tmp = tempfile.TemporaryDirectory()
    for rel, data in files.items():
        p = Path(tmp.name) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return tmp


GOOD_MOUNTS = [b"/dev/loop0 /srv/a xfs rw,relatime 0 0", b"/dev/loop1 /srv/with\rcr ext4 rw 0 0",
               b"/dev/loop2 /srv/sp\\040ace xfs ro 0 0"]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(junk_line, max_size=8), st.permutations(range(3)))
def test_random_mount_table_lines_cost_only_themselves(junk, order):
    lines = [GOOD_MOUNTS[i] for i in order]
    for i, j in enumerate(junk):
        lines.insert(i % (len(lines) + 1), j)
    with _tree({"proc/self/mounts": b"\n".join(lines) + b"\n"}) as base:
        mounts = {m[1]: m for m in discovery.read_mounts(Roots.under(base))}
    assert mounts.get("/srv/a", (None,))[:3] == ("/dev/loop0", "/srv/a", "xfs") or \
        any(j.split(b" ")[1:2] == [b"/srv/a"] for j in junk)     # a junk line mounted over it is its own business
    assert "/srv/with\rcr" in mounts or any(b"/srv/with\rcr" in j for j in junk)
    assert mounts.get("/srv/sp ace", (None,) * 4)[3] is True or any(b"/srv/sp" in j for j in junk)


GOOD_DISKSTATS = [b"   8       0 sda 10 0 80 5 20 0 160 9 0 14 14 0 0 0 0 3 1",
                  b" 259       0 nvme0n1 1 2 3 4 5 6 7 8 0 9 10 11 12 13 14 15 16",
                  b"   7       0 loop0 1 0 2 0 0 0 0 0 0 1 0"]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(junk_line, max_size=8))
def test_random_diskstats_lines_cost_only_themselves(junk):
    lines = list(GOOD_DISKSTATS)
    for i, j in enumerate(junk):
        lines.insert(i % (len(lines) + 1), j)
    with _tree({"proc/diskstats": b"\n".join(lines) + b"\n"}) as base:
        sample = diskstats.read(Roots.under(base))
    names = {j.split()[2] for j in junk if len(j.split()) > 2}
    for want in ("sda", "nvme0n1", "loop0"):
        assert want in sample.counters or want.encode() in names


# --- random TOML documents -----------------------------------------------------------------------

_KEYS = sorted({k for s in config.SECTIONS.values() for k in s} | set(config.PROFILE_KEYS) | set(config.TARGET_KEYS)
               | {"x", "", "a.b", "名前"})
_SECTIONS = sorted(set(config.SECTIONS) | {"profiles", "targets", "discover", "bogus"})
scalars = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.text(max_size=30), st.sampled_from(["1e10", "4k", "//etc", "/dev/zero", "-1", "randread"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=12)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}" for c in v) + '"'


def _key(k: str) -> str:
    return k if k and all(c.isalnum() or c in "_-" for c in k) and k.isascii() else _toml_value(k)


documents = st.lists(st.tuples(st.sampled_from(_SECTIONS), st.booleans(),
                               st.lists(st.tuples(st.sampled_from(_KEYS), values), max_size=6)), max_size=6)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(documents, st.binary(max_size=40))
def test_check_config_on_random_documents_exits_0_1_or_78_and_never_raises(doc, tail):
    text = ""
    for section, array, pairs in doc:
        text += f"[[{section}]]\n" if array else f"[{section}]\n"
        text += "".join(f"{_key(k)} = {_toml_value(v)}\n" for k, v in pairs)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.toml"
        path.write_bytes(text.encode() + tail)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["check-config", "-c", str(path)])
    # 1: valid, but a target cannot be probed on this host (its path is missing or read-only)
    assert code in (0, 1, 78), (code, err.getvalue()[:500])
    if code in (1, 78):
        assert err.getvalue().startswith(str(path)), err.getvalue()[:300]


# --- random request bytes against the real server ----------------------------------------------------

class _Server:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=False)
        Gauge("fuzz_up", "up", registry=self.registry).set(1)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = serve(f"127.0.0.1:{self.port}", self.registry, WebConfig())


_SERVER = None


def _server():
    global _SERVER
    if _SERVER is None:
        _SERVER = _Server()
    return _SERVER


def teardown_module():
    if _SERVER is not None:
        _SERVER.server.shutdown()


def _scrape(port) -> tuple[bytes, float]:
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.1", 0)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data, time.monotonic() - t0


requests = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda m, p, v, h, b: m + b" " + p + b" " + v + b"\r\n" + h + b"\r\n" + b,
              st.sampled_from([b"GET", b"HEAD", b"POST", b"get", b"GET\x00", b""]),
              st.sampled_from([b"/metrics", b"/", b"/x", b"*", b"/metrics?x=\xff", b""]),
              st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/9", b""]),
              st.lists(st.sampled_from([b"Content-Length: 5\r\n", b"Transfer-Encoding: chunked\r\n",
                                        b"Connection: keep-alive\r\n", b"Host: \xff\r\n", b"X: " + b"a" * 20000 + b"\r\n",
                                        b"Accept-Encoding: gzip\r\n", b": empty\r\n"]), max_size=4).map(b"".join),
              st.binary(max_size=60)))


@settings(max_examples=max(40, EXAMPLES // 4), deadline=None, suppress_health_check=list(HealthCheck))
@given(requests)
def test_random_requests_are_answered_or_closed_and_a_scrape_elsewhere_stays_fast(raw):
    srv = _server()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=15, source_address=("127.0.0.9", 0)) as s:
        try:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)   # nothing more is coming: the server must answer or close now
            got = b""
            while chunk := s.recv(65536):
                got += chunk
        except (ConnectionResetError, BrokenPipeError):
            got = b""
    assert got == b"" or got.startswith(b"HTTP/1.1 "), got[:200]
    data, took = _scrape(srv.port)
    assert data.startswith(b"HTTP/1.1 200 ") and b"fuzz_up 1.0" in data
    assert took < 1.0, took
