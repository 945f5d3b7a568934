"""No anonymous client can lock out an authenticated one: the policy of auth.py with a fake clock, its queue on a real event loop. No root."""
import asyncio
import concurrent.futures
import time

import bcrypt

from iowarden.daemon.outputs.auth import (FAILED_AUTH_PER_SOURCE, LIMITED_CHECK_SECONDS, MAX_HASHES_WAITING,
                                          BasicAuth, FairHasher)

HASH_SECONDS = 0.05


def _auth(clock=None):
    users = {"prometheus": bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4))}
    return BasicAuth(users, clock=clock) if clock else BasicAuth(users)


def test_five_wrong_passwords_from_the_scrapers_address_cost_it_one_minute_not_a_renewable_five():
    """Landed code: the limit was renewed by every failure while limited, so an attacker on the scraper's
    address kept it out for good."""
    now = [0.0]
    auth = _auth(lambda: now[0])
    for i in range(FAILED_AUTH_PER_SOURCE):
        auth.verify("prometheus", f"guess{i}".encode(), "10.0.0.9")
    assert auth.over_limit("10.0.0.9")
    for t in range(1, 59):   # the attacker keeps guessing every second: no renewal, and still limited
        now[0] = float(t)
        assert auth.over_limit("10.0.0.9")
    now[0] = LIMITED_CHECK_SECONDS
    assert not auth.over_limit("10.0.0.9")      # one check through, a minute after the limit began
    assert auth.over_limit("10.0.0.9")          # and only one
    assert auth.verify("prometheus", b"right", "10.0.0.9") and auth.remembered("prometheus", b"right")
    now[0] = 301.0
    assert not auth.over_limit("10.0.0.9")      # the window of the five failures is over: not renewed


def test_a_reload_keeps_what_was_proven_against_an_unchanged_hash_only():
    auth = _auth()
    assert auth.verify("prometheus", b"right", "10.0.0.1")
    kept = BasicAuth(dict(auth.users), previous=auth)
    assert kept.remembered("prometheus", b"right")
    changed = BasicAuth({"prometheus": bcrypt.hashpw(b"new", bcrypt.gensalt(rounds=4))}, previous=auth)
    assert not changed.remembered("prometheus", b"right")


def test_every_check_is_padded_to_the_costliest_users_time():
    """Landed code: a cost-4 user answered in 3-9 ms, an unknown one (dummy hash at cost 12) in 260-380 ms."""
    users = {"cheap": bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4)),
             "dear": bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=11))}
    auth = BasicAuth(users)
    # the hash's own cost: the CPU time of this thread, which a busy machine does not stretch (bcrypt hashes on
    # the calling thread), where the wall time it pads to only grows with load. Timed by the wall, the fastest of
    # three here took 1.05 s beside other work while the padding measured 0.50 s a moment before
    costly = float("inf")
    for _ in range(3):
        began = time.thread_time()
        bcrypt.checkpw(b"x", users["dear"])
        costly = min(costly, time.thread_time() - began)
    assert auth.cost == 11 and auth.check_seconds >= costly * 0.8


def _run_flood(flood_sources, settle_seconds: float):
    """A flood keeping checks in flight from the given sources (one check per attacker at a time, each
    rotating over its addresses) until every address has been heard once, then settle_seconds more; then a
    scraper's check: (the flood's hashes that began between the scraper's asking and its own hash, seconds
    it took, its answer). Counted in hashes, not seconds: a busy machine stretches every hash alike."""
    auth = _auth()
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    began = []   # whose hash began, in order (the one hashing thread appends)

    def slow(ok):
        began.append("scraper" if ok else "flood")
        time.sleep(HASH_SECONDS)
        return ok

    async def main():
        fair = FairHasher(asyncio.get_running_loop(), executor, auth)
        stop = asyncio.Event()

        async def attacker(sources):
            i = 0
            while not stop.is_set():
                source = sources[i % len(sources)]
                i += 1
                if await fair.run(source, lambda: slow(False)) is False:
                    auth.verify("prometheus", b"wrong", source)   # the failure the real check records
                await asyncio.sleep(0.001)

        tasks = [asyncio.ensure_future(attacker(group)) for group in flood_sources]
        deadline = time.monotonic() + 60
        while not all(auth.has_failed(s) for group in flood_sources for s in group):
            assert time.monotonic() < deadline, "the flood's addresses were never all heard"
            await asyncio.sleep(0.05)
        await asyncio.sleep(settle_seconds)
        started, asked = time.monotonic(), len(began)
        answer = await fair.run("10.9.9.9", lambda: slow(True))
        took = time.monotonic() - started
        stop.set()
        await asyncio.gather(*tasks)
        ahead = began[asked:began.index("scraper")] if "scraper" in began else began[asked:]
        return len(ahead), took, answer
    try:
        return asyncio.run(main())
    finally:
        executor.shutdown()


