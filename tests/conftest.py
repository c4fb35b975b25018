import os
import re
import sys
import time

import psutil
import pytest

sys.path.insert(0, os.path.dirname(__file__))


# What a pool can leave in /dev/shm: posix_ipc's objects made with a random name (``name=None``), which are
# a run of lowercase letters, semaphores with glibc's ``sem.`` prefix (shmpool.region, shmpool.memory off
# Linux).  Anything else there (Intel OpenMP's ``__KMP_REGISTERED_LIB_*``, torch's, another user's) is not
# a pool's: on a shared machine a neighbour's file must not fail the suite.
POOL_SHM_NAME = re.compile(r"(sem\.)?[a-z]+")


def shm_entries(shm_dir: str = "/dev/shm") -> set[str]:
    """The entries of ``shm_dir`` a pool of this user could have made (see ``POOL_SHM_NAME``)."""
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return set()
    out = set()
    for name in names:
        if not POOL_SHM_NAME.fullmatch(name):
            continue
        try:
            if os.stat(os.path.join(shm_dir, name)).st_uid != os.getuid():
                continue
        except OSError:   # gone meanwhile
            continue
        out.add(name)
    return out


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
