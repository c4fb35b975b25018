"""Building shmpool vector envs by name.

- :func:`make_vec` mirrors ``gymnasium.make_vec`` with a :class:`~shmpool.vector.VectorEnv`
  as the vectorizer (``wrappers`` applied to each env, ``vector_kwargs`` to the VectorEnv).
- :func:`register_envs` gives gymnasium ids a shmpool twin, ``shmpool/<id>``, whose
  ``vector_entry_point`` builds a shmpool VectorEnv.  ``gymnasium.make_vec`` only knows
  the modes ``"sync"``, ``"async"`` and ``"vector_entry_point"``, so a twin id is the one
  way it can build a shmpool env: ``gymnasium.make_vec("shmpool/CartPole-v1", 8)``.
- :func:`make` is EnvPool's ``make`` (argument names and meanings) over the same VectorEnv.
"""
from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gymnasium
from gymnasium.envs.registration import EnvSpec, VectorizeMode

from .topology import allowed_cpus
from .vector_env import VECTOR_PARAMETERS, VectorEnv

__all__ = ["TWIN_NAMESPACE", "list_tasks", "make", "make_vec", "register_envs", "register_task", "twin_id",
           "vector_entry_point"]

TWIN_NAMESPACE = "shmpool"


# --- gymnasium.make_vec's twin ----------------------------------------------------


def _create_single_env(spec: EnvSpec, kwargs: dict, wrappers: tuple) -> gymnasium.Env:
    env = gymnasium.make(spec, **kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    return env


def _find_spec(env_id: str | EnvSpec) -> EnvSpec:
    if isinstance(env_id, EnvSpec):
        return env_id
    if not isinstance(env_id, str):
        raise gymnasium.error.Error(f"Invalid id type: {type(env_id)}. Expected `str` or `EnvSpec`")
    if ":" in env_id:  # gymnasium's "module:Env-v0": import the module that registers the id
        module, env_id = env_id.split(":")
        importlib.import_module(module)
    return gymnasium.spec(env_id)


def _split_vector_kwargs(kwargs: dict) -> tuple[dict, dict]:
    """(env kwargs, VectorEnv/pool kwargs), split by the VectorEnv's parameter names."""
    env_kwargs = {k: v for k, v in kwargs.items() if k not in VECTOR_PARAMETERS}
    return env_kwargs, {k: v for k, v in kwargs.items() if k in VECTOR_PARAMETERS}


def make_vec(
    env_id: str | EnvSpec,
    num_envs: int = 1,
    vectorization_mode: VectorizeMode | str | None = None,
    *,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gymnasium.Env], gymnasium.Wrapper]] | None = None,
    **kwargs: Any,
) -> VectorEnv:
    """``gymnasium.make_vec`` with a shmpool :class:`VectorEnv` as the vectorizer.

    Every env is ``gymnasium.make(env_id, **kwargs)`` with ``wrappers`` applied
    in order, built inside its worker.  ``vector_kwargs`` go to the VectorEnv
    (``copy``, ``autoreset_mode``, ``num_workers``, ``batch_size``, ``cpus``,
    ``seed``, ...); so do keywords in ``kwargs`` named like those.  As in
    gymnasium, a spec's recorded ``num_envs``/``vector_kwargs``/``wrappers``
    win, so ``make_vec(envs.spec)`` rebuilds ``envs``.

    The returned env's ``spec`` is what gymnasium records, with
    ``vectorization_mode="vector_entry_point"`` and a shmpool
    ``vector_entry_point``: ``gymnasium.make_vec(envs.spec)`` rebuilds a shmpool
    env too when no wrappers were given (gymnasium refuses wrappers in that mode).

    ``vectorization_mode``: ``"async"`` (or None) is what this builds, so calls
    written for ``gymnasium.make_vec(..., vectorization_mode="async")`` work as
    they are; ``"sync"`` and ``"vector_entry_point"`` are refused with the reason.
    """
    check_vectorization_mode(vectorization_mode)
    spec = copy.deepcopy(_find_spec(env_id))
    spec_kwargs = spec.kwargs
    spec.kwargs = {}
    num_envs = spec_kwargs.pop("num_envs", num_envs)
    spec_kwargs.pop("vectorization_mode", None)
    vector_kwargs = dict(spec_kwargs.pop("vector_kwargs", vector_kwargs) or {})
    wrappers = tuple(spec_kwargs.pop("wrappers", wrappers) or ())
    spec_kwargs.update(kwargs)
    env_kwargs, more_vector_kwargs = _split_vector_kwargs(spec_kwargs)
    vector_kwargs.update(more_vector_kwargs)
    if spec.entry_point is None:
        raise gymnasium.error.Error(
            f"Cannot create vectorized environment for {spec.id} because it doesn't have an entry point defined.")

    env_fn = functools.partial(_create_single_env, spec, env_kwargs, wrappers)
    env = VectorEnv([env_fn] * num_envs, **vector_kwargs)

    recorded = copy.deepcopy(spec)
    # Pool options are recorded as plain kwargs: that is the only way gymnasium's
    # vector_entry_point mode passes them on (it refuses vector_kwargs).
    recorded.kwargs = {**env_kwargs, **vector_kwargs}
    if num_envs != 1:
        recorded.kwargs["num_envs"] = num_envs
    recorded.kwargs["vectorization_mode"] = VectorizeMode.VECTOR_ENTRY_POINT.value
    if wrappers:
        recorded.kwargs["wrappers"] = wrappers
    recorded.vector_entry_point = functools.partial(vector_entry_point, spec.id)
    env.spec = recorded
    return env


