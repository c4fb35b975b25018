"""A shard stepped in the pool's own process (``parent_shard``): the same results as
gymnasium's SyncVectorEnv, the same errors as a worker process's shard, nothing left behind."""
import os
import re
import signal

import gymnasium as gym
import numpy as np
import pytest
from compare import actions_for, env_row, gather_async, tree_equal
from conftest import our_children
from envs import CounterEnv, DictEnv, FaultyEnv

import shmpool
from shmpool import EnvError, PoolClosedError
from shmpool.arguments import check_parent_shard

CASES = [
    ("CartPole-v1", lambda: gym.make("CartPole-v1")),
    ("DictEnv", lambda: DictEnv()),
]


def worker_processes() -> int:
    return len(our_children())


@pytest.mark.parametrize("name,env_fn", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("autoreset_mode", ["NextStep", "SameStep"])
@pytest.mark.parametrize("workers", [1, 2])
def test_sync_steps_match_sync_vector_env(name, env_fn, autoreset_mode, workers, no_leaks):
    mode = gym.vector.AutoresetMode(autoreset_mode)
    ref = gym.vector.SyncVectorEnv([env_fn] * 5, autoreset_mode=mode)
    with shmpool.Pool(env_fn, 5, num_workers=workers, parent_shard=True, autoreset_mode=mode) as pool:
        assert pool.parent_shard == workers - 1
        assert pool.worker_pids[-1] == os.getpid() and pool.worker_cpus[-1] is None
        assert worker_processes() == workers - 1
        tree_equal(ref.reset(seed=3), pool.reset(seed=3), "reset")
        dones = 0
        for t, act in enumerate(actions_for(ref.single_action_space, 5, 120)):
            r, p = ref.step(act), pool.step(act)
            tree_equal(r, p, f"step {t}")
            dones += int(np.sum(r[2] | r[3]))
        assert dones > 0, "the trajectory must cross an autoreset to test it"
    ref.close()


@pytest.mark.parametrize("name,env_fn", CASES, ids=[c[0] for c in CASES])
def test_send_recv_matches_sync_vector_env(name, env_fn, no_leaks):
    ref = gym.vector.SyncVectorEnv([env_fn] * 6)
    with shmpool.Pool(env_fn, 6, num_workers=2, batch_size=2, seed=11, parent_shard=True) as pool:
        ref.reset(seed=11)
        pool.async_reset()
        for _ in range(3):
            pool.recv()
        for t, act in enumerate(actions_for(ref.single_action_space, 6, 30)):
            r = ref.step(act)
            got = gather_async(pool, 6, act, 2)
            for i in range(6):
                tree_equal(env_row(r[0], i), got[i][0], f"obs of env {i} at step {t}")
                assert (got[i][1], got[i][2], got[i][3]) == (r[1][i], r[2][i], r[3][i]), f"env {i} step {t}"
    ref.close()


class WatchedCounter(CounterEnv):
    """A CounterEnv listed on its class when built: the test watches the hosted envs there (each env's
    constructor is unpickled for it, so a list captured by a closure would be that env's own copy)."""

    built: list[CounterEnv] = []

    def __init__(self) -> None:
        super().__init__(tag=False)
        WatchedCounter.built.append(self)


def test_recv_steps_only_as_many_parent_shard_envs_as_its_batch_needs(no_leaks):
    """The envs built in this process can be watched directly: recv steps them one at a time
    and returns once its batch is full; the others sent wait for the next recv (a full drain
    here would hold the worker processes' next work back behind this shard's whole backlog)."""
    WatchedCounter.built.clear()
    made = WatchedCounter.built
    with shmpool.Pool(WatchedCounter, 4, num_workers=1, batch_size=2, parent_shard=True) as pool:
        assert pool.parent_shard == 0 and len(made) == 4
        pool.reset()
        pool.send(np.zeros(4, dtype=np.int64))
        obs, *_, infos = pool.recv()
        assert sorted(env.n for env in made) == [0, 0, 1, 1] and obs[:, 0].tolist() == [1.0, 1.0]
        first = infos["env_id"].tolist()
        obs, *_, infos = pool.recv()
        assert [env.n for env in made] == [1, 1, 1, 1] and sorted(first + infos["env_id"].tolist()) == [0, 1, 2, 3]


def test_env_error_in_the_parent_shard_is_an_env_error_and_the_pool_stays_usable(no_leaks):
    fns = [lambda: FaultyEnv()] * 3 + [lambda: FaultyEnv("step", at=2)]
    with shmpool.Pool(fns, num_workers=2, parent_shard=True) as pool:
        assert pool.shard_of(pool.parent_shard) == range(2, 4)
        pool.reset()
        pool.step(np.zeros(4, np.int64))
        with pytest.raises(EnvError) as info:
            pool.step(np.zeros(4, np.int64))
        err = info.value
        assert (err.env_id, err.worker, err.phase) == (3, 1, "step")
        assert f"env 3 (worker 1, pid {os.getpid()}) raised in step: ValueError: injected failure in step" in str(err)
        obs, _ = pool.reset()
        assert obs.shape == (4, 4)


def test_failing_constructor_in_the_parent_shard_names_the_env(no_leaks):
    fns = [lambda: FaultyEnv()] * 3 + [lambda: FaultyEnv("make")]
    with pytest.raises(EnvError, match=r"env 3 \(worker 1, pid \d+\) raised in make: ValueError: injected failure "
                                       r"in make; the pool was not created"):
        shmpool.Pool(fns, num_workers=2, parent_shard=True)


class ClosingCounter(CounterEnv):
    """Lists its step count on the class when closed (the class is shared by the envs of this process;
    a list captured by the constructor would be each env's own copy)."""

    closed: list[int] = []

    def close(self) -> None:
        ClosingCounter.closed.append(self.n)


def test_calls_side_infos_and_close_reach_the_parent_shard(no_leaks):
    ClosingCounter.closed.clear()
    closed = ClosingCounter.closed
    with shmpool.Pool(ClosingCounter, 4, num_workers=2, parent_shard=True) as pool:
        pool.reset()
        _, _, _, _, infos = pool.step(np.zeros(4, np.int64))
        assert list(infos["tag"]) == ["t1"] * 4 and infos["_tag"].all()   # strings: the side channel
        pool.set_attr("delay", [0.0, 0.0, 0.0, 0.001])
        assert pool.get_attr("delay") == (0.0, 0.0, 0.0, 0.001)
        assert pool.call("_info") == ({"tag": "t1"},) * 4
    # Only the hosted shard's envs close in this process (the others in their worker).
    assert closed == [1, 1]


def test_a_one_cpu_quota_runs_no_worker_process(monkeypatch, no_leaks):
    monkeypatch.setattr(shmpool.plan, "cpu_quota", lambda: 1.0)
    with shmpool.Pool("CartPole-v1", 6, seed=0) as pool:
        assert pool.num_workers == 1 and pool.parent_shard == 0
        assert pool.worker_pids == [os.getpid()] and worker_processes() == 0
        assert "1 worker (no worker process, worker 0's shard stepped in this process)" in repr(pool)
        ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 6)
        tree_equal(ref.reset(seed=0)[0], pool.reset()[0])
        for act in actions_for(ref.single_action_space, 6, 50):
            tree_equal(ref.step(act)[:4], pool.step(act)[:4])
        ref.close()


