"""``shmpool.make`` against envpool 1.2.5 itself: the same calls on both, in the same test.

Each test runs for envpool (skipped cleanly when it does not import, or lacks the task) and for
shmpool; where the two differ on purpose (docs/porting/envpool.md) the test says so."""
from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
from envs import SomeOwnElapsed

import shmpool

HAVE_ATARI = all(importlib.util.find_spec(m) is not None for m in ("ale_py", "cv2"))
TASKS = ["CartPole-v1", pytest.param("Pong-v5", marks=pytest.mark.skipif(not HAVE_ATARI, reason="needs ale-py, cv2"))]
IMPLS = ["envpool", "shmpool"]

# A reference run: envpool itself beside the EnvPool face, on CartPole and Atari (~45 s on 2 loaded cores, most of
# it envpool's start-up); the face itself is in the fast run too (test_fuzz.py, test_batched.py, test_faces_*.py).
pytestmark = [pytest.mark.slow, pytest.mark.heavy_imports]   # envpool beside the pool, in this process

# Keys envpool 1.2.5 always has and shmpool gives only when asked, for the reason in docs/porting/envpool.md.
LEFT_OUT_INFOS = {"ram"}   # an array info leaves the shared-memory info table: Pong gives it with info_ram=True


def _envpool():
    try:
        import envpool
    except Exception as exc:  # not installed, or a broken build
        pytest.skip(f"envpool does not import: {exc!r}")
    return envpool


def make(impl: str, task: str, **kwargs):
    if impl == "shmpool":
        return shmpool.make(task, **kwargs)
    envpool = _envpool()
    if task not in envpool.list_all_envs():
        pytest.skip(f"envpool has no {task}")
    return envpool.make(task, **kwargs)


def _kinds(tree: dict) -> dict:
    """Each info key's dtype (nested dicts recursed)."""
    return {k: _kinds(v) if isinstance(v, dict) else np.asarray(v).dtype for k, v in tree.items()}


def _actions(env, n: int) -> np.ndarray:
    return np.zeros(n, dtype=env.action_space.dtype)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("impl", IMPLS)
def test_env_is_gymnasium_env_and_vector_env(impl, task, no_leaks):
    with make(impl, task, env_type="gymnasium", num_envs=4, batch_size=2, num_threads=2) as env:
        assert isinstance(env, gym.Env) and isinstance(env, gym.vector.VectorEnv)
        assert env.action_space is env.single_action_space            # single-env spaces
        assert env.all_env_ids.dtype == np.int32 and env.all_env_ids.tolist() == [0, 1, 2, 3]
        assert env.is_async and len(env) == 4
        assert env.config["seed"] == 42 and env.spec.config.seed == 42   # envpool's default seed
        assert env.spec.config._fields == tuple(env.config)
        assert env.spec.observation_space == env.observation_space


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("impl", IMPLS)
def test_dtypes_and_info_layout(impl, task, no_leaks):
    env = make(impl, task, env_type="gymnasium", num_envs=3, num_threads=2)
    try:
        obs, info = env.reset()
        assert obs.shape == (3, *env.observation_space.shape) and obs.dtype == env.observation_space.dtype
        assert not any(k.startswith("_") for k in info)               # no gymnasium masks
        obs, rew, term, trunc, info = env.step(_actions(env, 3))
        assert rew.dtype == np.float32 and term.dtype == np.bool_ and trunc.dtype == np.bool_
        assert not any(k.startswith("_") for k in info)
        kinds = _kinds(info)
        assert kinds["env_id"] == np.int32 and kinds["elapsed_step"] == np.int32
        assert kinds["players"] == {"env_id": np.dtype(np.int32)}
        assert info["env_id"].tolist() == [0, 1, 2] and info["elapsed_step"].tolist() == [1, 1, 1]
        if task == "Pong-v5":
            assert kinds["lives"] == kinds["terminated"] == np.int32 and kinds["reward"] == np.float32
    finally:
        env.close()


