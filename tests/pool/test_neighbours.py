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


def _fake_proc(root, pid: int, comm: str, ppid: int, cpus: str, uid: int = 0, state: str = "S (sleeping)") -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "comm").write_text(comm + "\n")
    (d / "status").write_text(f"Name:\t{comm}\nState:\t{state}\nPPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
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


def test_a_helper_an_env_forks_and_a_dead_trainer_s_zombie_workers_are_no_neighbours(tmp_path):
    """Issue 69: a process an env forks keeps its worker's name and core (it was counted as another pool's worker,
    its owner the worker: so even this process's own pool was a neighbour), and the zombie workers of a killed
    trainer were counted as a pool still running."""
    _fake_proc(tmp_path, 104, "shmpool-w0", os.getpid(), "1")   # this process's own worker...
    _fake_proc(tmp_path, 106, "shmpool-w0", 104, "1")           # ...and a helper its env forked
    _fake_proc(tmp_path, 201, "shmpool-w0", 200, "0")           # another pool's worker...
    _fake_proc(tmp_path, 202, "shmpool-w0", 201, "0")           # ...and its env's helper: the pool counts once
    _fake_proc(tmp_path, 301, "shmpool-w0", 1, "0", state="Z (zombie)")   # a killed trainer's workers
    _fake_proc(tmp_path, 302, "shmpool-w1", 1, "1", state="X (dead)")
    found = neighbours.pinned_neighbours([0, 1], proc=str(tmp_path))
    assert [(n.pid, n.cpu, n.owner) for n in found] == [(201, 0, 200)]
    # Workers named in ``exclude`` (a pool's own, looking again once they run) are never its neighbours.
    assert neighbours.pinned_neighbours([0, 1], proc=str(tmp_path), exclude={201}) == []


def test_an_env_s_helper_left_behind_by_its_worker_is_no_neighbour(tmp_path):
    """An env's helper outliving its pool is adopted by init (or a subreaper) and keeps the worker's name and
    core: a pool built afterwards warned of "process 1".  A worker dies with its trainer, which maps the pool's
    region all along; the adopter maps none."""
    region = "7f00-7f10 rw-s 00000000 00:01 42                         /memfd:shmpool-region (deleted)\n"
    _fake_proc(tmp_path, 401, "shmpool-w0", 1, "0")       # adopted by init, whose maps cannot be read
    _fake_proc(tmp_path, 402, "shmpool-w1", 400, "1")     # adopted by a subreaper (same user: maps readable)
    (tmp_path / "400").mkdir()
    (tmp_path / "400" / "maps").write_text("5600-5700 r-xp 00000000 08:01 7 /usr/bin/tini\n")
    _fake_proc(tmp_path, 501, "shmpool-w0", 500, "0")     # a trainer's real worker: its trainer maps the region
    (tmp_path / "500").mkdir()
    (tmp_path / "500" / "maps").write_text(region)
    assert [(n.pid, n.owner) for n in neighbours.pinned_neighbours([0, 1], proc=str(tmp_path))] == [(501, 500)]
    # A trainer running as pid 1 (a container's entry point) maps its region: its workers count.
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "maps").write_text(region)
    found = neighbours.pinned_neighbours([0, 1], proc=str(tmp_path))
    assert [(n.pid, n.owner) for n in found] == [(401, 1), (501, 500)]


# Two trainers started at the same moment: each process plans its pool (the neighbour check), then waits at a
# barrier until the other has planned too, so both look before either's workers exist.
AT_ONCE = """
    import os, sys, time, warnings
    import shmpool, shmpool.pool
    me, other = sys.argv[1], sys.argv[2]
    planned = shmpool.pool.plan_pool

    def plan_then_wait(*args, **kwargs):
        plan = planned(*args, **kwargs)
        with open(me + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(me + ".tmp", me)
        deadline = time.monotonic() + 60
        while not os.path.exists(other) and time.monotonic() < deadline:
            time.sleep(0.01)
        return plan

    shmpool.pool.plan_pool = plan_then_wait
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pool = shmpool.Pool("CartPole-v1", 4, num_workers=2, parent_shard=False)
    # Only the other trainer counts (another suite's pools on this machine may be named beside it).
    them = f"process {open(other).read()} of user"
    said = [str(w.message) for w in caught if them in str(w.message)]
    print(len(said), int(them in repr(pool)), flush=True)
    sys.stdin.readline()   # both pools stay up until both have looked
    pool.close()
"""


def test_of_two_trainers_started_at_the_same_moment_the_later_one_warns(no_leaks, tmp_path):
    """Issue 69: both looked for neighbours before either's workers existed, and both stayed silent.  A pool now
    looks again once its own workers run, so at least the one that looks last sees the other's."""
    marks = [str(tmp_path / "a"), str(tmp_path / "b")]
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(AT_ONCE), me, other], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for me, other in (marks, marks[::-1])]
    try:
        said = [p.stdout.readline().split() for p in procs]
        outs = [p.communicate("go\n", timeout=60) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        assert all(len(s) == 2 for s in said), (said, outs)
        warned = [int(s[0]) for s in said]
        assert 1 <= sum(warned) and max(warned) == 1, said   # at least one warns, and each at most once
        assert [int(s[1]) for s in said] == warned, said   # what a pool warns of, its repr says
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


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
