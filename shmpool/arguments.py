"""Argument rules every face shares (Pool, RayPool, VectorEnv, ShmVecEnv, make).

One home, so the same mistake gets the same message whichever class the user built."""
from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gymnasium
import numpy as np

# Keywords of ``Pool`` besides the envs themselves: a face forwards these to the pool and treats any
# other keyword as an env kwarg.  tests/units/test_units.py checks this against ``Pool``'s signature.
POOL_KEYWORDS = frozenset({
    "num_workers", "batch_size", "cpus", "seed", "wait_policy", "step_timeout", "startup_timeout", "copy",
    "start_method", "wake", "autoreset_mode", "on_worker_error", "pin", "strict",
    "observation_mode", "max_concurrency", "max_lead", "parent_shard",
})


def keywords_of(fn: Callable) -> frozenset[str]:
    """The named parameters of ``fn`` (a face's constructor), without ``self`` and ``**`` catch-alls."""
    return frozenset(name for name, p in inspect.signature(fn).parameters.items()
                     if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD)


def check_typos(face: str, given: Iterable[str], known: Iterable[str]) -> None:
    """A keyword that is not one of ``face``'s but is close to one (``num_wokers``, ``batchsize``)
    is a typo, not an option for the env: ``TypeError`` naming the nearest (difflib), before the
    env is ever built with it.  (An env option that close to one of ours can still reach the env
    through a constructor: ``lambda: gymnasium.make(id, num_worker=...)``.)"""
    known = sorted(set(known))
    for key in given:
        if key in known:
            continue
        near = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
        if near:
            raise TypeError(f"{face} got an unknown keyword {key!r}: did you mean {near[0]!r}? (keywords that are "
                            f"not {face}'s go to the env)")


# max_lead="auto" for envs that are all alike: slack for resets and passing hiccups, while
# the spread of per-env steps over a few hundred recv/send cycles stays within a few %.
EVEN_LEAD = 8


def check_max_lead(max_lead: Any, alike: bool) -> int | None:
    """``max_lead`` resolved: "auto" is ``EVEN_LEAD`` when every env comes from one constructor
    (an id, one callable, or one callable repeated), else None (envs that may differ in cost
    must not be paced by the slowest); None never holds an env back."""
    if isinstance(max_lead, str) and max_lead == "auto":
        return EVEN_LEAD if alike else None
    if max_lead is None:
        return None
    if isinstance(max_lead, bool) or not isinstance(max_lead, (int, np.integer)):
        raise TypeError(f"max_lead must be an int, 'auto' or None, got {max_lead!r}")
    return int(check_count("max_lead", max_lead))


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


# shmpool's recipes (``shmpool.registration``), handed in by the registry when it is imported: it
# sits above this module (it builds pools), so this module cannot import it.
_recipes: Callable[[str, int, dict], Any] = lambda env_id, num_envs, env_kwargs: None  # noqa: E731


def know_recipes(recipes: Callable[[str, int, dict], Any]) -> None:
    """Called once by ``shmpool.registration``: ``recipes(env_id, num_envs, env_kwargs)`` gives the
    envs of the recipe an id names (None for a gymnasium id)."""
    global _recipes
    _recipes = recipes


def check_env_id(env_id: str) -> None:
    """An unknown id fails here, in the parent, with gymnasium's suggestion."""
    gymnasium.spec(env_id)


def env_constructors(env: Any, num_envs: int | None, env_kwargs: dict) -> list[Callable[[], Any]]:
    """Turn a gymnasium id, a recipe id (``Pong-v5``: ``shmpool.registration``), one callable or a
    list of callables into one callable per env (a ``shmpool.Batched`` env into a ``BatchedEnvs``,
    sliced into shards the same way)."""
    from .batched import Batched  # batched imports layout, which needs the compiled wire

    if num_envs is not None:
        num_envs = check_count("num_envs", num_envs)
    if isinstance(env, Batched):
        if env_kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(env_kwargs)}: a Batched env takes its "
                            "arguments in make_fn")
        return env.sized(num_envs)
    if isinstance(env, str):
        if num_envs is None:
            check_env_id(env)   # an unknown id is named first
            raise ValueError("num_envs is required when the env is given by id")
        recipe = _recipes(env, num_envs, env_kwargs)   # shmpool's own task (Pong-v5): its envs
        if recipe is not None:
            return recipe.sized(num_envs) if isinstance(recipe, Batched) else recipe
        check_env_id(env)
        return [functools.partial(make_by_id, env, env_kwargs)] * num_envs
    refuse_env_instances(env)
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