def test_twelve_checks_kept_in_flight_from_rotating_sources_cannot_hold_every_place():
    """Landed code: one shared queue of 4, a 503 not counted: the right password got 503 thirty times of
    thirty over 90 s. Here: 12 checks in flight, each attacker rotating over 2 addresses of its own (24);
    once each address has been heard (see FairHasher for the first moments of a flood), the scraper's
    check waits for the hash running, not behind the flood: at most that one of the flood's hashes begins
    after it asks and before its own (behind the flood it would be 12)."""
    pools = [[f"10.1.{k}.{i}" for i in range(2)] for k in range(12)]
    for settle in (0.0, 0.3, 1.0):
        ahead, took, answer = _run_flood(pools, settle)
        assert answer is True, "the scraper's check got no place"
        assert ahead <= 1, f"{ahead} of the flood's hashes went first; the scraper waited {took:.3f} s"


def test_one_check_per_source_and_a_newcomer_takes_a_failing_sources_place():
    auth = _auth()
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    async def main():
        fair = FairHasher(asyncio.get_running_loop(), executor, auth)
        blocker = asyncio.ensure_future(fair.run("10.0.0.1", lambda: time.sleep(0.3) or "ran"))
        await asyncio.sleep(0.05)
        assert await fair.run("10.0.0.1", lambda: "twice") is None          # one per source
        for i in range(FAILED_AUTH_PER_SOURCE):
            auth.verify("prometheus", b"bad", "10.0.0.2")
        failing = [asyncio.ensure_future(fair.run(f"10.0.0.{2 + i}", lambda: "failing")) for i in range(1)]
        clean = [asyncio.ensure_future(fair.run(f"10.0.1.{i}", lambda: "clean")) for i in range(MAX_HASHES_WAITING - 1)]
        await asyncio.sleep(0.01)
        newcomer = asyncio.ensure_future(fair.run("10.0.2.1", lambda: "newcomer"))
        return await asyncio.gather(blocker, *failing, *clean, newcomer)
    try:
        results = asyncio.run(main())
    finally:
        executor.shutdown()
    assert results[0] == "ran" and results[1] is None          # the failing source's check gave its place
    assert results[2:] == ["clean"] * (MAX_HASHES_WAITING - 1) + ["newcomer"]


# ---- the InfluxDB token is scrubbed before any text is cut -----------------------------------------

def test_a_server_echoing_the_token_gets_none_of_it_into_the_message():
    """Landed code: 50 of the token's 90 characters reached the log (the text was cut at 300 before the
    token was replaced)."""
    import http.server
    import threading

    from iowarden.daemon.outputs.influx_wire import V2Writer, WriteFailed
    token = "T" * 40 + "s3cr3t" + "K" * 44

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            sent = self.headers.get("Authorization", "")
            for body in ((" " * 250 + sent).encode(),):
                self.send_response(401, "bad " + sent)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        writer = V2Writer(f"http://127.0.0.1:{server.server_address[1]}", "o", "b", token, 5.0)
        try:
            writer.write(b"m v=1 1\n")
        except WriteFailed as exc:
            message = str(exc)
        else:
            raise AssertionError("the write did not fail")
    finally:
        server.shutdown()
    assert "***" in message
    for piece in ("s3cr3t", "T" * 8, "K" * 8):
        assert piece not in message, message
