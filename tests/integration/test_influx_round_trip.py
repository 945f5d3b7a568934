"""InfluxDB output against real servers.

victoria-metrics (the InfluxDB v2 write API) for the line-protocol round trip; small
fake servers for what a real one does not do on demand: refuse one batch with 400,
or accept a connection and never answer.
"""
import json
import os
import signal
import socket
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from iowarden.daemon.outputs.influx import InfluxWriter
from iowarden.daemon.outputs.line_protocol import line
from tests.integration import servers
from tests.integration.helpers import config_text, free_port, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    d = tmp_path_factory.mktemp("vm")
    port = free_port()
    server = servers.victoria_metrics(d / "data", port, str(d / "vm.log"))
    yield port
    server.stop()


def _export(port, match):
    url = f"http://127.0.0.1:{port}/api/v1/export?" + urllib.parse.urlencode({"match[]": match})
    with urllib.request.urlopen(url, timeout=10) as r:
        # split on line feeds only: str.splitlines() also splits inside values (U+0085, U+2028, ...)
        return [json.loads(x) for x in r.read().decode().split("\n") if x]


def _write_direct(port, text):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v2/write?org=o&bucket=b&precision=ns",
                                 data=text.encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 204


# Tag values are what users name (targets, mount points) and what the kernel names (devices,
# identities): any text (no surrogates: not UTF-8). A line feed, which no line-protocol parser
# can carry, is written as the two characters \n. Tag and field keys are iowarden's own
# vocabulary; here they take the punctuation line protocol escapes. (victoria-metrics misreads
# a '"' in a field key, and stores no string fields: the error text is checked not to forge.)
names = st.text(min_size=1, max_size=30)
keys = st.text(alphabet="abcXYZ_09 ,=\\.-:/\n", min_size=1, max_size=12)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.generate])   # each example is a server round trip: no shrinking
@given(st.lists(st.tuples(names, keys, keys), min_size=60, max_size=120))
def test_any_tag_value_round_trips_through_victoria_metrics(vm, triples):
    run = f"rt{time.time_ns()}"
    now = time.time()
    lines = [line(run, {"i": str(i), "tag": v, f"k_{k}": "x"}, {f"f_{fk}": float(i)}, now)
             for i, (v, k, fk) in enumerate(triples)]
    _write_direct(vm, "\n".join(lines))
    expect = {str(i): (v.replace("\n", "\\n"), f"k_{k}".replace("\n", "\\n"), f"{run}_f_{fk}".replace("\n", "\\n"))
              for i, (v, k, fk) in enumerate(triples)}

    def got():
        series = _export(vm, '{__name__=~"' + run + '_.*"}')
        return series if len(series) >= len(set(expect)) else None
    series = wait_for(got, timeout=20, what="the points in victoria-metrics")
    seen = {}
    for s in series:
        m = s["metric"]
        tagkey = next(k for k in m if k.startswith("k_"))
        seen[m["i"]] = (m["tag"], tagkey, m["__name__"])
        assert s["values"] == [float(m["i"])]
    assert seen == expect


def test_a_name_with_a_line_feed_cannot_forge_a_point(vm):
    target = "db\nforged_point,host=victim value=666"
    error = 'fio said "no"\nforged_point,host=victim value=667 1'
    _write_direct(vm, line("iowarden_probe", {"target": target, "host": "h"}, {"read_iops": 1.0, "error": error},
                           time.time()))
    series = wait_for(lambda: _export(vm, '{__name__="iowarden_probe_read_iops",host="h"}'), what="the point")
    assert series[0]["metric"]["target"] == target.replace("\n", "\\n")
    assert _export(vm, '{__name__=~"forged_point.*"}') == []


