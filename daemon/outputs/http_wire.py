"""The metrics endpoint's HTTP/1.1 on the wire (headers read within a bound, an answer written within a
deadline), the small socket and future helpers its loop uses, and the endpoint's own counters."""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import resource
import socket
import threading
import time

MAX_HEADER_BYTES = 16384
WRITE_TIMEOUT_SECONDS = 30.0
LISTEN_BACKLOG = 1024          # a real server's, not socketserver's 5


async def read_headers(reader) -> dict | None:
    headers, size = {}, 0
    while True:
        raw = await reader.readline()
        if not raw:
            return None
        size += len(raw)
        if size > MAX_HEADER_BYTES:
            raise ValueError("headers too large")
        text = raw.decode("latin-1").rstrip("\r\n")
        if not text:
            return headers
        name, _, value = text.partition(":")
        headers[name.strip().lower()] = value.strip()


async def send(writer, status: int, body: bytes, keep_alive: bool = False,
            content_type: str = "text/plain; charset=utf-8", extra: dict | None = None,
            head: bool = False, close: bool = False):
    reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
              429: "Too Many Requests", 503: "Service Unavailable"}[status]
    lines = [f"HTTP/1.1 {status} {reason}", "Server: iowarden", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}", f"Connection: {'keep-alive' if keep_alive and not close else 'close'}"]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body))
    await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_SECONDS)


class ServerCollector:
    """The endpoint's own counters: what clients made it hash, and what it turned away."""

    def __init__(self, server):
        self.server = server

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        srv = self.server
        g = GaugeMetricFamily("iowarden_http_connections", "Open connections to the metrics endpoint")
        g.add_metric([], srv.connections)
        yield g
        c = CounterMetricFamily("iowarden_http_rejected", "Connections or requests turned away, by reason",
                                labels=["reason"])
        for reason in ("connections", "per_source", "evicted", "timeout_or_oversize", "request_body",
                       "max_requests", "accept_failed"):
            c.add_metric([reason], srv.rejected_total[reason])
        if srv.auth is not None:
            c.add_metric(["auth_limited_or_busy"], srv.auth.refused_total)
            h = CounterMetricFamily("iowarden_http_auth_hashes", "bcrypt checks clients made the daemon run")
            h.add_metric([], srv.auth.hashes_total)
            yield h
        yield c


def source_of(peer) -> str:
    """The client's address, an IPv4 client of a dual-stack socket as its IPv4 address."""
    host = str(peer[0]) if peer else "?"
    return host[7:] if host.startswith("::ffff:") and "." in host else host


async def readable(loop, sock: socket.socket) -> None:
    """Until the socket has something to read (or is closed by its peer)."""
    ready = loop.create_future()
    loop.add_reader(sock.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


def failed(future: asyncio.Future) -> bool:
    return future.done() and (future.cancelled() or future.exception() is not None)


def raise_fd_limit() -> int:
    """Room for the endpoint's sockets: the soft limit raised to 4,096 where the hard one allows; the soft limit
    it then has."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4096)) if hard != resource.RLIM_INFINITY else max(soft, 4096)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    return soft


def connection_cap(fd_limit: int, most: int) -> int:
    """How many connections the endpoint holds at once: `most`, or half the process's file descriptors where
    that is fewer (a low LimitNOFILE, or a start outside the unit with a shell's 1,024). The other half is the
    daemon's: its database, the kernel files it reads, fio's pipes and the notify socket, so idle clients can
    never take the descriptor the main loop needs to tell systemd it is alive."""
    return max(1, min(most, fd_limit // 2))


def bind(addr, family) -> socket.socket:
    """The listening socket, non-blocking, with a real server's backlog; dual-stack on ":port"."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)   # ":port" serves IPv4 too
    try:
        sock.bind(addr)
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


WORK_DEADLINE_SECONDS = 60.0   # a render of /metrics, its gzip, or a password hash on a worker: past it, hung


class TimedPool(concurrent.futures.ThreadPoolExecutor):
    """The endpoint's workers (renders, gzip, bcrypt), each piece of work timed while it runs: a worker hung in
    one is seen by the endpoint's watch (check_server), as a part over its deadline is seen by the registry."""

    def __init__(self, max_workers: int, thread_name_prefix: str):
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.running: dict[int, tuple[str, float]] = {}   # work's token -> (what it is, monotonic start)
        self._running_lock = threading.Lock()
        self._tokens = itertools.count()
        self._start_every_worker(max_workers)

    def _start_every_worker(self, count: int) -> None:
        """Every worker thread started now, not at its first piece of work: a scrape then never needs a new
        thread, and a daemon at its task limit (TasksMax, pids.max) still serves /metrics. Each worker is held
        until all have started, so none is reused for another's start."""
        together = threading.Barrier(count)
        for started in [super(TimedPool, self).submit(together.wait, 10) for _ in range(count)]:
            started.result(timeout=15)

    def submit(self, fn, /, *args, **kwargs):
        token = next(self._tokens)

        def timed():
            with self._running_lock:
                self.running[token] = (getattr(fn, "__qualname__", repr(fn)), time.monotonic())
            try:
                return fn(*args, **kwargs)
            finally:
                with self._running_lock:
                    self.running.pop(token, None)
        return super().submit(timed)

    def longest(self) -> tuple[str, float] | None:
        """(what, seconds) of the work running longest now, or None."""
        with self._running_lock:
            if not self.running:
                return None
            what, started = min(self.running.values(), key=lambda v: v[1])
        return what, time.monotonic() - started


def check_server(server, timeout_seconds: float) -> None:
    """Raise unless a MetricsServer's thread lives, its loop answers within the timeout and none of its workers
    is held in one piece of work past WORK_DEADLINE_SECONDS: the step of the part that watches the endpoint
    (its loop and workers run on threads of their own, outside the registry)."""
    if not server._thread.is_alive():
        raise RuntimeError("its thread has ended")
    for pool in (server._workers, server._hasher):
        held = pool.longest()
        if held is not None and held[1] > WORK_DEADLINE_SECONDS:
            raise RuntimeError(f"a worker has been in {held[0]} for {held[1]:.0f} s, "
                               f"past its {WORK_DEADLINE_SECONDS:g} s")
    answered = threading.Event()
    try:
        server._loop.call_soon_threadsafe(answered.set)
    except RuntimeError as exc:   # the loop is closed
        raise RuntimeError(f"its loop is closed ({exc})") from None
    if not answered.wait(timeout_seconds):
        raise RuntimeError(f"its loop did not answer within {timeout_seconds:g} s")
