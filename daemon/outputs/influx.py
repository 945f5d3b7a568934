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

A write is one POST with a whole deadline (timeout_seconds from connect to the
last byte of the answer, however slowly a server trickles it) and at most
MAX_ANSWER_BYTES of the answer read. It is written on http.client rather than
influxdb-client: that library's write path reads an error body whole, formats
all of it into its exception, and its exceptions module calls
logging.basicConfig, doubling every log line of the daemon (a 500 with a 256 MiB
body took the daemon to 1.4 GB). The v2 write API is one request.

A batch the spool cannot take (its filesystem full or read-only) stays in
memory, up to MAX_HELD_POINTS; past that the oldest are dropped and counted.
Every failure of the spool is a counted, logged state, never an exception out
of a flush or the shutdown.

The token comes from a file or an environment variable and never reaches a log:
error texts are scrubbed of it.
"""
from __future__ import annotations

import logging
import os
import threading
import zlib

from iowarden.daemon.outputs.influx_wire import V2Writer, WriteFailed
from iowarden.probes.common import read_bounded

log = logging.getLogger("iowarden")

BATCH_FAULT_STATUSES = (400, 413, 422)   # the batch itself is refused: retrying it can never succeed
REJECTED_KEPT = 20                       # rejected batches kept on disk for a look
MAX_WRITES_PER_FLUSH = 8                 # spooled batches replayed per flush: a flush's time is bounded
MAX_HELD_POINTS = 200_000                # points kept in memory while neither server nor spool takes them
MAX_TOKEN_BYTES = 4096

# A segment's first line, then each point as its CRC-32 in hex, a space and the line: flipped bytes, a cut
# or a page of NULs in a segment cost the points they touch, counted as rejected, never forwarded.
SEGMENT_HEADER = b"# iowarden spool v2: crc32 per line\n"


def encode_segment(lines: list[str]) -> bytes:
    body = b"".join(b"%08x %s\n" % (zlib.crc32(ln.encode()), ln.encode()) for ln in lines)
    return SEGMENT_HEADER + body


def _checked(raw: bytes) -> str | None:
    """A v2 line's point when its checksum matches, else None."""
    crc, _, line = raw.partition(b" ")
    if line and crc == b"%08x" % zlib.crc32(line):
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return None