def test_ctrl_c_inside_a_parent_shard_env_closes_the_pool(no_leaks):
    class Interrupting(CounterEnv):
        def step(self, action):
            if self.n == 1:
                raise KeyboardInterrupt
            return super().step(action)

    pool = shmpool.Pool(lambda: Interrupting(tag=False), 4, num_workers=2, parent_shard=True)
    pool.reset()
    pool.step(np.zeros(4, np.int64))
    with pytest.raises(KeyboardInterrupt) as info:
        pool.step(np.zeros(4, np.int64))
    assert any("the pool was closed and its workers killed" in n for n in info.value.__notes__)
    with pytest.raises(PoolClosedError):
        pool.step(np.zeros(4, np.int64))


@pytest.mark.parametrize("crowded,given,timeout,on_error,async_batches,free_core,expected", [
    (True, False, None, "raise", False, False, True),
    (False, False, None, "raise", False, False, False),   # a core is left for the parent: every shard a process
    (True, True, None, "raise", False, False, False),     # num_workers asks for processes
    (True, False, 1.0, "raise", False, False, False),     # only a process can be stopped mid-step
    (True, False, None, "restart", False, False, False),  # only a process can die alone
    (True, False, None, "raise", True, False, True),      # async, the trainer's threads take every core
    (True, False, None, "raise", True, True, False),      # async beside a trainer that leaves a core free:
    (True, False, None, "raise", False, True, True),      # processes step while it computes (sync: no matter)
])
def test_auto_hosts_a_shard_only_when_crowded_and_nothing_asks_for_processes(crowded, given, timeout, on_error,
                                                                             async_batches, free_core, expected):
    assert check_parent_shard("auto", crowded, given, timeout, on_error, async_batches, free_core) is expected


