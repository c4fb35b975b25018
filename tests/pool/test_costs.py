"""Cheap envs beside a trainer are stepped in this process (issue 31), decided only under
``parent_shard="auto"`` with torch imported and said in ``repr`` — from which env the constructors
name, never by running one (issue 69: a probe env stepped in a forked copy of the trainer still wrote
to the user's logs, drew ids from shared counters and took configs from shared queues)."""
import functools
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import heavy_imports
import numpy as np
import pytest
from envs import Journal, journal_fns, journals

import shmpool
from shmpool import costs
from shmpool.arguments import make_by_id
from shmpool.topology import TrainerThreads

two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) != 2 or shmpool.plan.cpu_quota() is not None,
                               reason="the auto layout hosts a shard only where workers leave no core (2 cores)")


def beside_torch(monkeypatch):
    """The layout of a training script: torch imported, its threads beside the pool."""
    monkeypatch.setattr(shmpool.plan, "trainer_threads", lambda: TrainerThreads(2, None, None))


@two_cores
@pytest.mark.parametrize("face", ["Pool", "VectorEnv"])
def test_each_env_is_built_once_and_run_only_by_the_users_calls(face, monkeypatch, tmp_path, no_leaks):
    """Beside a trainer on 2 cores (where the old layout probe ran): each env's journal holds what the
    reference's does — one build, the user's reset and step.  The old probe built the last env once more
    and stepped it ~100 times (102 lines for env 3).  AsyncVectorEnv builds env 0 once more in the
    trainer for its spaces, unstepped; doing less is allowed, doing more is not."""
    beside_torch(monkeypatch)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    if face == "Pool":
        subject, reference = shmpool.Pool(journal_fns(ours, 4)), None
    else:
        subject = shmpool.VectorEnv(journal_fns(ours, 4))
        reference = gym.vector.AsyncVectorEnv(journal_fns(theirs, 4))
    for envs in filter(None, (subject, reference)):
        envs.reset(seed=0)
        envs.step(np.zeros(4, np.int64))
        envs.close()
    got = journals(ours, 4)
    assert all(lines == ["build", "reset", "step"] for lines in got[1:]), got
    if reference is None:
        assert got[0] == ["build", "reset", "step"], got
    else:
        want = journals(theirs, 4)
        assert want[1:] == got[1:]
        assert want[0] in (["build", "build", "reset", "step"], got[0]), (want[0], got[0])
        assert got[0] in (["build", "reset", "step"], ["build", "build", "reset", "step"]), got[0]


