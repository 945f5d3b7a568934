"""InfluxDB 2 writes (v2 write API) that survive outages: a bounded on-disk spool, replayed in order.

influxdb-client's batching API retries and then drops a batch for good. Here
every flush is a synchronous write with no client retries; what fails goes to
the spool (one file per batch, written whole then renamed, so a crash leaves
whole batches) and is replayed oldest first before anything newer is sent.
When the spool is full, new points are dropped, counted and logged: the spool
keeps the start of an outage rather than thrash.

A batch the server refuses as malformed (HTTP 400, 413, 422) would be refused
again on every retry and hold back everything behind it: it is set aside in
`rejected/` (the newest few kept for a look), counted and logged once. Any other
failure (connection, timeout, 5xx, 429, 401/403) keeps the batch for the next try.

On shutdown nothing is sent: what is in memory, and the batch a hung write is
still holding, go to the spool on disk, so SIGTERM never waits for a server.

The token comes from a file or an environment variable and never reaches a log:
error texts are scrubbed of it.
"""
from __future__ import annotations

import logging
import math
import os
import threading

log = logging.getLogger("iowarden")

BATCH_FAULT_STATUSES = (400, 413, 422)   # the batch itself is refused: retrying it can never succeed
REJECTED_KEPT = 20                       # rejected batches kept on disk for a look

# Line protocol, escaped completely. Hand-written rather than influxdb-client's Point,
# which leaves backslashes in tags as they are, so a value ending in one escapes the
# separator after it. A line feed ends a line in every parser (InfluxDB's and
# victoria-metrics'), and neither has an escape for it, so a line feed in a name, tag
# or string is written as the two characters \n: a name can never forge a point.
_KEY = str.maketrans({"\\": "\\\\", ",": "\\,", "=": "\\=", " ": "\\ ", "\n": "\\n"})
_MEASUREMENT = str.maketrans({"\\": "\\\\", ",": "\\,", " ": "\\ ", "\n": "\\n"})
_STRING = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})


def escape_tag(value) -> str:
    """A tag key, tag value or field key."""
    return str(value).translate(_KEY)


def field_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v}i"
    if isinstance(v, float):
        return repr(v)
    return '"' + str(v).translate(_STRING) + '"'


def line(measurement: str, tags: dict, fields: dict, ts_seconds: float) -> str | None:
    """One line of line protocol; None when there is no field to write.

    Empty tag values are left out (line protocol has none); NaN and infinite fields too
    (not representable): absent, not zero.
    """
    fields = {k: v for k, v in fields.items()
              if v is not None and not (isinstance(v, float) and not math.isfinite(v))}
    if not fields:
        return None
    tag_text = "".join(f",{escape_tag(k)}={escape_tag(v)}" for k, v in sorted(tags.items()) if v not in (None, ""))
    field_text = ",".join(f"{escape_tag(k)}={field_value(v)}" for k, v in fields.items())
    return f"{measurement.translate(_MEASUREMENT)}{tag_text} {field_text} {int(ts_seconds * 1e9)}"


