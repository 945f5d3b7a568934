"""The metrics endpoint under hostile clients, against the daemon as a process.

Clients come from several loopback addresses (127.0.0.2 ...: all of 127/8 is this
machine) so that per-source limits meet more than one source. Every client and
connection is bounded in count and time and closed by the test.
"""
import json
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from base64 import b64encode

import bcrypt
import psutil
import pytest

from iowarden.probes.common import kill_group
from tests.integration.helpers import free_port

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _daemon_with_auth(tmp_path, daemon_factory, rounds=12):
    hashed = bcrypt.hashpw(b"correct horse", bcrypt.gensalt(rounds=rounds)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    port = free_port()
    d = daemon_factory(f"[prometheus]\nlisten_address = \"127.0.0.1:{port}\"\nweb_config_file = \"{web}\"\n"
                       f"[daemon]\nstate_dir = \"{tmp_path / 'state'}\"\nlog_level = \"debug\"\n")
    d.wait_message("READY=1")
    return d, port


def _get(port, user=None, password=None, source="127.0.0.1", timeout=10):
    """(status, seconds) of one GET /metrics from a given loopback source address."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
    t0 = time.monotonic()
    try:
        auth = ""
        if user is not None:
            auth = "Authorization: Basic " + b64encode(f"{user}:{password}".encode()).decode() + "\r\n"
        s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    status = int(data.split(b" ", 2)[1]) if data else 0
    return status, time.monotonic() - t0


def test_unknown_and_known_users_take_the_same_time(tmp_path, daemon_factory):
    d, port = _daemon_with_auth(tmp_path, daemon_factory)
    known, unknown = [], []
    for i in range(4):   # each from a source of its own: under the per-source limit
        status, t = _get(port, "prometheus", f"wrong{i}", source=f"127.0.2.{i + 1}")
        assert status == 401
        known.append(t)
        status, t = _get(port, f"mallory{i}", "whatever", source=f"127.0.3.{i + 1}")
        assert status == 401
        unknown.append(t)
    ratio = statistics.median(unknown) / statistics.median(known)
    print(f"wrong password for a known user: median {statistics.median(known) * 1000:.0f} ms; unknown user: "
          f"{statistics.median(unknown) * 1000:.0f} ms")
    # on main: 0.4 ms against 236 ms, a ratio of ~0.002
    assert 0.5 < ratio < 2.0, (known, unknown)


ATTACKERS = """
import collections, json, socket, sys, threading, time
from base64 import b64encode
port, clients, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
counts = collections.Counter()
counted = threading.Lock()
end = time.monotonic() + seconds

def guess(n):
    i = 0
    while time.monotonic() < end:
        auth = b64encode(f"prometheus:guess-{n}-{i}".encode()).decode()
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(f"127.0.0.{2 + n}", 0))
            try:
                s.sendall(f"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Basic {auth}\\r\\n"
                          f"Connection: close\\r\\n\\r\\n".encode())
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            finally:
                s.close()
            status = data.split(b" ", 2)[1].decode() if data else "0"
        except OSError:
            status = "0"
        with counted:
            counts[status] += 1
        i += 1

