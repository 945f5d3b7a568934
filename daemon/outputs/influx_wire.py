"""One InfluxDB v2 write on the wire: a POST with a whole deadline and a bounded read of the answer (see influx.py)."""
from __future__ import annotations

import http.client
import io
import json
import time
import urllib.parse

from iowarden.probes.common import printable

MAX_ANSWER_BYTES = 4096                  # what is read of a server's answer: its error message, no more


class WriteFailed(Exception):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class V2Writer:
    """POST /api/v2/write: a whole deadline per write, and a bounded read of the answer."""

    def __init__(self, url: str, org: str, bucket: str, token: str, timeout_seconds: float):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"InfluxDB url {url!r}: expected http://HOST[:PORT] or https://...")
        self.scheme, self.host, self.port = u.scheme, u.hostname, u.port
        self.path = (u.path.rstrip("/") + "/api/v2/write?"
                     + urllib.parse.urlencode({"org": org, "bucket": bucket, "precision": "ns"}))
        self.token, self.timeout_seconds = token, timeout_seconds

    def write(self, body: bytes) -> None:
        conn_class = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        deadline = time.monotonic() + self.timeout_seconds
        conn = conn_class(self.host, self.port, timeout=self.timeout_seconds)
        wrapped = None
        try:
            headers = {"Content-Type": "text/plain; charset=utf-8"}
            if self.token:
                headers["Authorization"] = f"Token {self.token}"
            conn.connect()
            # every send and receive from here on gets only what is left of the whole deadline, so a server
            # that sends a byte every few seconds cannot hold the write (no timer thread: nothing to supervise)
            conn.sock = wrapped = DeadlineSocket(conn.sock, deadline)
            conn.request("POST", self.path, body=body, headers=headers)
            resp = conn.getresponse()
            answer = resp.read(MAX_ANSWER_BYTES)
        except (OSError, http.client.HTTPException) as exc:
            if time.monotonic() >= deadline or isinstance(exc, TimeoutError):
                raise WriteFailed(f"no whole answer within {self.timeout_seconds:g} s") from None
            raise WriteFailed(f"{type(exc).__name__}: {printable(scrub(str(exc), self.token), 300)}") from None
        finally:
            conn.close()
            if wrapped is not None:
                wrapped.release()   # the answer is read, or abandoned: the socket goes whatever holds it
        if resp.status // 100 != 2:
            raise WriteFailed(f"HTTP {resp.status} {printable(scrub(resp.reason, self.token), 60)}: "
                              f"{_message(answer, self.token)}", resp.status)


class DeadlineSocket:
    """A connected socket whose every send and receive may take only what is left of one deadline
    (monotonic): what http.client uses of a socket (sendall, makefile, close), and nothing else."""

    def __init__(self, sock, deadline: float):
        self._sock, self._deadline = sock, deadline
        # http.client closes the connection (a server's "Connection: close") before it reads the answer's
        # body from the file it made: as with a real socket's makefile, the socket stays open for its readers
        self._readers, self._close_wanted = 0, False

    def _left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the write's deadline passed")
        self._sock.settimeout(left)
        return left

    def sendall(self, data) -> None:
        self._left()
        self._sock.sendall(data)   # one timeout for the whole sendall (Python 3.5+)

    def makefile(self, mode: str = "rb", *_args, **_kwargs):
        if mode != "rb":
            raise ValueError(f"DeadlineSocket.makefile: {mode!r}")
        self._readers += 1
        return io.BufferedReader(_DeadlineReader(self))

    def recv_into(self, buffer) -> int:
        self._left()
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        self._close_wanted = True
        if self._readers == 0:
            self._sock.close()

    def reader_closed(self) -> None:
        self._readers -= 1
        if self._close_wanted and self._readers == 0:
            self._sock.close()

    def release(self) -> None:
        self._sock.close()


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: DeadlineSocket):
        self._sock = sock

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self._sock.reader_closed()
        super().close()

    def readinto(self, buffer) -> int:
        return self._sock.recv_into(buffer)


def scrub(text: str, token: str) -> str:
    """The text with the token, whole, replaced: before any cut, so no part of it survives at a cut's edge."""
    return text.replace(token, "***") if token else text


def _message(answer: bytes, token: str = "") -> str:
    """The server's error message from the first bytes of its answer: one line, printable, short, and
    never the token (a server may echo the request's headers)."""
    text = scrub(answer.decode("utf-8", "replace"), token)
    try:
        text = scrub(str(json.loads(text).get("message", text)), token)
    except (ValueError, AttributeError):
        pass
    return printable(text, 300)
