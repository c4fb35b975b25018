"""The shapes of CleanRL's Atari scripts as docs/porting/cleanrl.md ports them.

Each test builds the envs as the ported script builds them and uses them as its loop does (the
calls, the info keys it reads, what it computes from them), with random actions, and checks what
the script relies on against a reference where one exists: gymnasium's ``SyncVectorEnv`` for
``ppo_atari.py``, envpool itself for ``ppo_atari_envpool.py`` and ``ppo_rnd_envpool.py``.  (Our
code, not CleanRL's: the scripts' env lines are reproduced, not copied.)
"""
from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from cleanrl_shapes import EnvPoolEpisodeStats, RunningMeanStd, atari_env, ended_episodes, logged_games

import shmpool
from shmpool.gym_compat import LEGACY

needs_atari = pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("ale_py", "cv2")),
                                 reason="needs ale-py, cv2 (extra [atari])")
needs_ppo_atari = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("ale_py", "cv2", "stable_baselines3")),
    reason="needs ale-py, cv2 and stable-baselines3 (its Atari wrappers, which CleanRL's adapt)")


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


# --- ppo_atari.py: gymnasium's Atari ids ---------------------------------------------------------


@pytest.mark.slow   # a fresh interpreter imports shmpool and ale-py: 2-10 s
def test_import_shmpool_registers_the_ids_ppo_atari_makes():
    """CleanRL's ``ppo_atari.py`` makes ``BreakoutNoFrameskip-v4`` in each env's closure.  Under
    gymnasium 0.29, ale-py >= 0.9 (the releases with ROMs, what ``shmpool[atari]`` installs)
    registers no ids on import; after ``import shmpool`` they are there under either gymnasium."""
    pytest.importorskip("ale_py")
    done = _fresh("import shmpool, gymnasium\n"
                  "for name in ('BreakoutNoFrameskip-v4', 'ALE/Pong-v5', 'shmpool/BreakoutNoFrameskip-v4'):\n"
                  "    print(gymnasium.spec(name).id)")
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.split() == ["BreakoutNoFrameskip-v4", "ALE/Pong-v5", "shmpool/BreakoutNoFrameskip-v4"]


