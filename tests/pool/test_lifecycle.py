"""Processes and shared memory: nothing outlives a pool, however it ends."""
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
from conftest import shm_entries
from envs import EmptyEnv, ProbeEnv

import shmpool


def test_close_joins_workers_and_is_idempotent(no_leaks):
    pool = shmpool.Pool("CartPole-v1", 4, num_workers=2)
    pids = pool.worker_pids
    assert all(psutil.pid_exists(p) for p in pids)
    pool.close()
    pool.close()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_region_is_never_visible_in_dev_shm(no_leaks):
    before = shm_entries()
    with shmpool.Pool("CartPole-v1", 4, num_workers=2) as pool:
        pool.reset()
        assert shm_entries() == before  # unlinked before the workers even mapped it


def test_workers_are_pinned_to_distinct_allowed_cores(no_leaks):
    allowed = sorted(os.sched_getaffinity(0))
    with shmpool.Pool("CartPole-v1", 4, num_workers=len(allowed)) as pool:
        pinned = [sorted(os.sched_getaffinity(pid)) for pid in pool.worker_pids]
        assert pinned == [[c] for c in allowed]
        assert pool.worker_cpus == allowed
    with shmpool.Pool("CartPole-v1", 2, num_workers=1, cpus=str(allowed[-1])) as pool:
        assert os.sched_getaffinity(pool.worker_pids[0]) == {allowed[-1]}


def test_unpinned_workers_may_run_on_every_allowed_core(no_leaks):
    allowed = set(os.sched_getaffinity(0))
    with shmpool.Pool("CartPole-v1", 4, num_workers=2, pin=False) as pool:
        pool.reset(seed=0)
        assert [os.sched_getaffinity(pid) for pid in pool.worker_pids] == [allowed, allowed]
        assert "unpinned" in repr(pool) and not pool.pinned


@pytest.mark.parametrize("start_method", ["fork", "spawn"])   # libraries found in the trainer / in the worker
def test_worker_blas_threads_are_limited_and_the_trainers_are_not(start_method, no_leaks):
    from threadpoolctl import threadpool_info

    trainers = [(lib["filepath"], lib["num_threads"]) for lib in threadpool_info()]
    assert trainers, "numpy's BLAS should be loaded here"
    with shmpool.Pool(ProbeEnv, 2, num_workers=2, start_method=start_method) as pool:
        for probe in pool.call("probe"):
            assert probe["omp"] == "1"
            assert probe["pools"] and all(n == 1 for n in probe["pools"]), probe["pools"]
            assert probe["sigint"] == signal.SIG_IGN  # Ctrl-C is the parent's to handle
    assert [(lib["filepath"], lib["num_threads"]) for lib in threadpool_info()] == trainers


class EnvironmentWrites:
    """Every change made to this process's environment (``os.environ`` calls ``os.putenv``/``os.unsetenv`` for
    each), recorded whichever thread makes it: another thread starting a process meanwhile inherits it."""

    def __init__(self, monkeypatch) -> None:
        self.seen: list[tuple] = []
        for name in ("putenv", "unsetenv"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, lambda *args, real=real, name=name: (self.seen.append((name, *args)),
                                                                                 real(*args))[1])


@pytest.mark.parametrize("face", ["Pool fork", "Pool spawn", "AsyncVectorEnv fork"])
def test_starting_workers_never_changes_the_trainer_s_environment(face, no_leaks, monkeypatch):
    """Issue 69: while workers were forked, the trainer's own ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ... read
    "1" (put back afterwards), so a process another thread started meanwhile ran one thread.  The workers still run
    their BLAS and OpenMP libraries with one thread each (``test_worker_blas_threads_are_limited...``)."""
    import gymnasium as gym
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    writes = EnvironmentWrites(monkeypatch)
    kind, start_method = face.split()
    if kind == "Pool":
        with shmpool.Pool(ProbeEnv, 2, num_workers=2, start_method=start_method) as pool:
            probes = pool.call("probe")
        assert [p["omp"] for p in probes] == ["1", "1"]   # set in each worker, for what its envs load later
    else:   # the reference
        gym.vector.AsyncVectorEnv([ProbeEnv] * 2, context=start_method).close()
    assert writes.seen == []
    assert os.environ.get("OPENBLAS_NUM_THREADS") == "3" and "OMP_NUM_THREADS" not in os.environ