@pytest.mark.parametrize("task", TASKS)
def test_same_config_keys_dtypes_and_info_keys_as_envpool(task, no_leaks):
    ep = make("envpool", task, env_type="gymnasium", num_envs=2, num_threads=1)
    sp = make("shmpool", task, env_type="gymnasium", num_envs=2, num_threads=1)
    try:
        assert list(sp.config) == list(ep.config)                     # same keys, same order
        differ = {k for k in ep.config if sp.config[k] != ep.config[k]}
        assert differ == {"base_path"}                                # where each one's assets live
        for e in (ep, sp):
            e.reset()
        ep_out, sp_out = ep.step(_actions(ep, 2)), sp.step(_actions(sp, 2))
        assert [np.asarray(x).dtype for x in sp_out[:4]] == [np.asarray(x).dtype for x in ep_out[:4]]
        ep_kinds = _kinds(ep_out[4])
        assert _kinds(sp_out[4]) == {k: v for k, v in ep_kinds.items() if k not in LEFT_OUT_INFOS}
    finally:
        ep.close()
        sp.close()


@pytest.mark.skipif(not HAVE_ATARI, reason="needs ale-py, cv2")
def test_atari_info_ram_when_asked_has_envpools_keys_and_layout(no_leaks):
    ep = make("envpool", "Pong-v5", env_type="gymnasium", num_envs=2, num_threads=1)
    sp = make("shmpool", "Pong-v5", env_type="gymnasium", num_envs=2, num_threads=1, info_ram=True)
    try:
        for reset in (True, False):
            ep_info = ep.reset()[1] if reset else ep.step(_actions(ep, 2))[4]
            sp_info = sp.reset()[1] if reset else sp.step(_actions(sp, 2))[4]
            assert _kinds(sp_info) == _kinds(ep_info)                 # ram included, uint8
            assert sp_info["ram"].shape == ep_info["ram"].shape == (2, 128)
        assert sp.config["info_ram"] is True                          # an option given to make is listed
    finally:
        ep.close()
        sp.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_positional_reset_of_some_envs(impl, no_leaks):
    env = make(impl, "CartPole-v1", env_type="gymnasium", num_envs=4, num_threads=2)
    try:
        env.reset()
        for _ in range(3):
            env.step(_actions(env, 4))
        obs, info = env.reset(np.array([2, 0]))
        assert obs.shape == (2, 4) and info["env_id"].tolist() == [2, 0]
        assert info["elapsed_step"].tolist() == [0, 0]
        _, _, _, _, info = env.step(_actions(env, 4))
        assert info["elapsed_step"].tolist() == [1, 4, 1, 4]          # only envs 0 and 2 were reset
    finally:
        env.close()


@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP])
def test_elapsed_step_counts_the_steps_of_the_observations_episode(mode, no_leaks):
    """``info["elapsed_step"]`` against the reference count: the ``TimeLimit`` step counter of
    gymnasium's own envs in a SyncVectorEnv of the same autoreset mode (NEXT_STEP is EnvPool's
    order; SAME_STEP resets inside the ending step, so that step's row already counts 0)."""
    kwargs = {"max_episode_steps": 3, "autoreset_mode": mode}
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=3)] * 2,
                                   autoreset_mode=mode)
    with shmpool.make("CartPole-v1", env_type="gymnasium", num_envs=2, **kwargs) as env:
        ref.reset(seed=0)
        _, info = env.reset()
        assert info["elapsed_step"].tolist() == list(ref.get_attr("_elapsed_steps")) == [0, 0]
        seen = []
        for _ in range(8):
            _, _, term, trunc, info = env.step(_actions(env, 2))
            ref.step(_actions(env, 2))
            seen.append(int(info["elapsed_step"][0]))
            assert info["elapsed_step"].tolist() == list(ref.get_attr("_elapsed_steps")), seen
        assert min(seen) == 0 and max(seen) >= 2              # episodes did end and restart
    ref.close()


