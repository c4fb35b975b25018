"""Issue 59: every face's ``repr`` shows what ``repr(pool)`` shows (layout, waits, crowding)."""
from __future__ import annotations

import importlib.util

import gymnasium as gym
import pytest

import shmpool

needs_sb3 = pytest.mark.skipif(importlib.util.find_spec("stable_baselines3") is None,
                               reason="needs stable-baselines3 (the [sb3] extra)")


# --- 3. every face's repr shows its pool's plan -------------------------------------------------------


def _cartpole():
    return gym.make("CartPole-v1")


def _assert_plan_in(face_repr: str, pool: shmpool.Pool) -> None:
    assert pool.plan.describe_layout() in face_repr
    assert f"{pool.wait_policy.name} waits ({pool.wait_choice})" in face_repr
    assert repr(pool) in face_repr


def test_vector_env_repr_shows_the_plan(no_leaks):
    with shmpool.VectorEnv(_cartpole, 2) as envs:
        _assert_plan_in(repr(envs), envs.pool)
        # gymnasium's own repr first (0.29 and 1.x word it differently), then the plan
        assert repr(envs).startswith(gym.vector.VectorEnv.__repr__(envs) + " over Pool(")


def test_make_vec_repr_shows_the_plan(no_leaks):
    with shmpool.make_vec("CartPole-v1", 2) as envs:
        _assert_plan_in(repr(envs), envs.pool)
        assert "CartPole-v1" in gym.vector.VectorEnv.__repr__(envs)
        assert repr(envs).startswith(gym.vector.VectorEnv.__repr__(envs) + " over Pool(")


def test_envpool_face_repr_shows_the_plan_and_config(no_leaks):
    env = shmpool.make("CartPole-v1", num_envs=2)
    try:
        _assert_plan_in(repr(env), env.pool)
        assert repr(env).startswith("EnvPoolEnv(num_envs=2, batch_size=2, ")
        assert str(env) == repr(env)
    finally:
        env.close()


@needs_sb3
@pytest.mark.heavy_imports
def test_sb3_repr_shows_the_plan(no_leaks):
    from shmpool.sb3 import ShmVecEnv

    venv = ShmVecEnv(_cartpole, num_envs=2)
    try:
        _assert_plan_in(repr(venv), venv.pool)
        assert repr(venv).startswith("ShmVecEnv(num_envs=2)")
    finally:
        venv.close()