class Spool:
    def __init__(self, directory: str, max_bytes: int):
        self.directory, self.max_bytes = directory, max_bytes
        self.rejected_dir = os.path.join(directory, "rejected")
        os.makedirs(self.rejected_dir, mode=0o700, exist_ok=True)
        for name in os.listdir(directory):
            if name.endswith(".tmp"):  # a batch cut short by a crash was never complete
                os.unlink(os.path.join(directory, name))
        existing = [int(n[:-3]) for n in os.listdir(directory) if n.endswith(".lp") and n[:-3].isdigit()]
        self._next = max(existing, default=0) + 1
        self._lock = threading.Lock()   # the flushing part and shutdown both append

    def segments(self) -> list[str]:
        names = sorted((n for n in os.listdir(self.directory) if n.endswith(".lp") and n[:-3].isdigit()),
                       key=lambda n: int(n[:-3]))
        return [os.path.join(self.directory, n) for n in names]

    def size_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.segments())

    def append(self, lines: list[str]) -> int:
        """Keep a batch; returns how many lines were dropped because the spool is full."""
        with self._lock:
            room = self.max_bytes - self.size_bytes()
            kept, size = [], 0
            for ln in lines:  # keep what fits, oldest first; the rest is dropped
                n = len(ln.encode()) + 1
                if size + n > room:
                    break
                kept.append(ln)
                size += n
            if not kept:
                return len(lines)
            data = ("\n".join(kept) + "\n").encode()
            path = os.path.join(self.directory, f"{self._next:012d}.lp")
            self._next += 1
            with open(path + ".tmp", "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)
            return len(lines) - len(kept)

    def set_aside(self, data: str, name: str) -> str:
        """Keep a batch the server refused for good in rejected/ (the newest REJECTED_KEPT)."""
        path = os.path.join(self.rejected_dir, name)
        with open(path, "w") as f:
            f.write(data)
        old = sorted(os.listdir(self.rejected_dir))
        for n in old[:-REJECTED_KEPT]:
            os.unlink(os.path.join(self.rejected_dir, n))
        return path


class InfluxWriter:
    def __init__(self, url: str, org: str, bucket: str, token: str, spool_dir: str, spool_max_bytes: int,
                 timeout_seconds: float = 5.0, host: str | None = None):
        from influxdb_client import InfluxDBClient
        from influxdb_client.client.write_api import SYNCHRONOUS
        from urllib3 import Retry
        self.url, self.org, self.bucket, self._token = url, org, bucket, token
        self.host = host or os.uname().nodename
        # no client-side retries: a failed write goes to the spool at once, in order
        self._client = InfluxDBClient(url=url, token=token or "none", org=org, timeout=int(timeout_seconds * 1000),
                                      retries=Retry(total=0))
        self._api = self._client.write_api(write_options=SYNCHRONOUS)
        self.spool = Spool(spool_dir, spool_max_bytes)
        self._pending: list[str] = []
        self._inflight: list[str] = []   # a new batch being sent, not yet on disk (spooled if we stop now)
        self._lock = threading.Lock()
        self.points_written_total = 0
        self.points_spooled_total = 0
        self.points_dropped_total = 0
        self.points_rejected_total = 0
        self.write_errors_total = 0
        self.spool_bytes = self.spool.size_bytes()   # kept current by flush(): no directory walk per scrape
        self.last_error: str | None = None

    def add(self, lines: list[str | None]) -> None:
        with self._lock:
            self._pending.extend(x for x in lines if x)

    def _write(self, data: str) -> str:
        """'ok', 'retry' (keep the batch for later) or 'rejected' (the batch itself was refused)."""
        try:
            self._api.write(bucket=self.bucket, org=self.org, record=data)
            return "ok"
        except Exception as exc:  # connection refused, timeouts, 4xx/5xx
            self.write_errors_total += 1
            status = getattr(exc, "status", None)
            msg = f"{type(exc).__name__}: {exc}"
            if self._token:
                msg = msg.replace(self._token, "***")
            if status in BATCH_FAULT_STATUSES:
                self.last_error = msg
                return "rejected"
            if msg != self.last_error:
                log.warning("InfluxDB write to %s failed: %s", self.url, msg.splitlines()[0][:300])
            self.last_error = msg
            return "retry"

    def _reject(self, data: str, name: str) -> None:
        n = data.count("\n") + (0 if data.endswith("\n") else 1)
        self.points_rejected_total += n
        kept = self.spool.set_aside(data, name)
        log.error("InfluxDB at %s refused a batch of %d points as invalid (%s); set aside in %s, going on with "
                  "the rest", self.url, n, (self.last_error or "").splitlines()[0][:300], kept)

    def flush(self) -> None:
        """Replay the spool oldest first, then send what is new; keep what fails."""
        try:
            self._flush()
        finally:
            self.spool_bytes = self.spool.size_bytes()

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        for path in self.spool.segments():
            with open(path) as f:
                data = f.read()
            outcome = self._write(data)
            if outcome == "retry":
                break
            if outcome == "rejected":
                self._reject(data, os.path.basename(path))
            else:
                self.points_written_total += data.count("\n")
                log.info("replayed %d spooled points to InfluxDB", data.count("\n"))
            os.unlink(path)
        if not batch:
            return
        if not self.spool.segments():
            with self._lock:
                self._inflight = batch
            data = "\n".join(batch)
            outcome = self._write(data)
            with self._lock:
                if self._inflight is not batch:
                    return   # shutdown spooled it while the write hung
                self._inflight = []
            if outcome == "ok":
                self.points_written_total += len(batch)
                self.last_error = None
                return
            if outcome == "rejected":
                self._reject(data + "\n", f"new-{os.getpid()}-{id(batch)}.lp")
                return
        self._spool(batch)

    def _spool(self, batch: list[str]) -> None:
        dropped = self.spool.append(batch)
        self.points_spooled_total += len(batch) - dropped
        if dropped:
            self.points_dropped_total += dropped
            log.error("InfluxDB spool is full (%d bytes): dropped %d points (%d dropped so far)",
                      self.spool.max_bytes, dropped, self.points_dropped_total)

    def spool_pending(self) -> int:
        """On shutdown: put what is unsent (in memory, or held by a write that hangs) on disk; no network."""
        with self._lock:
            batch = self._inflight + self._pending
            self._inflight, self._pending = [], []
        if batch:
            self._spool(batch)
        self.spool_bytes = self.spool.size_bytes()
        return len(batch)

    def close(self) -> None:
        self._client.close()


def read_token(token_file: str, token_env: str) -> str:
    if token_file:
        with open(token_file) as f:
            return f.read().strip()
    return os.environ.get(token_env, "") if token_env else ""
