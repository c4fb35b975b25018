"""Argument rules every face shares (Pool, RayPool, VectorEnv, ShmVecEnv, make).

One home, so the same mistake gets the same message whichever class the user built."""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np

# Keywords of ``Pool`` besides the envs themselves: a face forwards these to the pool and treats any
# other keyword as an env kwarg.  tests/test_units.py checks this against ``Pool``'s signature.
POOL_KEYWORDS = frozenset({
    "num_workers", "batch_size", "cpus", "seed", "wait_policy", "step_timeout", "startup_timeout", "copy",
    "start_method", "wake", "autoreset_mode", "on_worker_error",
})


def check_count(name: str, value: Any, low: int = 1) -> int:
    """``value`` as an int ``>= low``; TypeError for a non-int (bools included), ValueError below ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


def make_by_id(env_id: str, kwargs: dict) -> gymnasium.Env:
    """``gymnasium.make(env_id, **kwargs)``; module-level so constructors pickle by reference."""
    return gymnasium.make(env_id, **kwargs)


def env_constructors(env: Any, num_envs: int | None, env_kwargs: dict) -> list[Callable[[], Any]]:
    """Turn a gymnasium id, one callable or a list of callables into one callable per env
    (a ``shmpool.Batched`` env into a ``BatchedEnvs``, sliced into shards the same way)."""
    from .batched import Batched  # batched imports layout, which needs the compiled wire

    if num_envs is not None:
        num_envs = check_count("num_envs", num_envs)
    if isinstance(env, Batched):
        if env_kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(env_kwargs)}: a Batched env takes its "
                            "arguments in make_fn")
        return env.sized(num_envs)
    if isinstance(env, str):
        gymnasium.spec(env)  # unknown ids fail here, in the parent, with gymnasium's suggestion
        if num_envs is None:
            raise ValueError("num_envs is required when the env is given by id")
        return [functools.partial(make_by_id, env, env_kwargs)] * num_envs
    if env_kwargs:
        raise TypeError(f"unexpected keyword arguments {sorted(env_kwargs)}: env kwargs are only accepted "
                        "with a gymnasium id")
    if callable(env):
        if num_envs is None:
            raise ValueError("num_envs is required when the env is given by one callable")
        return [env] * num_envs
    fns = list(env)
    if not fns or not all(callable(f) for f in fns):
        raise TypeError("env must be a gymnasium id, a callable, or a non-empty list of callables")
    if num_envs is not None and num_envs != len(fns):
        raise ValueError(f"num_envs={num_envs} but {len(fns)} env constructors were given")
    return fns


def shard_sizes(num_envs: int, num_workers: int) -> list[int]:
    """Contiguous shards as even as possible: the first ``num_envs % num_workers`` get one more."""
    base, extra = divmod(num_envs, num_workers)
    return [base + (1 if w < extra else 0) for w in range(num_workers)]


def is_ray_pool(obj: Any) -> bool:
    """A :class:`shmpool.distributed.RayPool`, checked without importing ray: if the module
    was never imported, nothing can be one."""
    mod = sys.modules.get("shmpool.distributed")
    return mod is not None and isinstance(obj, mod.RayPool)