def check_vectorization_mode(mode: VectorizeMode | str | None) -> None:
    """``make_vec``'s ``vectorization_mode``: None or ``"async"``; the others say why not."""
    if mode is None:
        return
    try:
        mode = VectorizeMode(mode)
    except ValueError:
        raise ValueError(f"Invalid vectorization mode: {mode!r}, "
                         f"valid modes: {[m.value for m in VectorizeMode]}") from None
    if mode is VectorizeMode.SYNC:
        raise ValueError("vectorization_mode='sync' has no meaning for shmpool.make_vec: it always steps the envs "
                         "in worker processes, as 'async' does; use gymnasium.make_vec for SyncVectorEnv")
    if mode is VectorizeMode.VECTOR_ENTRY_POINT:
        raise ValueError("vectorization_mode='vector_entry_point' has no meaning for shmpool.make_vec: it builds "
                         "the envs one by one in its workers, never the id's own vector env; "
                         "use gymnasium.make_vec for that")


def vector_entry_point(env_id: str, num_envs: int = 1, **kwargs: Any) -> VectorEnv:
    """What ``gymnasium.make_vec`` calls in ``"vector_entry_point"`` mode for a shmpool twin id.

    gymnasium passes everything as keywords (it refuses ``vector_kwargs`` and
    ``wrappers`` in this mode); keywords named like VectorEnv/pool parameters
    (``num_workers``, ``copy``, ``autoreset_mode``, ...) configure the VectorEnv,
    the rest go to ``gymnasium.make(env_id, ...)`` (``render_mode``,
    ``max_episode_steps``, the env's own kwargs)."""
    return VectorEnv(env_id, num_envs, **kwargs)


def twin_id(env_id: str) -> str:
    """The shmpool twin of a gymnasium id: ``CartPole-v1`` -> ``shmpool/CartPole-v1``,
    ``ALE/Pong-v5`` -> ``shmpool-ALE/Pong-v5`` (gymnasium ids have one namespace)."""
    return f"{TWIN_NAMESPACE}-{env_id}" if "/" in env_id else f"{TWIN_NAMESPACE}/{env_id}"


def _is_twin(spec: EnvSpec) -> bool:
    ns = spec.namespace or ""
    return ns == TWIN_NAMESPACE or ns.startswith(TWIN_NAMESPACE + "-")


def register_envs(env_ids: Iterable[str] | None = None) -> list[str]:
    """Register ``shmpool/<id>`` twins of gymnasium ids; returns the twin ids registered now.

    ``env_ids`` defaults to every id in gymnasium's registry with an entry point
    (importing ``shmpool.vector`` does this once; call again after importing a
    package that registers more ids, e.g. ``ale_py``).  A twin has the id's
    entry point, kwargs and time limit, so ``gymnasium.make("shmpool/X")`` and
    ``make_vec(..., vectorization_mode="sync")`` give exactly ``X``'s envs, and a
    ``vector_entry_point`` that builds a shmpool VectorEnv, which ``make_vec``
    uses by default."""
    registry = gymnasium.envs.registration.registry
    explicit = env_ids is not None
    added = []
    for env_id in list(registry if env_ids is None else env_ids):
        spec = gymnasium.spec(env_id)
        if _is_twin(spec) or twin_id(spec.id) in registry:
            continue
        if spec.entry_point is None:
            if explicit:
                raise gymnasium.error.Error(f"{spec.id} has no entry point: shmpool builds envs one by one")
            continue
        gymnasium.register(
            id=twin_id(spec.id),
            entry_point=spec.entry_point,
            reward_threshold=spec.reward_threshold,
            nondeterministic=spec.nondeterministic,
            max_episode_steps=spec.max_episode_steps,
            order_enforce=spec.order_enforce,
            disable_env_checker=spec.disable_env_checker,
            additional_wrappers=spec.additional_wrappers,
            vector_entry_point=functools.partial(vector_entry_point, spec.id),
            kwargs=dict(spec.kwargs),
        )
        added.append(twin_id(spec.id))
    return added


