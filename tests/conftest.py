import os
import sys
import time

import psutil
import pytest

sys.path.insert(0, os.path.dirname(__file__))


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a child process or a /dev/shm entry behind."""
    before_shm = shm_entries()
    yield
    me = psutil.Process()
    deadline = time.monotonic() + 5
    while me.children(recursive=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    children = me.children(recursive=True)
    assert not children, f"leaked processes: {children}"
    assert shm_entries() - before_shm == set()