class _RefusingServer:
    """An InfluxDB v2 write endpoint that answers 400 to a batch holding 'poison', 204 to others."""

    def __init__(self):
        self.accepted: list[str] = []
        self.refused = 0
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                if "poison" in body:
                    srv.refused += 1
                    payload = b'{"code":"invalid","message":"unable to parse points"}'
                    self.send_response(400)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                srv.accepted.extend(body.splitlines())
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server, self.port = servers.serve_in_thread(Handler)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_refused_batch_is_set_aside_and_the_spool_moves_on(tmp_path):
    # first the server is down: a poisoned batch and a good one both wait in the spool
    dead = free_port()
    w = InfluxWriter(f"http://127.0.0.1:{dead}", "o", "b", "", str(tmp_path / "spool"), 1 << 20, timeout_seconds=2)
    w.add([line("m", {"t": "poison"}, {"v": 1.0}, 1.0)])
    w.flush()
    w.add([line("m", {"t": "good"}, {"v": 2.0}, 2.0)])
    w.flush()
    assert len(w.spool.segments()) == 2
    # then a server that refuses the poisoned one
    srv = _RefusingServer()
    try:
        w.url = f"http://127.0.0.1:{srv.port}"
        w.close()
        w2 = InfluxWriter(w.url, "o", "b", "", str(tmp_path / "spool"), 1 << 20, timeout_seconds=2)
        for i in range(5):
            w2.add([line("m", {"t": f"new{i}"}, {"v": float(i)}, 3.0 + i)])
            w2.flush()
        assert srv.refused == 1                       # on main: refused on every flush, 36 times
        assert w2.spool.segments() == []
        assert w2.points_rejected_total == 1 and w2.points_written_total == 6
        assert [x.split(" ")[0] for x in srv.accepted] == ["m,t=good"] + [f"m,t=new{i}" for i in range(5)]
        kept = os.listdir(w2.spool.rejected_dir)
        assert len(kept) == 1 and "poison" in (tmp_path / "spool" / "rejected" / kept[0]).read_text()
        # a new batch refused at once is set aside too, and what comes after it is written
        w2.add([line("m", {"t": "poison2"}, {"v": 9.0}, 9.0)])
        w2.flush()
        w2.add([line("m", {"t": "after"}, {"v": 10.0}, 10.0)])
        w2.flush()
        assert w2.points_rejected_total == 2 and srv.accepted[-1].startswith("m,t=after")
        w2.close()
    finally:
        srv.stop()


class _SilentServer:
    """Accepts connections and reads, but never answers: a hung InfluxDB."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def stop(self):
        self.stopping = True
        self.sock.close()
        for c in self.conns:
            c.close()


def test_sigterm_stops_within_5_s_with_a_hung_influxdb_and_spools_what_was_unsent(loop_xfs, tmp_path,
                                                                                  daemon_factory):
    silent = _SilentServer()
    try:
        state = tmp_path / "state"
        extra = (f"[influxdb]\nenabled = true\nurl = \"http://127.0.0.1:{silent.port}\"\nflush_interval_seconds = 1.0\n"
                 "timeout_seconds = 20.0\n")
        d = daemon_factory(config_text(loop_xfs.mountpoint, state, runtime=0.3, interval=1.0, extra=extra))
        d.wait_message("READY=1")
        wait_for(lambda: len(silent.conns) >= 1, what="a write to the hung server")
        wait_for(lambda: "probe loop/rr on" in d.output(), what="a probe result")
        time.sleep(2)   # a write is hanging now, and results are in memory behind it
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=15) == 0
        took = time.monotonic() - t0
        print(f"stopped in {took:.2f} s with a hung InfluxDB (timeout_seconds = 20)")
        assert took < 5, f"stopped in {took:.1f} s (on main: 21 s at timeout_seconds = 20)"
        spooled = "".join(p.read_text() for p in (state / "influx-spool").glob("*.lp"))
        assert spooled.count("iowarden_probe,") >= 1, d.output()[-2000:]
        assert "unsent points kept in the spool" in d.output()
    finally:
        silent.stop()
