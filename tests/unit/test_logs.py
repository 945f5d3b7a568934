"""A log line said once, then how often it repeated (184 'deferred: device busy' lines in 35 min)."""
import logging

from iowarden.daemon.logs import RepeatFilter


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def record(msg, *args, **extra):
    r = logging.LogRecord("iowarden.probing", logging.INFO, __file__, 1, msg, args, None)
    r.__dict__.update({"REPEATS": True, **extra})
    return r


def shown(f, msg, *args, **extra):
    r = record(msg, *args, **extra)
    return r.getMessage() if f.filter(r) else None


def test_a_repeated_message_is_said_once_a_minute_with_its_count():
    clock = Clock()
    f = RepeatFilter(60.0, clock)
    said = []
    for i in range(36):   # every 5 s for three minutes, the util of the moment changing
        said.append(shown(f, "probe %s/%s deferred: device busy (%.0f%% util)", "db", "rr", 60.0 + i))
        clock.now += 5.0
    lines = [s for s in said if s]
    assert len(lines) == 3, lines
    assert lines[0] == "probe db/rr deferred: device busy (60% util)"
    assert lines[1] == "probe db/rr deferred: device busy (72% util) (11 more like this in the last 60 s)"


def test_each_subject_is_its_own_message_and_alerts_always_pass():
    clock = Clock()
    f = RepeatFilter(60.0, clock)
    assert shown(f, "probe %s/%s deferred: device busy", "db", "rr")
    assert shown(f, "probe %s/%s deferred: device busy", "db", "rw")        # another profile
    assert shown(f, "probe %s/%s deferred: device busy", "logs", "rr")      # another target
    assert shown(f, "probe %s/%s deferred: device busy", "db", "rr") is None
    for _ in range(3):   # events (not marked REPEATS), however close: a raise, a clear, a target discovered
        assert shown(f, "ALERT %s #%d cleared", "VolumeDegraded", 7, REPEATS=False)
        assert shown(f, "target %s discovered", "new:/srv/vol1", REPEATS=False)
    # a message formatted before logging (a probe's result with its figures) differs each time: kept
    assert shown(f, "probe db/rr on sdb: read 100 IOPS") and shown(f, "probe db/rr on sdb: read 101 IOPS")


def test_the_table_of_messages_is_bounded():
    clock = Clock()
    f = RepeatFilter(60.0, clock)
    for i in range(5000):
        shown(f, "device %s added", f"loop{i}")
    assert len(f._seen) <= 4096


def test_the_lanes_log_count_finds_a_message_said_twice_a_minute_and_passes_a_counted_one():
    from tests.integration.logcount import count
    log = "\n".join([
        "2026-11-24 21:00:00,000 INFO probe vol0/rr deferred: device busy (71% util)",
        "2026-11-24 21:00:30,000 INFO probe vol1/rr deferred: device busy (80% util)",     # another subject
        "2026-11-24 21:01:05,000 INFO probe vol0/rr deferred: device busy (93% util) (12 more like this in the last 65 s)",
        "2026-11-24 21:01:10,000 INFO probe vol0/randread-4k on loop1: read 900 IOPS, write 0 IOPS, clat p99 1.2 ms",
        "2026-11-24 21:01:20,000 INFO probe vol0/randread-4k on loop1: read 950 IOPS, write 0 IOPS, clat p99 1.1 ms",
        "2026-11-24 21:02:00,000 WARNING SMART: loop1 not read",
        "2026-11-24 21:02:40,000 WARNING SMART: loop1 not read",
    ])
    counts, chatter = count(log)
    assert len(chatter) == 1 and "40 s apart" in chatter[0] and "SMART" in chatter[0], chatter
    assert counts["INFO probe vol0/rr deferred: device busy (#% util)"] == 1
