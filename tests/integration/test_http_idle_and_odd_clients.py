"""The metrics endpoint against idle, hostile and odd clients,
against the daemon as a process. The hostile client is one loopback address (127.0.0.9), the honest
scraper another (127.0.0.1); every socket the test opens is closed by it.
"""
import resource
import socket
import statistics
import ssl
import subprocess
import time

import psutil
import pytest

from tests.integration.helpers import free_port
from tests.integration.test_http_hostile_clients import _get

pytestmark = [pytest.mark.root, pytest.mark.slow]

HOSTILE = "127.0.0.9"


@pytest.fixture
def many_fds():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 16384), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _cert(tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "s.key"),
                    "-out", str(tmp_path / "s.crt"), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {tmp_path}/s.crt\n  key_file: {tmp_path}/s.key\n")
    return web


def _daemon(tmp_path, daemon_factory, web=None):
    port = free_port()
    d = daemon_factory(f"[prometheus]\nlisten_address = \"127.0.0.1:{port}\"\n"
                       + (f"web_config_file = \"{web}\"\n" if web else "")
                       + f"[daemon]\nstate_dir = \"{tmp_path / 'state'}\"\nlog_level = \"info\"\n")
    d.wait_message("READY=1")
    return d, port


def _open_idle(port, n, source=HOSTILE):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.bind((source, 0))
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    return socks


def _tls_scrape(port, ca):
    ctx = ssl.create_default_context(cafile=str(ca))
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.1", 0)) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    return int(data.split(b" ", 2)[1]), time.monotonic() - t0


def test_4000_idle_tls_connections_from_one_source_cost_little_and_others_are_served(tmp_path, daemon_factory,
                                                                                      many_fds):
    web = _cert(tmp_path)
    d, port = _daemon(tmp_path, daemon_factory, web)
    proc = psutil.Process(d.proc.pid)
    rss_before = proc.memory_info().rss
    socks = _open_idle(port, 4000)
    try:
        peak_rss, peak_fds, times = rss_before, 0, []
        for _ in range(12):   # 25 s held, as the attack: a scrape from elsewhere every 2 s
            status, took = _tls_scrape(port, tmp_path / "s.crt")
            assert status == 200
            times.append(took)
            peak_rss = max(peak_rss, proc.memory_info().rss)
            peak_fds = max(peak_fds, proc.num_fds())
            time.sleep(2.0)
        limit_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        print(f"4000 idle TLS connections from {HOSTILE}: RSS {rss_before / 1e6:.0f} -> peak {peak_rss / 1e6:.0f} MB, "
              f"peak fds {peak_fds}; 12 scrapes from 127.0.0.1: slowest {max(times) * 1000:.0f} ms")
        # without a cap per source: 651 MB and 2,013 fds at 2,000; 4,096 fds and 13 of 30 scrapes failed at 4,300
        assert peak_rss < 100e6 + rss_before, peak_rss
        assert peak_fds < 700, peak_fds          # 64 from the hostile source at most, and the daemon's own
        # Served as usual, and never near Prometheus' 10 s scrape timeout: the first scrape meets the daemon
        # still turning away the flood's backlog, and a machine busy with other work stretches any one of them
        # (1.05 s once beside the rest of the suite), so the bound on the slowest has room.
        assert statistics.median(times) < 0.25, times
        assert max(times) < 3.0, times
        assert peak_fds < limit_nofile
    finally:
        for s in socks:
            s.close()
    out = d.output()
    assert "Too many open files" not in out
    assert out.count("\n") < 200, out[-3000:]   # unguarded: 17,646 log lines


def test_2000_idle_plain_connections_from_one_source_lock_nobody_out(tmp_path, daemon_factory, many_fds):
    d, port = _daemon(tmp_path, daemon_factory)
    socks = _open_idle(port, 2000)
    try:
        time.sleep(1.0)
        results = [_get(port, source="127.0.0.1", timeout=5) for _ in range(10)]
        # unguarded, the daemon kept 511 of them and reset every other scrape
        assert [s for s, _ in results] == [200] * 10
        assert max(t for _, t in results) < 1.0
        assert psutil.Process(d.proc.pid).num_fds() < 300
    finally:
        for s in socks:
            s.close()


def test_a_new_connection_must_send_its_request_whole_within_10_s(tmp_path, daemon_factory):
    d, port = _daemon(tmp_path, daemon_factory)
    s = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(HOSTILE, 0))
    try:
        t0 = time.monotonic()
        closed_at = None
        for ch in b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n":   # one byte a second: 34 s for the whole request
            try:
                s.sendall(bytes([ch]))
            except OSError:
                closed_at = time.monotonic() - t0
                break
            time.sleep(1.0)
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    closed_at = time.monotonic() - t0
                    break
            except BlockingIOError:
                pass
            except OSError:
                closed_at = time.monotonic() - t0
                break
            finally:
                s.setblocking(True)
        # unguarded: answered 200 after 34 s (the 60 s keep-alive timeout held the first request line)
        assert closed_at is not None and closed_at < 13, closed_at
    finally:
        s.close()


def test_a_get_with_a_body_is_refused_and_its_body_never_read_as_a_request(tmp_path, daemon_factory):
    d, port = _daemon(tmp_path, daemon_factory)
    smuggled = b"GET /nothing-here HTTP/1.1\r\nHost: x\r\n\r\n"
    req = (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(smuggled)).encode() + b"\r\n\r\n"
           + smuggled)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(req)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    # unguarded: "200 OK ... HTTP/1.1 404" on one connection
    assert data.startswith(b"HTTP/1.1 400 ") and data.count(b"HTTP/1.1 ") == 1, data[:300]
    assert _get(port)[0] == 200
