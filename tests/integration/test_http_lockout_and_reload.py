"""No anonymous client can lock out an authenticated one, and a reload
applies the endpoint's new address and auth or says it refused them. The daemon as a process; clients
from loopback addresses of their own (all of 127/8 is this machine), each bounded in count and time and
closed by the test."""
import selectors
import signal
import socket
import threading
import time
from base64 import b64encode

import bcrypt
import pytest

from tests.integration.helpers import free_port, wait_for
from tests.integration.test_http_hostile_clients import _get

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _auth_config(tmp_path, port, rounds=12):
    hashed = bcrypt.hashpw(b"correct horse", bcrypt.gensalt(rounds=rounds)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    return (f"[prometheus]\nlisten_address = \"127.0.0.1:{port}\"\nweb_config_file = \"{web}\"\n"
            f"[daemon]\nstate_dir = \"{tmp_path / 'state'}\"\nlog_level = \"info\"\n"
            "[sampler]\ndevices = [\"iowarden-none\"]\n[tracer]\nenabled = false\n[smart]\nenabled = false\n")


class Holders:
    """`per_source` connections from each of `sources` addresses that never send a byte, re-opened as the
    server closes them: every place they can get, held."""

    def __init__(self, port, sources, per_source):
        self.port, self.sources, self.per_source = port, sources, per_source
        self.sel = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.opened = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, source):
        s = socket.socket()
        s.setblocking(False)
        s.bind((source, 0))
        s.connect_ex(("127.0.0.1", self.port))
        self.sel.register(s, selectors.EVENT_READ, source)
        self.opened += 1

    def _run(self):
        for source in self.sources:
            for _ in range(self.per_source):
                self._open(source)
        reopen: list[tuple[float, str]] = []   # a closed place is taken again 50 ms later, not in a tight loop
        while not self.stop.is_set():
            now = time.monotonic()
            while reopen and reopen[0][0] <= now:
                self._open(reopen.pop(0)[1])
            for key, _ in self.sel.select(0.02):
                try:
                    data = key.fileobj.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.sel.unregister(key.fileobj)
                    key.fileobj.close()
                    reopen.append((time.monotonic() + 0.05, key.data))
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()
        self.sel.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def test_nine_sources_of_64_anonymous_connections_and_a_rotating_bcrypt_flood_cannot_keep_out_the_scraper(
        tmp_path, daemon_factory):
    """Landed code: the scraper with the right password was refused 26 times of 26 over 130 s (every place
    held), and, after a restart, answered 503 thirty times of thirty (the hash queue flooded)."""
    port = free_port()
    d = daemon_factory(_auth_config(tmp_path, port))
    d.wait_message("READY=1")
    stop = threading.Event()
    heard: dict[str, int] = {}
    flood_sources = [[f"127.0.4.{2 * k + i + 1}" for i in range(2)] for k in range(12)]

    def flood(sources):   # one wrong password in flight per thread, rotating over its addresses
        i = 0
        while not stop.is_set():
            source = sources[i % len(sources)]
            i += 1
            try:
                status, _ = _get(port, "prometheus", f"guess{i}", source=source, timeout=10)
            except OSError:
                continue
            if status == 401:
                heard[source] = heard.get(source, 0) + 1

    threads = [threading.Thread(target=flood, args=(group,), daemon=True) for group in flood_sources]
    scrapes: list[tuple[int, float]] = []
    with Holders(port, [f"127.0.5.{i + 1}" for i in range(9)], 64) as holders:
        for t in threads:
            t.start()
        try:
            # the flood's every address answered once (its first check is the one FairHasher cannot refuse). Eight
            # minutes: with four test workers on the two cores, 24 first checks took over two (their hashes queue
            # behind each other, and each address is refused 503 until its turn), and beside a soak as well, over
            # four; the scraper's share is asserted after, so a slow start costs time, not the test's meaning
            wait_for(lambda: len(heard) == 24, timeout=480, what="every flooding address heard once")
            wait_for(lambda: holders.opened >= 9 * 64, what="the anonymous connections opened")
            for _ in range(30):
                scrapes.append(_get(port, "prometheus", "correct horse", timeout=10))
                time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join(15)
    statuses = [s for s, _ in scrapes]
    slowest = max(t for _, t in scrapes)
    typical = sorted(t for _, t in scrapes)[len(scrapes) // 2]
    print(f"scraper beside 9 x 64 anonymous connections and 12 guesses in flight: {statuses.count(200)} of "
          f"{len(scrapes)} answered 200, first {scrapes[0][1] * 1000:.0f} ms (a bcrypt check), slowest "
          f"{slowest * 1000:.0f} ms; anonymous connections opened {holders.opened}, wrong passwords hashed "
          f"{sum(heard.values())}")
    assert statuses == [200] * 30, statuses
    # kept out would be refusals, or waits at Prometheus's 10 s scrape timeout. The times are taken in this
    # process, whose 13 flooding and holding threads share its interpreter with the scraper, on two cores the
    # suite's lanes keep 80-90 % busy: a median of 0.75 s and one scrape of 8.9 s were seen there with every
    # answer a 200. What must hold is that every scrape lands inside the timeout, and most far inside it
    assert typical < 2.0 and slowest < 10.0, sorted(t for _, t in scrapes)[-3:]


def test_sighup_with_basic_auth_and_a_new_port_moves_the_endpoint_and_protects_it(tmp_path, daemon_factory):
    """Landed code: 'configuration reloaded' while the old port went on serving /metrics without auth and the
    new one stayed closed."""
    old_port, new_port = free_port(), free_port()
    plain = (f"[prometheus]\nlisten_address = \"127.0.0.1:{old_port}\"\n"
             f"[daemon]\nstate_dir = \"{tmp_path / 'state'}\"\nlog_level = \"info\"\n"
             "[sampler]\ndevices = [\"iowarden-none\"]\n[tracer]\nenabled = false\n[smart]\nenabled = false\n")
    d = daemon_factory(plain)
    d.wait_message("READY=1")
    assert _get(old_port)[0] == 200
    d.cfg.write_text(_auth_config(tmp_path, new_port, rounds=4))
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in d.output(), what="the reload")
    assert "except [prometheus]" not in d.output()
    assert _get(new_port)[0] == 401 and _get(new_port, "prometheus", "correct horse")[0] == 200
    with pytest.raises(OSError):
        _get(old_port, timeout=2)


