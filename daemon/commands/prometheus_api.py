"""The Prometheus HTTP query API as `iowarden replay --prometheus` reads it (Prometheus, Thanos, Mimir and
VictoriaMetrics serve the same API): label values, and range queries cut into chunks the server accepts.

Every request has a whole deadline (connect to the last byte of the answer, however slowly a server trickles
it), at most MAX_ANSWER_BYTES of an answer are read, and a request that fails for a reason a retry can mend
(no connection, a timeout, HTTP 429 or 5xx) is tried `retries` times in all before the replay stops with
the reason. Credentials come from files and never reach a message: a password in the URL would show in
`ps` and in shell history, so the URL may not carry one.
"""
from __future__ import annotations

import http.client
import json
import math
import time
import urllib.parse

from iowarden.probes.common import ParseError, printable, read_bounded

from iowarden.daemon.outputs.influx_wire import DeadlineSocket, scrub

MAX_ANSWER_BYTES = 32 << 20      # past it, fewer points are asked for: JSON of 32 MB is some 150 MB parsed
SAMPLES_PER_REQUEST = 400_000    # what a chunk asks for over all its series: about 10 MB of JSON
MAX_POINTS_PER_QUERY = 10_000    # Prometheus refuses a range query of more than 11,000 points per series
MIN_POINTS_PER_QUERY = 60        # a server that takes fewer is not one a month can be read from
CREDENTIAL_MAX_BYTES = 64 << 10
RETRY_PAUSE_SECONDS = 1.0        # doubled after each failed try
# how Prometheus and VictoriaMetrics say a query asked for too much at once (points per series, samples)
TOO_MANY = ("points per timeseries", "maximum resolution", "too many points", "too many samples",
            "maxsamplesperquery", "maxpointspertimeseries")


class QueryFailed(ParseError):
    """The server could not be read: the message says which server, what it answered and what to do."""


class TooManyPoints(QueryFailed):
    """The server refused a range query as too many points per series: the caller asks for less at a time."""


