"""Hotplug events: a burst is one re-read, and a failing event source is retried, not a dead thread."""
import threading
import time

from iowarden.daemon.sources import inventory


class Event:
    def __init__(self, action, name):
        self.action, self.sys_name = action, name


class Monitor:
    """A netlink monitor whose events are a list: `at` seconds after the start, each."""

    def __init__(self, events, fail_first=0):
        self.t0 = time.monotonic()
        self.events = list(events)
        self.fail_first = fail_first

    def poll(self, timeout):
        if self.fail_first:
            self.fail_first -= 1
            raise OSError("netlink buffer overrun")
        if self.events and time.monotonic() - self.t0 >= self.events[0][0]:
            at, action, name = self.events.pop(0)
            return Event(action, name)
        time.sleep(min(timeout, 0.01))
        return None


def run(monitor, seconds):
    """The listener as the daemon runs it: the registry's part "uevents", its step called in a loop."""
    from iowarden.daemon.registry import Registry
    calls = []
    inv = inventory.Inventory(lambda action, name, names: calls.append((action, name)), "/nonexistent")
    inv._monitor = monitor
    stop = threading.Event()
    registry = Registry()
    registry.add("uevents", 0.0, 60.0, lambda: inv.step(stop))
    registry.start(stop)
    time.sleep(seconds)
    stop.set()
    registry.join(5)
    inv.stats = registry.stats()["uevents"]
    return inv, calls


def test_a_burst_of_hotplug_events_is_one_reread_not_one_each():
    burst = [(0.0, "add", f"loop{i}") for i in range(500)] + [(0.6, "remove", "sdz")]
    inv, calls = run(Monitor(burst), 1.5)
    assert inv.events_total == 501
    assert 1 <= len(calls) <= 2, len(calls)      # 500 events: one (or two) re-reads, not 500
    assert calls[-1] == ("remove", "sdz")


def test_a_failing_event_source_is_counted_waited_out_and_events_still_handled():
    """pyudev's poll() raised outside any handler and ended the listener in silence: now each
    failure is the part's counted error, waited out (no busy loop), and the events after it are handled."""
    inv, calls = run(Monitor([(0.0, "add", "sdb")], fail_first=2), 2.5)
    assert calls == [("add", "sdb")]
    assert inv.stats.errors_total == 2 and inv.stats.restarts_total == 0, inv.stats


def test_device_changes_diff_names_and_identities():
    from iowarden.daemon.sources.inventory import device_changes
    before = {"loop0": "loop-file:/a", "sda": "wwn-0x5000"}
    # the settings poll may have seen loop1 already; the diff is against what the last burst saw
    assert device_changes(before, {**before, "loop1": "loop-file:/b"}) == (["loop1"], [])
    assert device_changes(before, {"sda": "wwn-0x5000"}) == ([], ["loop0"])
    # detached and attached to another file within one burst: another volume
    assert device_changes(before, {"loop0": "loop-file:/c", "sda": "wwn-0x5000"}) == (["loop0"], ["loop0"])
    assert device_changes(before, dict(before)) == ([], [])


def test_the_one_device_filter_decides_which_arrivals_are_said():
    from iowarden.daemon.sources.sampler import selected
    assert selected("loop1", ("loop1", "nvme*n1"), ("ram*",)) and selected("nvme0n1", ("loop1", "nvme*n1"), ())
    assert not selected("loop9", ("loop1", "nvme*n1"), ()) and not selected("sda", ("loop1",), ())
    assert selected("loop9", (), ("ram*", "zram*")) and selected("sda", (), ("ram*",))
    assert not selected("zram0", (), ("ram*", "zram*"))
