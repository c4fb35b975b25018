"""Cheap envs beside a trainer are stepped in this process (issue 31): measured on a probe env,
decided only under ``parent_shard="auto"`` with torch imported, and said in ``repr``.  The probe
runs in a forked process of its own (issue 57): nothing the user handed over is run or advanced."""
import os
import random
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import heavy_imports
import numpy as np
import pytest

import shmpool
from shmpool import costs
from shmpool.topology import TrainerThreads


class Slow(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, delay=0.0, fail=False, slow_every=None):
        self.delay, self.fail, self.slow_every = delay, fail, slow_every
        self.closed = False
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        if self.fail:
            raise ValueError("no")
        import time
        self.steps += 1
        if self.slow_every is None or self.steps % self.slow_every:
            time.sleep(self.delay)
        return np.zeros(2, np.float32), 0.0, False, False, {}


class Captures(gym.Env):
    """Advances a counter it was handed (a trainer's tensor or array) and draws from numpy's and
    Python's global RNGs when built and at every step, as careless envs do.  Observation: the counter."""

    observation_space = gym.spaces.Box(0, 1e9, (1,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, counter, delay=0.0):
        self.counter, self.delay = counter, delay
        self.drawn = np.random.random() + random.random()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.counter.copy(), {}

    def step(self, action):
        self.counter += 1
        np.random.random(), random.random()
        time.sleep(self.delay)
        return self.counter.copy(), 0.0, False, False, {}


def test_step_cost_is_a_step_of_a_probe_env():
    # The probe reports its steps' lower quartile, which a loaded machine's slow steps do not reach: a 2 ms
    # sleep comes back as 2.0-2.2 ms idle, and ~2.1-3 ms loaded (a sleep overshoots, never undershoots);
    # 1.5 ms either side still fails a cost off by the 2 ms (none measured, or two steps counted as one).
    assert costs.step_cost(lambda: Slow(0.002)).seconds == pytest.approx(0.002, abs=0.0015)
    # A step that only sleeps 0 s (a yield): ~60 us on a loaded machine; 0.5 ms is 8x that, and a quarter of the
    # 2 ms step above.
    assert costs.step_cost(lambda: Slow(0.0)).seconds < 0.0005


def test_step_cost_is_what_a_step_costs_when_nothing_else_runs():
    # Two steps in three slowed (a busy VM, cold caches): the median would say 1 ms; the layout
    # then flips between runs.  Every third step is the env's own cost (~5-10 us on a loaded machine): 0.3 ms
    # is 30x that, and a third of the 1 ms a median would report.
    assert costs.step_cost(lambda: Slow(0.001, slow_every=3)).seconds < 0.0003


def test_an_env_that_cannot_be_probed_gives_no_cost():
    assert costs.step_cost(lambda: Slow(fail=True)) == costs.StepCost(None, "the probe env or its constructor raised")
    assert costs.step_cost(lambda: 1 / 0) == costs.StepCost(None, "the probe env or its constructor raised")


def test_the_probe_stays_within_its_budget():
    # Event, not speed: 100 steps of 20 ms would take 2 s; the budget stops the stepping after 50 ms
    # (3 steps), and the whole probe (fork, 3 steps, exit: ~0.1 s idle) ends well inside 1 s even on a busy
    # VM, and half the 2 s a probe that ignored its budget would take.
    t = time.perf_counter()
    costs.step_cost(lambda: Slow(0.02), budget_s=0.05)
    assert time.perf_counter() - t < 1.0


def _slow_constructor():
    time.sleep(30)
    return Slow()


def _blocking_first_step():
    env = Slow()
    env.step = lambda action: time.sleep(30)
    return env


@pytest.mark.parametrize("make_env", [_slow_constructor, _blocking_first_step])
def test_the_probe_is_bounded_as_a_whole_and_leaves_no_process(make_env, no_leaks):
    # A constructor that takes 30 s, or a first step that blocks, costs the deadline (0.5 s here)
    # plus the kill (~1 s on a loaded machine); the old probe ran in this process and waited the 30 s.  5 s
    # leaves 5x that for a loaded CI, and still fails on a probe that waited the env out.
    t = time.perf_counter()
    found = costs.step_cost(make_env, deadline_s=0.5)
    assert time.perf_counter() - t < 5.0
    assert found == costs.StepCost(None, "the probe process took longer than 0.5 s")
    assert found.describe() == "one env's step not measured (the probe process took longer than 0.5 s)"


def test_the_probe_advances_nothing_of_this_process():
    """A constructor capturing the trainer's array, or a live env (``lambda: env``), and envs that
    draw from the global RNGs: after the probe, the array, the env and the next draws are as before."""
    counter = np.zeros(1)
    live = Captures(np.zeros(1))
    np_state, py_state = np.random.get_state(), random.getstate()
    assert costs.step_cost(lambda: Captures(counter)).seconds is not None
    assert costs.step_cost(lambda: live).seconds is not None
    assert counter.tolist() == [0.0] and live.counter.tolist() == [0.0]
    drawn = np.random.random(), random.random()
    np.random.set_state(np_state)
    random.setstate(py_state)
    assert (np.random.random(), random.random()) == drawn


@pytest.mark.parametrize("delay, placement", [(0.0, "every env here"), (0.002, "one env here, one in a worker")])
@pytest.mark.parametrize("captured", ["array", "live env"])
def test_a_pool_beside_a_trainer_leaves_what_it_was_handed(monkeypatch, delay, placement, captured, no_leaks):
    """The probe runs (torch beside the pool, ``parent_shard="auto"``): the trainer's array or live
    env is not advanced, each env starts from its own copy of it, and the global RNGs' next draws
    are those they would have been without the pool, as with AsyncVectorEnv."""
    if len(os.sched_getaffinity(0)) != 2 or shmpool.plan.cpu_quota() is not None:
        pytest.skip("the probe runs only where the default layout hosts a shard (exactly 2 cores, no quota)")
    monkeypatch.setattr(shmpool.plan, "trainer_threads", lambda: TrainerThreads(2, None, None))
    counter = np.zeros(1)
    live = Captures(counter, delay)
    make = (lambda: Captures(counter, delay)) if captured == "array" else (lambda: live)
    np_state, py_state = np.random.get_state(), random.getstate()
    with shmpool.Pool(make, 2) as pool:
        assert isinstance(pool.plan.probe, costs.StepCost) and pool.plan.probe.seconds is not None
        assert "measured in a probe process" in repr(pool), repr(pool)
        hosted_only = pool.num_workers == 1
        assert hosted_only == (placement == "every env here"), repr(pool)
        drawn = np.random.random(), random.random()
        np.random.set_state(np_state)
        random.setstate(py_state)
        assert (np.random.random(), random.random()) == drawn
        assert counter.tolist() == [0.0]
        obs, _ = pool.reset(seed=0)
        assert obs[:, 0].tolist() == [0.0, 0.0]
        obs, *_ = pool.step(np.zeros(2, np.int64))
        obs, *_ = pool.step(np.zeros(2, np.int64))
        assert obs[:, 0].tolist() == [2.0, 2.0]   # each env its own copy, from 0
        assert counter.tolist() == [0.0]


@pytest.mark.parametrize("cost, n, here", [(10e-6, 8, True), (10e-6, 32, True), (10e-6, 128, False),
                                            (190e-6, 8, False), (None, 8, False)])
def test_cheap_enough(cost, n, here):
    assert costs.cheap_enough(cost, n) is here


LAYOUT = """
    {imports}
    import shmpool
    pool = shmpool.Pool({env!r}, {n}{extra})
    print("workers", pool.num_workers, "processes", len([c for c in pool.worker_cpus if c is not None]))
    print(repr(pool))
    pool.close()
"""


def _layout(env, n, torch_first=True, extra=""):
    code = textwrap.dedent(LAYOUT.format(imports="import torch" if torch_first else "", env=env, n=n, extra=extra))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


two_cores = pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) != 2,
                               reason="the auto layout hosts a shard only when workers leave no core (2 cores)")


@pytest.mark.slow   # a subprocess importing torch: ~11 s on 2 loaded cores
@two_cores
def test_cheap_envs_beside_torch_run_in_this_process():
    heavy_imports.require("torch")   # imported by the subprocess only
    out = _layout("CartPole-v1", 8)
    assert "workers 1 processes 0" in out
    assert "every env stepped in this process: a step of one env costs" in out


@pytest.mark.slow   # four subprocesses importing torch: ~27 s on 2 loaded cores
@two_cores
def test_without_a_trainer_or_with_a_choice_the_layout_is_the_default():
    heavy_imports.require("torch")   # imported by the subprocesses only
    assert "workers 2 processes 1" in _layout("CartPole-v1", 8, torch_first=False)
    assert "workers 2 processes 2" in _layout("CartPole-v1", 8, extra=", num_workers=2")
    assert "workers 2 processes 2" in _layout("CartPole-v1", 8, extra=", parent_shard=False")
    assert "workers 2 processes 1" in _layout("CartPole-v1", 256)