def test_dropping_a_pool_without_close_reaps_it(no_leaks):
    pool = shmpool.Pool("CartPole-v1", 2, num_workers=2)
    pool.reset()
    pids = pool.worker_pids
    assert all(psutil.pid_exists(p) for p in pids)
    del pool   # no reference cycle: the pool goes now, not at the next garbage collection
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and any(
            psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        time.sleep(0.01)
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"workers {left} outlived their dropped pool"


def test_many_pools_at_once(no_leaks):
    pools = [shmpool.Pool("CartPole-v1", 3, num_workers=1, seed=i) for i in range(3)]
    try:
        obs = [p.reset()[0].copy() for p in pools]
        assert not np.array_equal(obs[0], obs[1])
        for p in pools:
            p.step(np.zeros(3, dtype=np.int64))
    finally:
        for p in pools:
            p.close()


def _resources() -> dict:
    me = psutil.Process()
    return {"fds": me.num_fds(), "threads": me.num_threads(), "shm": len(shm_entries()),
            "rss": me.memory_info().rss}


@pytest.mark.slow   # a soak: 200 pools, 15-40 s
@pytest.mark.timeout(600)  # 15-35 s on 2 cores: each pool forks two workers from the (large) test process
def test_two_hundred_pools_created_and_closed_leak_nothing(no_leaks):
    def one(k):
        with shmpool.Pool(EmptyEnv, 2, num_workers=2) as p:
            p.reset(seed=k)
            p.step(np.zeros(2, dtype=np.int64))
            if k % 2:  # half of them end with a batch still in flight
                p.send(np.zeros(2, dtype=np.int64))

    for k in range(20):  # warm-up: imports, allocator pools
        one(k)
    before = _resources()
    # fds, threads and segments count exactly: one leaked per pool shows 200 times over.  (400 pools
    # took a minute, a tenth of the suite, and could catch nothing more.)
    for k in range(200):
        one(k)
    after = _resources()
    # A leak can only add: threads or fds that earlier tests left (Ray's driver threads wind
    # down slowly) may end during the loop, which is no leak of ours.
    assert after["fds"] <= before["fds"] and after["threads"] <= before["threads"], (before, after)
    assert after["shm"] == before["shm"]
    assert after["rss"] - before["rss"] < 16 * 2**20, f"RSS grew by {(after['rss'] - before['rss']) / 2**20:.1f} MiB"


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_start_methods(method, no_leaks):
    with shmpool.Pool("CartPole-v1", 3, num_workers=2, start_method=method, seed=0) as pool:
        obs, _ = pool.reset()
        obs2, rew, *_ = pool.step(np.ones(3, dtype=np.int64))
        assert rew.tolist() == [1.0] * 3


@pytest.mark.parametrize("policy", ["spin", "hybrid", "yield", "block"])
@pytest.mark.parametrize("wake", ["futex", "semaphore"])
@pytest.mark.filterwarnings("ignore:wait_policy 'spin'")
def test_every_wait_policy_and_wake_mechanism_gives_the_same_results(policy, wake, no_leaks):
    results = []
    with shmpool.Pool("CartPole-v1", 4, num_workers=2, batch_size=2, seed=0, wait_policy=policy,
                      wake=wake) as pool:
        pool.reset(seed=3)
        for t in range(30):
            obs, rew, term, trunc, _ = pool.step(np.full(4, t % 2, dtype=np.int64))
            results.append(obs.copy())
        pool.async_reset()
        for _ in range(50):
            obs, rew, term, trunc, info = pool.recv()
            pool.send(np.zeros(2, dtype=np.int64), info["env_id"])
        pool.recv()
        pool.recv()
        time.sleep(0.12)  # longer than a wait slice: the sleeping side must still wake
        obs, *_ = pool.step(np.zeros(4, dtype=np.int64))
    import gymnasium as gym
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    ref.reset(seed=3)
    for t in range(30):
        np.testing.assert_array_equal(ref.step(np.full(4, t % 2, dtype=np.int64))[0], results[t])


def test_steps_carry_the_sync_counter_across_2_32(monkeypatch, no_leaks):
    """The sync counter is a 32-bit word: a long run wraps it.  Started just below 2**32
    (the region's test hook), a real pool steps across the wrap with the same results as
    SyncVectorEnv; a target computed without the wrap, or compared without it, would hang
    (step_timeout fails the test) or read results before the workers wrote them."""
    import gymnasium as gym

    import shmpool.region
    start = 2**32 - 5
    monkeypatch.setattr(shmpool.region, "SYNC_START", start)
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    ref.reset(seed=3)
    with shmpool.Pool("CartPole-v1", 4, num_workers=2, seed=0, step_timeout=5.0) as pool:
        assert pool._backend.dispatch.wire.sync_count() == start
        pool.reset(seed=3)
        for t in range(6):   # two shards a step: 2**32-3, 2**32-1, then 1, 3, 5, 7
            actions = np.full(4, t % 2, dtype=np.int64)
            want = ref.step(actions)
            got = pool.step(actions)
            for w, g in zip(want[:4], got[:4]):
                np.testing.assert_array_equal(g, w)
        assert pool._backend.dispatch.wire.sync_count() == (start + 2 * 6) % 2**32 == 7


def test_spinning_on_shared_cores_warns(no_leaks):
    cpu = min(os.sched_getaffinity(0))
    with pytest.warns(RuntimeWarning, match=rf"wait_policy 'spin' with 2 workers on cpus \[{cpu}\]"):
        shmpool.Pool(EmptyEnv, 2, num_workers=2, cpus=[cpu], wait_policy="spin").close()


def test_pool_built_in_a_thread_outlives_the_thread(no_leaks):
    """PR_SET_PDEATHSIG fires when the forking *thread* exits; a pool built in a
    worker thread must keep its workers after that thread is gone."""
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("pool", shmpool.Pool("CartPole-v1", 2, num_workers=2)))
    t.start()
    t.join()
    with box["pool"] as pool:
        time.sleep(0.2)
        pool.reset(seed=0)
        obs, rew, *_ = pool.step(np.zeros(2, dtype=np.int64))
        assert rew.tolist() == [1.0, 1.0]