def test_a_reload_naming_a_port_in_use_keeps_the_old_endpoint_and_says_so(tmp_path, daemon_factory):
    port = free_port()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        text = (f"[prometheus]\nlisten_address = \"127.0.0.1:{port}\"\n"
                f"[daemon]\nstate_dir = \"{tmp_path / 'state'}\"\nlog_level = \"info\"\n"
                "[sampler]\ndevices = [\"iowarden-none\"]\n[tracer]\nenabled = false\n[smart]\nenabled = false\n")
        d = daemon_factory(text)
        d.wait_message("READY=1")
        d.cfg.write_text(text.replace(f":{port}\"", f":{busy.getsockname()[1]}\""))
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "configuration reloaded" in d.output(), what="the reload")
        out = d.output()
        assert "the metrics endpoint keeps its address, TLS and auth as they were: cannot serve on" in out, out
        assert "except [prometheus]" in out
        assert _get(port)[0] == 200
        # and a later reload with the old section is no change at all
        d.cfg.write_text(text)
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: d.output().count("configuration reloaded") == 2, what="the second reload")
        assert _get(port)[0] == 200
    finally:
        busy.close()


def test_an_authenticated_scrape_keeps_its_connection_and_an_anonymous_one_is_closed_after_401(tmp_path,
                                                                                             daemon_factory):
    port = free_port()
    d = daemon_factory(_auth_config(tmp_path, port, rounds=4))
    d.wait_message("READY=1")
    good = "Authorization: Basic " + b64encode(b"prometheus:correct horse").decode() + "\r\n"
    for auth, closed in (("", True), (good, False)):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
            data = b""
            while b"\r\n\r\n" not in data:
                data += s.recv(65536)
            head = data.split(b"\r\n\r\n")[0].decode()
            assert ("Connection: close" in head) == closed, head
        finally:
            s.close()


def test_users_whose_hashes_differ_in_cost_are_not_told_apart_by_timing(tmp_path, daemon_factory):
    """A cost-4 user's wrong password once answered in 3-9 ms, a cost-12 (or unknown) one in 260-380 ms: the
    users a password file holds could be told apart by how fast a wrong password is refused. Now every check
    does the costliest hash's work, and the medians stay within 1.5x of each other."""
    import statistics
    port = free_port()
    cheap = bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4)).decode()
    dear = bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=12)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  cheap: '{cheap}'\n  dear: '{dear}'\n")
    d = daemon_factory(f"[prometheus]\nlisten_address = \"127.0.0.1:{port}\"\nweb_config_file = \"{web}\"\n"
                       f"[daemon]\nstate_dir = \"{tmp_path / 'state'}\"\nlog_level = \"info\"\n"
                       "[sampler]\ndevices = [\"iowarden-none\"]\n[tracer]\nenabled = false\n[smart]\nenabled = false\n")
    d.wait_message("READY=1")
    times = {"cheap": [], "dear": [], "nobody": []}
    users = list(times)
    # eight rounds, the order turned each round: with four in a fixed order, whichever user came last in a
    # round met the busy machine's bursts more often (877 ms against 505 ms beside two fio jobs), though
    # every check does the same cost-12 work
    for i in range(8):   # each from a source of its own: under the per-source limit
        for k, user in enumerate(users[i % 3:] + users[:i % 3]):
            status, t = _get(port, user, f"wrong{i}", source=f"127.0.6.{4 * i + k + 1}")
            assert status == 401
            times[user].append(t)
    med = {u: statistics.median(ts) for u, ts in times.items()}
    print("median answer to a wrong password: " + ", ".join(f"{u} {m * 1000:.0f} ms" for u, m in med.items()))
    assert max(med.values()) / min(med.values()) < 1.5, med