def decode_segment(data: bytes) -> tuple[list[str], int]:
    """(the points that are whole, how many lines are damaged). A segment whose header and every checksum
    fail to read is one written before the sums: its lines that are UTF-8 without NULs are kept, the server
    judges the rest (a batch it refuses is set aside as before)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()        # the last line's own end
    header = bool(lines) and lines[0] + b"\n" == SEGMENT_HEADER
    if header:
        lines = lines[1:]
    elif lines and len(lines[0]) > len(SEGMENT_HEADER) and _checked(lines[0][len(SEGMENT_HEADER):]) is not None:
        lines[0], header = lines[0][len(SEGMENT_HEADER):], True   # the header's own line feed was damaged
    checked = [_checked(raw) for raw in lines]
    if header or any(c is not None for c in checked):
        good = [c for c in checked if c is not None]
        return good, len(checked) - len(good)
    good, bad = [], 0
    for raw in lines:
        text = raw.decode("utf-8", "replace") if raw.strip(b"\0 \t\r") else ""
        if text and "\0" not in text and "\ufffd" not in text:
            good.append(text)
        elif raw:
            bad += 1
    return good, bad


class Spool:
    """Whole batches on disk, oldest first. Every method but append() tolerates a spool it cannot read."""

    def __init__(self, directory: str, max_bytes: int):
        self.directory, self.max_bytes = directory, max_bytes
        self.rejected_dir = os.path.join(directory, "rejected")
        self._lock = threading.Lock()   # the flushing part and shutdown both append
        self._next = 1
        try:
            os.makedirs(self.rejected_dir, mode=0o700, exist_ok=True)
            for name in os.listdir(directory):
                if name.endswith(".tmp"):  # a batch cut short by a crash was never complete
                    os.unlink(os.path.join(directory, name))
        except OSError as exc:
            log.error("InfluxDB spool %s is not usable now (%s): unsent points wait in memory",
                      directory, exc.strerror or exc)
        existing = [int(n[:-3]) for n in self._names() if n[:-3].isdigit()]
        self._next = max(existing, default=0) + 1

    def _names(self) -> list[str]:
        try:
            return [n for n in os.listdir(self.directory) if n.endswith(".lp")]
        except OSError:
            return []

    def segments(self) -> list[str]:
        names = sorted((n for n in self._names() if n[:-3].isdigit()), key=lambda n: int(n[:-3]))
        return [os.path.join(self.directory, n) for n in names]

    def size_bytes(self) -> int:
        total = 0
        for p in self.segments():
            try:
                total += os.path.getsize(p)
            except OSError:
                pass
        return total

    def append(self, lines: list[str]) -> tuple[int, int]:
        """Keep a batch, oldest lines first: (lines kept, lines over the size limit). OSError when the
        spool cannot be written (full, read-only): then nothing was kept."""
        with self._lock:
            room = self.max_bytes - self.size_bytes() - len(SEGMENT_HEADER)
            kept, size = [], 0
            for ln in lines:
                n = len(ln.encode()) + 10     # its checksum, a space and its line feed (encode_segment)
                if size + n > room:
                    break
                kept.append(ln)
                size += n
            if not kept:
                return 0, len(lines)
            data = encode_segment(kept)
            path = os.path.join(self.directory, f"{self._next:012d}.lp")
            try:
                with open(path + ".tmp", "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(path + ".tmp", path)
            except OSError:
                try:
                    os.unlink(path + ".tmp")
                except OSError:
                    pass
                raise
            self._next += 1
            return len(kept), len(lines) - len(kept)

    def set_aside(self, data: str, name: str) -> str | None:
        """Keep a batch the server refused for good in rejected/ (the newest REJECTED_KEPT); None if it cannot."""
        path = os.path.join(self.rejected_dir, name)
        try:
            with open(path, "w") as f:
                f.write(data)
            old = sorted(os.listdir(self.rejected_dir))
            for n in old[:-REJECTED_KEPT]:
                os.unlink(os.path.join(self.rejected_dir, n))
        except OSError:
            return None
        return path


class InfluxWriter:
    def __init__(self, url: str, org: str, bucket: str, token: str, spool_dir: str, spool_max_bytes: int,
                 timeout_seconds: float = 5.0, host: str | None = None):
        self.url, self.org, self.bucket, self._token = url, org, bucket, token
        self.host = host or os.uname().nodename
        self._http = V2Writer(url, org, bucket, token, timeout_seconds)
        self.spool = Spool(spool_dir, spool_max_bytes)
        self._pending: list[str] = []
        self._inflight: list[str] = []   # a new batch being sent, not yet on disk (spooled if we stop now)
        self._lock = threading.Lock()
        self.points_written_total = 0
        self.points_spooled_total = 0
        self.points_dropped_total = 0
        self.points_rejected_total = 0
        self.write_errors_total = 0
        self.spool_errors_total = 0
        self.spool_bytes = self.spool.size_bytes()   # kept current by flush(): no directory walk per scrape
        self.last_error: str | None = None
        self._spool_error_said: str | None = None

    def add(self, lines: list[str | None]) -> None:
        with self._lock:
            self._pending.extend(x for x in lines if x)
            self._bound_pending()

    def _bound_pending(self) -> None:
        over = len(self._pending) - MAX_HELD_POINTS
        if over > 0:   # the oldest go: neither the server nor the spool has taken them for a long time
            del self._pending[:over]
            self.points_dropped_total += over

    def _write(self, data: str) -> str:
        """'ok', 'retry' (keep the batch for later) or 'rejected' (the batch itself was refused)."""
        try:
            self._http.write(data.encode())
            return "ok"
        except WriteFailed as exc:  # connection refused, deadlines, 4xx/5xx
            self.write_errors_total += 1
            msg = str(exc)
            if self._token:
                msg = msg.replace(self._token, "***")
            if exc.status in BATCH_FAULT_STATUSES:
                self.last_error = msg
                return "rejected"
            if msg != self.last_error:
                log.warning("InfluxDB write to %s failed: %s", self.url, msg)
            self.last_error = msg
            return "retry"

    def _reject(self, data: str, name: str) -> None:
        n = data.count("\n") + (0 if data.endswith("\n") else 1)
        self.points_rejected_total += n
        kept = self.spool.set_aside(data, name)
        log.error("InfluxDB at %s refused a batch of %d points as invalid (%s); %s, going on with the rest",
                  self.url, n, self.last_error or "", f"set aside in {kept}" if kept else "not kept (spool not writable)")

    def flush(self) -> None:
        """Replay the spool oldest first, then send what is new; keep what fails."""
        try:
            self._flush()
        finally:
            self.spool_bytes = self.spool.size_bytes()

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        for path in self.spool.segments()[:MAX_WRITES_PER_FLUSH]:
            try:
                lines, damaged = decode_segment(read_bounded(path, self.spool.max_bytes + 1))
            except OSError:
                break
            if damaged:
                self.points_rejected_total += damaged
                log.error("InfluxDB spool segment %s: %d damaged points (their checksum does not match) are not "
                          "sent; %d whole ones are", path, damaged, len(lines))
            data = "\n".join(lines) + "\n"
            outcome = self._write(data) if lines else "ok"
            if outcome == "retry":
                break
            if outcome == "rejected":
                self._reject(data, os.path.basename(path))
            elif lines:
                self.points_written_total += len(lines)
                log.info("replayed %d spooled points to InfluxDB", len(lines))
            try:
                os.unlink(path)
            except OSError:
                break   # a read-only spool: the segment would be sent again; stop here
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

    def _spool(self, batch: list[str]) -> bool:
        """Put a batch on disk; when the spool cannot take it, keep it in memory (bounded). False then."""
        try:
            kept, dropped = self.spool.append(batch)
        except OSError as exc:
            self.spool_errors_total += 1
            said = exc.strerror or str(exc)
            if said != self._spool_error_said:
                log.error("InfluxDB spool %s cannot be written (%s): %d points wait in memory (at most %d)",
                          self.spool.directory, said, len(batch), MAX_HELD_POINTS)
                self._spool_error_said = said
            with self._lock:
                self._pending[:0] = batch
                self._bound_pending()
            return False
        self._spool_error_said = None
        self.points_spooled_total += kept
        if dropped:
            self.points_dropped_total += dropped
            log.error("InfluxDB spool is full (%d bytes): dropped %d points (%d dropped so far)",
                      self.spool.max_bytes, dropped, self.points_dropped_total)
        return True

    def spool_pending(self) -> int:
        """On shutdown: put what is unsent (in memory, or held by a write that hangs) on disk; no network.
        Returns how many points were kept; what the spool cannot take is counted as dropped and said."""
        with self._lock:
            batch = self._inflight + self._pending
            self._inflight, self._pending = [], []
        if batch and not self._spool(batch):
            with self._lock:
                lost, self._pending = len(self._pending), []
            self.points_dropped_total += lost
            log.error("InfluxDB: %d unsent points lost at shutdown: the spool %s cannot be written", lost,
                      self.spool.directory)
            return 0
        self.spool_bytes = self.spool.size_bytes()
        return len(batch)

    def close(self) -> None:
        pass   # one connection per write, closed by it


def read_token(token_file: str, token_env: str) -> str:
    if token_file:
        return read_bounded(token_file, MAX_TOKEN_BYTES).decode("utf-8", "replace").strip()
    return os.environ.get(token_env, "") if token_env else ""
