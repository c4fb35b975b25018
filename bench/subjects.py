"""The systems the env-only benchmarks compare, as timed subjects: gymnasium's vector envs and shmpool.

Each subject is opened (not timed), then ``measure(seconds, warmup)`` steps it with one
fixed batch of actions (so the policy costs nothing) and counts env steps:

- ``SyncVectorEnv``: gymnasium's for-loop over the envs in this process;
- ``AsyncVectorEnv``: gymnasium's one process per env, observations in shared memory;
- ``shmpool sync``: ``Pool.step`` of all N envs (workers pinned one per allowed core);
- ``shmpool async``: ``Pool(batch_size=N/2)``, ``recv`` the first half of the envs to
  finish and ``send`` the same batch straight back, so envs step while the parent copies.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box
from gymnasium.vector.utils import batch_space

import shmpool

from ._timing import Sample, timed_loop

SYNC_VEC, ASYNC_VEC, POOL_SYNC, POOL_ASYNC = "SyncVectorEnv", "AsyncVectorEnv", "shmpool sync", "shmpool async"
SYSTEMS = (SYNC_VEC, ASYNC_VEC, POOL_SYNC, POOL_ASYNC)
ACTION_SEED = 0


def fixed_actions(space: gym.Space, n: int) -> np.ndarray:
    """One batch of actions every system gets on every step: zeros for Box, a seeded draw otherwise."""
    if isinstance(space, Box):
        return np.zeros((n, *space.shape), dtype=space.dtype)
    return fixed_random_actions(space, n)


def fixed_random_actions(space: gym.Space, n: int) -> np.ndarray:
    """``n`` actions drawn once from ``space`` (uniform for a bounded Box), seeded: every system gets these."""
    batched = batch_space(space, n)
    batched.seed(ACTION_SEED)
    return batched.sample()


def pool_info(pool: shmpool.Pool) -> dict[str, Any]:
    """What a pool resolved its defaults to, for the JSON record."""
    return {
        "num_workers": pool.num_workers,
        "worker_cpus": pool.worker_cpus,
        "batch_size": pool.batch_size,
        "wait_policy": pool.wait_policy.name,
        "worker_wait_policy": pool.worker_wait_policy.name,
    }


class GymVector:
    """gymnasium's ``SyncVectorEnv`` or ``AsyncVectorEnv`` (shared memory) over ``make_env``, fixed actions."""

    def __init__(self, system: str, make_env: Callable[[], gym.Env], n: int, actions: np.ndarray) -> None:
        fns = [make_env] * n
        if system == SYNC_VEC:
            self.env = gym.vector.SyncVectorEnv(fns)
        else:
            self.env = gym.vector.AsyncVectorEnv(fns, shared_memory=True)
        self.n = n
        self.info: dict[str, Any] = {}
        try:
            self.env.reset(seed=0)
        except BaseException:
            self.env.close()
            raise
        self._step = functools.partial(self.env.step, actions)

    def measure(self, seconds: float, warmup: float) -> Sample:
        return timed_loop(self._step, self.n, seconds, warmup)

    def close(self) -> None:
        self.env.close()


class PoolSync:
    """shmpool, ``pool.step(actions)`` over all envs; ``env`` is a gymnasium id or an env constructor."""

    def __init__(self, env: str | Callable[[], gym.Env], n: int, actions: np.ndarray) -> None:
        self.pool = shmpool.Pool(env, n, seed=0)
        self.n = n
        self.info = pool_info(self.pool)
        try:
            self.pool.reset()
        except BaseException:
            self.pool.close()
            raise
        self._step = functools.partial(self.pool.step, actions)

    def measure(self, seconds: float, warmup: float) -> Sample:
        return timed_loop(self._step, self.n, seconds, warmup)

    def close(self) -> None:
        self.pool.close()


class PoolAsync:
    """shmpool with ``batch_size=N//2``: receive the first half to finish, send it straight back.

    The seeded first reset is a blocking ``reset()`` before ``async_reset()``: a seeded
    Atari reset reloads the ROM (~0.2 s per env, as gymnasium's ``AtariEnv`` does), which
    ``async_reset`` alone would leave running into the timed loop."""

    def __init__(self, env: str | Callable[[], gym.Env], n: int, actions: np.ndarray) -> None:
        self.batch = max(1, n // 2)
        self.pool = shmpool.Pool(env, n, batch_size=self.batch, seed=0)
        self.info = pool_info(self.pool)
        self.actions = actions[: self.batch]
        try:
            self.pool.reset()
            self.pool.async_reset()
        except BaseException:
            self.pool.close()
            raise

    def _step(self) -> None:
        *_, infos = self.pool.recv()
        self.pool.send(self.actions, infos["env_id"])

    def measure(self, seconds: float, warmup: float) -> Sample:
        return timed_loop(self._step, self.batch, seconds, warmup)

    def close(self) -> None:
        self.pool.close()