@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP])
def test_elapsed_step_of_envs_without_their_own_is_counted_beside_envs_with_it(mode, no_leaks):
    """Env 0 reports its own ``elapsed_step``, env 1 none: env 0's row is its own value and env
    1's the count (the reference's TimeLimit counter), on every step of several episodes; the
    envs that report never set the others' counts to 0."""
    gym.register("shmpool-test/SomeOwnElapsed-v0", entry_point=SomeOwnElapsed)
    try:
        ref = gym.vector.SyncVectorEnv([SomeOwnElapsed] * 2, autoreset_mode=mode)
        with shmpool.make("shmpool-test/SomeOwnElapsed-v0", env_type="gymnasium", num_envs=2, seed=0,
                          autoreset_mode=mode) as env:
            _, ref_info = ref.reset(seed=0)
            _, info = env.reset()
            rows = []
            for _ in range(8):
                counts = list(ref.get_attr("_elapsed_steps"))
                expected = [int(ref_info["elapsed_step"][0]), counts[1]]
                assert bool(ref_info["_elapsed_step"][0]) and not ref_info["_elapsed_step"][1]
                assert info["elapsed_step"].tolist() == expected
                rows.append(expected)
                _, _, _, _, info = env.step(_actions(env, 2))
                _, _, _, _, ref_info = ref.step(_actions(env, 2))
            assert {r[0] for r in rows} >= {1000, 1001} and max(r[1] for r in rows) >= 2
        ref.close()
    finally:
        gym.registry.pop("shmpool-test/SomeOwnElapsed-v0", None)


@pytest.mark.parametrize("impl", IMPLS)
def test_float_actions_threads_and_seeds(impl, no_leaks):
    env = make(impl, "CartPole-v1", env_type="gymnasium", num_envs=2, num_threads=8)  # more threads than envs
    again = make(impl, "CartPole-v1", env_type="gymnasium", num_envs=2)
    try:
        assert env.config["num_threads"] == 8
        first, _ = env.reset()
        np.testing.assert_array_equal(first, again.reset()[0])         # default seed 42: reproducible
        obs, rew, *_ = env.step(np.array([0.7, 1.9]))                 # floats truncate, as envpool casts them
        ref, *_ = again.step(np.array([0, 1], dtype=np.int32))
        np.testing.assert_array_equal(obs, ref)
    finally:
        env.close()
        again.close()
    with make(impl, "CartPole-v1", env_type="gymnasium", num_envs=2, seed=-1) as env:
        obs, _ = env.reset()
        assert env.config["seed"] == -1 and np.all(np.isfinite(obs))


def test_refusals_say_why():
    with pytest.raises(NotImplementedError, match="XLA"):
        with shmpool.make("CartPole-v1", num_envs=1) as env:
            env.xla()
    with pytest.raises(NotImplementedError, match="env_type='dm' is not implemented: .*TimeStep"):
        shmpool.make("CartPole-v1", env_type="dm")
    with pytest.raises(ValueError, match="gym_reset_return_info=False is for env_type='gym'"):
        shmpool.make("CartPole-v1", env_type="gymnasium", gym_reset_return_info=False)


@pytest.mark.skipif(not HAVE_ATARI, reason="needs ale-py, cv2")
@pytest.mark.parametrize("impl", IMPLS)
def test_atari_render(impl, no_leaks):
    env = make(impl, "Pong-v5", env_type="gymnasium", num_envs=3, num_threads=1, render_mode="rgb_array")
    try:
        env.reset()
        assert env.render_mode == "rgb_array"
        one, two = env.render(), env.render(np.array([1, 2]))
        assert one.shape == (1, 210, 160, 3) and two.shape == (2, 210, 160, 3) and one.dtype == np.uint8
        assert one.any()
    finally:
        env.close()
    with make(impl, "Pong-v5", env_type="gymnasium", num_envs=1, num_threads=1) as env:
        with pytest.raises(RuntimeError, match="render_mode must be set"):
            env.render()


# --- the old gym API, a statistics wrapper (CleanRL's script: tests/faces/test_envpool_port.py) ---------------


