"""The InfluxDB output against servers that trickle, that answer with a huge error
body, and spools that are full or read-only. Fake servers are real sockets on loopback,
each stopped by its test; filesystems are loop devices, detached by their fixtures.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from iowarden.daemon.outputs.influx import InfluxWriter
from iowarden.daemon.outputs.line_protocol import line
from tests.conftest import LoopXfs
from tests.integration.helpers import config_text, free_port
from tests.integration.test_state_full_filesystem import fill

pytestmark = [pytest.mark.root, pytest.mark.slow]


class _RawServer:
    """Accepts connections on loopback and hands each to `answer(conn)` on a thread of its own."""

    def __init__(self, answer):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.stopping = threading.Event()
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopping.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            c.recv(1 << 20)   # the request (small here); then the answer, however this server gives it
            self.answer(c, self.stopping)
        except OSError:
            pass

    def stop(self):
        self.stopping.set()
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


def _trickle(c, stopping):
    for ch in b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n":   # one byte every 3 s: 2 minutes
        if stopping.wait(3.0):
            return
        c.sendall(bytes([ch]))


def test_a_trickling_server_cannot_hold_a_write_past_its_whole_deadline(tmp_path):
    srv = _RawServer(_trickle)
    try:
        w = InfluxWriter(f"http://127.0.0.1:{srv.port}", "o", "b", "", str(tmp_path / "spool"), 1 << 20,
                         timeout_seconds=5.0)
        w.add([line("m", {"t": "a"}, {"v": 1.0}, 1.0)])
        t0 = time.monotonic()
        w.flush()
        took = time.monotonic() - t0
        # unguarded, the write never ended: each byte came within the per-operation timeout
        assert took < 7.0, took
        assert "within 5 s" in (w.last_error or ""), w.last_error
        assert len(w.spool.segments()) == 1 and w.points_dropped_total == 0   # kept for the next try
    finally:
        srv.stop()


HUGE = 256 << 20


def _huge_error(c, stopping):
    c.sendall(f"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: {HUGE}\r\n\r\n"
              .encode())
    chunk = b"x" * (1 << 20)
    for _ in range(HUGE >> 20):
        if stopping.is_set():
            return
        c.sendall(chunk)


WRITER_SCRIPT = """
import json, logging, resource, sys, time
from iowarden.daemon.outputs.influx import InfluxWriter
from iowarden.daemon.outputs.line_protocol import line
log = logging.getLogger("iowarden")
log.addHandler(logging.StreamHandler(sys.stderr))
w = InfluxWriter(sys.argv[1], "o", "b", "", sys.argv[2], 1 << 20, timeout_seconds=10.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
w.add([line("m", {"t": "a"}, {"v": 1.0}, 1.0)])
t0 = time.monotonic()
w.flush()
log.warning("after the flush")
print(json.dumps({"before_kb": before, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "seconds": time.monotonic() - t0, "error": w.last_error, "root_handlers": len(logging.getLogger().handlers),
                  "spooled": len(w.spool.segments())}))
"""


def test_a_huge_error_body_is_read_only_in_part_and_logged_once_and_short(tmp_path):
    srv = _RawServer(_huge_error)
    try:
        r = subprocess.run([sys.executable, "-c", WRITER_SCRIPT, f"http://127.0.0.1:{srv.port}",
                            str(tmp_path / "spool")], capture_output=True, text=True, timeout=60)
    finally:
        srv.stop()
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    grew_mb = (got["peak_kb"] - got["before_kb"]) / 1024
    print(f"a 500 with a 256 MiB body: the writer's peak RSS grew {grew_mb:.1f} MB, flush {got['seconds']:.2f} s")
    assert grew_mb < 20, got                              # unguarded: 79 MB -> 1.39 GB
    assert got["error"].startswith("HTTP 500") and len(got["error"]) < 400, got["error"]
    assert got["root_handlers"] == 0                      # no logging.basicConfig behind the daemon's back
    assert r.stderr.count("after the flush") == 1         # unguarded, every line was printed twice
    assert len(r.stderr) < 2000, r.stderr[:500]
    assert got["spooled"] == 1


@pytest.fixture
def small_spool_fs():
    fs = LoopXfs("16M", mkfs=("mkfs.ext4", "-q", "-F"))
    yield fs
    fs.close()


def test_a_full_spool_keeps_the_batch_in_memory_and_spools_it_when_space_returns(small_spool_fs, caplog):
    dead = free_port()
    spool = small_spool_fs.mountpoint / "spool"
    w = InfluxWriter(f"http://127.0.0.1:{dead}", "o", "b", "", str(spool), 1 << 20, timeout_seconds=1.0)
    filler = fill(small_spool_fs.mountpoint)
    try:
        for i in range(5):
            w.add([line("m", {"t": "a"}, {"v": float(i)}, float(i))])
            w.flush()   # unguarded: an OSError traceback every flush, and the batch was gone, uncounted
        assert w.points_dropped_total == 0 and w.spool_errors_total == 5
        assert caplog.text.count("cannot be written") == 1        # said once, not per flush
    finally:
        os.unlink(filler)
    w.add([line("m", {"t": "a"}, {"v": 5.0}, 5.0)])
    w.flush()
    from iowarden.daemon.outputs.influx import decode_segment
    spooled = [ln for p in w.spool.segments() for ln in decode_segment(open(p, "rb").read())[0]]
    assert sum(ln.startswith("m,t=a ") for ln in spooled) == 6, spooled   # every point, in order
    assert [float(x.split("v=")[1].split(" ")[0]) for x in spooled] == [0, 1, 2, 3, 4, 5]


def test_sigterm_with_a_read_only_spool_still_closes_everything(shared_loop_xfs, tmp_path, daemon_factory):
    state = tmp_path / "state"
    spool = state / "influx-spool"
    spool.mkdir(parents=True)
    dead = free_port()
    extra = (f"[influxdb]\nenabled = true\nurl = \"http://127.0.0.1:{dead}\"\nflush_interval_seconds = 1.0\n"
             "timeout_seconds = 1.0\niostat_interval_seconds = 1.0\n")
    # read-only before the start: the daemon reaches its spool through the directory it opened and verified
    # at start, so a mount laid over the path later is not where it writes
    subprocess.run(["mount", "--bind", str(spool), str(spool)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(spool)], check=True)
        d = daemon_factory(config_text(shared_loop_xfs.mountpoint, state, runtime=0.3, interval=1.0, extra=extra))
        d.wait_message("READY=1")
        time.sleep(4)   # flushes fail to the dead server, and the spool cannot take them
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=15) == 0
        out = d.output()
        # unguarded: a traceback from spool_pending, the HTTP server and the database left open
        assert "Traceback" not in out, out[-3000:]
        assert "unsent points lost at shutdown" in out and "cannot be written" in out
        assert "iowarden stopping" in out
    finally:
        subprocess.run(["umount", str(spool)], check=True)
    # the database was closed cleanly: no WAL left to replay
    assert not (state / "state.db-wal").exists() or (state / "state.db-wal").stat().st_size == 0