# --- EnvPool's make -----------------------------------------------------------------

# Task ids with EnvPool's own semantics (built-in recipes such as "Pong-v5" with
# EnvPool's preprocessing) plug in here: ``builder(num_envs=n, **kwargs)`` returns
# one env constructor per env.  Ids not listed are gymnasium ids.
_TASKS: dict[str, Callable[..., list[Callable[[], gymnasium.Env]]]] = {}


def register_task(task_id: str, builder: Callable[..., list[Callable[[], gymnasium.Env]]]) -> None:
    """Make ``make(task_id, ...)`` build its envs with ``builder(num_envs=n, **kwargs)``
    (one constructor per env, or a ``shmpool.batched.Batched`` with ``num_envs`` set)."""
    _TASKS[task_id] = builder


def _batch_pong(num_envs: int, **kwargs: Any):
    """``BatchPong-v0``: numpy-batched Pong, one ``BatchPong`` per worker (kwargs: ``max_episode_steps``)."""
    from .batched import Batched
    from .envs.batch_pong import BatchPong
    return Batched(functools.partial(BatchPong, **kwargs), num_envs=num_envs)


register_task("BatchPong-v0", _batch_pong)


# Built-in recipe modules and the package each needs; loaded on first use so that
# importing shmpool never imports mujoco (or ale-py).
_BUILTIN_RECIPES = {"shmpool.workers.recipes.mujoco": "mujoco", "shmpool.workers.recipes.atari": "ale_py"}
_loaded_builtins = False


def _load_builtin_tasks() -> None:
    global _loaded_builtins
    if _loaded_builtins:
        return
    _loaded_builtins = True
    for module, needs in _BUILTIN_RECIPES.items():
        if importlib.util.find_spec(needs) is None:
            continue  # that extra is not installed: its ids stay plain gymnasium ids
        importlib.import_module(module).register()


# Ids the recipes of an extra would serve, recognised without importing it (for the hint below).
_MUJOCO_V5 = frozenset(f"{name}-v5" for name in (
    "Ant", "HalfCheetah", "Hopper", "Humanoid", "HumanoidStandup", "InvertedDoublePendulum",
    "InvertedPendulum", "Pusher", "Reacher", "Swimmer", "Walker2d"))
_EXTRAS = {"mujoco": ("mujoco", "the ten MuJoCo -v5 tasks"), "ale_py": ("atari", "every Atari <Game>-v5")}


def missing_extras() -> dict[str, str]:
    """Extras whose built-in tasks are unavailable because their package is not installed:
    ``{extra: what it would add}``."""
    return {extra: what for needs, (extra, what) in _EXTRAS.items() if importlib.util.find_spec(needs) is None}


def _missing_extra_hint(task_id: str) -> str | None:
    """How to get ``task_id`` when it is a built-in task whose extra is not installed."""
    missing = missing_extras()
    if "mujoco" in missing and task_id in _MUJOCO_V5:
        return f"{task_id} is a built-in shmpool task: pip install 'shmpool[mujoco]'"
    if "atari" in missing and task_id.endswith("-v5") and "/" not in task_id and task_id not in _MUJOCO_V5:
        return f"{task_id} looks like a built-in Atari task: pip install 'shmpool[atari]'"
    return None


def list_tasks() -> list[str]:
    """Task ids ``make`` builds with shmpool's own recipes (any other gymnasium id works too,
    through ``gymnasium.make``).  Tasks of extras that are not installed are not listed; a
    warning names those extras."""
    _load_builtin_tasks()
    missing = missing_extras()
    if missing:
        warnings.warn("not listed, their extras are not installed: " + "; ".join(
            f"{what} (pip install 'shmpool[{extra}]')" for extra, what in missing.items()), stacklevel=2)
    return sorted(_TASKS)


