"""Basic auth for the metrics endpoint: bcrypt work bounded, shared fairly, and never a way to lock out
the scraper that knows the password.

bcrypt is slow on purpose (~0.25 s at cost 12), so what a client can make the daemon hash is the
attack surface. The rules, each against an attack seen:
- a correct password is remembered (only correct ones: wrong ones cannot evict them) and costs
  nothing afterwards; a reload that keeps a user's hash keeps what was remembered for it;
- one hash at a time (one core at most), from a queue (FairHasher) that holds one check per source and
  serves sources that have not failed before those that have: twelve wrong passwords kept in flight
  from rotating sources cannot hold every place (the landed queue of 4 answered the right password 503
  thirty times in a row), and a waiting check of a failing source gives its place to a newcomer;
- a source with FAILED_AUTH_PER_SOURCE failures in FAILED_AUTH_WINDOW_SECONDS gets 429 without a hash,
  but failures while it is limited do not renew the limit, and it still gets one check every
  LIMITED_CHECK_SECONDS: five wrong passwords from the scraper's own address cost the scraper at
  most that long, not five renewable minutes;
- every check takes as long as the costliest user's (padded on the event loop, holding no thread), and
  an unknown user is checked against a hash of that cost: no user, known or not, cheap or costly, is
  told apart by timing.
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import threading
import time

FAILED_AUTH_PER_SOURCE = 5
FAILED_AUTH_WINDOW_SECONDS = 300.0
LIMITED_CHECK_SECONDS = 60.0         # a limited source still gets one check this often (the scraper behind it)
MAX_HASHES_WAITING = 4               # checks waiting for the hashing thread (one per source); more get 503
GOOD_CREDENTIALS_KEPT = 64
MAX_SOURCES_REMEMBERED = 4096


def _cost(hashed: bytes) -> int:
    """A bcrypt hash's cost ($2b$12$...: 12)."""
    return int(hashed.split(b"$")[2])


