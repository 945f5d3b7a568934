"""InfluxDB 2 writes (v2 write API) that survive outages: a bounded on-disk spool, replayed in order.

influxdb-client's batching API retries and then drops a batch for good. Here
every flush is a synchronous write with no client retries; what fails goes to
the spool (one file per batch, written whole then renamed, so a crash leaves
whole batches) and is replayed oldest first before anything newer is sent.
When the spool is full, new points are dropped, counted and logged: the spool
keeps the start of an outage rather than thrash.

The token comes from a file or an environment variable and never reaches a log:
error texts are scrubbed of it.
"""
from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("iowarden")


def escape_tag(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def field_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v}i"
    if isinstance(v, float):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def line(measurement: str, tags: dict, fields: dict, ts_seconds: float) -> str | None:
    """One line of line protocol; None when there is no field to write."""
    fields = {k: v for k, v in fields.items() if v is not None and not (isinstance(v, float) and v != v)}
    if not fields:
        return None
    tag_text = "".join(f",{escape_tag(k)}={escape_tag(v)}" for k, v in sorted(tags.items()) if v not in (None, ""))
    field_text = ",".join(f"{escape_tag(k)}={field_value(v)}" for k, v in fields.items())
    meas = measurement.replace(",", "\\,").replace(" ", "\\ ")
    return f"{meas}{tag_text} {field_text} {int(ts_seconds * 1e9)}"


class Spool:
    def __init__(self, directory: str, max_bytes: int):
        self.directory, self.max_bytes = directory, max_bytes
        os.makedirs(directory, mode=0o700, exist_ok=True)
        for name in os.listdir(directory):
            if name.endswith(".tmp"):  # a batch cut short by a crash was never complete
                os.unlink(os.path.join(directory, name))
        existing = [int(n[:-3]) for n in os.listdir(directory) if n.endswith(".lp") and n[:-3].isdigit()]
        self._next = max(existing, default=0) + 1

    def segments(self) -> list[str]:
        names = sorted((n for n in os.listdir(self.directory) if n.endswith(".lp") and n[:-3].isdigit()),
                       key=lambda n: int(n[:-3]))
        return [os.path.join(self.directory, n) for n in names]

    def size_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.segments())

    def append(self, lines: list[str]) -> int:
        """Keep a batch; returns how many lines were dropped because the spool is full."""
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
        self._lock = threading.Lock()
        self.points_written_total = 0
        self.points_spooled_total = 0
        self.points_dropped_total = 0
        self.write_errors_total = 0
        self.spool_bytes = self.spool.size_bytes()   # kept current by flush(): no directory walk per scrape
        self.last_error: str | None = None

    def add(self, lines: list[str | None]) -> None:
        with self._lock:
            self._pending.extend(x for x in lines if x)

    def _write(self, data: str) -> bool:
        try:
            self._api.write(bucket=self.bucket, org=self.org, record=data)
            return True
        except Exception as exc:  # connection refused, timeouts, 4xx/5xx: all the same to the spool
            self.write_errors_total += 1
            msg = f"{type(exc).__name__}: {exc}"
            if self._token:
                msg = msg.replace(self._token, "***")
            if msg != self.last_error:
                log.warning("InfluxDB write to %s failed: %s", self.url, msg.splitlines()[0][:300])
            self.last_error = msg
            return False

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
            if not self._write(data):
                break
            os.unlink(path)
            self.points_written_total += data.count("\n")
            log.info("replayed %d spooled points to InfluxDB", data.count("\n"))
        if not batch:
            return
        if not self.spool.segments() and self._write("\n".join(batch)):
            self.points_written_total += len(batch)
            self.last_error = None
            return
        dropped = self.spool.append(batch)
        self.points_spooled_total += len(batch) - dropped
        if dropped:
            self.points_dropped_total += dropped
            log.error("InfluxDB spool is full (%d bytes): dropped %d points (%d dropped so far)",
                      self.spool.max_bytes, dropped, self.points_dropped_total)

    def close(self) -> None:
        self._client.close()


def read_token(token_file: str, token_env: str) -> str:
    if token_file:
        with open(token_file) as f:
            return f.read().strip()
    return os.environ.get(token_env, "") if token_env else ""