def ppo_atari_envs(kind: str, sb3_wrappers: bool, num_envs: int = 2) -> gym.vector.VectorEnv:
    """``ppo_atari.py``'s envs, ported (``shmpool``) or as the script builds them (``sync``).  Under
    gymnasium 1.x both autoreset on the same step, the guide's choice: 0.29's only autoreset,
    so the transitions the script learns from stay what they are at its pins."""
    if sb3_wrappers:   # SB3 (and torch) imported once here: forked workers inherit it, none imports it again
        importlib.import_module("stable_baselines3.common.atari_wrappers")
    fns = [functools.partial(atari_env, "BreakoutNoFrameskip-v4", sb3_wrappers)] * num_envs
    options = {} if LEGACY else {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    if kind == "sync":
        return gym.vector.SyncVectorEnv(fns, **options)
    return shmpool.VectorEnv(fns, **options)


def assert_ppo_atari_port_steps_as_sync_vector_env(steps: int, sb3_wrappers: bool = True) -> list[tuple]:
    """Step the port and ``SyncVectorEnv`` side by side with the same seed and random actions, as
    the script uses them; returns the episodes the script logs (the same from both)."""
    port, reference = ppo_atari_envs("shmpool", sb3_wrappers), ppo_atari_envs("sync", sb3_wrappers)
    try:
        assert isinstance(port.single_action_space, gym.spaces.Discrete)   # the script's assert
        assert port.single_action_space == reference.single_action_space
        assert port.single_observation_space == reference.single_observation_space
        obs, _ = port.reset(seed=1)
        np.testing.assert_array_equal(obs, reference.reset(seed=1)[0])
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        rng = np.random.default_rng(0)
        logged = []
        for t in range(steps):
            actions = rng.integers(0, port.single_action_space.n, 2)
            got, want = port.step(actions), reference.step(actions)
            for a, b in zip(got[:4], want[:4]):   # observations, rewards, terminations, truncations
                np.testing.assert_array_equal(a, b)
            episodes = ended_episodes(got[4])
            assert episodes == ended_episodes(want[4])
            logged += [(t, *episode) for episode in episodes]
        return logged
    finally:
        port.close()
        reference.close()


@needs_atari
def test_ppo_atari_port_steps_as_sync_vector_env(no_leaks):
    """The version's observation wrappers (renamed in 1.0) and statistics through the port."""
    assert assert_ppo_atari_port_steps_as_sync_vector_env(12, sb3_wrappers=False) == []   # no game ends


@needs_ppo_atari
@pytest.mark.slow   # SB3 (torch) imported, then Breakout with CleanRL's whole stack until a game ends in each env
@pytest.mark.heavy_imports
def test_ppo_atari_port_logs_the_episodes_sync_vector_env_logs(no_leaks):
    logged = assert_ppo_atari_port_steps_as_sync_vector_env(260)
    assert {i for _, i, _, _ in logged} == {0, 1}   # a random Breakout game is 130-250 steps of 4 frames
    assert all(length > 100 for *_, length in logged)   # a whole game's frames (5 lives), not a life's


# --- ppo_atari_envpool.py and ppo_rnd_envpool.py: the EnvPool face's old gym API ---------------------


def script_envs(task: str, num_envs: int = 2, **options: Any) -> EnvPoolEpisodeStats:
    """The envpool scripts' env lines, ported: ``shmpool.make`` for ``envpool.make`` with their
    options, the single-env spaces set on the env, their statistics wrapper around it."""
    envs = shmpool.make(task, env_type="gym", num_envs=num_envs, episodic_life=True, reward_clip=True, seed=1,
                        **options)
    envs.num_envs = num_envs
    envs.single_action_space = envs.action_space
    envs.single_observation_space = envs.observation_space
    return EnvPoolEpisodeStats(envs)


def _autoreset_trace(make) -> list[tuple]:
    """(rewards, ended, elapsed_step) of 8 steps of two CartPoles cut at 3 steps."""
    env = make("CartPole-v1", env_type="gymnasium", num_envs=2, seed=0, max_episode_steps=3)
    try:
        env.reset()
        trace = []
        for _ in range(8):
            _, reward, term, trunc, info = env.step(np.array([0, 1]))
            assert "final_observation" not in info and "final_obs" not in info
            trace.append((reward.tolist(), (term | trunc).tolist(), info["elapsed_step"].tolist()))
        return trace
    finally:
        env.close()


@pytest.mark.parametrize("face", ["shmpool", pytest.param("envpool", marks=pytest.mark.heavy_imports)])
def test_the_envpool_face_autoresets_on_the_next_step_as_envpool(no_leaks, face):
    """EnvPool's autoreset under either gymnasium (the VectorEnv's default under 0.29 is the same
    step): the ending row holds the episode's last reward and count, the next step resets (reward
    0, count 0).  The same calls on envpool itself, where it is installed."""
    make = pytest.importorskip("envpool").make if face == "envpool" else shmpool.make
    ended = ([1.0, 1.0], [True, True], [3, 3])
    reset = ([0.0, 0.0], [False, False], [0, 0])
    assert _autoreset_trace(make) == [([1.0, 1.0], [False, False], [1, 1]), ([1.0, 1.0], [False, False], [2, 2]),
                                      ended, reset] * 2


@needs_atari
@pytest.mark.slow   # two Breakout games to their end: 4-10 s on 2 loaded cores
def test_ppo_atari_envpool_logs_each_game_once_with_its_whole_return(no_leaks):
    """The script logs a game where ``done`` and ``info["lives"] == 0``, with the wrapper's ``r``
    (the game's unclipped rewards, ``info["reward"]``) and ``l``.  That needs EnvPool's autoreset,
    on the next step: the row where a game ends holds that game's last reward, lives and
    ``terminated``, under either gymnasium."""
    envs = script_envs("Breakout-v5")
    try:
        obs = envs.reset()
        assert isinstance(obs, np.ndarray) and obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        assert isinstance(envs.action_space, gym.spaces.Discrete) and envs.single_action_space.n == 4
        rng = np.random.default_rng(0)
        game_return, game_length = np.zeros(2), np.zeros(2, int)
        lives_at_done = [[], []]
        games = []
        for _ in range(1500):
            obs, reward, done, info = envs.step(rng.integers(0, 4, 2))
            assert reward.dtype == np.float32 and done.dtype == bool and obs.shape == (2, 4, 84, 84)
            assert set(np.unique(reward)) <= {-1.0, 0.0, 1.0} and info["lives"].dtype == np.int32
            game_return += info["reward"]
            game_length += 1
            for i in np.flatnonzero(done):
                lives_at_done[i].append(int(info["lives"][i]))
            for i, r, length in logged_games(done, info):
                assert info["terminated"][i] == 1
                assert (r, length) == (game_return[i], game_length[i])
                games.append(i)
                game_return[i], game_length[i] = 0.0, 0
            if sorted(games) == [0, 1]:
                break
        assert sorted(games) == [0, 1]            # each env's first game, once
        assert [lives[:5] for lives in lives_at_done] == [[4, 3, 2, 1, 0]] * 2   # done at each lost life
    finally:
        envs.close()


class OldGymApi(gym.Wrapper):
    """envpool 1.2.5's env as envpool < 1.0 gave it (the API the scripts are written for, which
    its ``env_type="gym"`` no longer gives): ``reset()`` -> observations, ``step`` ->
    ``(obs, reward, done, info)`` with ``info["TimeLimit.truncated"]``."""

    def reset(self, **kwargs: Any) -> np.ndarray:
        return self.env.reset(**kwargs)[0]

    def step(self, action: Any) -> tuple:
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["TimeLimit.truncated"] = truncated
        return obs, reward, terminated | truncated, info


ENVPOOL_INFOS = ("lives", "reward", "terminated", "elapsed_step", "TimeLimit.truncated", "r", "l")


@needs_atari
@pytest.mark.slow   # envpool and the port side by side, 400 steps of two envs: 20-45 s on 2 loaded cores
@pytest.mark.parametrize("task", ["Breakout-v5", "MontezumaRevenge-v5"])
@pytest.mark.heavy_imports
def test_the_envpool_scripts_envs_step_as_envpool_s(no_leaks, task):
    """The scripts' envs, ported and on envpool itself, through their statistics wrapper: the same
    observations (``ppo_rnd_envpool.py`` normalizes the newest frame, ``obs[:, 3]``), rewards,
    dones, infos and logged games at every step.  ``noop_max=1`` makes the ALE's start
    deterministic in both (EnvPool's random streams are its own); no sticky actions here."""
    envpool = pytest.importorskip("envpool")
    n = 2
    ours = script_envs(task, n, noop_max=1)
    theirs = OldGymApi(envpool.make(task, env_type="gymnasium", num_envs=n, episodic_life=True, reward_clip=True,
                                    seed=1, noop_max=1))
    theirs.num_envs = n
    theirs.single_action_space, theirs.single_observation_space = theirs.action_space, theirs.observation_space
    theirs = EnvPoolEpisodeStats(theirs)
    try:
        assert ours.single_action_space == theirs.single_action_space
        assert ours.single_observation_space == theirs.single_observation_space
        np.testing.assert_array_equal(ours.reset(), theirs.reset())
        rng = np.random.default_rng(0)
        games = []
        for _ in range(400):
            actions = rng.integers(0, ours.single_action_space.n, n)
            (o1, r1, d1, i1), (o2, r2, d2, i2) = ours.step(actions), theirs.step(actions)
            np.testing.assert_array_equal(o1, o2)
            np.testing.assert_array_equal(r1, r2)
            np.testing.assert_array_equal(d1, d2)
            for key in ENVPOOL_INFOS:
                np.testing.assert_array_equal(i1[key], i2[key], err_msg=key)
                assert i1[key].dtype == i2[key].dtype, key
            assert logged_games(d1, i1) == logged_games(d2, i2)
            games += logged_games(d1, i1)
        if task == "Breakout-v5":
            assert {i for i, _, _ in games} == {0, 1}
    finally:
        ours.close()
        theirs.close()


@needs_atari
@pytest.mark.slow   # a few dozen Montezuma steps in two envs and the script's normalizer: 4-12 s loaded
def test_ppo_rnd_envpool_normalizes_the_newest_frame_as_gyms_running_mean_std(no_leaks):
    """``ppo_rnd_envpool.py``'s observation normalizer: gym's ``RunningMeanStd`` of shape
    ``(1, 1, 84, 84)`` fed the newest frame of every env, ``num_steps`` steps at a time, under
    sticky actions (``repeat_action_probability=0.25``, EnvPool's option).  Its mean and variance
    are the frames' own (gym's update is a parallel-moments update from a prior of weight 1e-4)."""
    n, num_steps, rounds = 2, 8, 3
    envs = script_envs("MontezumaRevenge-v5", n, repeat_action_probability=0.25)
    try:
        assert envs.unwrapped.config["repeat_action_probability"] == 0.25
        assert envs.single_action_space.n == 18
        envs.reset()
        obs_rms = RunningMeanStd(shape=(1, 1, 84, 84))
        seen, batch = [], []
        for _ in range(num_steps * rounds):
            s, r, d, _ = envs.step(np.random.randint(0, envs.single_action_space.n, size=(n,)))
            batch += s[:, 3, :, :].reshape([-1, 1, 84, 84]).tolist()
            if len(batch) % (num_steps * n) == 0:
                batch = np.stack(batch)
                obs_rms.update(batch)
                seen.append(batch)
                batch = []
        frames = np.concatenate(seen).astype(np.float64)
        assert frames.shape == (num_steps * rounds * n, 1, 84, 84) and frames.var(axis=0).max() > 0   # it moved
        assert obs_rms.mean.shape == obs_rms.var.shape == (1, 1, 84, 84) and obs_rms.mean.dtype == np.float64
        prior = 1e-4 / (len(frames) + 1e-4)
        np.testing.assert_allclose(obs_rms.mean[0], frames.mean(axis=0), rtol=prior * 2, atol=1e-9)
        np.testing.assert_allclose(obs_rms.var[0], frames.var(axis=0), rtol=1e-6, atol=255 ** 2 * prior * 2)
        normalized = ((s[:, 3].reshape(n, 1, 84, 84) - obs_rms.mean) / np.sqrt(obs_rms.var)).clip(-5, 5)
        assert normalized.shape == (n, 1, 84, 84) and np.isfinite(normalized).all()
        reward_rms = RunningMeanStd()   # the curiosity rewards' normalizer, fed per-rollout moments
        reward_rms.update_from_moments(0.5, 0.25, n)
        assert reward_rms.var == pytest.approx((1e-4 + 0.25 * n + 0.25 * 1e-4 * n / (n + 1e-4)) / (n + 1e-4))
    finally:
        envs.close()
