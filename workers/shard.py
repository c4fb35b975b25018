"""A worker's envs and how one result is written into shared memory."""
from __future__ import annotations

from math import isfinite

import numpy as np
from gymnasium.spaces import Dict, Tuple

from shmpool import layout as L
from shmpool.autoreset import NEXT_STEP, SAME_STEP
from shmpool.infos import InfoWriter


class ResultError(Exception):
    """An env returned something that does not fit its declared space."""


def _leaf_writer(arr: np.ndarray):
    """Copies one env's value of a leaf into its row, refusing a wrong shape
    (numpy would broadcast it silently) or a dtype that only an unsafe cast
    fits (floats into an integer space would be truncated silently)."""
    shape, dtype = arr.shape[1:], arr.dtype

    def write(i, value):
        if type(value) is not np.ndarray:
            value = np.asarray(value)
        if value.shape != shape:
            raise ResultError(f"observation has shape {value.shape}, the space says {shape}")
        if value.dtype != dtype and not np.can_cast(value.dtype, dtype, "same_kind"):
            raise ResultError(f"observation has dtype {value.dtype}, which the space's {dtype} cannot hold")
        arr[i] = value
    return write


class Shard:
    """The envs ``start..stop-1`` of one worker, writing results by env id."""

    def __init__(self, envs: list, start: int, views: L.Views, buf, obs_space, act_space,
                 autoreset_mode: str = NEXT_STEP) -> None:
        self.envs = envs
        self.start = start
        self.stop = start + len(envs)
        self.views = views
        self.infos = InfoWriter(views, buf)
        self.autoreset = [False] * len(envs)   # NEXT_STEP: reset at the next step
        self.same_step = autoreset_mode == SAME_STEP
        self.next_step = autoreset_mode == NEXT_STEP
        self.pending_seeds: list = [None] * len(envs)
        writers = [_leaf_writer(a) for a in views.obs]
        if len(writers) == 1 and not isinstance(obs_space, (Dict, Tuple)):
            self.write_obs = writers[0]
        else:
            def write_obs(i, obs):
                for w, v in zip(writers, L.split(obs_space, obs)):
                    w(i, v)
            self.write_obs = write_obs
        acts = views.act
        if len(acts) == 1 and not isinstance(act_space, (Dict, Tuple)):
            single = acts[0]
            self.action = single.__getitem__
        else:
            def action(i):
                return L.assemble(act_space, [a[i] for a in acts])
            self.action = action

    def step(self, i: int):
        """Step env ``i`` under the autoreset mode; returns its info dict after
        writing everything else in place.

        NEXT_STEP: the step after an episode ends resets instead (reward 0).
        SAME_STEP: an ending step resets at once; the info then carries
        ``final_obs`` and ``final_info`` (gymnasium's layout).
        DISABLED: no resets; the parent refuses to step an env that ended."""
        j = i - self.start
        v = self.views
        env = self.envs[j]
        if self.autoreset[j]:
            obs, info = env.reset()
            self.autoreset[j] = False
            v.reward[i] = 0.0
            v.terminated[i] = False
            v.truncated[i] = False
        else:
            obs, reward, terminated, truncated, info = env.step(self.action(i))
            if not isfinite(reward):
                raise ResultError(f"reward is {reward}: rewards must be finite")
            v.reward[i] = reward
            v.terminated[i] = terminated
            v.truncated[i] = truncated
            if terminated or truncated:
                if self.next_step:
                    self.autoreset[j] = True
                elif self.same_step:
                    final = {"final_obs": obs, "final_info": info}
                    obs, info = env.reset()
                    info = {**final, **info}
        self.write_obs(i, obs)
        return info

    def reset(self, i: int, seed=None, options=None):
        j = i - self.start
        if seed is None:
            seed = self.pending_seeds[j]
        self.pending_seeds[j] = None
        if options is None:
            obs, info = self.envs[j].reset(seed=seed)
        else:
            obs, info = self.envs[j].reset(seed=seed, options=options)
        self.autoreset[j] = False
        v = self.views
        v.reward[i] = 0.0
        v.terminated[i] = False
        v.truncated[i] = False
        self.write_obs(i, obs)
        return info