def _affinity_cpus(offset: int | None, num_threads: int | None) -> list[int] | None:
    """EnvPool's ``thread_affinity_offset``: workers use allowed cpus from ``offset`` on."""
    if offset is None or offset < 0:  # EnvPool's default -1: no particular core
        return None
    allowed = allowed_cpus()
    cpus = allowed[offset:] if num_threads is None else allowed[offset:offset + num_threads]
    if not cpus:
        raise ValueError(f"thread_affinity_offset={offset} is past the {len(allowed)} allowed cpus {allowed}")
    return cpus


def make(
    task_id: str,
    env_type: str = "gymnasium",
    num_envs: int = 1,
    batch_size: int | None = None,
    num_threads: int | None = None,
    seed: int | None = None,
    thread_affinity_offset: int | None = None,
    **kwargs: Any,
) -> VectorEnv:
    """EnvPool's ``envpool.make`` over a shmpool :class:`VectorEnv`.

    - ``task_id``: a task with a shmpool recipe (:func:`list_tasks`: the MuJoCo v5 tasks
      when ``mujoco`` is installed, every Atari ``<Game>-v5`` with EnvPool's preprocessing
      when ``ale_py`` is installed) or any gymnasium id.
    - ``env_type``: ``"gymnasium"`` or ``"gym"`` (both give gymnasium's 5-tuple
      API); ``"dm"`` is not supported.
    - ``num_envs``; ``batch_size`` (``None``/0: ``num_envs``): how many envs
      ``recv()`` returns.
    - ``num_threads`` (``None``/0: one per allowed core, at most ``num_envs``):
      the number of worker processes.
    - ``seed``: env ``i`` is seeded ``seed + i`` at its first reset (None: unseeded).
    - ``thread_affinity_offset``: workers are pinned to the allowed cpus
      ``allowed[offset:offset + num_threads]`` (``None``/-1: all allowed cpus).
    - ``**kwargs``: keywords named like VectorEnv/pool parameters
      (``wait_policy``, ``autoreset_mode``, ...) configure the pool, the rest go
      to the env (``gymnasium.make``).

    As in EnvPool, ``observation_space`` and ``action_space`` of the returned env
    are the single-env spaces (so ``env.action_space.n`` works);
    ``single_observation_space``/``single_action_space`` are the same objects.
    For gymnasium's batched spaces use :func:`make_vec`.

    Differences from EnvPool: ``reset()`` is gymnasium's (every env, keyword
    ``seed``/``options``; EnvPool's ``reset(env_id)`` is
    ``reset(options={"reset_mask": mask})`` here) and returns all ``num_envs``
    envs even when ``batch_size < num_envs`` (use ``async_reset()`` + ``recv()``
    for EnvPool's batch); sync ``step`` infos carry no ``env_id``.
    """
    if env_type in ("dm", "dm_env"):
        raise NotImplementedError(
            "env_type='dm' (dm_env TimeStep API) is not supported by shmpool; use env_type='gymnasium'")
    if env_type not in ("gymnasium", "gym"):
        raise ValueError(f"env_type must be 'gymnasium', 'gym' or 'dm', got {env_type!r}")
    batch_size = batch_size or None       # EnvPool's 0 means "num_envs"
    num_threads = num_threads or None     # EnvPool's 0 means "the default"
    pool_kwargs = dict(num_workers=num_threads, batch_size=batch_size, seed=seed,
                       cpus=_affinity_cpus(thread_affinity_offset, num_threads))
    _load_builtin_tasks()
    if task_id in _TASKS:
        env_kwargs, vector_kwargs = _split_vector_kwargs(kwargs)
        env = VectorEnv(_TASKS[task_id](num_envs=num_envs, **env_kwargs), **pool_kwargs, **vector_kwargs)
    else:
        try:
            env = VectorEnv(task_id, num_envs, **pool_kwargs, **kwargs)
        except gymnasium.error.Error as exc:
            hint = _missing_extra_hint(task_id)
            if hint is None:
                raise
            raise type(exc)(f"{exc} ({hint})") from exc
    env.observation_space = env.single_observation_space
    env.action_space = env.single_action_space
    env.config = {"task_id": task_id, "env_type": env_type, "num_envs": num_envs, "batch_size": env.batch_size,
                  "num_threads": env.pool.num_workers, "seed": seed,
                  "thread_affinity_offset": thread_affinity_offset, **kwargs}
    return env
