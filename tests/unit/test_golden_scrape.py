"""A golden scrape, node_exporter style: the exposition of a snapshot made from fixture trees and
captured tool outputs, diffed against tests/fixtures/golden/scrape.prom. A change to any family,
label, help text or value shows up as a diff to review.

    IOWARDEN_REGENERATE_GOLDEN=1 python -m pytest tests/unit/test_golden_scrape.py   # after a deliberate change
"""
import dataclasses
import difflib
import os
import re

from tests.conftest import FIXTURES
from tests.unit.test_exporter import scrape, snapshot

GOLDEN = FIXTURES / "golden" / "scrape.prom"


def _stable(text: str) -> str:
    """What differs between machines and runs: the Python version, and how long each section took."""
    text = re.sub(r'python="[^"]*"', 'python="X"', text)
    return re.sub(r"^(iowarden_scrape_collector_duration_seconds\{[^}]*\}) .*$", r"\1 0", text, flags=re.M)


def test_scrape_matches_the_golden_file(tree):
    got = _stable(scrape(snapshot(tree)))
    if os.environ.get("IOWARDEN_REGENERATE_GOLDEN"):
        GOLDEN.write_text(got)
    want = GOLDEN.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "scrape"))
    assert got == want, "the exposition changed (IOWARDEN_REGENERATE_GOLDEN=1 to accept):\n" + diff[:6000]


class _Broken:
    """A value of a shape nobody foresaw, where the XFS section reads a report."""

    def __getattr__(self, name):
        raise RuntimeError("unexpected report")


def test_a_failing_section_leaves_the_rest_of_the_scrape(tree):
    snap = snapshot(tree)
    broken = dataclasses.replace(snap, xfs={"/srv": (_Broken(), 1.7e9)})
    text = scrape(broken)
    assert 'iowarden_scrape_collector_success{collector="xfs"} 0.0' in text
    assert 'iowarden_scrape_collector_success{collector="disks"} 1.0' in text
    assert "iowarden_xfs_" not in text
    # everything else is as it was
    good = _stable(scrape(snap))
    others = [line for line in good.splitlines()
              if "iowarden_xfs_" not in line and "collector_success" not in line and "duration_seconds{" not in line]
    got = set(_stable(text).splitlines())
    assert [line for line in others if line not in got] == []
