"""`replay --prometheus` without a server: iostat's formulas from node_exporter's counters (the daemon's own
iostat the reference), resets and gaps, node-mixin's `for`, peers, and the API client's answers to a server
that fails, refuses, echoes a secret or is not Prometheus (a small HTTP server of the test's own)."""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings, strategies as st

from iowarden.probes.common import ParseError
from iowarden.probes.diskstats import DiskCounters, compute_rates

from iowarden.daemon.commands.args import duration, instant_seconds
from iowarden.daemon.commands.prometheus_api import PrometheusAPI, QueryFailed, TooManyPoints, read_credential
from iowarden.daemon.commands.replay_prometheus import (COUNTERS, Deltas, firing_intervals, iostat_values,
                                                        peer_groups, peer_key, selector)

FIELDS = ("reads", "sectors_read", "read_ms", "writes", "sectors_written", "write_ms", "io_ms", "weighted_io_ms")


def exported(c: DiskCounters) -> dict:
    """node_exporter's counters of a /proc/diskstats line (its units: bytes and seconds)."""
    return {"reads": c.reads, "writes": c.writes, "read_bytes": c.sectors_read * 512,
            "written_bytes": c.sectors_written * 512, "read_seconds": c.read_ms / 1000,
            "write_seconds": c.write_ms / 1000, "io_seconds": c.io_ms / 1000, "weighted_seconds": c.weighted_io_ms / 1000}


counters = st.builds(lambda *v: DiskCounters(8, 0, "sda", **dict(zip(FIELDS, v))),
                     *[st.integers(0, 10**9) for _ in FIELDS])


@settings(max_examples=300, deadline=None)
@given(counters, st.lists(st.integers(0, 10**6), min_size=len(FIELDS), max_size=len(FIELDS)),
       st.floats(0.5, 120), st.booleans())
def test_the_columns_are_the_daemons_iostat_from_the_same_counters(before, increase, seconds, reset):
    """Over a pair of scrapes, or across a reset (a re-created device: its counters start again, smaller)."""
    after = DiskCounters(8, 0, "sda", **{f: (0 if reset else getattr(before, f)) + inc
                                         for f, inc in zip(FIELDS, increase)})
    if reset and all(getattr(after, f) >= getattr(before, f) for f in FIELDS):
        return      # not a reset at all: the first case
    if reset and any(0 <= getattr(after, f) - getattr(before, f) + 2**32 < 2**31 for f in FIELDS):
        return      # iostat would take it for a 32-bit wrap; node_exporter's counters are 64-bit
    ours = iostat_values(exported(before), exported(after), seconds)
    theirs = compute_rates(before, after, seconds).as_sysstat()
    for key, value in ours.items():
        # node_exporter's times are float seconds: at a counter of 10^9 ms (10^6 s) a double holds it to some
        # 2e-10 s, so a difference of two is good to 5e-10 s: up to 1e-7 % of util over half a second and 5e-7 ms
        # of an await (a 1 ms increase on a 97,346,816 ms counter came out 0.1000000015 % against 0.1)
        assert value == pytest.approx(theirs[key], rel=1e-9, abs=1e-6), key


def scrape(t, device="sda", **values):
    base = {k: 100.0 for k in COUNTERS}
    base.update(values)
    return [({"__name__": COUNTERS[k], "device": device}, [(t, v)]) for k, v in base.items()]


def test_a_reset_counts_its_new_value_a_gap_gives_no_line_a_repeated_sample_is_read_once():
    d = Deltas({"sda": "kind:sd"}, gap_seconds=45)
    assert d.lines(scrape(0)) == []                      # the first scrape: nothing to pair it with
    (line,) = d.lines(scrape(15, reads=400.0))           # 300 reads in 15 s
    assert line.timestamp == 15 and line.values["r/s"] == pytest.approx(20) and line.model == "kind:sd"
    (line,) = d.lines(scrape(15, reads=400.0) + scrape(30, reads=100.0))   # 15 again (a range's closed edge)
    assert line.timestamp == 30 and line.values["r/s"] == pytest.approx(100 / 15)   # reset: its new value
    assert d.lines(scrape(90, reads=200.0)) == []        # 60 s after the last: a gap, no line across it
    (line,) = d.lines(scrape(105, reads=230.0))
    assert line.values["r/s"] == pytest.approx(2)


def test_a_scrape_missing_a_series_waits_for_a_whole_one_and_other_devices_are_not_read():
    d = Deltas({"sda": None}, gap_seconds=45)
    d.lines(scrape(0))
    part = [s for s in scrape(15, reads=400.0) if s[0]["__name__"] != COUNTERS["io_seconds"]]
    assert d.lines(part + scrape(15, device="sdz")) == []
    (line,) = d.lines(scrape(30, reads=700.0))
    assert line.values["r/s"] == pytest.approx(600 / 30)


