"""What differs by gymnasium version, at whichever version is installed (``.ci/versions`` runs this file at 1.0,
1.1, 1.2, 1.3 and the newest; ``.ci/run`` at 0.29.1): shmpool imports, its metadata and default autoreset are that
version's ``AsyncVectorEnv``'s, ``gymnasium.make_vec`` of a shmpool id builds shmpool's env, and a recipe id without
its extra names the extra."""
from __future__ import annotations

import functools
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from envs import same

import shmpool
from shmpool.gym_compat import GYMNASIUM_VERSION, HAS_AUTORESET_MODE, LEGACY, AutoresetMode


class Ending(gym.Env):
    """Episodes of ``length`` steps, with the step count in observations and infos."""

    observation_space = gym.spaces.Box(-100, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)
    metadata = {"render_modes": [], "marker": "ending"}

    def __init__(self, length):
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0], np.float32), {"t": 0}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= self.length, False, {"t": self.t}


FNS = [functools.partial(Ending, length) for length in (2, 3)]


def run(envs, steps=6):
    try:
        out = [envs.reset(seed=0)]
        out += [envs.step(np.zeros(2, np.int64)) for _ in range(steps)]
        return out, dict(envs.metadata)
    finally:
        envs.close()


def test_the_installed_version_is_the_one_this_module_reads():
    assert GYMNASIUM_VERSION == tuple(int(p) for p in gym.__version__.split(".")[:2])
    assert HAS_AUTORESET_MODE == hasattr(gym.vector, "AutoresetMode")


def test_default_run_and_metadata_equal_the_versions_async_vector_env(no_leaks):
    """1.0: next step, no ``autoreset_mode`` in metadata; 1.1 on: next step, the enum there; 0.29: same step."""
    want, want_metadata = run(gym.vector.AsyncVectorEnv(FNS))
    got, got_metadata = run(shmpool.VectorEnv(FNS, num_workers=2))
    same(got, want, "run")
    assert got_metadata == want_metadata
    assert ("autoreset_mode" in got_metadata) == HAS_AUTORESET_MODE


@pytest.mark.skipif(HAS_AUTORESET_MODE or LEGACY, reason="gymnasium 1.0 only")
def test_under_1_0_same_step_is_shmpools_keyword_with_1_1s_layout(no_leaks):
    """1.0's vector envs have no ``autoreset_mode``; shmpool keeps its keyword there (as under 0.29): a script written
    for it works, and SAME_STEP gives 1.1's ``final_obs``/``final_info``."""
    envs = shmpool.VectorEnv(FNS, num_workers=2, autoreset_mode="same_step")
    assert envs.autoreset_mode is AutoresetMode.SAME_STEP and "autoreset_mode" not in envs.metadata
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(2, np.int64))
        obs, _, terminated, _, infos = envs.step(np.zeros(2, np.int64))
    finally:
        envs.close()
    assert terminated.tolist() == [True, False] and obs[0].tolist() == [0.0]
    assert infos["final_obs"][0].tolist() == [2.0] and infos["_final_obs"].tolist() == [True, False]
    assert infos["final_info"]["t"][0] == 2


def test_gymnasium_make_vec_of_a_twin_id_builds_shmpools_env(no_leaks):
    """0.29's ``make_vec`` defaults to its own AsyncVectorEnv for any id; a shmpool id means shmpool's env under
    every version, and gymnasium's ids and explicit modes keep meaning gymnasium's."""
    ours = gym.make_vec("shmpool/CartPole-v1", 2)
    theirs = gym.make_vec("CartPole-v1", 2, vectorization_mode="async")
    try:
        assert type(ours) is shmpool.VectorEnv
        assert not isinstance(theirs, shmpool.VectorEnv)
        same(run(ours)[0], run(theirs)[0], "run")
    finally:
        ours.close()
        theirs.close()


def test_gymnasium_make_vec_of_a_twin_id_in_async_mode_is_gymnasiums(no_leaks):
    envs = gym.make_vec("shmpool/CartPole-v1", 2, vectorization_mode="async")
    try:
        assert not isinstance(envs, shmpool.VectorEnv)
    finally:
        envs.close()


def subprocess_outcome(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or done.stderr[-500:]


@pytest.mark.parametrize("call", ["shmpool.make_vec('shmpool-recipe/Ant-v5', num_envs=2)",
                                  "shmpool.VectorEnv('shmpool-recipe/Ant-v5', 2)",
                                  "shmpool.Pool('shmpool-recipe/Ant-v5', 2)"])
def test_a_mujoco_recipe_id_without_mujoco_names_the_extra(call):
    # As if mujoco were not installed (as the Atari ids' tests do with ale_py): the recipe ids are not registered.
    code = (f"import sys; sys.modules['mujoco'] = None\nimport shmpool\ntry:\n    {call}\n"
            "except Exception as e:\n    print(type(e).__name__, e)")
    got = subprocess_outcome(code)
    assert got.startswith("NameNotFound ") or got.startswith("NamespaceNotFound "), got
    assert got.endswith("(shmpool-recipe/Ant-v5 is a built-in shmpool task: pip install 'shmpool[mujoco]')"), got


def test_an_atari_recipe_id_in_the_recipe_namespace_without_ale_py_names_the_extra():
    code = ("import sys; sys.modules['ale_py'] = None\nimport shmpool\ntry:\n"
            "    shmpool.make_vec('shmpool-recipe/Pong-v5', num_envs=2)\n"
            "except Exception as e:\n    print(type(e).__name__, e)")
    got = subprocess_outcome(code)
    assert got.endswith("(shmpool-recipe/Pong-v5 looks like a built-in Atari task: pip install 'shmpool[atari]')"), got