def test_gym_env_type_is_the_old_four_tuple_api(no_leaks):
    """envpool 1.2.5 maps env_type="gym" to gymnasium's 5-tuple; shmpool gives the gym API of
    envpool < 1.0, which CleanRL's EnvPool scripts call (see docs/porting/envpool.md)."""
    with shmpool.make("CartPole-v1", env_type="gym", num_envs=2, num_threads=1) as env:
        obs = env.reset()
        assert isinstance(obs, np.ndarray) and obs.shape == (2, 4)
        dones = []
        for _ in range(40):
            out = env.step(np.ones(2, dtype=np.int32))
            assert len(out) == 4
            obs, rew, done, info = out
            assert rew.dtype == np.float32 and done.dtype == np.bool_
            assert info["TimeLimit.truncated"].dtype == np.bool_ and not info["TimeLimit.truncated"].any()
            dones.append(done)
        assert np.any(dones)                                           # pushing right ends episodes
    with shmpool.make("CartPole-v1", env_type="gym", num_envs=2, num_threads=1, gym_reset_return_info=True) as env:
        obs, info = env.reset()
        assert info["env_id"].tolist() == [0, 1]


class RecordEpisodeStatistics5(gym.Wrapper):
    """The same statistics over gymnasium's 5-tuple (envpool >= 1.0's API, for both)."""

    def __init__(self, env):
        super().__init__(env)
        self.num_envs = getattr(env, "num_envs", 1)

    def reset(self, **kwargs):
        obs, info = super().reset(**kwargs)
        self.episode_returns = np.zeros(self.num_envs, dtype=np.float32)
        self.episode_lengths = np.zeros(self.num_envs, dtype=np.int32)
        return obs, info

    def step(self, action):
        obs, rew, term, trunc, info = super().step(action)
        self.episode_returns += rew
        self.episode_lengths += 1
        info["l"] = self.episode_lengths.copy()
        done = term | trunc
        self.episode_returns[done] = 0
        self.episode_lengths[done] = 0
        return obs, rew, term, trunc, info


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("impl", IMPLS)
def test_gymnasium_wrapper_subclass_steps(impl, task, no_leaks):
    env = make(impl, task, env_type="gymnasium", num_envs=2, num_threads=1)
    with RecordEpisodeStatistics5(env) as envs:
        assert envs.unwrapped is env
        obs, info = envs.reset()
        assert obs.shape[0] == 2
        for _ in range(3):
            obs, rew, term, trunc, info = envs.step(np.zeros(2, dtype=np.int32))
        assert info["l"].tolist() == [3, 3] and info["elapsed_step"].tolist() == [3, 3]
    assert env.closed


# Issue 69: Atari options of another type than their default's, taken or refused (TypeError) as envpool does;
# a bool option given "no" turned it on.  tests/faces/test_recipes_atari.py checks the messages.
OPTION_TYPES = [
    ({"zero_discount_on_life_loss": "no"}, TypeError), ({"episodic_life": "yes"}, TypeError),
    ({"reward_clip": [0]}, TypeError), ({"gray_scale": b""}, TypeError), ({"full_action_space": "False"}, TypeError),
    ({"frame_skip": "4"}, TypeError), ({"frame_skip": 4.0}, TypeError), ({"noop_max": 3.5}, TypeError),
    ({"img_height": 84.0}, TypeError), ({"max_episode_steps": 100.0}, TypeError), ({"mode": 1.5}, TypeError),
    ({"repeat_action_probability": "0.25"}, TypeError), ({"repeat_action_probability": None}, TypeError),
    ({"zero_discount_on_life_loss": 1}, None), ({"episodic_life": 0.0}, None), ({"reward_clip": None}, None),
    ({"gray_scale": np.bool_(True)}, None), ({"noop_max": True}, None), ({"frame_skip": np.int64(3)}, None),
    ({"repeat_action_probability": 1}, None),
]


@pytest.mark.skipif(not HAVE_ATARI, reason="needs ale-py, cv2")
@pytest.mark.parametrize(("options", "error"), OPTION_TYPES, ids=[repr(o) for o, _ in OPTION_TYPES])
@pytest.mark.parametrize("impl", IMPLS)
def test_atari_options_of_another_type_are_taken_or_refused_as_envpool_does(impl, options, error, no_leaks):
    if error is not None:
        with pytest.raises(error):
            make(impl, "Pong-v5", env_type="gymnasium", num_envs=1, num_threads=1, **options)
        return
    env = make(impl, "Pong-v5", env_type="gymnasium", num_envs=1, num_threads=1, **options)
    env.close()
