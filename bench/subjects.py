"""The systems the benchmarks compare: one name each, opened one way each.

Two ways to drive them.  Env-only (``bench.core``, ``bench.tasks``, ``bench.throughput``): a
subject is opened (not timed), then ``measure(seconds, warmup)`` steps it with one fixed
batch of actions (so no policy costs anything) and counts env steps.  With a policy
(``bench train``): :func:`open_stepper` gives every system, SB3's and EnvPool's included,
the same ``reset()`` / ``step(actions) -> (obs, rewards, dones)`` face (``bench.ppo.Stepper``).

The env-only systems:

- ``SyncVectorEnv``: gymnasium's for-loop over the envs in this process;
- ``AsyncVectorEnv``: gymnasium's one process per env, observations in shared memory;
- ``shmpool sync``: ``Pool.step`` of all N envs (workers pinned one per allowed core);
- ``shmpool async``: ``Pool(batch_size=N/2)``, ``recv`` the first half of the envs to
  finish and ``send`` the same batch straight back, so envs step while the parent copies.
"""
from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box
from gymnasium.vector.utils import batch_space

import shmpool

from ._timing import Sample, timed_loop
from .envs import gym_env_fn

if TYPE_CHECKING:
    from .ppo import Stepper

SYNC_VEC, ASYNC_VEC, POOL_SYNC, POOL_ASYNC = "SyncVectorEnv", "AsyncVectorEnv", "shmpool sync", "shmpool async"
SB3_DUMMY, SB3_SUBPROC, ENVPOOL = "SB3 DummyVecEnv", "SB3 SubprocVecEnv", "EnvPool"
POOL_SYNC_UNPINNED = "shmpool sync unpinned"   # Pool(pin=False): bench train's, on request
POOL_SYNC_PROCESSES = "shmpool sync processes"   # Pool(parent_shard=False): bench train's, on request
POOL_ASYNC_PARENT = "shmpool async parent shard"   # async with parent_shard=True: bench train's, on request
SYSTEMS = (SYNC_VEC, ASYNC_VEC, POOL_SYNC, POOL_ASYNC)          # the env-only headline's
ALL_SYSTEMS = (SYNC_VEC, ASYNC_VEC, SB3_DUMMY, SB3_SUBPROC, ENVPOOL, POOL_SYNC, POOL_ASYNC)   # bench train's
GYM_VECTOR = (SYNC_VEC, ASYNC_VEC)
SHMPOOL = (POOL_SYNC, POOL_ASYNC, POOL_SYNC_UNPINNED, POOL_SYNC_PROCESSES, POOL_ASYNC_PARENT)
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
        "parent_shard": pool.parent_shard,
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


# --- the systems driven by a policy (bench train): reset() and step(actions) -> (obs, rewards, dones) ----

class GymVectorStepper:
    """gymnasium's ``SyncVectorEnv`` or ``AsyncVectorEnv`` (shared memory)."""

    def __init__(self, system: str, task: str, n: int, seed: int) -> None:
        fns = [gym_env_fn(task)] * n
        self.env = gym.vector.SyncVectorEnv(fns) if system == SYNC_VEC else gym.vector.AsyncVectorEnv(fns)
        self.num_envs = self.batch = n
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        self.seed = seed
        self.info: dict[str, Any] = {}

    def reset(self) -> np.ndarray:
        return self.env.reset(seed=self.seed)[0]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs, reward, terminated, truncated, _ = self.env.step(actions)
        return obs, reward, terminated | truncated

    def close(self) -> None:
        self.env.close()


class SB3Stepper:
    """stable-baselines3's ``DummyVecEnv`` or ``SubprocVecEnv``, through the VecEnv API."""

    def __init__(self, system: str, task: str, n: int, seed: int) -> None:
        from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv
        fns = [gym_env_fn(task)] * n
        self.env = DummyVecEnv(fns) if system == SB3_DUMMY else SubprocVecEnv(fns)
        self.num_envs = self.batch = n
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space
        self.seed = seed
        self.info: dict[str, Any] = {}

    def reset(self) -> np.ndarray:
        self.env.seed(self.seed)
        return self.env.reset()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs, reward, done, _ = self.env.step(actions)
        return obs, reward, done

    def close(self) -> None:
        self.env.close()


class EnvPoolStepper:
    """EnvPool's own task, sync: ``batch_size = N``, ``num_threads`` = the allowed cores."""

    def __init__(self, task: str, n: int, seed: int) -> None:
        import envpool
        threads = min(n, len(os.sched_getaffinity(0)))
        with warnings.catch_warnings():   # its float64 Box bounds cast to float32: nothing to act on here
            warnings.simplefilter("ignore", UserWarning)
            self.env = envpool.make(task, env_type="gymnasium", num_envs=n, batch_size=n, num_threads=threads,
                                    seed=seed)
        self.num_envs = self.batch = n
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space
        self.info = {"num_threads": threads}

    def reset(self) -> np.ndarray:
        return self.env.reset()[0]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs, reward, terminated, truncated, _ = self.env.step(actions)
        return obs, reward, terminated | truncated

    def close(self) -> None:
        self.env.close()


class ShmpoolStepper:
    """``shmpool.make(task, num_envs=N)``: sync ``step``, or async ``recv``/``send`` with ``batch_size = N/2``;
    ``shmpool sync unpinned``: sync with ``pin=False`` (workers free to move among the allowed cores);
    ``shmpool sync processes``: sync with ``parent_shard=False`` (every shard in a worker process);
    ``shmpool async parent shard``: async with ``parent_shard=True`` (the last shard stepped inside ``recv``)."""

    def __init__(self, system: str, task: str, n: int, seed: int) -> None:
        self.batch = max(1, n // 2) if system in (POOL_ASYNC, POOL_ASYNC_PARENT) else n
        parent_shard = {POOL_SYNC_PROCESSES: False, POOL_ASYNC_PARENT: True}.get(system, "auto")
        self.env = shmpool.make(task, num_envs=n, batch_size=self.batch, seed=seed,
                                pin=system != POOL_SYNC_UNPINNED, parent_shard=parent_shard)
        self.num_envs = n
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        self.info = {"pool": repr(self.env.pool)}
        self._ids: np.ndarray | None = None

    def reset(self) -> np.ndarray:
        obs, _ = self.env.reset()   # seeded; a seeded Atari reset reloads the ROM: keep it out of recv
        if self.batch == self.num_envs:
            return obs
        self.env.async_reset()
        obs, _, _, _, info = self.env.recv()
        self._ids = info["env_id"]
        return obs

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._ids is None:
            obs, reward, terminated, truncated, _ = self.env.step(actions)
        else:
            self.env.send(actions, self._ids)
            obs, reward, terminated, truncated, info = self.env.recv()
            self._ids = info["env_id"]
        return obs, reward, terminated | truncated

    def close(self) -> None:
        self.env.close()


def open_stepper(system: str, task: str, n: int, seed: int = 0) -> Stepper:
    """The vector env of ``system`` over ``task`` with ``n`` envs, seeded ``seed``."""
    if system in GYM_VECTOR:
        return GymVectorStepper(system, task, n, seed)
    if system in (SB3_DUMMY, SB3_SUBPROC):
        return SB3Stepper(system, task, n, seed)
    if system == ENVPOOL:
        return EnvPoolStepper(task, n, seed)
    if system in SHMPOOL:
        return ShmpoolStepper(system, task, n, seed)
    raise ValueError(f"unknown system {system!r}; systems: {', '.join(SYSTEMS)}")