@pytest.mark.parametrize("torch_threads,omp,cores,leaves", [
    (None, None, 2, False), (1, None, 2, True), (2, None, 2, False), (2, "1", 2, False),   # torch's own count wins
    (None, "1", 2, True), (None, "2", 2, False), (None, "4,2", 2, False), (4, None, 8, True)])
def test_trainer_leaves_a_core_reads_torch_then_openmp(torch_threads, omp, cores, leaves):
    from shmpool.topology import TrainerThreads
    assert TrainerThreads(torch_threads, omp, None).leaves_a_core(cores) is leaves


def test_parent_shard_refuses_a_step_timeout_and_other_values():
    with pytest.raises(ValueError, match=r"^parent_shard=True cannot honour step_timeout=2.0: this process steps "
                                         r"that shard itself, and nothing can stop it mid-step; use "
                                         r"parent_shard=False$"):
        shmpool.Pool("CartPole-v1", 2, parent_shard=True, step_timeout=2.0)
    with pytest.raises(TypeError, match=r"^parent_shard must be True, False or 'auto', got 1$"):
        shmpool.Pool("CartPole-v1", 2, parent_shard=1)


def test_auto_on_two_cores_steps_one_shard_here(monkeypatch, no_leaks):
    from shmpool.topology import TrainerThreads
    if len(os.sched_getaffinity(0)) != 2 or shmpool.plan.cpu_quota() is not None:
        pytest.skip("the default layout is crowded only on exactly 2 cores without a quota")
    monkeypatch.setattr(shmpool.plan, "trainer_threads", lambda: TrainerThreads(None, None, None))   # no torch
    with shmpool.Pool("CartPole-v1", 8) as pool:
        assert pool.num_workers == 2 and pool.parent_shard == 1 and worker_processes() == 1
    with shmpool.Pool("CartPole-v1", 8, num_workers=2) as pool:
        assert pool.parent_shard is None and worker_processes() == 2
    # Beside torch, envs this cheap are all stepped here (shmpool.costs); dearer ones keep a worker.
    monkeypatch.setattr(shmpool.plan, "trainer_threads", lambda: TrainerThreads(2, None, None))
    with shmpool.Pool("CartPole-v1", 8) as pool:
        assert pool.num_workers == 1 and pool.parent_shard == 0 and worker_processes() == 0
    monkeypatch.setattr(shmpool.plan, "known_cost", lambda fns: shmpool.costs.KnownCost("CartPole-v1", "x:X", 1e-3))
    with shmpool.Pool("CartPole-v1", 8) as pool:
        assert pool.num_workers == 2 and pool.parent_shard == 1 and worker_processes() == 1
    # Async: the parent's shard unless the trainer's threads leave a core for the worker processes.
    with shmpool.Pool("CartPole-v1", 8, batch_size=4) as pool:
        assert pool.parent_shard == 1 and worker_processes() == 1
    monkeypatch.setattr(shmpool.plan, "trainer_threads", lambda: TrainerThreads(1, None, None))
    with shmpool.Pool("CartPole-v1", 8, batch_size=4) as pool:
        assert pool.parent_shard is None and worker_processes() == 2