def test_node_mixin_fires_after_its_for_and_a_missing_point_ends_the_run():
    minute = 60.0
    held = [(i * minute, 12.0) for i in range(40)]
    assert firing_intervals(held, minute) == [(1800.0, 39 * minute)]
    assert firing_intervals([(i * minute, 12.0) for i in range(30)], minute) == []      # 29 minutes: pending
    broken = [(i * minute, 12.0) for i in range(40) if i != 20]
    assert firing_intervals(broken, minute) == []
    dipped = [(i * minute, 12.0 if i != 35 else 3.0) for i in range(80)]
    assert firing_intervals(dipped, minute) == [(1800.0, 34 * minute), (36 * minute + 1800, 79 * minute)]


def test_peers_are_disks_of_a_model_else_of_a_kind_and_arrays_have_none():
    assert peer_key("sda", "ST4000") == "model:ST4000" and peer_key("nvme0n1", None) == "kind:nvme"
    assert peer_key("md0", "x") is None and peer_key("dm-3", None) is None and peer_key("rbd0", None) is None
    devices = {n: peer_key(n, m) for n, m in [("sda", "A"), ("sdb", "A"), ("sdc", "B"), ("nvme0n1", None),
                                              ("nvme1n1", None), ("md0", None)]}
    assert sorted(peer_groups(devices)) == [("nvme0n1", "nvme1n1"), ("sda", "sdb")]


def test_an_instance_is_quoted_as_a_promql_string():
    assert selector('a"b\\c:9100') == '{instance="a\\"b\\\\c:9100"}'
    assert selector("h:9100", 'device="sda"') == '{instance="h:9100", device="sda"}'


def test_durations_and_instants_are_refused_by_name():
    assert duration("1h30m") == 5400 and duration("15s") == 15 and duration("90") == 90
    for bad in ("", "5 minutes", "0s", "-1m", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)
    assert instant_seconds("now-2h", 10_000) == 2800 and instant_seconds("-1d", 100_000) == 13_600
    assert instant_seconds("1700000000", 0) == 1.7e9
    with pytest.raises(argparse.ArgumentTypeError, match="not an instant"):
        instant_seconds("yesterday", 0)


def test_a_url_with_a_password_or_no_host_is_refused_before_anything_is_sent():
    with pytest.raises(ParseError, match="carries credentials") as e:
        PrometheusAPI("http://me:s3cret@prom:9090")
    assert "s3cret" not in str(e.value)
    for bad in ("prom:9090", "ftp://prom", "http://prom:99999"):
        with pytest.raises(ParseError):
            PrometheusAPI(bad)


def test_chunks_cover_the_window_once_within_the_points_asked_for():
    api = PrometheusAPI("http://prom:9090", max_points=100)
    chunks = api.chunks(0, 10_000, 15)
    assert chunks[0][0] == 0 and chunks[-1][1] == 10_000
    assert all(b - a <= 99 * 15 for a, b in chunks)
    assert all(n[0] == p[1] + 15 for p, n in zip(chunks, chunks[1:]))
    while api.fewer_points():
        pass
    assert 60 <= api.max_points < 120


def test_a_credential_file_is_read_bounded_and_never_shown(tmp_path):
    f = tmp_path / "token"
    f.write_text("abc.def\nsecond line ignored\n")
    assert read_credential(str(f), "--bearer-token-file") == "abc.def"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ParseError, match="empty"):
        read_credential(str(tmp_path / "empty"), "--bearer-token-file")
    with pytest.raises(ParseError, match="cannot read"):
        read_credential(str(tmp_path / "absent"), "--password-file")


class Scripted:
    """A small HTTP server answering each request with the next (status, content type, body) of a script,
    the request's Authorization header substituted for {auth} (a server that echoes it)."""

    def __init__(self, answers):
        self.answers, self.seen = list(answers), []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.do_GET()

            def do_GET(self):
                scripted.seen.append(self.path)
                status, ctype, body, *delay = scripted.answers.pop(0)
                time.sleep(delay[0] if delay else 0)
                body = body.replace("{auth}", self.headers.get("Authorization", "")).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    made = []

    def make(*answers):
        made.append(Scripted(answers))
        return made[-1]
    yield make
    for s in made:
        s.close()


OK = json.dumps({"status": "success", "data": ["h1:9100"]})


def test_a_failing_server_is_tried_again_and_said_with_its_tries(scripted):
    s = scripted((503, "text/plain", "overloaded"), (200, "application/json", OK))
    api = PrometheusAPI(s.url, retries=3, sleep=lambda _: None)
    assert api.label_values("instance", "up", 0, 1) == ["h1:9100"] and len(s.seen) == 2
    s = scripted(*[(502, "text/plain", "bad gateway")] * 2)
    with pytest.raises(QueryFailed, match=r"HTTP 502: bad gateway \(2 tries\)"):
        PrometheusAPI(s.url, retries=2, sleep=lambda _: None).label_values("instance", "up", 0, 1)


