"""The systems the benchmarks compare, each opened here and only here, behind one face.

:func:`open_vec` opens any of them (gymnasium's Sync/Async vector envs, SB3's DummyVecEnv,
SubprocVecEnv and ShmVecEnv, EnvPool, ``shmpool.Pool``, ``shmpool.make``, ``shmpool.VectorEnv``,
``RayPool``) as a :class:`Vec`: ``reset()``, then ``step(actions)`` of ``batch`` envs at a time.
Sync systems step all ``num_envs`` per call; async ones (``batch < num_envs``) ``send`` the
actions of the envs they last received and ``recv`` the next ``batch`` to finish.

Three ways to drive a Vec: :class:`EnvOnly` (one fixed batch of actions, env steps counted:
``bench core``, ``tasks``, ``throughput``...), :class:`Latency` (every call timed, and every
env step of an async pool: ``bench latency``, with ``--ray`` too), and ``bench.ppo.Trainer``
(a policy in the loop: ``bench train``; :func:`open_stepper` names its systems).
"""
from __future__ import annotations

import functools
import gc
import itertools
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
from gymnasium.spaces import Box
from gymnasium.vector.utils import batch_space

import shmpool

from ._timing import Case, RecvLog, Sample, latency_loop, percentiles_of, timed_loop
from .envs import gym_env_fn

# What open_vec opens.
SYNC_VEC, ASYNC_VEC = "SyncVectorEnv", "AsyncVectorEnv"
SB3_DUMMY, SB3_SUBPROC, SHM_VEC = "SB3 DummyVecEnv", "SB3 SubprocVecEnv", "ShmVecEnv"
ENVPOOL, POOL, MAKE, VECTOR, RAY = "EnvPool", "shmpool.Pool", "shmpool.make", "shmpool.VectorEnv", "RayPool"
GYM_VECTOR = (SYNC_VEC, ASYNC_VEC)
SB3 = (SB3_DUMMY, SB3_SUBPROC, SHM_VEC)
SHMPOOL_KINDS = (POOL, MAKE, VECTOR, RAY)

# The rows of the env-only and training tables.
POOL_SYNC, POOL_ASYNC = "shmpool sync", "shmpool async"
POOL_SYNC_UNPINNED = "shmpool sync unpinned"       # Pool(pin=False): bench train's, on request
POOL_SYNC_PROCESSES = "shmpool sync processes"     # Pool(parent_shard=False): bench train's, on request
POOL_ASYNC_PARENT = "shmpool async parent shard"   # async with parent_shard=True: bench train's, on request
SYSTEMS = (SYNC_VEC, ASYNC_VEC, POOL_SYNC, POOL_ASYNC)          # the env-only headline's
ALL_SYSTEMS = (SYNC_VEC, ASYNC_VEC, SB3_DUMMY, SB3_SUBPROC, ENVPOOL, POOL_SYNC, POOL_ASYNC)   # bench train's
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


def action_space_of(make_env: Callable[[], gym.Env]) -> gym.Space:
    """One env's action space (the env is built and closed)."""
    probe = make_env()
    try:
        return probe.action_space
    finally:
        probe.close()


def pool_info(pool: Any) -> dict[str, Any]:
    """What a pool resolved its defaults to, for the JSON record."""
    return {"num_workers": pool.num_workers, "worker_cpus": pool.worker_cpus, "batch_size": pool.batch_size,
            "wait_policy": pool.wait_policy.name, "worker_wait_policy": pool.worker_wait_policy.name,
            "parent_shard": pool.parent_shard}


