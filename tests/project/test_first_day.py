"""A new user's first day (issue 33): typos named with the nearest keyword, built-in ids named where
they are built, counts checked as every face checks them."""
import gymnasium as gym
import pytest

import shmpool


def cartpole():
    return gym.make("CartPole-v1")


@pytest.mark.parametrize("build, face, typo, meant", [
    (lambda: shmpool.Pool("CartPole-v1", num_envs=4, num_wokers=2), "Pool", "num_wokers", "num_workers"),
    (lambda: shmpool.Pool("CartPole-v1", num_env=4), "Pool", "num_env", "num_envs"),
    (lambda: shmpool.Pool(cartpole, 2, wait_polcy="block"), "Pool", "wait_polcy", "wait_policy"),
    (lambda: shmpool.make("CartPole-v1", num_envs=4, batchsize=2), "make", "batchsize", "batch_size"),
    (lambda: shmpool.make_vec("CartPole-v1", 2, num_wokers=1), "make_vec", "num_wokers", "num_workers"),
    (lambda: shmpool.VectorEnv([cartpole] * 2, autoreset_mod="same_step"), "VectorEnv", "autoreset_mod",
     "autoreset_mode"),
])
def test_a_keyword_close_to_one_of_ours_is_named_as_a_typo(build, face, typo, meant, no_leaks):
    with pytest.raises(TypeError, match=rf"^{face} got an unknown keyword '{typo}': did you mean '{meant}'\?"):
        build()


@pytest.mark.heavy_imports
def test_sb3_vec_env_kwargs_typos_are_named_by_the_face(no_leaks):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env

    from shmpool.sb3 import ShmVecEnv
    with pytest.raises(TypeError, match=r"^ShmVecEnv got an unknown keyword 'start_methd': did you mean "
                                        r"'start_method'\?"):
        make_vec_env("CartPole-v1", n_envs=2, vec_env_cls=ShmVecEnv, vec_env_kwargs={"start_methd": "fork"})


def test_env_keywords_far_from_ours_still_reach_the_env(no_leaks):
    with shmpool.Pool("CartPole-v1", 2, num_workers=1, sutton_barto_reward=True) as pool:
        assert pool.get_attr("_sutton_barto_reward") == (True, True)


def test_a_builtin_task_id_given_to_pool_builds_the_recipe(no_leaks):
    # Once refused with a pointer to shmpool.make; every face now builds the recipe (issue 59).
    pytest.importorskip("ale_py")
    with shmpool.Pool("Pong-v5", 2, stack_num=2) as pool:
        assert pool.single_observation_space.shape == (2, 84, 84)


def test_make_vec_counts_are_checked_as_pool_checks_them():
    with pytest.raises(ValueError, match=r"^num_envs must be >= 1, got 0$"):
        shmpool.make_vec("CartPole-v1", num_envs=0)


def test_wait_choice_says_microseconds(no_leaks):
    with shmpool.Pool("CartPole-v1", 2, num_workers=2) as pool:
        assert " µs, else sleep" in str(pool.wait_choice)
        assert "000 ns" not in str(pool.wait_choice)