def test_a_server_echoing_the_token_has_it_scrubbed(scripted):
    token = "tok-9f8e7d6c5b4a"
    s = scripted(*[(500, "text/plain", "no good: {auth}")] * 2)
    with pytest.raises(QueryFailed) as e:
        PrometheusAPI(s.url, retries=2, bearer_token=token, sleep=lambda _: None).label_values("instance", "up", 0, 1)
    assert token not in str(e.value) and "Bearer ***" in str(e.value)
    s = scripted((401, "application/json", '{"status":"error","error":"{auth}"}'))
    with pytest.raises(QueryFailed, match="credentials given were not accepted") as e:
        PrometheusAPI(s.url, bearer_token=token).label_values("instance", "up", 0, 1)
    assert token not in str(e.value)


def test_not_prometheus_and_too_many_points_are_told_apart(scripted):
    s = scripted((200, "text/html", "<html>Grafana</html>"))
    with pytest.raises(QueryFailed, match=r"does not answer as a Prometheus query API .*text/html, not JSON"):
        PrometheusAPI(s.url).label_values("instance", "up", 0, 1)
    s = scripted((422, "application/json", json.dumps({
        "status": "error", "errorType": "bad_data",
        "error": "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution"})))
    with pytest.raises(TooManyPoints):
        PrometheusAPI(s.url).query_range("up", 0, 1e6, 1)
    s = scripted((400, "application/json", json.dumps({"status": "error", "errorType": "bad_data",
                                                       "error": "parse error at char 3"})))
    with pytest.raises(QueryFailed, match=r"refused the query \(bad_data\): parse error at char 3"):
        PrometheusAPI(s.url).query_range("up(", 0, 1, 1)


def test_the_plots_trace_is_io_weighted_and_bounded_in_points():
    from iowarden.daemon.commands.replay_plots import MAX_POINTS, AwaitTrace
    from iowarden.daemon.passive.values import Flow, Window
    trace = AwaitTrace(0, 30 * 86400)        # a month: one bucket is half an hour
    for t in range(15, 3600, 15):
        trace.add(Window("sda", t, 15, {"read": Flow(100.0, 400.0, 1.0), "write": Flow(300.0, 1200.0, 3.0)}))
        trace.add(Window("sdb", t, 15, {"read": Flow(0.0, 0.0, 0.0)}))          # idle: no point
    # (100 x 1 ms + 300 x 3 ms) / 400: each window's await weighted by its I/Os, in buckets of 1,728 s
    assert sorted(trace.series("sda")) == [0, 1, 2] and trace.series("sdb") == {}
    assert all(v == pytest.approx(2.5) for v in trace.series("sda").values())
    for t in range(0, 30 * 86400, 600):
        trace.add(Window("sdc", t, 15, {"read": Flow(1.0, 4.0, 1.0)}))
    assert len(trace.series("sdc")) <= MAX_POINTS


# The CLI as a terminal starts it: SIGINT's default action, unblocked. A child inherits its parent's ignored and
# blocked signals, and a test worker's are what whoever started the suite, and the tests before this one on that
# worker, left them: beside the whole suite the CLI let Ctrl-C go unanswered for 30 s, and never when run by itself.
# A single-threaded process of its own resets both and execs the CLI (a preexec_fn in a forked copy of a worker with
# threads, this test's server among them, could deadlock).
_AS_AT_A_TERMINAL = [sys.executable, "-c",
                     "import os, signal, sys\n"
                     "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
                     "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})\n"
                     "os.execv(sys.executable, [sys.executable, '-m', 'iowarden.daemon.cli', *sys.argv[1:]])\n"]


def _signal_masks(pid: int) -> str:
    try:
        return " ".join(x for x in open(f"/proc/{pid}/status").read().splitlines() if x.startswith("Sig"))
    except OSError as exc:
        return str(exc)


def test_ctrl_c_prints_what_was_replayed_and_where_it_stopped(scripted):
    """The second host's first answer is slow; Ctrl-C meanwhile: the first host's report, and the stop said. The
    command runs as a user runs it, in a process of its own that the signal is sent to: a test worker's own SIGINT
    is its runner's (under pytest-xdist one sent to the worker went unanswered for the whole slow answer)."""
    ok = lambda data: (200, "application/json", json.dumps({"status": "success", "data": data}))  # noqa: E731
    samples = [{"metric": {"__name__": name, "device": "sda"}, "values": [[t, str(100 + t)] for t in (985, 1000, 1015)]}
               for name in COUNTERS.values()]
    s = scripted(ok(["h1:9100", "h2:9100"]), ok([{"device": "sda"}]), ok([]),
                 ok({"resultType": "matrix", "result": samples}), ok({"resultType": "matrix", "result": []}),
                 (*ok([]), 60))
    proc = subprocess.Popen([*_AS_AT_A_TERMINAL, "replay", "--prometheus", s.url,
                             "--from", "1000", "--to", "1020", "--retries", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # on the condition, not after a fixed delay: the first host's five answers come when they come
        deadline = time.monotonic() + 60
        while len(s.seen) < 6 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(s.seen) == 6, ("requests seen:", s.seen)
        signals = _signal_masks(proc.pid)   # said if the signal goes unanswered
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the replay did not stop within 30 s of SIGINT; its signals: {signals}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert "h1:9100: 1 disks" in out and "interrupted: h1:9100 was replayed up to" in out, out
    assert "the hosts after it were not read" in out
