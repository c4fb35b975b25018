"""Issue 59, a user's first week: the built-in recipes by their ids from every face.

The reference for a recipe's frames is ``shmpool.make`` (EnvPool's face, where the recipes have
always been reachable): the other faces must give the same frames for the same seed and actions,
with the EnvPool options under the same names.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import shmpool

GYMNASIUM_1 = int(gym.__version__.split(".")[0]) >= 1
# ale-py 0.12 registers its ids only under gymnasium 1.x (its env module needs 1.x's API).
needs_ale = pytest.mark.skipif(importlib.util.find_spec("ale_py") is None or not GYMNASIUM_1,
                               reason="needs ale-py with gymnasium 1.x (ale-py's envs need gymnasium >= 1.0)")
needs_mujoco = pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs mujoco")
needs_sb3 = pytest.mark.skipif(importlib.util.find_spec("stable_baselines3") is None,
                               reason="needs stable-baselines3 (the [sb3] extra)")

# EnvPool's options, named as shmpool.make names them, given to every face alike.
OPTIONS = dict(episodic_life=True, reward_clip=True, noop_max=5, img_height=64, img_width=48)
SEED = 11
STEPS = 40


@pytest.fixture(scope="module")
def frames_of_make() -> list[np.ndarray]:
    """The reference: ``shmpool.make``'s observations for SEED and a fixed action sequence (played once
    for the module: the tests only read it)."""
    env = shmpool.make("Pong-v5", env_type="gymnasium", num_envs=2, seed=SEED, **OPTIONS)
    try:
        return _play(env.reset()[0], lambda a: env.step(a)[0], 2)
    finally:
        env.close()


def _play(first: np.ndarray, step, num_envs: int) -> list[np.ndarray]:
    actions = np.random.default_rng(0).integers(0, 6, (STEPS, num_envs))
    return [np.array(first)] + [np.array(step(a)) for a in actions]


def _assert_same_frames(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert got[0].shape == want[0].shape == (2, 4, 64, 48)
    assert got[0].dtype == np.uint8
    for t, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"step {t}")


# --- 1. recipes from every face ------------------------------------------------------------------


@needs_ale
def test_make_vec_builds_the_atari_recipe_with_make_s_frames(frames_of_make, no_leaks):
    want = frames_of_make
    with shmpool.make_vec("Pong-v5", num_envs=2, **OPTIONS) as envs:
        assert envs.single_observation_space.shape == (4, 64, 48)
        got = _play(envs.reset(seed=SEED)[0], lambda a: envs.step(a)[0], 2)
    _assert_same_frames(got, want)


@needs_ale
def test_make_vec_default_options_are_envpool_s():
    with shmpool.make_vec("Pong-v5", num_envs=2) as envs:
        obs, _ = envs.reset(seed=0)
        assert (obs.shape, obs.dtype) == ((2, 4, 84, 84), np.uint8)


@needs_ale
def test_gymnasium_make_vec_builds_the_recipe_through_its_shmpool_id(frames_of_make, no_leaks):
    want = frames_of_make
    envs = gym.make_vec("shmpool/Pong-v5", 2, **OPTIONS)
    try:
        assert isinstance(envs, shmpool.VectorEnv)
        got = _play(envs.reset(seed=SEED)[0], lambda a: envs.step(a)[0], 2)
    finally:
        envs.close()
    _assert_same_frames(got, want)


@needs_ale
def test_make_vec_s_spec_rebuilds_the_recipe(no_leaks):
    with shmpool.make_vec("Pong-v5", num_envs=2, **OPTIONS) as envs:
        spec = envs.spec
    assert spec.id == "shmpool-recipe/Pong-v5"
    with gym.make_vec(spec) as again:
        assert isinstance(again, shmpool.VectorEnv)
        assert again.single_observation_space.shape == (4, 64, 48)


@needs_ale
def test_vector_env_takes_a_recipe_id(frames_of_make, no_leaks):
    want = frames_of_make
    with shmpool.VectorEnv("Pong-v5", num_envs=2, **OPTIONS) as envs:
        got = _play(envs.reset(seed=SEED)[0], lambda a: envs.step(a)[0], 2)
    _assert_same_frames(got, want)


@needs_ale
def test_a_recipe_option_misspelt_is_the_recipe_s_error():
    with pytest.raises(ValueError, match=r"^unknown Atari option 'episodic_lives'; options are "):
        shmpool.make_vec("Pong-v5", num_envs=2, episodic_lives=True)


@needs_ale
@needs_sb3
@pytest.mark.heavy_imports
def test_sb3_shm_vec_env_takes_a_recipe_id(frames_of_make, no_leaks):
    from shmpool.sb3 import ShmVecEnv

    want = frames_of_make
    venv = ShmVecEnv("Pong-v5", num_envs=2, **OPTIONS)
    try:
        venv.seed(SEED)
        got = _play(venv.reset(), lambda a: venv.step(a)[0], 2)
    finally:
        venv.close()
    _assert_same_frames(got, want)


@needs_ale
@needs_sb3
@pytest.mark.heavy_imports
def test_sb3_make_vec_env_reaches_the_recipe_by_its_shmpool_id(frames_of_make, no_leaks):
    from stable_baselines3.common.env_util import make_vec_env

    from shmpool.sb3 import ShmVecEnv

    want = frames_of_make
    venv = make_vec_env("shmpool/Pong-v5", n_envs=2, seed=SEED, vec_env_cls=ShmVecEnv, env_kwargs=OPTIONS)
    try:
        got = _play(venv.reset(), lambda a: venv.step(a)[0], 2)
    finally:
        venv.close()
    _assert_same_frames(got, want)


@needs_sb3
@pytest.mark.heavy_imports
def test_sb3_refuses_a_batched_recipe_saying_why():
    from shmpool.sb3 import ShmVecEnv

    with pytest.raises(ValueError, match=r"^BatchPong-v0 is a batched recipe .*SB3's VecEnv cannot host.*"
                                         r"shmpool\.make_vec\('BatchPong-v0', num_envs=\.\.\.\)"):
        ShmVecEnv("BatchPong-v0", num_envs=4)


def test_batch_pong_from_make_vec(no_leaks):
    with shmpool.make_vec("BatchPong-v0", num_envs=4) as envs:
        obs, _ = envs.reset(seed=1)
        ref = shmpool.make("BatchPong-v0", num_envs=4, seed=1)
        try:
            np.testing.assert_array_equal(obs, ref.reset()[0])
        finally:
            ref.close()


def _env_module(env: gym.Env) -> str:
    return type(env.unwrapped).__module__


@needs_mujoco
def test_a_gymnasium_id_keeps_meaning_gymnasium_s_env(no_leaks):
    # Ant-v5 is gymnasium's own id (from gymnasium 1.0): every gymnasium face builds gymnasium's Ant,
    # only shmpool.make (EnvPool's face) means the recipe by it.  gymnasium 0.29 has no Ant-v5
    # (its newest is v4), so there the id is the recipe's alone.
    gymnasium_s = "Ant-v5" in gym.registry
    with shmpool.make_vec("Ant-v5", num_envs=1) as envs:
        want = "gymnasium.envs.mujoco.ant_v5" if gymnasium_s else "shmpool.workers.recipes.mujoco"
        assert envs.pool.apply(_env_module) == (want,)
    assert gymnasium_s == GYMNASIUM_1
    with shmpool.make_vec("shmpool-recipe/Ant-v5", num_envs=1) as envs:
        assert envs.pool.apply(_env_module) == ("shmpool.workers.recipes.mujoco",)
        got = envs.reset(seed=3)[0]
    ref = shmpool.make("Ant-v5", num_envs=1, seed=3)
    try:
        assert ref.pool.apply(_env_module) == ("shmpool.workers.recipes.mujoco",)
        np.testing.assert_array_equal(got, ref.reset()[0])
    finally:
        ref.close()


def test_an_unknown_recipe_id_is_gymnasium_s_error():
    with pytest.raises(gym.error.NameNotFound):
        shmpool.make_vec("shmpool-recipe/NoSuchGame-v5", num_envs=1)


@pytest.mark.parametrize("call", ["shmpool.make_vec('Pong-v5', num_envs=2)", "shmpool.VectorEnv('Pong-v5', 2)",
                                  "shmpool.Pool('Pong-v5', 2)", "shmpool.make('Pong-v5', num_envs=2)"])
def test_a_recipe_id_without_its_extra_names_the_extra_in_every_face(call):
    # As if ale-py were not installed: every face says which extra would serve the id, as make always did.
    code = (f"import sys; sys.modules['ale_py'] = None\nimport shmpool\ntry:\n    {call}\n"
            "except Exception as e:\n    print(type(e).__name__, e)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == ("NameNotFound Environment `Pong` doesn't exist. "
                                   "(Pong-v5 looks like a built-in Atari task: pip install 'shmpool[atari]')"), \
        done.stdout + done.stderr[-500:]
