"""Cheap envs beside a trainer are stepped in this process (issue 31): measured on a probe env,
decided only under ``parent_shard="auto"`` with torch imported, and said in ``repr``."""
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest

from shmpool import costs


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


def test_step_cost_is_a_step_of_a_probe_env():
    assert costs.step_cost(lambda: Slow(0.002)) == pytest.approx(0.002, abs=0.0015)
    assert costs.step_cost(lambda: Slow(0.0)) < 0.0005


def test_step_cost_is_what_a_step_costs_when_nothing_else_runs():
    # Two steps in three slowed (a busy VM, cold caches): the median would say 1 ms; the layout
    # then flips between runs.  Every third step is the env's own cost.
    assert costs.step_cost(lambda: Slow(0.001, slow_every=3)) < 0.0003


def test_an_env_that_cannot_be_probed_gives_no_cost():
    assert costs.step_cost(lambda: Slow(fail=True)) is None
    assert costs.step_cost(lambda: 1 / 0) is None


def test_the_probe_stays_within_its_budget():
    import time
    t = time.perf_counter()
    costs.step_cost(lambda: Slow(0.02), budget_s=0.05)
    assert time.perf_counter() - t < 0.2


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


@two_cores
def test_cheap_envs_beside_torch_run_in_this_process():
    pytest.importorskip("torch")
    out = _layout("CartPole-v1", 8)
    assert "workers 1 processes 0" in out
    assert "every env stepped in this process: a step of one env costs" in out


@two_cores
def test_without_a_trainer_or_with_a_choice_the_layout_is_the_default():
    pytest.importorskip("torch")
    assert "workers 2 processes 1" in _layout("CartPole-v1", 8, torch_first=False)
    assert "workers 2 processes 2" in _layout("CartPole-v1", 8, extra=", num_workers=2")
    assert "workers 2 processes 2" in _layout("CartPole-v1", 8, extra=", parent_shard=False")
    assert "workers 2 processes 1" in _layout("CartPole-v1", 256)
