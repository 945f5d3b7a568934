"""/metrics renders once per snapshot version: a frequent scraper never waits for a render, a rare one waits for
a fresh one. The real endpoint on loopback, a registry whose render is slow on purpose. No root."""
import socket
import threading
import time
import urllib.request

from prometheus_client.core import GaugeMetricFamily

from iowarden.daemon.outputs.exposition import Exposition
from iowarden.daemon.outputs.http import STALE_OK_SECONDS, serve
from iowarden.daemon.outputs.web_config import WebConfig

RENDER_SECONDS = 0.3


class _SlowRegistry:
    def __init__(self, published):
        self.published, self.renders, self.lock = published, 0, threading.Lock()

    def register(self, collector):   # the endpoint registers its own counters: not needed here
        pass

    def collect(self):
        with self.lock:
            self.renders += 1
        version = self.published[0][0]
        time.sleep(RENDER_SECONDS)
        g = GaugeMetricFamily("snapshot_version", "the version rendered")
        g.add_metric([], version)
        yield g


def _scrape(port) -> tuple[float, float]:
    t0 = time.monotonic()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    value = float([line for line in body.splitlines() if line.startswith("snapshot_version ")][0].split()[1])
    return value, time.monotonic() - t0


def test_one_render_per_snapshot_and_a_frequent_scraper_never_waits():
    published = [(1, time.monotonic())]
    reg = _SlowRegistry(published)
    with socket.socket() as s:   # a free port on loopback
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    server = serve(f"127.0.0.1:{free}", reg, WebConfig(), version_of_snapshot=lambda: published[0])
    port = server.server_address[1]
    try:
        assert _scrape(port)[0] == 1.0                       # the first scrape waits for the first render
        value, took = _scrape(port)
        assert value == 1.0 and took < RENDER_SECONDS and reg.renders == 1   # same version: its bytes, no render
        published[0] = (2, time.monotonic())                 # the core published the next snapshot just now
        value, took = _scrape(port)
        assert value == 1.0 and took < RENDER_SECONDS        # the one just superseded, without waiting...
        deadline = time.monotonic() + 10 * RENDER_SECONDS   # version 2's render, begun by that scrape, ends
        while reg.renders < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        while _scrape(port)[0] != 2.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _scrape(port)[0] == 2.0 and reg.renders == 2  # ...while version 2 rendered, once
        # a scraper that comes rarely (Prometheus every 15 s): the snapshot it would get was superseded long ago
        published[0] = (3, time.monotonic() - STALE_OK_SECONDS - 1)
        value, took = _scrape(port)
        assert value == 3.0 and took >= RENDER_SECONDS
        published[0] = (5, time.monotonic())                 # two versions on: 3 is not the one just superseded
        value, took = _scrape(port)
        assert value == 5.0 and took >= RENDER_SECONDS and reg.renders == 4
    finally:
        server.shutdown()


def test_a_scrape_that_finds_its_render_already_done_gets_it():
    """Seen as empty answers to 3 of 50 scrapes at once: awaiting a render that is already done does not yield,
    so the scrape read the kept render before the render's own done-callback had run and kept it."""
    import asyncio

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    server = serve(f"127.0.0.1:{free}", _SlowRegistry([(7, 0.0)]), WebConfig(),
                   version_of_snapshot=lambda: (7, time.monotonic() - 10))

    async def scrape_as_the_render_finishes():
        done = server._loop.create_future()
        done.add_done_callback(lambda f: server._keep(7, f))
        server._rendering = (7, done)
        done.set_result(Exposition(["seven\n"]))   # its callback now waits its turn on the loop
        return await server._render(gzipped=False)

    try:
        body = asyncio.run_coroutine_threadsafe(scrape_as_the_render_finishes(), server._loop).result(5)
        assert body == b"seven\n"
    finally:
        server.shutdown()