def refuse_env_instances(env: Any) -> None:
    """A TypeError naming the fix when ``env`` is a built env (or a list holding one) where constructors are
    needed: every env is built in its worker from its own constructor, so a built one cannot be shared out."""
    built = [env] if isinstance(env, (gymnasium.Env, gymnasium.vector.VectorEnv)) else (
        [e for e in env if isinstance(e, (gymnasium.Env, gymnasium.vector.VectorEnv))]
        if isinstance(env, (list, tuple)) else [])
    if not built:
        return
    spec = getattr(built[0], "spec", None)
    env_id = getattr(spec, "id", None)
    instead = (f"lambda: gym.make({env_id!r}) (one constructor, with num_envs), a list of such callables, or "
               f"the id {env_id!r}" if env_id else "a callable that builds one (lambda: MyEnv()), with num_envs, "
               "or a list of such callables")
    raise TypeError(f"an env instance ({type(built[0]).__name__}) was given where env constructors are needed: "
                    f"each worker builds its own envs, so give {instead}")


def check_parent_shard(parent_shard: Any, crowded: bool, num_workers_given: bool, step_timeout: float | None,
                       on_worker_error: str, async_batches: bool = False, trainer_leaves_a_core: bool = False) -> bool:
    """``parent_shard`` resolved: whether the pool's own process steps its last shard.

    ``"auto"``: when the workers, one per usable core, leave no core (or quota) for the
    parent (``crowded``), and nothing asked for worker processes: an explicit
    ``num_workers``, a ``step_timeout`` (only a process can be stopped mid-step),
    ``on_worker_error="restart"`` (only a process can die alone), or async batches
    (``batch_size < num_envs``) beside a trainer whose torch/OpenMP threads leave a core
    free: worker processes then step while the trainer computes between ``send`` and
    ``recv``, and the parent's shard steps only inside ``recv``."""
    if parent_shard == "auto":
        return (crowded and not num_workers_given and step_timeout is None
                and on_worker_error == "raise" and not (async_batches and trainer_leaves_a_core))
    if type(parent_shard) is not bool:
        raise TypeError(f"parent_shard must be True, False or 'auto', got {parent_shard!r}")
    if parent_shard and step_timeout is not None:
        raise ValueError(f"parent_shard=True cannot honour step_timeout={step_timeout}: this process steps that "
                         "shard itself, and nothing can stop it mid-step; use parent_shard=False")
    return parent_shard


def shard_sizes(num_envs: int, num_workers: int) -> list[int]:
    """Contiguous shards as even as possible: the first ``num_envs % num_workers`` get one more."""
    base, extra = divmod(num_envs, num_workers)
    return [base + (1 if w < extra else 0) for w in range(num_workers)]


# --- options every face takes ---------------------------------------------------------------


def check_batch_size(value: Any, num_envs: int) -> int:
    """``batch_size``: None (all ``num_envs``) or a count up to ``num_envs``, as an int."""
    size = num_envs if value is None else check_count("batch_size", value)
    if size > num_envs:
        raise ValueError(f"batch_size={size} is more than num_envs={num_envs}")
    return size


def check_num_workers(value: Any, num_envs: int) -> int:
    """``num_workers``: a count up to ``num_envs`` (every worker needs an env), as an int."""
    workers = check_count("num_workers", value)
    if workers > num_envs:
        raise ValueError(f"num_workers={workers} is more than num_envs={num_envs}: every worker needs an env")
    return workers


def check_max_concurrency(value: Any) -> int | None:
    """``max_concurrency`` (AsyncVectorEnv's keyword): None or a positive int, refused with its errors."""
    if value is None:
        return None
    if not isinstance(value, (int, np.integer)):
        raise ValueError(f"`max_concurrency` must be an integer or None, got {type(value)}.")
    if value < 1:
        raise ValueError(f"`max_concurrency` must be a positive or None, got {value}.")
    return int(value)


def workers_within(num_workers: int, max_concurrency: int | None, chosen: bool) -> int:
    """``num_workers`` under ``max_concurrency``: a worker steps one env at a time, so at most
    ``num_workers`` envs run at once.  A default is capped; an explicit count above it is refused."""
    if max_concurrency is None or num_workers <= max_concurrency:
        return num_workers
    if chosen:
        raise ValueError(f"num_workers={num_workers} is more than max_concurrency={max_concurrency}: each worker "
                         "steps one env at a time, so num_workers envs may run at once; give one of the two")
    return max_concurrency