def child_affinity(processes: Sequence[Any]) -> list[list[int]]:
    """The distinct cpu sets the env processes may run on (recorded: they must be the cell's cores)."""
    return sorted({tuple(sorted(os.sched_getaffinity(p.pid))) for p in processes}, key=lambda t: (len(t), t))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used so far; NaN for this process (a pool's shard it
    steps, ``parent_shard``, has its CPU in the loop's own)."""
    return float("nan") if pid == os.getpid() else sum(psutil.Process(pid).cpu_times()[:2])


class Vec:
    """One opened system of ``num_envs`` envs, stepped ``batch`` envs per call.

    ``observation_space``/``action_space`` are one env's; ``env`` is the system's own object;
    ``info`` what it resolved its settings to (for the JSON record)."""

    def __init__(self, kind: str, env: Any, num_envs: int, batch: int, seed: int, asynchronous: bool) -> None:
        self.kind, self.env, self.num_envs, self.batch, self.seed = kind, env, num_envs, batch, seed
        self.asynchronous = asynchronous
        self.sb3 = kind in SB3
        self.observation_space = env.observation_space if self.sb3 or kind == ENVPOOL else env.single_observation_space
        self.action_space = env.action_space if self.sb3 or kind == ENVPOOL else env.single_action_space
        self.ids: np.ndarray | None = None
        if kind == RAY:
            self.info = {"pools": env.num_pools, "sub_batch_sizes": env.sub_batch_sizes}
        elif kind in (*SHMPOOL_KINDS, SHM_VEC):
            self.info = pool_info(env if kind == POOL else env.pool)
        elif kind == ENVPOOL:
            cfg = env.config
            self.info = {k: cfg[k] for k in ("num_threads", "batch_size", "thread_affinity_offset")}
        else:
            self.info = {"processes": len(getattr(env, "processes", ()))}

    def cast(self, actions: np.ndarray) -> np.ndarray:
        """``actions`` in the dtype the system takes (EnvPool converts nothing itself)."""
        return np.asarray(actions, dtype=self.action_space.dtype) if self.kind == ENVPOOL else actions

    def reset(self) -> np.ndarray:
        """Reset every env (env ``i`` seeded ``seed + i``); the first ``batch`` observations.

        Async: a blocking seeded reset first (a seeded Atari reset reloads the ROM, ~0.2 s an env,
        which ``async_reset`` alone would leave running into the timed loop), then the first recv."""
        if self.sb3:
            self.env.seed(self.seed)
            return self.env.reset()
        if self.kind in GYM_VECTOR or self.kind == VECTOR:
            return self.env.reset(seed=self.seed)[0]
        if not self.asynchronous:
            return self.env.reset()[0]
        if self.kind != ENVPOOL:
            self.env.reset()
        self.env.async_reset()
        out = self.env.recv()
        self.ids = out[-1]["env_id"]
        return out[0]

    def raw_step(self, actions: np.ndarray) -> tuple:
        """One call in the system's own API: ``step``, or ``send`` to the last envs received and ``recv``."""
        if self.ids is None:
            return self.env.step(actions)
        self.env.send(actions, self.ids)
        out = self.env.recv()
        self.ids = out[-1]["env_id"]
        return out

    def stepping(self, actions: np.ndarray) -> Callable[[], object]:
        """A call that steps ``batch`` envs with these actions (nothing else around the system's own call)."""
        if self.ids is None:
            return functools.partial(self.env.step, actions)
        return functools.partial(self.raw_step, actions)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The trainer's face: ``(obs, rewards, dones)`` of ``batch`` envs; dones = terminated | truncated."""
        out = self.raw_step(actions)
        return (out[0], out[1], out[2]) if self.sb3 else (out[0], out[1], out[2] | out[3])

    def close(self) -> None:
        self.env.close()
        if self.kind == ENVPOOL:
            self.env = None
            gc.collect()   # EnvPool's threads stop when the C++ pool is destroyed


def open_vec(kind: str, env: Any, n: int, *, batch: int | None = None, seed: int = 0, asynchronous: bool | None = None,
             **options: Any) -> Vec:
    """Open ``n`` envs of ``env`` in system ``kind``, ``batch`` envs per call (default all of them);
    ``send``/``recv`` when ``asynchronous`` (default: when ``batch < n``), else ``step``.

    ``env``: a gymnasium id or constructor (EnvPool and ``shmpool.make``: a task id); ``options``
    go to the system's constructor (``cpus``, ``wait_policy``, ``num_threads``, ``start_method``...)."""
    batch = n if batch is None else batch
    asynchronous = batch < n if asynchronous is None else asynchronous
    if kind in GYM_VECTOR + SB3 and isinstance(env, str):
        env = gym_env_fn(env)
    if kind == SYNC_VEC:
        opened = gym.vector.SyncVectorEnv([env] * n, **options)
    elif kind == ASYNC_VEC:
        opened = gym.vector.AsyncVectorEnv([env] * n, shared_memory=True, **options)
    elif kind in SB3:
        from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

        from shmpool.sb3 import ShmVecEnv
        opened = {SB3_DUMMY: DummyVecEnv, SB3_SUBPROC: SubprocVecEnv, SHM_VEC: ShmVecEnv}[kind]([env] * n, **options)
    elif kind == ENVPOOL:
        import envpool
        options.setdefault("num_threads", min(n, len(os.sched_getaffinity(0))))
        with warnings.catch_warnings():   # its float64 Box bounds cast to float32: nothing to act on here
            warnings.simplefilter("ignore", UserWarning)
            opened = envpool.make(env, env_type="gymnasium", num_envs=n, batch_size=batch, seed=seed, **options)
    elif kind == POOL:
        opened = shmpool.Pool(env, n, seed=seed, **({"batch_size": batch} if asynchronous else {}), **options)
    elif kind == MAKE:
        opened = shmpool.make(env, num_envs=n, batch_size=batch, seed=seed, **options)
    elif kind == VECTOR:
        opened = shmpool.VectorEnv(env, n, seed=seed, **options)
    elif kind == RAY:
        from shmpool.distributed import RayPool
        opened = RayPool(env, n, seed=seed, batch_size=batch if asynchronous else None, **options)
    else:
        raise ValueError(f"unknown system {kind!r}")
    try:
        return Vec(kind, opened, n, batch, seed, asynchronous)
    except BaseException:
        opened.close()
        raise


def open_stepper(system: str, task: str, n: int, seed: int = 0) -> Vec:
    """The vector env of ``bench train``'s ``system`` over ``task`` with ``n`` envs, seeded ``seed``.

    shmpool's rows are ``shmpool.make(task)`` (its recipes): sync ``step``, async ``batch = N/2``;
    ``unpinned``: ``pin=False``; ``processes``: ``parent_shard=False``; ``parent shard``: ``True``."""
    if system in (*GYM_VECTOR, SB3_DUMMY, SB3_SUBPROC, ENVPOOL):
        return open_vec(system, task, n, seed=seed)
    if system in SHMPOOL:
        batch = max(1, n // 2) if system in (POOL_ASYNC, POOL_ASYNC_PARENT) else n
        parent_shard = {POOL_SYNC_PROCESSES: False, POOL_ASYNC_PARENT: True}.get(system, "auto")
        return open_vec(MAKE, task, n, batch=batch, seed=seed, pin=system != POOL_SYNC_UNPINNED,
                        parent_shard=parent_shard)
    raise ValueError(f"unknown system {system!r}; systems: {', '.join((*ALL_SYSTEMS, *SHMPOOL))}")


class EnvOnly:
    """Vecs stepped with fixed actions, env steps counted: what every env-only table times.

    ``actions``: ``(n, ...)`` rows (a vec takes its first ``batch``), a list of such arrays
    (cycled, one per call), or ``n -> rows``.  Several vecs (one per NUMA node) are stepped in
    turn from this thread."""

    def __init__(self, vecs: Sequence[Vec], actions: Any) -> None:
        self.vecs = list(vecs)
        self.units = sum(v.batch for v in self.vecs)
        self.info: dict[str, Any] = self.vecs[0].info if len(self.vecs) == 1 else {}
        try:
            calls = []
            for v in self.vecs:
                v.reset()
                rows = actions(v.batch) if callable(actions) else actions
                if isinstance(rows, list):
                    calls.append(functools.partial(_cycled, v.raw_step, itertools.cycle(
                        [v.cast(a[: v.batch]) for a in rows])))
                else:
                    calls.append(v.stepping(v.cast(rows[: v.batch])))
        except BaseException:
            self.close()
            raise
        self._step = calls[0] if len(calls) == 1 else functools.partial(_each, calls)

    def measure(self, seconds: float, warmup: float) -> Sample:
        return timed_loop(self._step, self.units, seconds, warmup)

    def close(self) -> None:
        self.__dict__.pop("_step", None)
        for v in self.vecs:
            v.close()
        self.vecs = []


def _cycled(step: Callable[[np.ndarray], object], actions: itertools.cycle) -> None:
    step(next(actions))


def _each(calls: Sequence[Callable[[], object]]) -> None:
    for call in calls:
        call()


def env_only(kind: str, env: Any, n: int, actions: Any, *, batch: int | None = None, **options: Any) -> EnvOnly:
    """:class:`EnvOnly` over one :func:`open_vec`: a :class:`~bench._timing.Case`'s opener."""
    return EnvOnly([open_vec(kind, env, n, batch=batch, **options)], actions)


class Latency:
    """One vec with every call timed (``latency_loop``): percentiles per call and, async, per env step.

    Observer (per env step) latency: from the call that sent an env's action to the ``recv`` that
    returned it (a :class:`~bench._timing.RecvLog`); sync: every env of a step sees the whole call.
    ``info["driver_cpu_us_per_call"]``: this process's CPU (every thread) per timed call."""

    def __init__(self, vec: Vec, actions: np.ndarray, percentiles: Sequence[int]) -> None:
        self.vec, self.percentiles, self.log = vec, percentiles, RecvLog()
        self.info: dict[str, Any] = dict(vec.info)
        try:
            vec.reset()
        except BaseException:
            vec.close()
            raise
        self.actions = vec.cast(actions[: vec.batch])
        self._step = vec.stepping(self.actions) if not vec.asynchronous else self._logged

    def _logged(self) -> None:
        self.log.add(self.vec.raw_step(self.actions)[-1]["env_id"])

    def measure(self, seconds: float, warmup: float) -> Sample:
        if warmup > 0:
            latency_loop(self._step, warmup)
        self.log.clear()
        cpu = time.process_time()
        sample = latency_loop(self._step, seconds, percentiles=self.percentiles)
        self.info["driver_cpu_us_per_call"] = 1e6 * (time.process_time() - cpu) / sample.count
        if self.vec.asynchronous:
            observed = self.log.observer_latencies(self.vec.num_envs, timed=sample.count)
            self.info["observer_latency_us"] = percentiles_of(observed, self.percentiles)
            self.info["observer_steps"] = int(observed.size)
        else:
            self.info["observer_latency_us"] = dict(sample.latency_us)
            self.info["observer_note"] = "sync: every env of a step sees the whole step call"
        self.log.clear()
        return sample

    def close(self) -> None:
        self.vec.close()


def headline_cases(gym_env: Any, pool_env: Any, n: int, actions: np.ndarray, suffix: str = "") -> list[Case]:
    """The four env-only systems of :data:`SYSTEMS`: gymnasium's vector envs over ``gym_env``, and
    ``shmpool.Pool`` over ``pool_env``, sync and async (``batch_size = N/2``); names end in ``suffix``."""
    return [Case(SYNC_VEC + suffix, functools.partial(env_only, SYNC_VEC, gym_env, n, actions)),
            Case(ASYNC_VEC + suffix, functools.partial(env_only, ASYNC_VEC, gym_env, n, actions)),
            Case(POOL_SYNC + suffix, functools.partial(env_only, POOL, pool_env, n, actions)),
            Case(POOL_ASYNC + suffix, functools.partial(env_only, POOL, pool_env, n, actions, batch=max(1, n // 2)))]
