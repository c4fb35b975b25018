"""What CleanRL's Atari scripts do with their envs, for the porting tests (our code, not CleanRL's).

- ``ppo_atari.py`` builds each env from an Atari id with SB3-style wrappers (the ones CleanRL's
  ``cleanrl_utils.atari_wrappers`` adapts; SB3's own are used here) and gymnasium's observation
  wrappers, whose names changed in gymnasium 1.0; it logs ``episode`` from the infos of the step
  an episode ends, whose layout changed too: :func:`atari_env`, :func:`ended_episodes`.
- ``ppo_atari_envpool.py`` and ``ppo_rnd_envpool.py`` wrap ``envpool.make(..., env_type="gym")``
  in an episode-statistics wrapper of their own that reads EnvPool's ``info["reward"]`` and
  ``info["terminated"]``, and log a game where ``done`` and ``info["lives"] == 0``:
  :class:`EnvPoolEpisodeStats`, :func:`logged_games`.  ``ppo_rnd_envpool.py`` also normalizes
  observations with gym's ``RunningMeanStd``, which moved: :data:`RunningMeanStd`.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from shmpool.gym_compat import LEGACY

if LEGACY:
    from gymnasium.wrappers.normalize import RunningMeanStd
else:
    from gymnasium.wrappers.utils import RunningMeanStd

__all__ = ["EnvPoolEpisodeStats", "RunningMeanStd", "atari_env", "ended_episodes", "logged_games"]


def atari_env(env_id: str, sb3_wrappers: bool = True) -> gym.Env:
    """One env of ``ppo_atari.py``: the id's frames through episode statistics, up to 30 no-ops,
    4-frame skip with max-pooling, a life as an episode, FIRE on reset, clipped rewards, 84x84
    grayscale, 4 stacked frames (``(4, 84, 84)`` uint8).  ``sb3_wrappers=False`` leaves out the
    SB3-style ones (no-ops to clipping), which need SB3 and torch: gymnasium's wrappers only."""
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
    if sb3_wrappers:
        from stable_baselines3.common.atari_wrappers import (  # the caller imports SB3 first: see ppo_atari_envs
            ClipRewardEnv,
            EpisodicLifeEnv,
            FireResetEnv,
            MaxAndSkipEnv,
            NoopResetEnv,
        )

        env = EpisodicLifeEnv(MaxAndSkipEnv(NoopResetEnv(env, noop_max=30), skip=4))
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireResetEnv(env)
        env = ClipRewardEnv(env)
    env = gym.wrappers.ResizeObservation(env, (84, 84))
    if LEGACY:   # gymnasium 0.29's names; 1.0 renamed both
        return gym.wrappers.FrameStack(gym.wrappers.GrayScaleObservation(env), 4)
    return gym.wrappers.FrameStackObservation(gym.wrappers.GrayscaleObservation(env), 4)


def ended_episodes(infos: dict) -> list[tuple[int, float, int]]:
    """``(env index, return, length)`` of the episodes ``ppo_atari.py`` logs from one step's infos:
    0.29's ``infos["final_info"]``, one dict (or None) per env; 1.x's under SAME_STEP autoreset,
    one dict of batched values with ``_key`` masks."""
    if "final_info" not in infos:
        return []
    final = infos["final_info"]
    if LEGACY:
        # 0.29's statistics wrapper keeps r and l as 1-element arrays
        return [(i, np.asarray(info["episode"]["r"]).item(), np.asarray(info["episode"]["l"]).item())
                for i, info in enumerate(final) if info and "episode" in info]
    if "episode" not in final:
        return []
    episode = final["episode"]
    return [(int(i), float(episode["r"][i]), int(episode["l"][i])) for i in np.flatnonzero(final["_episode"])]


class EnvPoolEpisodeStats(gym.Wrapper):
    """The envpool scripts' episode statistics on the old gym API: per env, the game's running
    return of EnvPool's unclipped ``info["reward"]`` and its length, published as ``info["r"]``
    (float32) and ``info["l"]`` (int32) after each step and restarted where ``info["terminated"]``
    says a whole game (not a life) ended.

    ``forward_spaces``: copy the single-env spaces onto the wrapper, docs/porting/cleanrl.md's
    edit under gymnasium 1.x, whose wrappers forward no attributes."""

    def __init__(self, env: gym.Env, forward_spaces: bool = True) -> None:
        super().__init__(env)
        self.num_envs = env.num_envs
        if forward_spaces:
            self.single_action_space = env.single_action_space
            self.single_observation_space = env.single_observation_space

    def reset(self, **kwargs: Any) -> Any:
        obs = super().reset(**kwargs)
        self.returns = np.zeros(self.num_envs, np.float32)
        self.lengths = np.zeros(self.num_envs, np.int32)
        return obs

    def step(self, action: Any) -> tuple:
        obs, reward, done, info = super().step(action)
        self.returns += info["reward"]
        self.lengths += 1
        info["r"], info["l"] = self.returns.copy(), self.lengths.copy()
        game_on = 1 - info["terminated"]
        self.returns *= game_on
        self.lengths *= game_on
        return obs, reward, done, info


def logged_games(done: np.ndarray, info: dict) -> list[tuple[int, float, int]]:
    """``(env index, return, length)`` of the games the envpool scripts log after a step: the rows
    that are done with no life left."""
    return [(i, float(info["r"][i]), int(info["l"][i])) for i, d in enumerate(done) if d and info["lives"][i] == 0]