def check_wake(wake: Any, have_futex: bool, on_worker_error: str, batched: bool) -> bool:
    """``wake`` (``"auto"``, ``"futex"``, ``"semaphore"``) against what the platform has and
    ``on_worker_error``; returns whether the pool wakes through posix semaphores."""
    if wake not in ("auto", "futex", "semaphore"):
        raise ValueError(f"wake must be 'auto', 'futex' or 'semaphore', got {wake!r}")
    if wake == "futex" and not have_futex:
        raise ValueError("wake='futex' but this platform has no futex")
    use_sems = wake == "semaphore" or not have_futex
    if on_worker_error == "restart" and use_sems:
        raise ValueError(
            "on_worker_error='restart' needs futex wake-ups: with wake='semaphore' (or without futexes) the "
            "semaphores are unlinked once the workers opened them, so a replacement could not open them")
    if on_worker_error == "restart" and batched:
        # A replacement marks envs one by one as restarted; a batched shard is one object.
        raise ValueError("on_worker_error='restart' is not supported for batched envs (shmpool.batched.Batched): "
                         "use on_worker_error='raise'")
    return use_sems


def check_on_worker_error(value: Any) -> str:
    """``on_worker_error``: ``"raise"`` or ``"restart"``, returned as given; ValueError otherwise."""
    if value not in ("raise", "restart"):
        raise ValueError(f"on_worker_error must be 'raise' or 'restart', got {value!r}")
    return value


def check_step_timeout(value: Any) -> float | None:
    """``step_timeout``: positive seconds (int or float) or None, returned as given; ValueError otherwise."""
    if value is not None and not value > 0:
        raise ValueError(f"step_timeout must be positive seconds or None, got {value}")
    return value


def check_seed(value: Any) -> int | None:
    """A pool's base ``seed``: an int (numpy ints too) as a Python int, or None; TypeError otherwise."""
    if value is None:
        return None
    if not isinstance(value, (int, np.integer)):
        raise TypeError(f"seed must be an int or None, got {type(value).__name__}")
    return int(value)


def check_options_list(options: Sequence, num_envs: int) -> list:
    """``reset(options=[...])``: one entry (a dict or None) per env, as a new list; ValueError on a
    length mismatch."""
    if len(options) != num_envs:
        raise ValueError(f"options list has {len(options)} entries, the pool has {num_envs} envs")
    return list(options)


# --- env ids ---------------------------------------------------------------------------------


def env_id_array(env_ids: Any) -> np.ndarray:
    """``send(actions, env_ids)``'s ids as a C-contiguous ``(n,)`` int64 array, ``n >= 1``
    (the array itself when it already is one).  ValueError for another shape or dtype, or none.
    Range and repeats are :func:`check_env_ids`' job."""
    ids = env_ids if type(env_ids) is np.ndarray else np.asarray(env_ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError(f"env_ids must be a 1-d array of ints, got shape {ids.shape} dtype {ids.dtype}")
    if len(ids) == 0:
        raise ValueError("env_ids is empty")
    if ids.dtype != np.int64 or not ids.flags.c_contiguous:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
    return ids


def check_env_ids(ids: np.ndarray, num_envs: int) -> None:
    """Raise ValueError if an id of the int array ``ids`` is outside ``[0, num_envs)`` or
    appears more than once (the ids sent to ``send``: each env steps once per call)."""
    bad = ids[(ids < 0) | (ids >= num_envs)]
    if len(bad):
        raise ValueError(f"env ids {bad.tolist()} are out of range for a pool of {num_envs} envs")
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"env ids {uniq[counts > 1].tolist()} appear more than once")


def env_id_list(env_ids: Any, num_envs: int) -> list[int]:
    """The envs a ``call``/``get_attr``/``set_attr``/``apply`` addresses, as Python ints in the order
    given: every env for None, one for an int, else the iterable's ids.  ValueError for ids outside
    ``[0, num_envs)`` (non-ints included); repeats are allowed (each asks the env once more)."""
    if env_ids is None:
        return list(range(num_envs))
    ids = [env_ids] if isinstance(env_ids, (int, np.integer)) else list(env_ids)
    bad = [i for i in ids if not isinstance(i, (int, np.integer)) or not 0 <= i < num_envs]
    if bad:
        raise ValueError(f"env ids {bad} are out of range for a pool of {num_envs} envs")
    return [int(i) for i in ids]