def test_restart_mode_replaces_a_worker_process_beside_the_parent_shard(no_leaks):
    """The parent's shard cannot die alone, but the worker processes beside it are replaced
    as in any pool: their envs report worker_restarted, the parent's envs step on."""
    with shmpool.Pool(lambda: CounterEnv(tag=False), 4, num_workers=2, parent_shard=True,
                      on_worker_error="restart") as pool:
        pool.reset()
        for _ in range(3):
            pool.step(np.zeros(4, np.int64))
        os.kill(pool.worker_pids[0], signal.SIGKILL)
        obs, _, _, truncated, infos = pool.step(np.zeros(4, np.int64))
        assert pool.worker_restarts == [1, 0]
        assert truncated.tolist() == [True, True, False, False]
        assert infos["_worker_restarted"].tolist() == [True, True, False, False]
        assert obs[2:, 0].tolist() == [4.0, 4.0]   # the parent's shard kept counting
        obs, _, _, truncated, _ = pool.step(np.zeros(4, np.int64))
        assert obs[2:, 0].tolist() == [5.0, 5.0] and not truncated.any()


def test_trainer_threads_say_what_was_seen(monkeypatch):
    from shmpool.topology import TrainerThreads, trainer_threads
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    monkeypatch.delenv("KMP_BLOCKTIME", raising=False)
    assert trainer_threads().spin_settings == (("GOMP_SPINCOUNT", "10000"),)
    assert TrainerThreads(1, None, None).describe() == "torch 1 thread"
    assert TrainerThreads(2, "1", "PASSIVE").describe() == "torch 2 threads, OMP_NUM_THREADS=1, OMP_WAIT_POLICY=PASSIVE"
    assert TrainerThreads(None, None, None).describe() == "no torch/OpenMP settings seen"
    assert (TrainerThreads(2, None, None, (("GOMP_SPINCOUNT", "10000"),)).describe()
            == "torch 2 threads, GOMP_SPINCOUNT=10000")


ENDS_ITS_PROCESS = """
import os, sys
import gymnasium as gym
import shmpool

def make():
    os._exit(3)

fns = [lambda: gym.make("CartPole-v1")] * 3 + [make]
try:
    shmpool.Pool(fns, parent_shard=sys.argv[1] == "True")
except shmpool.WorkerDiedError as exc:
    print("raised:", exc, flush=True)
print("the trainer goes on", flush=True)
"""


@pytest.mark.parametrize("parent_shard", [True, False])
def test_an_env_that_ends_its_process_ends_the_trainer_only_in_the_parent_shard_and_the_docs_say_so(parent_shard):
    """Issue 69: a constructor calling os._exit in the default 2-core layout ended the trainer (its shard is hosted
    there), where AsyncVectorEnv loses a worker and raises.  Nothing can intercept os._exit: the parent_shard docs
    say so where the user meets it, with ``parent_shard=False`` as the fix, which raises as a worker does."""
    import subprocess
    import sys
    import textwrap
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(ENDS_ITS_PROCESS), str(parent_shard)],
                         capture_output=True, text=True, timeout=120)
    if parent_shard:
        assert res.returncode == 3 and "goes on" not in res.stdout, (res.stdout, res.stderr[-2000:])
    else:
        assert res.returncode == 0, res.stderr[-2000:]
        assert re.search(r"raised: worker 1 \(pid \d+, cpu \d+, envs 2\.\.3\) exited with code 3 during starting",
                         res.stdout), res.stdout
        assert "the trainer goes on" in res.stdout
    doc = " ".join(shmpool.Pool.__doc__.split())
    assert re.search(r"parent_shard : .*constructors and steps run in this process, so an env that ends its process "
                     r"\(``os\._exit``.*ends the trainer.*``parent_shard=False`` gives every shard a process", doc)
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "performance.md")) as f:
        section = " ".join(f.read().split("## The parent's own shard")[1].split("\n## ")[0].split())
    assert "constructors and steps run in the trainer" in section and "`os._exit`" in section
    assert "`parent_shard=False` gives every shard a process, the fix" in section
