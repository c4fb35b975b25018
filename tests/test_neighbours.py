"""Two pools on one box (issue 59): a pool whose workers would be pinned to cores another process's
pool workers are pinned to says so once, in a warning and in ``repr``; the first pool stays silent."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import shmpool
from shmpool import neighbours


def _fake_proc(root, pid: int, comm: str, ppid: int, cpus: str, uid: int = 0) -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "comm").write_text(comm + "\n")
    (d / "status").write_text(f"Name:\t{comm}\nPPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                              f"Cpus_allowed_list:\t{cpus}\n")


def test_only_other_processes_workers_pinned_to_our_cores_are_neighbours(tmp_path):
    _fake_proc(tmp_path, 101, "shmpool-w0", 100, "0")          # another pool's worker on cpu 0
    _fake_proc(tmp_path, 102, "shmpool-w1", 100, "3")          # on a core we do not use
    _fake_proc(tmp_path, 103, "shmpool-w0", 100, "0-3")        # unpinned (pin=False)
    _fake_proc(tmp_path, 104, "shmpool-w0", os.getpid(), "1")  # one of this process's own pools
    _fake_proc(tmp_path, 105, "python", 100, "1")               # not a worker
    (tmp_path / "self").mkdir()
    found = neighbours.pinned_neighbours([0, 1], proc=str(tmp_path))
    assert [(n.pid, n.cpu, n.owner) for n in found] == [(101, 0, 100)]
    said = neighbours.describe(found)
    assert said == "cpus [0] shared with the workers of another shmpool pool (process 100 of user root)"
    assert neighbours.pinned_neighbours([0], proc=str(tmp_path / "missing")) == []


# The first pool, in a process of its own: how many of its warnings name the test's process
# (another suite running pools on this machine may be named; the test's process never is).
FIRST = """
    import os, sys, time, warnings
    import shmpool
    test = f"process {os.getppid()} of user"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pool = shmpool.Pool("CartPole-v1", 4, num_workers=2, parent_shard=False)
    print("ready", len([w for w in caught if test in str(w.message)]), flush=True)
    sys.stdin.readline()   # until the test is done
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pool.reset(seed=0)
        pool.step([0] * 4)
    print("later", len([w for w in caught if "another shmpool pool" in str(w.message)]), flush=True)
    pool.close()
"""


def test_a_second_process_s_pool_on_the_same_cores_warns_once_and_the_first_stays_silent(no_leaks):
    cpus = sorted(os.sched_getaffinity(0))
    first = subprocess.Popen([sys.executable, "-c", textwrap.dedent(FIRST)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().split() == ["ready", "0"]   # nobody else there: silent
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with shmpool.Pool("CartPole-v1", 4, num_workers=2, parent_shard=False) as pool:
                said = [str(w.message) for w in caught if "another shmpool pool" in str(w.message)]
                assert len(said) == 1 and f"process {first.pid} of user" in said[0], said
                assert f"pinned to cpus {cpus}" in said[0] and "pin=False" in said[0]
                # Another suite's pools on this machine (pytest -n, a neighbour's run) may be named beside it.
                assert "shared with the workers of another shmpool pool (process " in repr(pool)
                assert f"process {first.pid} of user" in repr(pool), repr(pool)
                pool.reset(seed=0)
                pool.step([0] * 4)
            assert len([w for w in caught if "another shmpool pool" in str(w.message)]) == 1
        # Given cores of its own or unpinned, nothing is said.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with shmpool.Pool("CartPole-v1", 4, num_workers=2, parent_shard=False, pin=False) as pool:
                assert "another shmpool pool" not in repr(pool)
            assert not [w for w in caught if "another shmpool pool" in str(w.message)]
        out, err = first.communicate("go\n", timeout=60)
        assert out.split() == ["later", "0"], err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
