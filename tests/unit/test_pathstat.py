"""A path's stat asked by a child with a deadline: a hung filesystem is said, never waited on for long, and
costs one child however often it is asked. The hang is a child that never answers (as `stat` on a dead
NFS mount); no root needed."""
import os
import sys
import time

import pytest

from iowarden.probes import pathstat
from iowarden.probes.pathstat import parse


@pytest.fixture
def watches():
    made = []

    def make(**kw):
        made.append(pathstat.PathWatch(**kw))
        return made[-1]
    yield make
    for w in made:
        w.close()

# answers as coreutils stat would, but a path containing "DEAD" never answers
FAKE_STAT = (sys.executable, "-c", "import os, sys, time\n"
             "p = sys.argv[1]\n"
             "time.sleep(3600) if 'DEAD' in p else None\n"
             "s = os.stat(p)\n"
             "print(s.st_dev, format(s.st_mode, 'x'), format(os.major(s.st_rdev), 'x'), format(os.minor(s.st_rdev), 'x'))")


def test_the_real_stat_answers_as_os_stat(tmp_path, watches):
    watch = watches()
    answers = watch.check([str(tmp_path), "/dev/null", str(tmp_path / "nope")], timeout_seconds=5)
    st = os.stat(tmp_path)
    assert answers[str(tmp_path)].ok and (answers[str(tmp_path)].st_dev, answers[str(tmp_path)].st_mode) == \
        (st.st_dev, st.st_mode)
    assert answers["/dev/null"].st_rdev == os.stat("/dev/null").st_rdev
    assert answers[str(tmp_path / "nope")].error == "No such file or directory"


def test_hung_paths_cost_one_deadline_together_and_one_child_each(tmp_path, watches):
    watch = watches(argv=FAKE_STAT)
    good = str(tmp_path)
    t0 = time.monotonic()
    answers = watch.check([good, "/mnt/DEAD-a", "/mnt/DEAD-b"], timeout_seconds=1.0)
    took = time.monotonic() - t0
    assert answers[good].ok and answers["/mnt/DEAD-a"].hung and answers["/mnt/DEAD-b"].hung
    assert took < 1.8, f"two hung paths took {took:.1f} s: their deadlines were waited one after the other"
    assert answers["/mnt/DEAD-a"].hung_text(1.0) == "/mnt/DEAD-a did not answer within 1 s: its filesystem is hung"
    # asked again while its child is stuck: answered at once, and no second child
    t0 = time.monotonic()
    again = watch.check(["/mnt/DEAD-a"], timeout_seconds=1.0)
    assert again["/mnt/DEAD-a"].hung and time.monotonic() - t0 < 0.5
    assert watch.hung_children_total == 2


def test_poll_never_waits_and_says_hung_after_the_deadline(watches):
    now = [100.0]
    watch = watches(clock=lambda: now[0], argv=FAKE_STAT)
    t0 = time.monotonic()
    assert watch.poll(["/mnt/DEAD"], max_age_seconds=1.0, deadline_seconds=5.0) == {}   # asked, no answer yet
    now[0] += 6.0
    answer = watch.poll(["/mnt/DEAD"], max_age_seconds=1.0, deadline_seconds=5.0)["/mnt/DEAD"]
    assert answer.hung and time.monotonic() - t0 < 1.0
    now[0] += 60.0   # the stuck child is not asked again while it is held
    watch.poll(["/mnt/DEAD"], max_age_seconds=1.0, deadline_seconds=5.0)
    assert watch.hung_children_total == 1 and len(watch._asking) == 1


def test_a_child_let_go_after_its_deadline_gives_way_to_a_new_question(watches):
    now = [0.0]
    watch = watches(clock=lambda: now[0], argv=FAKE_STAT)
    watch.poll(["/mnt/DEAD"], 1.0, 5.0)
    now[0] = 10.0
    assert watch.poll(["/mnt/DEAD"], 1.0, 5.0)["/mnt/DEAD"].hung
    child = watch._asking["/mnt/DEAD"][0]
    child.wait(5)          # killed at its deadline: it ends when the filesystem lets it go
    now[0] = 20.0
    watch.poll(["/mnt/DEAD"], 1.0, 5.0)
    assert watch._asking["/mnt/DEAD"][0] is not child    # asked again, by a new child


def test_parse_names_the_error_without_the_tools_words():
    a = parse("/x", b"", b"stat: cannot statx '/x': Permission denied\n", 1, 0.0)
    assert a.error == "Permission denied" and not a.ok and not a.hung
    assert parse("/x", b"2049 41ed 0 0\n", b"", 0, 0.0).st_mode == 0o40755


def test_many_threads_asking_the_same_paths_at_once_all_get_answers(tmp_path, watches):
    """The discovery, the scheduler and the probe workers ask the same mount points from their own threads:
    one reads each child's answer, the others take it (a second reader found the pipe closed)."""
    import threading
    watch = watches()
    paths = [str(tmp_path)] + [str(tmp_path / f"d{i}") for i in range(4)]
    for p in paths[1:]:
        os.mkdir(p)
    errors, answers = [], []

    def ask():
        try:
            for _ in range(20):
                got = watch.check(paths, timeout_seconds=5)
                answers.append(all(got[p].ok for p in paths))
        except Exception as exc:   # noqa: BLE001 - the test's finding
            errors.append(repr(exc))
    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(answers) == 120 and all(answers)


def test_without_pidfds_the_wait_still_ends_on_the_childs_exit(tmp_path, watches, monkeypatch):
    """A seccomp filter or an older kernel without pidfd_open: the answer is still waited for, not taken as
    hung at once."""
    import errno as errno_

    def refused(pid):
        raise OSError(errno_.EPERM, "Operation not permitted")
    monkeypatch.setattr(pathstat.os, "pidfd_open", refused)
    answer = watches().check([str(tmp_path)], timeout_seconds=5)[str(tmp_path)]
    assert answer.ok, answer


def test_a_child_that_cannot_be_started_is_said_as_the_daemons_limit_not_the_paths(tmp_path, watches, monkeypatch):
    def out_of_tasks(*args, **kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")
    monkeypatch.setattr(pathstat.subprocess, "Popen", out_of_tasks)
    w = watches()
    answer = w.check([str(tmp_path)])[str(tmp_path)]
    assert not answer.asked and not answer.hung and not answer.ok
    assert "task limit" in answer.error and "TasksMax" in answer.error
