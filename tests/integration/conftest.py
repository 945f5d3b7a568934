"""Fixtures for the integration tests (the loop-device ones live in tests/conftest.py)."""
import pytest

from tests.integration.helpers import DaemonProc


@pytest.fixture
def daemon_factory(tmp_path):
    made = []

    def make(text):
        d = DaemonProc(tmp_path, text)
        made.append(d)
        return d
    yield make
    for d in made:
        d.close()
