"""A lane of its own for the scenarios that take half an hour of wall clock.

A daemon's first half hour, or a compressed week on call, is mostly waiting: probes every minute, a
throttle at minute 20, an alert after it. Run one after the other, they would push the README's test
command past its hour. So a test marked `@pytest.mark.lane.with_args(scenario)` has its scenario started on this
thread as soon as the suite is collected; the scenarios run one at a time, beside the rest of the suite,
on devices of their own (a busy neighbour is what every end-to-end test must hold against anyway), and
the test itself, moved to the end of the run, waits for its scenario's report and fails with its error.

A scenario is a function `scenario(lane)` that appends the lines of its report to `lane.report`: it waits with
`lane.sleep()` or `lane.wait_for()`, which end it early (with `Cancelled`) when the session is ending,
so its context managers remove what it made.
"""
from __future__ import annotations

import threading
import time
import traceback
from typing import Callable


class Cancelled(Exception):
    """The session ended before the scenario did."""


class Lane(threading.Thread):
    def __init__(self, scenarios: list[Callable]):
        super().__init__(name="test-lane", daemon=True)
        self.scenarios = list(dict.fromkeys(scenarios))   # each once, in the order the tests were collected
        self.stopping = threading.Event()
        self._done: dict[Callable, threading.Event] = {s: threading.Event() for s in self.scenarios}
        self._results: dict[Callable, tuple[list[str], BaseException | None, str]] = {}
        self.started_at = time.monotonic()
        self.report: list[str] = []   # the running scenario's (each gets a list of its own)

    def run(self):
        for scenario in self.scenarios:
            report: list[str] = []
            self.report = report   # the scenario writes its lines here: kept when it fails half way
            error, trace = None, ""
            t0 = time.monotonic()
            if self.stopping.is_set():
                error = Cancelled("the session ended before this scenario started")
            else:
                try:
                    scenario(self)
                except BaseException as e:   # handed to the test that owns it; the next scenario still runs
                    error, trace = e, traceback.format_exc()
            report.append(f"[lane] {scenario.__name__}: {time.monotonic() - t0:.0f} s, started "
                          f"{t0 - self.started_at:.0f} s into the lane")
            self._results[scenario] = (report, error, trace)
            self._done[scenario].set()

    def sleep(self, seconds: float) -> None:
        if self.stopping.wait(max(0.0, seconds)):
            raise Cancelled("the session is ending")

    def wait_for(self, fn, timeout: float, what: str, every: float = 1.0):
        deadline = time.monotonic() + timeout
        while True:
            value = fn()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            self.sleep(every)

    def result(self, scenario: Callable, timeout: float) -> list[str]:
        """The scenario's report; its error raised here, in the test that owns it."""
        if not self._done[scenario].wait(timeout):
            raise AssertionError(f"{scenario.__name__} did not end within {timeout:.0f} s of its test starting")
        report, error, trace = self._results[scenario]
        print("\n".join(report))
        if error is not None:
            # what the scenario saw, in the failure itself: a CI log that keeps only the failures keeps it
            said = "\n".join(x[:300] for x in report[-60:])
            if isinstance(error, AssertionError):
                raise AssertionError(f"{error}\n--- the scenario's report:\n{said}\n--- in the lane:\n{trace}")
            raise RuntimeError(f"{scenario.__name__} failed in the lane:\n{trace}") from error
        return report

    def reports(self) -> list[str]:
        """Every scenario's report so far, headed by its name (the session's summary prints them)."""
        out = []
        for scenario in self.scenarios:
            if scenario in self._results:
                report, error, _ = self._results[scenario]
                out += [f"== lane: {scenario.__name__}: {'failed: ' + str(error)[:300] if error else 'passed'}",
                        *report]
        return out

    def stop(self, timeout: float = 60.0) -> None:
        self.stopping.set()
        self.join(timeout)