class BasicAuth:
    """Who may scrape, at a bounded cost in bcrypt work (see the module's docstring). Thread-safe: the
    hashing thread verifies, the event loop asks."""

    def __init__(self, users: dict[str, bytes], clock=time.monotonic, previous: "BasicAuth | None" = None):
        import bcrypt
        self.users = users
        self.clock = clock
        self.cost = max((_cost(h) for h in users.values()), default=4)
        # an unknown user is checked against this, at the cost of the costliest real hash
        self._dummy = bcrypt.hashpw(b"iowarden-dummy", bcrypt.gensalt(rounds=self.cost))
        started = time.monotonic()
        bcrypt.checkpw(b"iowarden-timing", self._dummy)
        # what every check is padded to: the costliest hash's own time, with a margin for a busy machine
        self.check_seconds = (time.monotonic() - started) * 1.25
        self._good: collections.OrderedDict[bytes, bool] = collections.OrderedDict()
        if previous is not None:   # a reload: what was proven against a hash that did not change still holds
            self._good.update(previous._good)
        self._failures: dict[str, collections.deque] = {}
        self._limited_check_at: dict[str, float] = {}
        self._turned_away: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hashes_total = 0          # bcrypt checks run: what clients made the daemon spend
        self.refused_total = 0         # checks refused without a hash (429 or 503)

    def _key(self, user: str, password: bytes) -> bytes:
        hashed = self.users.get(user, self._dummy)
        return hashlib.sha256(user.encode() + b"\0" + password + b"\0" + hashed).digest()

    def remembered(self, user: str, password: bytes) -> bool:
        with self._lock:
            key = self._key(user, password)
            if key in self._good:
                self._good.move_to_end(key)
                return True
        return False

    def _recent_failures(self, source: str, now: float) -> collections.deque:
        q = self._failures.get(source)
        while q and q[0] < now - FAILED_AUTH_WINDOW_SECONDS:
            q.popleft()
        return q if q is not None else collections.deque()

    def has_failed(self, source: str) -> bool:
        """Failed a check, or was turned away, within the window (its checks wait behind those of sources
        that have not)."""
        now = self.clock()
        with self._lock:
            if now - self._turned_away.get(source, float("-inf")) < FAILED_AUTH_WINDOW_SECONDS:
                return True
            return bool(self._recent_failures(source, now))

    def note_turned_away(self, source: str, flooding: bool = False) -> None:
        """A check of this source got no place (503). flooding: it asked again while its check waited; it
        falls behind for the window, without counting towards its 429. A source turned away only because
        every place was taken stays as it was: the scraper that came at a bad moment is not marked."""
        with self._lock:
            self.refused_total += 1
            if not flooding:
                return
            self._turned_away[source] = self.clock()
            self._turned_away.move_to_end(source)
            while len(self._turned_away) > MAX_SOURCES_REMEMBERED:
                self._turned_away.popitem(last=False)

    def over_limit(self, source: str) -> bool:
        """True: answer 429 without a hash. A limited source is let through once per LIMITED_CHECK_SECONDS."""
        now = self.clock()
        with self._lock:
            if len(self._recent_failures(source, now)) < FAILED_AUTH_PER_SOURCE:
                return False
            if now - self._limited_check_at.get(source, float("-inf")) >= LIMITED_CHECK_SECONDS:
                self._limited_check_at[source] = now
                return False
            return True

    def verify(self, user: str, password: bytes, source: str) -> bool:
        """Run one bcrypt check (the caller bounds how many run at once) and remember its outcome."""
        import bcrypt
        known = user in self.users
        hashed = self.users.get(user, self._dummy)
        # bcrypt reads 72 bytes at most (and bcrypt 5 refuses more): no stored password is longer
        ok = len(password) <= 72 and bcrypt.checkpw(password, hashed) and known
        if hashed is not self._dummy and _cost(hashed) < self.cost:
            # a cheaper user's check also does the costliest hash's work: the padding below is a fixed time
            # measured at start, and on a busy machine the costly hash stretches past it while a cheap one
            # does not (medians of 264 ms against 421 ms with two cores running four workers of tests)
            bcrypt.checkpw(b"iowarden-timing", self._dummy)
        with self._lock:
            self.hashes_total += 1
            if ok:
                self._good[self._key(user, password)] = True
                while len(self._good) > GOOD_CREDENTIALS_KEPT:
                    self._good.popitem(last=False)
            else:
                now = self.clock()
                q = self._recent_failures(source, now)
                if len(q) < FAILED_AUTH_PER_SOURCE:   # failures while limited do not renew the limit
                    q.append(now)
                    self._failures[source] = q
                    if len(q) == FAILED_AUTH_PER_SOURCE:
                        self._limited_check_at[source] = now   # its next check: LIMITED_CHECK_SECONDS from now
                if len(self._failures) > MAX_SOURCES_REMEMBERED:   # a bound on the sources remembered
                    for old in list(self._failures)[:MAX_SOURCES_REMEMBERED // 2]:
                        del self._failures[old]
                        self._limited_check_at.pop(old, None)
        return ok


class FairHasher:
    """The checks waiting for the one hashing thread, at most one per source. Runs on the event loop;
    `run(source, fn)` answers fn's result, or None when the check got no place or lost it (503).

    Order: sources that have not failed (nor been turned away) within the window before those that have,
    oldest first within each. When every place is taken, a newcomer from a source that has not failed
    takes the place of the oldest waiting check of one that has; otherwise it is turned away. A source
    that asks again while its check waits counts as failing for the window (not towards its 429 limit). So
    an attacker's addresses, once each has failed, queue behind the scraper: its check waits for the one
    hash running. What this cannot do is tell a scraper from addresses never seen before: each costs the
    attacker one check before it falls behind, and while a flood's addresses are new (the first pool size x
    hash time of it), a scraper's check can be turned away (503) and is let in at its next scrape."""

    def __init__(self, loop: asyncio.AbstractEventLoop, executor, auth: BasicAuth):
        self.loop, self.executor, self.auth = loop, executor, auth
        self._waiting: collections.OrderedDict[str, tuple[asyncio.Future, object]] = collections.OrderedDict()
        self._running: str | None = None

    def _victim(self, newcomer_failed: bool) -> str | None:
        if newcomer_failed:
            return None
        return next((s for s in self._waiting if self.auth.has_failed(s)), None)

    async def run(self, source: str, fn):
        if source in self._waiting or source == self._running:
            self.auth.note_turned_away(source, flooding=True)
            return None   # one check per source at a time
        self._forget_gone()
        if len(self._waiting) >= MAX_HASHES_WAITING:
            victim = self._victim(self.auth.has_failed(source))
            if victim is None:
                self.auth.note_turned_away(source)
                return None
            future, _ = self._waiting.pop(victim)
            self.auth.note_turned_away(victim)
            future.set_result(None)
        future = self.loop.create_future()
        self._waiting[source] = (future, fn)
        if self._running is None:
            self._next()
        return await future

    def _forget_gone(self) -> None:
        for gone in [s for s, (f, _) in self._waiting.items() if f.done()]:
            del self._waiting[gone]   # its client went away while it waited: no hash for nobody

    def _next(self) -> None:
        self._forget_gone()
        if not self._waiting:
            self._running = None
            return
        clean = [s for s in self._waiting if not self.auth.has_failed(s)]
        source = clean[0] if clean else next(iter(self._waiting))
        future, fn = self._waiting.pop(source)
        self._running = source
        job = self.loop.run_in_executor(self.executor, fn)

        def done(f, future=future):
            if not future.done():   # its client may have gone (evicted, closed): then nobody waits
                if f.cancelled():
                    future.cancel()
                elif f.exception() is not None:
                    future.set_exception(f.exception())
                else:
                    future.set_result(f.result())
            self._next()
        job.add_done_callback(done)
