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


def our_children() -> list:
    """Child processes, minus multiprocessing's own per-interpreter helpers
    (the spawn resource tracker and the forkserver live until exit by design)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "resource_tracker" in cmd or "forkserver" in cmd:
            continue
        out.append(child)
    return out


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a child process or a /dev/shm entry behind."""
    before_shm = shm_entries()
    yield
    deadline = time.monotonic() + 5
    while our_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    children = our_children()
    assert not children, f"leaked processes: {children}"
    assert shm_entries() - before_shm == set()
