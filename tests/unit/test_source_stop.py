"""A source with a process of its own is stopped by the daemon's main thread while its part's thread may be
reading it ("no part is stopped from another thread while stepping"): sources/spec.py `stoppable`."""
import threading
import time

from iowarden.daemon.sources.spec import stoppable
from tests.thread_frames import blocked_in


def _until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_a_stop_waits_for_the_read_under_way_and_the_next_read_is_not_interleaved():
    events, reading, release = [], threading.Event(), threading.Event()

    def read():
        events.append("read begins")
        reading.set()
        release.wait(5)
        events.append("read ends")
        return "value"
    read_fn = stoppable(read, lambda: events.append("stopped"), wait_seconds=5)
    reader = threading.Thread(target=read_fn)
    reader.start()
    assert reading.wait(5)
    stopper = threading.Thread(target=read_fn.stop)
    stopper.start()
    # the stop is waiting for the read (blocked taking its lock), not under way beside it
    assert _until(lambda: blocked_in(stopper, "stop_between_reads")), "the stop never began"
    assert events == ["read begins"]
    release.set()
    reader.join(5)
    stopper.join(5)
    assert events == ["read begins", "read ends", "stopped"]


def test_a_read_held_past_the_wait_does_not_keep_the_process_alive(caplog):
    stopped, release, reading = threading.Event(), threading.Event(), threading.Event()
    read_fn = stoppable(lambda: (reading.set(), release.wait(5)), stopped.set, wait_seconds=0.2)
    reader = threading.Thread(target=read_fn)
    reader.start()
    assert reading.wait(5)
    t0 = time.monotonic()
    read_fn.stop()
    assert stopped.is_set() and time.monotonic() - t0 < 2
    assert "still under way" in caplog.text
    release.set()
    reader.join(5)