def read_credential(path: str, what: str) -> str:
    """A token or password from a file: its first line, never shown (an error names the file only)."""
    try:
        text = read_bounded(path, CREDENTIAL_MAX_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParseError(f"{what} {path}: cannot read: {getattr(exc, 'strerror', None) or type(exc).__name__}") \
            from None
    secret = text.split("\n", 1)[0].strip()
    if not secret:
        raise ParseError(f"{what} {path}: empty")
    return secret


class PrometheusAPI:
    """Queries are POSTs of form fields (a long selector never meets a URL length limit); label values, which
    Prometheus serves to a GET only, a GET."""

    def __init__(self, url: str, timeout_seconds: float = 30.0, retries: int = 3, bearer_token: str | None = None,
                 basic_auth: tuple[str, str] | None = None, max_points: int = MAX_POINTS_PER_QUERY,
                 sleep=time.sleep):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ParseError(f"--prometheus {printable(url, 200)!r}: expected http://HOST[:PORT][/PATH] or "
                             "https://...")
        if u.username is not None or u.password is not None:
            raise ParseError("--prometheus: the URL carries credentials, which `ps` and shell history would show: "
                             "give --basic-auth-user with --password-file, or --bearer-token-file")
        try:
            port = u.port
        except ValueError:
            raise ParseError(f"--prometheus {printable(url, 200)!r}: the port is not a number from 1 to 65535") \
                from None
        self.scheme, self.host, self.port = u.scheme, u.hostname, port
        self.base_path = u.path.rstrip("/")
        self.shown = f"{u.scheme}://{u.netloc}{self.base_path}"
        self.timeout_seconds, self.retries, self.max_points = timeout_seconds, max(1, retries), max_points
        self._secrets = [s for s in (bearer_token, basic_auth[1] if basic_auth else None) if s]
        self._auth = None
        if bearer_token:
            self._auth = f"Bearer {bearer_token}"
        elif basic_auth:
            import base64
            self._auth = "Basic " + base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode()).decode()
            self._secrets.append(self._auth.split(" ", 1)[1])
        self._sleep = sleep
        self.requests = 0

    # -- the API's calls -------------------------------------------------------------------------
    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        # the one call Prometheus takes only as a GET (a POST is 405)
        data = self._call(f"/api/v1/label/{urllib.parse.quote(label)}/values",
                          {"match[]": match, "start": _ts(start), "end": _ts(end)}, method="GET")
        if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
            raise self._not_prometheus("/api/v1/label/.../values", "its data is not a list of label values")
        return sorted(data)

    def series(self, match: str, start: float, end: float) -> list[dict]:
        data = self._call("/api/v1/series", {"match[]": match, "start": _ts(start), "end": _ts(end)})
        if not isinstance(data, list) or not all(isinstance(v, dict) for v in data):
            raise self._not_prometheus("/api/v1/series", "its data is not a list of label sets")
        return data

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[tuple[dict, list]]:
        """[(labels, [(unix seconds, float), ...])] of one range query the caller keeps within max_points
        (chunks() cuts a long window). A value the server gives as NaN or infinite is left out: unknown."""
        data = self._call("/api/v1/query_range", {"query": expr, "start": _ts(start), "end": _ts(end),
                                                  "step": f"{step:g}"})
        if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise self._not_prometheus("/api/v1/query_range", "its data is not a matrix")
        return self._matrix(data["result"], "/api/v1/query_range")

    def _matrix(self, result: list, path: str) -> list[tuple[dict, list]]:
        out = []
        for series in result:
            try:
                labels = series["metric"]
                points = []
                for t, v in series["values"]:
                    x = float(v)
                    if math.isfinite(x):
                        points.append((float(t), x))
                if not isinstance(labels, dict):
                    raise TypeError
            except (KeyError, TypeError, ValueError):
                raise self._not_prometheus(path, "a series is not {metric, values}") from None
            out.append((labels, points))
        return out

    def raw_samples(self, selector: str, start: float, end: float) -> list[tuple[dict, list]]:
        """[(labels, [(unix seconds, float), ...])]: the samples as scraped in (start, end], through an instant
        query of a range selector (Prometheus and VictoriaMetrics alike answer it with the raw samples)."""
        span_ms = max(1, round((end - start) * 1000))
        data = self._call("/api/v1/query", {"query": f"{selector}[{span_ms}ms]", "time": _ts(end)})
        if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise self._not_prometheus("/api/v1/query", "a range selector's data is not a matrix")
        return self._matrix(data["result"], "/api/v1/query")

    def chunks(self, start: float, end: float, step: float, series: int = 1) -> list[tuple[float, float]]:
        """The window cut into consecutive (start, end) ranges of at most max_points steps (or scrapes) each,
        and at most SAMPLES_PER_REQUEST over `series` series."""
        points = min(self.max_points, max(MIN_POINTS_PER_QUERY, SAMPLES_PER_REQUEST // max(1, series)))
        span = step * (points - 1)
        out, t = [], start
        while t <= end:
            out.append((t, min(end, t + span)))
            t = out[-1][1] + step
        return out

    def fewer_points(self) -> bool:
        """After a TooManyPoints: ask for half as many per query, while that is still a useful amount."""
        if self.max_points // 2 < MIN_POINTS_PER_QUERY:
            return False
        self.max_points //= 2
        return True

    # -- one request ------------------------------------------------------------------------------
    def _call(self, path: str, fields: dict, method: str = "POST"):
        pause, last = RETRY_PAUSE_SECONDS, None
        for attempt in range(self.retries):
            if attempt:
                self._sleep(pause)
                pause *= 2
            try:
                status, content_type, body = self._request(method, path, fields)
            except _Transient as exc:
                last = str(exc)
                continue
            if status in (401, 403):
                raise QueryFailed(f"{self.shown} refused the request (HTTP {status}): "
                                  + ("the credentials given were not accepted" if self._auth else
                                     "it wants credentials: --bearer-token-file FILE, or --basic-auth-user USER "
                                     "with --password-file FILE"))
            if status == 429 or status >= 500:
                last = f"HTTP {status}: {self._message(body)}"
                continue
            try:
                answer = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                answer = None
            if not isinstance(answer, dict) or answer.get("status") not in ("success", "error"):
                raise self._not_prometheus(path, f"HTTP {status}, {printable(content_type or 'no content type', 60)}"
                                           f", {'not JSON' if answer is None else 'JSON without a status'}")
            if answer["status"] == "error":
                said = printable(self._scrub(str(answer.get("error", ""))), 300)
                if any(x in said.lower() for x in TOO_MANY):
                    raise TooManyPoints(f"{self.shown}: {said}")
                raise QueryFailed(f"{self.shown}{path}: the server refused the query "
                                  f"({printable(str(answer.get('errorType', '')), 40)}): {said}")
            if "data" not in answer:
                raise self._not_prometheus(path, "a success without data")
            return answer["data"]
        raise QueryFailed(f"cannot read {self.shown}{path}: {last} ({self.retries} tries)")

    def _request(self, method: str, path: str, fields: dict) -> tuple[int, str, bytes]:
        conn_class = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        deadline = time.monotonic() + self.timeout_seconds
        conn = conn_class(self.host, self.port, timeout=self.timeout_seconds)
        wrapped = None
        self.requests += 1
        form = urllib.parse.urlencode(fields)
        body, target = (form.encode(), self.base_path + path) if method == "POST" else \
            (None, f"{self.base_path}{path}?{form}")
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        if self._auth:
            headers["Authorization"] = self._auth
        try:
            conn.connect()
            conn.sock = wrapped = DeadlineSocket(conn.sock, deadline)
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            answer = resp.read(MAX_ANSWER_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            if time.monotonic() >= deadline or isinstance(exc, TimeoutError):
                raise _Transient(f"no whole answer within {self.timeout_seconds:g} s") from None
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise _Transient(printable(self._scrub(reason), 200)) from None
        finally:
            conn.close()
            if wrapped is not None:
                wrapped.release()
        if len(answer) > MAX_ANSWER_BYTES:
            raise TooManyPoints(f"{self.shown}{path}: an answer over {MAX_ANSWER_BYTES >> 20} MiB")
        return resp.status, resp.getheader("Content-Type", ""), answer

    def _scrub(self, text: str) -> str:
        for s in self._secrets:
            text = scrub(text, s)
        return text

    def _message(self, body: bytes) -> str:
        text = self._scrub(body[:4096].decode("utf-8", "replace"))
        try:
            text = self._scrub(str(json.loads(text).get("error", text)))
        except (ValueError, AttributeError):
            pass
        return printable(text, 200)

    def _not_prometheus(self, path: str, why: str) -> QueryFailed:
        return QueryFailed(f"{self.shown} does not answer as a Prometheus query API ({path}: {why}): give the "
                           "server's base URL, as Grafana's data source has it (http://HOST:9090, or Thanos', "
                           "Mimir's /prometheus, VictoriaMetrics' :8428)")


class _Transient(Exception):
    """A failure a retry may mend: no connection, a timeout, a reset."""


def _ts(t: float) -> str:
    return f"{t:.3f}"