class Numbered(gym.Env):
    """Takes its id from a counter shared by every env, as scripts number their envs' logs or ports."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, counter):
        with counter.get_lock():
            self.number = counter.value
            counter.value += 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([self.number], np.float32), {}

    def step(self, action):
        return np.array([self.number], np.float32), 0.0, False, False, {}


@two_cores
def test_envs_numbered_by_a_shared_counter_get_every_number_once(monkeypatch, no_leaks):
    """The old probe drew number 3 first, so the pool's envs came out [1, 2, 3, 4] (and 4 in all
    were drawn)."""
    beside_torch(monkeypatch)
    counter = mp.get_context("fork").Value("i", 0)
    with shmpool.Pool(lambda: Numbered(counter), 4, start_method="fork") as pool:
        obs, _ = pool.reset(seed=0)
        assert sorted(obs[:, 0].tolist()) == [0.0, 1.0, 2.0, 3.0]
    assert counter.value == 4


class CleanRLStyle:
    """Constructors as the scripts users port write them."""

    @staticmethod
    def make_env(env_id, idx, capture_video, run_name):   # CleanRL's make_env
        def thunk():
            env = gym.make(env_id, render_mode="rgb_array") if capture_video and idx == 0 else gym.make(env_id)
            return gym.wrappers.RecordEpisodeStatistics(env)
        return thunk

    @staticmethod
    def make_vec_env(env_id, rank):   # the shape of SB3's make_vec_env: a closure over the id, wrapped again
        def _init():
            return gym.make(env_id, render_mode="rgb_array")
        return functools.partial(lambda f: f(), _init)


def _unknown():
    return Journal(os.devnull)


@pytest.mark.parametrize("fn, named", [
    (functools.partial(make_by_id, "CartPole-v1", {}), "CartPole-v1"),               # Pool("CartPole-v1", n)
    (functools.partial(make_by_id, "CartPole-v1", {"render_mode": "rgb_array"}), "CartPole-v1"),
    (functools.partial(make_by_id, "CartPole-v1", {"render_mode": "human"}), None),   # draws every step
    (functools.partial(make_by_id, "CartPole-v1", {"max_episode_steps": 10}), None),  # another env than the id's
    (functools.partial(gym.make, "Pendulum-v1"), "Pendulum-v1"),
    (CleanRLStyle.make_env("CartPole-v1", 1, False, "CartPole-v1__ppo__1__1"), "CartPole-v1"),
    (CleanRLStyle.make_vec_env("Acrobot-v1", 0), "Acrobot-v1"),
    (lambda: gym.make("MountainCar-v0"), "MountainCar-v0"),
    (lambda: gym.make("MountainCar-v0", render_mode="human"), None),   # a window drawn every step
    (lambda: gym.make(gym.spec("CartPole-v1")), "CartPole-v1"),   # the id is one of the code's constants
    (lambda: (gym.make("CartPole-v1"), gym.make("Pendulum-v1")), None),   # two ids: which one steps is unknown
    (_unknown, None),
    (Journal, None),
])
def test_which_env_a_constructor_builds_is_read_not_run(fn, named):
    assert costs.named_env_id(fn) == named


def test_a_constructor_is_never_called_to_know_its_cost():
    calls = []

    def thunk():
        calls.append(1)
        return gym.make(env_id)

    env_id = "CartPole-v1"
    spec = gym.spec("Taxi-v4" if "Taxi-v4" in gym.registry else "Taxi-v3")
    held = spec
    assert costs.known_cost([thunk] * 8) == costs.KnownCost(
        "CartPole-v1", "gymnasium.envs.classic_control.cartpole:CartPoleEnv", 8e-6)
    assert costs.named_env_id(lambda: gym.make(held)) == spec.id   # an EnvSpec in a closure names its id
    assert calls == []


@pytest.mark.parametrize("ids, known", [
    (["CartPole-v1"] * 4, "CartPole-v1"),
    (["CartPole-v1", "CartPole-v1", "Pendulum-v1"], None),   # envs of two kinds
    (["Ant-v5"] * 2, None),                                   # a kind not known to be cheap
])
def test_known_cost_of_a_pools_constructors(ids, known):
    found = costs.known_cost([functools.partial(make_by_id, i, {}) for i in ids])
    assert (found and found.env_id) == known


@pytest.mark.parametrize("seconds, n, here", [(10e-6, 8, True), (10e-6, 32, True), (10e-6, 128, False),
                                               (190e-6, 8, False)])
def test_cheap_enough(seconds, n, here):
    assert costs.cheap_enough(costs.KnownCost("X-v0", "x:X", seconds), n) is here
    assert not costs.cheap_enough(None, n)


def test_every_known_kind_is_registered_in_this_gymnasium():
    """The table's keys are entry points as gymnasium registers them: one renamed would never match."""
    registered = {str(spec.entry_point) for spec in gym.registry.values()}
    assert set(costs.STEP_COST_S) <= registered | {"gymnasium.envs.toy_text.taxi:TaxiEnv"}, \
        set(costs.STEP_COST_S) - registered


LAYOUT = """
    {imports}
    import shmpool
    pool = shmpool.Pool({env}, {n}{extra})
    print("workers", pool.num_workers, "processes", len([c for c in pool.worker_cpus if c is not None]))
    print(repr(pool))
    pool.close()
"""


def _layout(env, n, torch_first=True, extra=""):
    code = textwrap.dedent(LAYOUT.format(imports="import torch" if torch_first else "", env=env, n=n, extra=extra))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow   # a subprocess importing torch: ~11 s on 2 loaded cores
@two_cores
def test_cheap_envs_beside_torch_run_in_this_process():
    heavy_imports.require("torch")   # imported by the subprocess only
    out = _layout("'CartPole-v1'", 8)
    assert "workers 1 processes 0" in out
    assert ("every env stepped in this process: CartPole-v1 (gymnasium.envs.classic_control.cartpole:CartPoleEnv) "
            "steps in about 8 µs, 8 of them less than handing a shard to a worker beside the trainer") in out, out


@pytest.mark.slow   # five subprocesses importing torch: ~30 s on 2 loaded cores
@two_cores
def test_without_a_trainer_a_choice_or_a_known_cheap_env_the_layout_is_the_default():
    heavy_imports.require("torch")   # imported by the subprocesses only
    assert "workers 2 processes 1" in _layout("'CartPole-v1'", 8, torch_first=False)
    assert "workers 2 processes 2" in _layout("'CartPole-v1'", 8, extra=", num_workers=2")
    assert "workers 2 processes 2" in _layout("'CartPole-v1'", 8, extra=", parent_shard=False")
    assert "workers 2 processes 1" in _layout("'CartPole-v1'", 256)
    # A constructor naming no id keeps the worker, even for an env as cheap: nothing is run to find out.
    unnamed = ("lambda: __import__('gymnasium').wrappers.TimeLimit("
               "__import__('gymnasium.envs.classic_control', fromlist=['_']).CartPoleEnv(), 500)")
    assert "workers 2 processes 1" in _layout(unnamed, 8)