threads = [threading.Thread(target=guess, args=(n,)) for n in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(counts))
"""


def test_wrong_passwords_cost_bounded_work_and_a_real_scrape_stays_fast(tmp_path, daemon_factory):
    d, port = _daemon_with_auth(tmp_path, daemon_factory)
    assert _get(port, "prometheus", "correct horse")[0] == 200       # learned once
    # The guessing clients run in a process of their own: threads of this one would hold its interpreter
    # while the correct scrape's answer waits to be read, and the test would time itself, not the daemon.
    attackers = subprocess.Popen([sys.executable, "-c", ATTACKERS, str(port), "8", "17"], stdout=subprocess.PIPE,
                                 text=True, start_new_session=True)
    scrape_seconds = []
    try:
        time.sleep(1.0)   # every guessing client under way
        t_end = time.monotonic() + 15
        while time.monotonic() < t_end:
            status, t = _get(port, "prometheus", "correct horse")
            assert status == 200
            scrape_seconds.append(t)
            time.sleep(0.2)
        out, _ = attackers.communicate(timeout=30)
    finally:
        kill_group(attackers)
        attackers.wait()
    answered = {int(status): n for status, n in json.loads(out).items()}
    # A server that hashed every guess spent a bcrypt check (~0.24 s of a core) on each, and its correct
    # scrapes took up to 1.9 s. The attackers here loop without pause, so the daemon is busy answering
    # them: what is bounded is the hashing they can cause, and the correct scrape must not wait behind them.
    print(f"under 8 guessing clients: {len(scrape_seconds)} correct scrapes, median "
          f"{statistics.median(scrape_seconds) * 1000:.1f} ms, max {max(scrape_seconds) * 1000:.1f} ms; "
          f"guesses answered 401: {answered.get(401, 0)}, 429: {answered.get(429, 0)}, "
          f"503: {answered.get(503, 0)}")
    # A scrape queued behind the guesses' hashing waits for several of them every time; one that is not still
    # meets the busy machine's own pauses now and then (four test workers on two cores: five of 65 scrapes at
    # 0.26-1.4 s, the rest under 0.1 s). So nine scrapes in ten must take under 0.5 s, and the median under 0.2
    p90 = statistics.quantiles(scrape_seconds, n=10)[-1]
    assert p90 < 0.5 and statistics.median(scrape_seconds) < 0.2, sorted(scrape_seconds)[-8:]
    refused = answered.get(429, 0) + answered.get(503, 0)
    assert refused > 10 * answered.get(401, 0)   # nearly every guess refused without a hash
    body = urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Authorization": "Basic " + b64encode(b"prometheus:correct horse").decode()})).read().decode()
    hashes = float(re.search(r"^iowarden_http_auth_hashes_total (\S+)", body, re.M).group(1))
    print(f"bcrypt checks run: {hashes:.0f}")
    assert hashes <= 8 * 5 + 1      # per source: 5 failures in 5 minutes (and the one correct check)


def test_slow_clients_cannot_hold_the_server(tmp_path, daemon_factory):
    port = free_port()
    d = daemon_factory(f"[prometheus]\nlisten_address = \"127.0.0.1:{port}\"\n"
                       f"[daemon]\nstate_dir = \"{tmp_path / 'state'}\"\nlog_level = \"debug\"\n")
    d.wait_message("READY=1")
    slow = []
    try:
        for i in range(300):   # half-sent requests, held open
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(f"127.0.1.{1 + i % 200}", 0))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        times = [_get(port)[1] for _ in range(10)]
        print(f"scrapes beside 300 half-sent requests: max {max(times) * 1000:.1f} ms; daemon threads "
              f"{psutil.Process(d.proc.pid).num_threads()}")
        # a real scrape is not held up (held, it waits out the server's request timeout); one of ten took 1.26 s
        # on the suite's busy two cores, the rest 1-4 ms
        assert max(times) < 3.0 and sorted(times)[5] < 0.5, times
        assert psutil.Process(d.proc.pid).num_threads() < 40  # on main: a thread per slow connection
        # the server closes them after its request timeout (on main: held as long as the client liked)
        deadline = time.monotonic() + 20
        for s in slow:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        for s in slow:
            s.close()


def test_fifty_connections_at_once_are_all_accepted_promptly(tmp_path, daemon_factory):
    port = free_port()
    d = daemon_factory(f"[prometheus]\nlisten_address = \"127.0.0.1:{port}\"\n"
                       f"[daemon]\nstate_dir = \"{tmp_path / 'state'}\"\nlog_level = \"debug\"\n")
    d.wait_message("READY=1")
    barrier = threading.Barrier(50)
    results: list[tuple[int, float]] = []

    def one():
        barrier.wait()
        results.append(_get(port))

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # every one answered: 200, or 503 past the bound of 40 scrapes at once (node_exporter's
    # --web.max-requests); scrapes arriving together share one render, so that is rare
    statuses = [s for s, _ in results]
    print(f"50 at once: {statuses.count(200)} x 200, {statuses.count(503)} x 503, slowest "
          f"{max(t for _, t in results) * 1000:.0f} ms")
    assert set(statuses) <= {200, 503} and statuses.count(200) >= 40, statuses
    # on main: a backlog of 5 left 7-8 of them waiting a 1 s SYN retransmit
    assert max(t for _, t in results) < 0.9, sorted(t for _, t in results)[-5:]
