"""/metrics is watched like every part: its loop runs on a thread of its own, so a part of the
registry checks that the thread lives and its loop answers; a dead endpoint is counted as the part's error
and started again. The real endpoint on loopback, no root."""
import socket
import threading
import time
import urllib.request

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from iowarden.daemon.outputs.http import serve
from iowarden.daemon.outputs.web_config import WebConfig
from iowarden.daemon.outputs.wiring import watch_endpoint
from iowarden.daemon.registry import Registry


class One:
    def describe(self):
        return []

    def collect(self):
        g = GaugeMetricFamily("iowarden_up_for_the_test", "1")
        g.add_metric([], 1)
        yield g


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port):
    reg = CollectorRegistry(auto_describe=False)
    reg.register(One())
    return serve(f"127.0.0.1:{port}", reg, WebConfig(), version_of_snapshot=lambda: (1, time.monotonic()))


def served(port) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return b"iowarden_up_for_the_test 1.0" in r.read()
    except OSError:
        return False


def test_a_dead_endpoint_is_counted_and_started_again_by_its_watch():
    port = free_port()
    holder = {"server": start(port)}

    def watch():
        holder["server"], problem = watch_endpoint(holder["server"], lambda: start(port), 2.0)
        if problem:
            raise RuntimeError(problem)

    registry, stop = Registry(), threading.Event()
    registry.add("metrics-endpoint", 0.2, 5.0, watch, vital=True)
    registry.start(stop)
    try:
        assert served(port)
        time.sleep(0.5)
        assert registry.stats()["metrics-endpoint"].errors_total == 0   # alive and answering: no error
        holder["server"].shutdown()          # the endpoint's thread ends (as an escaped fault would end it)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and registry.stats()["metrics-endpoint"].errors_total == 0:
            time.sleep(0.05)
        stats = registry.stats()["metrics-endpoint"]
        assert stats.errors_total == 1 and "the metrics endpoint was down (its thread has ended)" in stats.last_error
        assert served(port)                  # started again on the same address
        time.sleep(0.5)
        assert registry.stats()["metrics-endpoint"].errors_total == 1   # and watched as healthy since
        assert registry.stuck() == []        # the watchdog goes on: it serves
        # an endpoint that cannot be started again (its address taken): stuck, the watchdog withheld
        holder["server"].shutdown()
        squatter = socket.socket()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen(1)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and "metrics-endpoint" not in registry.stuck():
                time.sleep(0.05)
            assert registry.stuck() == ["metrics-endpoint"]
            assert not served(port)
        finally:
            squatter.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and registry.stuck():
            time.sleep(0.05)
        assert registry.stuck() == [] and served(port)   # its address free again: serving, and well
    finally:
        stop.set()
        registry.join(5)
        holder["server"].shutdown()


def test_a_worker_hung_in_a_render_is_seen_by_the_watch_and_the_endpoint_started_again(monkeypatch):
    """The endpoint's render workers were threads nobody watched. Each piece of their work is timed;
    a render held past its deadline (a collector that blocks) is the watch's error, and the endpoint is started
    again with fresh workers; the hung one is left to end (Python cannot stop a thread), and no longer serves."""
    from iowarden.daemon.outputs import http_wire
    monkeypatch.setattr(http_wire, "WORK_DEADLINE_SECONDS", 0.5)
    release, hanging = threading.Event(), threading.Event()

    class Hangs(One):
        first = True

        def collect(self):
            if Hangs.first:
                Hangs.first = False
                hanging.set()
                release.wait(30)
            yield from super().collect()

    def start_hanging(port):
        reg = CollectorRegistry(auto_describe=False)
        reg.register(Hangs())
        fresh = iter(range(1, 1000))
        return serve(f"127.0.0.1:{port}", reg, WebConfig(), version_of_snapshot=lambda: (next(fresh), time.monotonic()))

    port = free_port()
    holder = {"server": start_hanging(port)}
    first = holder["server"]
    problems = []

    def watch():
        holder["server"], problem = watch_endpoint(holder["server"], lambda: start_hanging(port), 2.0)
        if problem:
            problems.append(problem)
            raise RuntimeError(problem)
    registry, stop = Registry(), threading.Event()
    registry.add("metrics-endpoint", 0.2, 5.0, watch, vital=True)
    try:
        scrape = threading.Thread(target=served, args=(port,), daemon=True)
        scrape.start()                       # its render hangs in the collector
        assert hanging.wait(10)
        registry.start(stop)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not problems:
            time.sleep(0.05)
        assert problems and "a worker has been in" in problems[0] and "past its 0.5 s" in problems[0], problems
        assert holder["server"] is not first
        # the watch's error is counted when its step returns, a moment after the problem is said
        while time.monotonic() < deadline and registry.stats()["metrics-endpoint"].errors_total == 0:
            time.sleep(0.05)
        assert registry.stats()["metrics-endpoint"].errors_total == 1
        assert served(port)                  # the new endpoint's workers render
    finally:
        release.set()
        stop.set()
        registry.join(5)
        holder["server"].shutdown()
