"""The /metrics endpoint, secured the way Prometheus' own exporters are: a web-config file.

    tls_server_config:
      cert_file: /etc/iowarden/tls.crt
      key_file: /etc/iowarden/tls.key
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, NoClientCert
      client_ca_file: /etc/iowarden/clients-ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2b$12$...   # bcrypt hash (htpasswd -nBC 12 prometheus)

client_python's start_http_server has TLS but no basic auth, hence this small
server. Scrapes only render the collector's snapshot; nothing here does I/O work.

It runs on one asyncio loop, so a connection that is slow, idle or hostile costs a
socket, not a thread, and cannot crowd out a scrape. A connection counts from the
moment it is accepted, before and during its TLS handshake:
- at most MAX_CONNECTIONS open (or half the process's file descriptors, where fewer), and
  MAX_CONNECTIONS_PER_SOURCE from one address (more are closed at once, unread and unlogged,
  and counted), so one client can neither take the whole budget nor the daemon's file descriptors;
- TLS starts only once the client has sent something (its ClientHello): an idle
  connection holds a socket, never a TLS object and its buffers (asyncio's SSL
  protocol allocates 256 KiB a connection: 2,000 idle ones were 650 MB);
- a new connection's first request (handshake included) must arrive whole within
  REQUEST_READ_TIMEOUT_SECONDS of the accept; a kept-alive one may idle
  KEEPALIVE_IDLE_SECONDS, then its next request must arrive whole within
  REQUEST_READ_TIMEOUT_SECONDS of its first byte; then the connection is closed;
- a request with a body is refused (400) and its connection closed: GET and HEAD
  have none, and one left unread would be taken for the next request;
- MAX_REQUESTS rendered at a time (more get 503, like node_exporter's --web.max-requests);
- a listen backlog the size of a real server's, not socketserver's 5.
Renders follow the daemon's snapshots: one render (and one gzip of it) per snapshot
version serves every scrape until the core publishes the next (about every second).
While the next is being rendered, a scrape takes the one before if it was current less
than STALE_OK_SECONDS ago, so a frequent scraper never waits for a render, and one that
scrapes rarely (Prometheus every 15 s) waits for a fresh one, as node_exporter's would.
Basic auth (auth.py) is bcrypt, slow on purpose, with its work bounded and shared fairly per source.
A connection is closed after a 401, 429 or 503: a client without the password holds a socket for
one answer, not for as long as it keeps it alive. And when every place is taken, a newcomer from a
source holding fewer connections takes the place of the oldest not yet authenticated connection
of the source holding most: 64 anonymous connections from each of 9 addresses cannot keep out the
scraper with the password (the landed server refused it 26 times of 26).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST

from iowarden.daemon.outputs import exposition
from iowarden.daemon.outputs.http_wire import (MAX_HEADER_BYTES, ServerCollector, TimedPool, bind,
                                              connection_cap, failed, raise_fd_limit, read_headers, readable, send,
                                              source_of)
from iowarden.daemon.outputs.auth import FAILED_AUTH_WINDOW_SECONDS, BasicAuth, FairHasher
from iowarden.daemon.config_schema import parse_listen_address
from iowarden.daemon.outputs.web_config import WebConfig, parse_basic

log = logging.getLogger("iowarden")

REQUEST_READ_TIMEOUT_SECONDS = 10.0
KEEPALIVE_IDLE_SECONDS = 60.0
HANDSHAKE_TIMEOUT_SECONDS = 10.0
MAX_CONNECTIONS = 512
MAX_CONNECTIONS_PER_SOURCE = 64      # Prometheus keeps one or two; 50 at once from one host still fit
MAX_REQUESTS = 40

STALE_OK_SECONDS = 1.0   # the sampler's period: how long ago the render a scrape gets without waiting was current


@dataclass(eq=False)
class Conn:
    """One accepted connection, for the fair sharing of places."""
    source: str
    accepted_at: float
    trusted: bool = False        # it has passed basic auth: never evicted for a newcomer
    evicted: bool = False
    task: asyncio.Task | None = field(default=None, repr=False)
    sock: socket.socket | None = field(default=None, repr=False)
    writer: asyncio.StreamWriter | None = field(default=None, repr=False)


@dataclass
class Rendered:
    version: int
    pieces: exposition.Exposition
    body: bytes | None = None      # each made when a scrape first asks for it
    gzipped: bytes | None = None


class MetricsServer:
    """The endpoint on an asyncio loop in a thread of its own; shutdown() stops it."""

    def __init__(self, addr, family, registry, web: WebConfig, version_of_snapshot=None):
        """version_of_snapshot: () -> (version, monotonic time it was published) of what the registry renders;
        without it every scrape renders afresh."""
        self.registry, self.web = registry, web
        self.version_of_snapshot = version_of_snapshot
        self.auth = BasicAuth(web.users) if web.users else None
        self.connections = 0
        self._open: set[Conn] = set()
        self._evicting = 0
        self.requests_in_flight = 0
        self.rejected_total = collections.Counter()   # why connections or requests were turned away
        self._workers = TimedPool(max_workers=4, thread_name_prefix="iowarden-http")
        # bcrypt on a thread of its own: hashing can never take a renderer, and uses one core at most
        self._hasher = TimedPool(max_workers=1, thread_name_prefix="iowarden-auth")
        self._rendering: tuple[int, asyncio.Future] | None = None   # (version, its render under way)
        self._rendered: Rendered | None = None
        self._renderer = exposition.Renderer()
        self._fresh_version = 0   # without version_of_snapshot: a version per scrape
        self._per_source: collections.Counter = collections.Counter()   # open connections by source address
        self._serving: set[asyncio.Task] = set()
        self.max_connections = connection_cap(raise_fd_limit(), MAX_CONNECTIONS)
        self.socket = bind(addr, family)
        self.server_address = self.socket.getsockname()
        self._loop = asyncio.new_event_loop()
        self._fair = FairHasher(self._loop, self._hasher, self.auth) if self.auth is not None else None
        self._ready = threading.Event()
        self._stopped = None
        self._thread = threading.Thread(target=self._run, name="iowarden-http", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self._loop)
        self._stopped = asyncio.Event()

        async def main():
            accepting = asyncio.ensure_future(self._accept_loop())
            self._ready.set()
            await self._stopped.wait()
            accepting.cancel()
            for task in list(self._serving):
                task.cancel()
            await asyncio.gather(accepting, *self._serving, return_exceptions=True)
        try:
            self._loop.run_until_complete(main())
        except Exception:   # noqa: BLE001 - logged; the daemon's part watchdog sees scrapes stop
            log.exception("metrics server stopped")
        finally:
            self.socket.close()
            self._ready.set()

    def reconfigure(self, web: WebConfig) -> None:
        """New TLS and basic-auth settings for the connections accepted and the requests read from now on
        (a reload that keeps the listen address). What a user proved against an unchanged hash holds."""
        def swap():
            self.web = web
            self.auth = BasicAuth(web.users, previous=self.auth) if web.users else None
            self._fair = FairHasher(self._loop, self._hasher, self.auth) if self.auth is not None else None
        done = threading.Event()
        self._loop.call_soon_threadsafe(lambda: (swap(), done.set()))
        if not done.wait(10):
            raise OSError("the metrics endpoint's loop did not take the new settings within 10 s")

    def shutdown(self):
        if self._stopped is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(2.0)
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._hasher.shutdown(wait=False, cancel_futures=True)

    async def _accept_loop(self):
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(self.socket)
            except OSError:   # EMFILE, ENFILE, ENOBUFS: out of something; the queue waits a moment
                self.rejected_total["accept_failed"] += 1
                await asyncio.sleep(0.05)
                continue
            source = source_of(peer)
            reason = "per_source" if self._per_source[source] >= MAX_CONNECTIONS_PER_SOURCE else None
            if reason is None and self.connections - self._evicting >= self.max_connections:
                victim = self._victim_for(source)
                if victim is None:
                    reason = "connections"
                else:
                    victim.evicted = True
                    self._evicting += 1
                    self.rejected_total["evicted"] += 1
                    victim.task.cancel()
            if reason:
                self.rejected_total[reason] += 1
                sock.close()
                continue
            self.connections += 1
            self._per_source[source] += 1
            conn = Conn(source, loop.time(), sock=sock)
            self._open.add(conn)
            conn.task = asyncio.ensure_future(self._serve(sock, conn))
            self._serving.add(conn.task)
            conn.task.add_done_callback(self._serving.discard)
            # released when its task is done, however: a task evicted before it first ran never runs a finally
            conn.task.add_done_callback(lambda _task, c=conn: self._release(c))

    def _release(self, conn: Conn) -> None:
        """A connection's place, counters and socket given back (its task has ended)."""
        self._open.discard(conn)
        if conn.evicted:
            self._evicting -= 1
        self.connections -= 1
        self._per_source[conn.source] -= 1
        if self._per_source[conn.source] <= 0:
            del self._per_source[conn.source]
        if conn.writer is not None:
            conn.writer.close()
        elif conn.sock is not None:
            conn.sock.close()

    def _victim_for(self, source: str) -> Conn | None:
        """The connection a newcomer from `source` may take the place of: the oldest not authenticated one of
        the source holding the most such, if that source holds more than the newcomer's would."""
        held = collections.Counter(c.source for c in self._open if not c.trusted and not c.evicted)
        if not held:
            return None
        top, count = held.most_common(1)[0]
        if count <= self._per_source[source] + 1:
            return None   # fair already: the newcomer's source holds as many
        return min((c for c in self._open if c.source == top and not c.trusted and not c.evicted),
                   key=lambda c: c.accepted_at)

    async def _serve(self, sock: socket.socket, conn: Conn):
        """One accepted connection, counted from its accept to its close."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        deadline = conn.accepted_at + REQUEST_READ_TIMEOUT_SECONDS
        # the place, counters and socket are given back by _release, when this task is done
        try:
            await asyncio.wait_for(readable(loop, sock), deadline - loop.time())
            reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES, loop=loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
            transport, _ = await asyncio.wait_for(loop.connect_accepted_socket(
                lambda: protocol, sock, ssl=self.web.tls,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_SECONDS if self.web.tls else None),
                max(0.0, deadline - loop.time()))
        except (asyncio.TimeoutError, ssl.SSLError, OSError, ConnectionError):
            self.rejected_total["timeout_or_oversize"] += 1
            return
        conn.writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        await self._connection(reader, conn.writer, conn, deadline)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: Conn,
                          first_deadline: float):
        loop = asyncio.get_running_loop()
        try:
            deadline = first_deadline
            while True:
                try:
                    if deadline is None:   # kept alive: idle until the first byte, then the request's own deadline
                        first = await asyncio.wait_for(reader.read(1), KEEPALIVE_IDLE_SECONDS)
                        if not first:
                            return
                        deadline = loop.time() + REQUEST_READ_TIMEOUT_SECONDS
                    else:
                        first = b""
                    line, head = await asyncio.wait_for(self._read_request(reader), max(0.0, deadline - loop.time()))
                except (asyncio.TimeoutError, asyncio.LimitOverrunError, ValueError):
                    self.rejected_total["timeout_or_oversize"] += 1
                    return
                if head is None:
                    return
                if head.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in head:
                    self.rejected_total["request_body"] += 1
                    await send(writer, 400, b"a request with a body is not accepted here\n", close=True)
                    return
                keep_alive = await self._respond(first + line, head, writer, conn)
                if not keep_alive:
                    return
                deadline = None
        except (ConnectionError, ssl.SSLError, OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            return   # a client that went away or would not read its answer
        except asyncio.CancelledError:
            raise
        except Exception:   # noqa: BLE001 - one request's failure closes its connection, nothing more
            log.debug("metrics request from %s failed", conn.source, exc_info=True)

    async def _read_request(self, reader) -> tuple[bytes, dict | None]:
        line = await reader.readline()
        if not line:
            return b"", None
        return line, await read_headers(reader)

    async def _respond(self, first: bytes, headers: dict, writer, conn: Conn) -> bool:
        parts = first.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await send(writer, 400, b"bad request\n", close=True)
            return False
        method, target, version = parts
        asked = headers.get("connection", "").lower()
        keep_alive = (version == "HTTP/1.1" and asked != "close") or asked == "keep-alive"
        if method not in ("GET", "HEAD"):
            await send(writer, 405, b"method not allowed\n", keep_alive, extra={"Allow": "GET, HEAD"})
            return keep_alive
        if self.auth is not None:
            verdict = await self._authorize(headers.get("authorization", ""), conn.source)
            if verdict != "ok":
                status, extra = {"limited": (429, {"Retry-After": str(int(FAILED_AUTH_WINDOW_SECONDS))}),
                                 "busy": (503, {"Retry-After": "1"})}.get(
                    verdict, (401, {"WWW-Authenticate": 'Basic realm="iowarden"'}))
                # closed: a client without the password holds a place for one answer, no longer
                await send(writer, status, b"unauthorized\n", extra=extra, close=True)
                return False
            conn.trusted = True
        path = target.split("?")[0]
        if path == "/metrics":
            if self.requests_in_flight >= MAX_REQUESTS:
                self.rejected_total["max_requests"] += 1
                await send(writer, 503, b"too many concurrent scrapes\n", extra={"Retry-After": "1"},
                                 close=True)
                return False
            self.requests_in_flight += 1
            try:
                zipped = "gzip" in headers.get("accept-encoding", "")
                body = await self._render(gzipped=zipped)
            finally:
                self.requests_in_flight -= 1
            extra = {"Content-Encoding": "gzip"} if zipped else {}
            await send(writer, 200, body, keep_alive, CONTENT_TYPE_LATEST, extra, head=method == "HEAD")
        elif path == "/":
            await send(writer, 200, b"<html><body><h1>iowarden</h1><a href='/metrics'>metrics</a></body></html>",
                             keep_alive, "text/html", head=method == "HEAD")
        else:
            await send(writer, 404, b"not found\n", keep_alive)
        return keep_alive

    async def _render(self, gzipped: bool) -> bytes:
        """The exposition of the newest snapshot (gzipped when asked), rendered once per snapshot version
        on a worker thread; scrapes that arrive while it renders share it, or take the render before it
        if that one was current less than STALE_OK_SECONDS ago."""
        if self.version_of_snapshot is not None:
            version, published = self.version_of_snapshot()
        else:
            self._fresh_version += 1   # every scrape renders, and waits for its own render
            version, published = self._fresh_version, float("-inf")
        done = self._rendered
        if done is None or done.version != version:
            if self._rendering is None or self._rendering[0] != version or failed(self._rendering[1]):
                future = asyncio.ensure_future(self._loop.run_in_executor(self._workers, self._renderer.exposition,
                                                                          self.registry))
                future.add_done_callback(lambda f, v=version: self._keep(v, f))
                self._rendering = (version, future)
            if done is not None and done.version == version - 1 and time.monotonic() - published < STALE_OK_SECONDS:
                pass   # the render of the snapshot just superseded: no wait
            else:
                rendering, future = self._rendering
                await asyncio.shield(future)
                # a future already done when awaited does not yield, so its done callback (_keep) may still be
                # waiting its turn on the loop: keep its render here too (keeping it twice is a no-op)
                self._keep(rendering, future)
                done = self._rendered
        if gzipped:
            if done.gzipped is None:
                done.gzipped = await self._loop.run_in_executor(self._workers, done.pieces.gzipped)
            return done.gzipped
        if done.body is None:
            done.body = await self._loop.run_in_executor(self._workers, done.pieces.body)
        return done.body

    def _keep(self, version: int, future: asyncio.Future) -> None:
        if failed(future):
            return   # the scrapes awaiting it get the error; the next scrape tries again
        if self._rendered is None or self._rendered.version < version:
            self._rendered = Rendered(version, future.result())

    async def _authorize(self, header: str, source: str) -> str:
        creds = parse_basic(header)
        if creds is None:
            return "denied"
        user, password = creds
        auth, fair = self.auth, self._fair
        if auth.remembered(user, password):
            return "ok"   # the common case, a scrape with the right password: no hash, no thread hop
        if auth.over_limit(source):
            auth.refused_total += 1
            return "limited"

        def check():
            started = time.monotonic()
            return auth.verify(user, password, source), time.monotonic() - started
        result = await fair.run(source, check)
        if result is None:
            return "busy"   # counted by the hasher (note_turned_away)
        ok, took = result
        if took < auth.check_seconds:   # every check as long as the costliest user's: no one told apart
            await asyncio.sleep(auth.check_seconds - took)
        return "ok" if ok else "denied"

def serve(listen: str, registry, web: WebConfig, version_of_snapshot=None) -> MetricsServer:
    addr, family = parse_listen_address(listen)
    server = MetricsServer(addr, family, registry, web, version_of_snapshot)
    registry.register(ServerCollector(server))
    return server