def test_the_leak_check_sees_what_a_pool_can_leave_and_nothing_of_a_neighbour(tmp_path):
    """``no_leaks`` compares /dev/shm before and after a test: only the names a pool can make
    (posix_ipc's random lowercase names, ``sem.`` for semaphores), so Intel OpenMP's or torch's files
    written by another process meanwhile do not fail the suite, and a leaked semaphore still does."""
    import subprocess
    import sys

    import posix_ipc
    for name in ("__KMP_REGISTERED_LIB_4242_0", "torch_4242_1_0", "sem.mp-abc", "wxyzabc", "sem.qrstuvw"):
        (tmp_path / name).write_bytes(b"")
    assert shm_entries(str(tmp_path)) == {"wxyzabc", "sem.qrstuvw"}
    before = shm_entries()
    neighbour = f"/dev/shm/__KMP_REGISTERED_LIB_{os.getpid()}_0"
    subprocess.run([sys.executable, "-c", f"open({neighbour!r}, 'w').write('x')"], check=True)
    sem = posix_ipc.Semaphore(None, posix_ipc.O_CREX)
    try:
        assert shm_entries() - before == {"sem." + sem.name.lstrip("/")}
    finally:
        sem.unlink()
        os.unlink(neighbour)
    assert shm_entries() == before
