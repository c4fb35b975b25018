"""Building shmpool vector envs by name.

- :func:`make_vec` mirrors ``gymnasium.make_vec`` with a :class:`~shmpool.vector.VectorEnv`
  as the vectorizer (``wrappers`` applied to each env, ``vector_kwargs`` to the VectorEnv).
- :func:`register_envs` gives gymnasium ids a shmpool twin, ``shmpool/<id>``, whose
  ``vector_entry_point`` builds a shmpool VectorEnv.  ``gymnasium.make_vec`` only knows
  the modes ``"sync"``, ``"async"`` and ``"vector_entry_point"``, so a twin id is the one
  way it can build a shmpool env: ``gymnasium.make_vec("shmpool/CartPole-v1", 8)``.
- :func:`make` is EnvPool's ``make`` (argument names and meanings) over the same VectorEnv.
- :func:`register_recipes` puts shmpool's own tasks (the Atari ``<Game>-v5`` recipes with
  EnvPool's semantics, the MuJoCo ``-v5`` recipes, ``BatchPong-v0``) in gymnasium's registry.

What an id means, in every face (``make_vec``, ``VectorEnv``, ``Pool``, SB3's ``ShmVecEnv``,
``gymnasium.make_vec`` of the ids below; ``make``, EnvPool's face, differs in one point):

- a gymnasium id (``CartPole-v1``, ``ALE/Pong-v5``, ``Ant-v5``) is gymnasium's env, and its
  twin ``shmpool/<id>`` the same env;
- a recipe id gymnasium does not have (``Pong-v5``, ``BatchPong-v0``) is the recipe, and so is
  ``shmpool/<id>`` (what ``gymnasium.make_vec`` and SB3's ``make_vec_env`` are given);
- ``shmpool-recipe/<id>`` is always the recipe: the one name of the MuJoCo recipes outside
  ``make``, because gymnasium's ``Ant-v5`` must keep meaning gymnasium's env wherever gymnasium's
  names are used.  ``make`` (EnvPool's face) takes a recipe's id first, as EnvPool's ``make``
  means its own tasks: ``make("Ant-v5")`` is the recipe.

A recipe's options (EnvPool's names for Atari: ``episodic_life``, ``reward_clip``,
``noop_max``, ``frame_skip``, ``stack_num``, ``img_height``, ...) are keywords of every face,
handed to the recipe by :func:`recipe_constructors`, the one path ``make`` uses too.
"""
from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gymnasium
from gymnasium.envs.registration import EnvSpec

from .arguments import POOL_KEYWORDS, check_count, check_seed, check_typos, keywords_of, know_recipes
from .envpool_env import ENV_TYPES, RENDER_MODES, EnvPoolEnv, base_config
from .gym_compat import LEGACY, VectorizeMode
from .gymnasium_face import VECTOR_PARAMETERS, VectorEnv
from .topology import allowed_cpus
from .workers.recipes import MUJOCO_TASK_IDS, atari_games

__all__ = ["RECIPE_NAMESPACE", "TWIN_NAMESPACE", "list_tasks", "make", "make_vec", "recipe_constructors",
           "recipe_task", "register_ale_ids", "register_envs", "register_recipes", "register_task", "twin_id",
           "vector_entry_point"]

TWIN_NAMESPACE = "shmpool"
RECIPE_NAMESPACE = "shmpool-recipe"


# --- gymnasium.make_vec's twin ----------------------------------------------------


def _create_single_env(spec: EnvSpec, kwargs: dict, wrappers: tuple) -> gymnasium.Env:
    return _wrapped(functools.partial(gymnasium.make, spec, **kwargs), wrappers)


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
    in order, built inside its worker.  A recipe id (``"Pong-v5"``, ``"BatchPong-v0"``,
    ``"shmpool-recipe/Ant-v5"``; see the module docstring) builds the recipe, ``kwargs``
    its options as ``make`` takes them (``episodic_life=True``, ``img_height=64``...);
    gymnasium's own ids (``"Ant-v5"``) keep meaning gymnasium's envs.  ``vector_kwargs`` go to the VectorEnv
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
    check_typos("make_vec", kwargs, POOL_KEYWORDS | VECTOR_PARAMETERS | keywords_of(make_vec))
    task = recipe_task(env_id.id if isinstance(env_id, EnvSpec) else env_id)
    if task is None and isinstance(env_id, str):
        _check_extra(env_id)
    # A recipe is recorded under its shmpool-recipe/ id, so that envs.spec rebuilds it.
    spec = copy.deepcopy(gymnasium.spec(recipe_id(task)) if task and not isinstance(env_id, EnvSpec)
                         else _find_spec(env_id))
    spec_kwargs = spec.kwargs
    spec.kwargs = {}
    num_envs = check_count("num_envs", spec_kwargs.pop("num_envs", num_envs))
    spec_kwargs.pop("vectorization_mode", None)
    vector_kwargs = dict(spec_kwargs.pop("vector_kwargs", vector_kwargs) or {})
    wrappers = tuple(spec_kwargs.pop("wrappers", wrappers) or ())
    spec_kwargs.update(kwargs)
    env_kwargs, more_vector_kwargs = _split_vector_kwargs(spec_kwargs)
    vector_kwargs.update(more_vector_kwargs)
    if task is not None:
        env = VectorEnv(_wrapped_recipe(task, num_envs, env_kwargs, wrappers), **vector_kwargs)
    elif spec.entry_point is None:
        raise gymnasium.error.Error(
            f"Cannot create vectorized environment for {spec.id} because it doesn't have an entry point defined.")
    else:
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


def _wrapped(fn: Callable[[], gymnasium.Env], wrappers: tuple) -> gymnasium.Env:
    env = fn()
    for wrapper in wrappers:
        env = wrapper(env)
    return env


def _wrapped_recipe(task: str, num_envs: int, env_kwargs: dict, wrappers: tuple) -> Any:
    """``make_vec``'s envs of a recipe: its constructors, each env wrapped in ``wrappers``."""
    fns = recipe_constructors(task, num_envs, env_kwargs)
    if not wrappers:
        return fns
    if not isinstance(fns, list):
        raise gymnasium.error.Error(f"{task} is a batched recipe (one object steps a worker's envs): "
                                    "wrappers of single envs cannot wrap it")
    return [functools.partial(_wrapped, fn, wrappers) for fn in fns]


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
    ``max_episode_steps``, the env's own kwargs), or to the recipe of a recipe id."""
    if kwargs.get("max_episode_steps", 0) is None:
        # gymnasium 0.29's "custom" mode always passes the spec's limit, None for a recipe
        # (which keeps its own); None means "the id's own limit" in gymnasium too.
        del kwargs["max_episode_steps"]
    return VectorEnv(env_id, num_envs, **kwargs)


def twin_id(env_id: str) -> str:
    """The shmpool twin of a gymnasium id: ``CartPole-v1`` -> ``shmpool/CartPole-v1``,
    ``ALE/Pong-v5`` -> ``shmpool-ALE/Pong-v5`` (gymnasium ids have one namespace)."""
    return f"{TWIN_NAMESPACE}-{env_id}" if "/" in env_id else f"{TWIN_NAMESPACE}/{env_id}"


def register_ale_ids() -> bool:
    """Register gymnasium's Atari ids (``ALE/Pong-v5``, ``BreakoutNoFrameskip-v4``, ...) when ale-py
    is installed; True if it is.  ``import shmpool`` does this once, before any face resolves an id,
    so each face knows them on its first call whatever was called before (gymnasium 1.x registers
    them only on ``gym.register_envs(ale_py)``; ale-py registers them on import where it can).
    Under gymnasium 0.29, ale-py >= 0.9 (the releases that ship ROMs) registers none on import: its
    import also loads its vector env, which needs gymnasium 1.x, and the failure skips the ids.
    Its single envs run under 0.29, so they are registered here (CleanRL's ``ppo_atari.py`` at its
    pins makes ``BreakoutNoFrameskip-v4``); ale-py 0.8 registers them itself."""
    try:
        if importlib.util.find_spec("ale_py") is None:
            return False
        ale_py = importlib.import_module("ale_py")
    except ImportError:   # installed but broken (or blocked with sys.modules["ale_py"] = None)
        return False
    gymnasium.register_envs(ale_py)   # 1.x: registers them; 0.29: a no-op
    if "ALE/Pong-v5" not in gymnasium.envs.registration.registry:
        try:
            from ale_py.registration import register_v0_v4_envs, register_v5_envs
        except ImportError:   # an ale-py without that module registers through gymnasium's plugins
            return True
        register_v0_v4_envs()
        register_v5_envs()
    return True


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
    if LEGACY:
        _route_legacy_make_vec()
    return added


def _is_shmpool_id(env_id: Any) -> bool:
    """Whether ``env_id`` (an id, ``"module:id"`` or an EnvSpec) names a shmpool twin or recipe."""
    try:
        spec = _find_spec(env_id)
    except (gymnasium.error.Error, ImportError, ValueError):
        return False   # gymnasium's own make_vec says what is wrong with it
    return _is_twin(spec) or spec.namespace == RECIPE_NAMESPACE


def _route_legacy_make_vec() -> None:
    """Under gymnasium 0.29, make ``gymnasium.make_vec(twin or recipe id, n)`` build a shmpool VectorEnv, as under
    1.x: 0.29's ``make_vec`` defaults to ``vectorization_mode="async"`` and builds its own (experimental)
    AsyncVectorEnv from any id's entry point, never the ``vector_entry_point`` the twins register.  Its
    ``make_vec`` is replaced by one that, for shmpool's ids and no mode given, builds them with
    :func:`make_vec`; every other call (gymnasium's ids, any explicit mode) is 0.29's own, unchanged.  Ids
    named ``"shmpool:shmpool/X"`` reach 0.29's function before shmpool is imported, so they need
    ``import shmpool`` first there."""
    legacy = gymnasium.envs.registration.make_vec
    if getattr(legacy, "routes_shmpool_ids", False):
        return

    @functools.wraps(legacy)
    def routed(id: str | EnvSpec, num_envs: int = 1, vectorization_mode: str | None = None,  # noqa: A002
               vector_kwargs: dict[str, Any] | None = None, wrappers: Sequence[Callable] | None = None,
               **kwargs: Any) -> Any:
        if vectorization_mode is None and _is_shmpool_id(id):
            return make_vec(id, num_envs, vector_kwargs=vector_kwargs, wrappers=wrappers, **kwargs)
        return legacy(id, num_envs, "async" if vectorization_mode is None else vectorization_mode,
                      vector_kwargs, wrappers, **kwargs)

    routed.routes_shmpool_ids = True
    for module in (gymnasium, gymnasium.envs, gymnasium.envs.registration):
        if getattr(module, "make_vec", None) is legacy:
            module.make_vec = routed


# --- EnvPool's make -----------------------------------------------------------------

# Task ids with EnvPool's own semantics (built-in recipes such as "Pong-v5" with
# EnvPool's preprocessing) plug in here: ``builder(num_envs=n, **kwargs)`` returns
# one env constructor per env.  Ids not listed are gymnasium ids.
_TASKS: dict[str, Callable[..., list[Callable[[], gymnasium.Env]]]] = {}


# A task's options with their defaults: the task-specific keys of EnvPool's ``config``.
_TASK_CONFIGS: dict[str, dict[str, Any]] = {}


def register_task(task_id: str, builder: Callable[..., list[Callable[[], gymnasium.Env]]],
                  config: dict[str, Any] | None = None) -> None:
    """Make ``make(task_id, ...)`` build its envs with ``builder(num_envs=n, **kwargs)``
    (one constructor per env, or a ``shmpool.batched.Batched`` with ``num_envs`` set).
    ``config``: the task's options and their defaults, listed in ``env.config`` after
    EnvPool's common keys (the keywords given to ``make`` override them)."""
    _TASKS[task_id] = builder
    _TASK_CONFIGS[task_id] = dict(config or {})


# Built-in task modules (shmpool.workers.recipes) and the package each needs (None: nothing
# beyond shmpool); loaded on first use so that importing shmpool never imports mujoco (or
# ale-py).  Each gives ``tasks()``; it is registered from here, so the recipes never import
# this module.
_BATCH_PONG = "shmpool.workers.recipes.batch_pong"
_BUILTIN_RECIPES = {_BATCH_PONG: None, "shmpool.workers.recipes.mujoco": "mujoco",
                    "shmpool.workers.recipes.atari": "ale_py"}
_loaded_builtins = False


def _load_builtin_tasks() -> None:
    global _loaded_builtins
    if _loaded_builtins:
        return
    _loaded_builtins = True
    for module, needs in _BUILTIN_RECIPES.items():
        if needs is not None and importlib.util.find_spec(needs) is None:
            continue  # that extra is not installed: its ids stay plain gymnasium ids
        recipes = importlib.import_module(module)
        configs = recipes.configs() if hasattr(recipes, "configs") else {}   # EnvPool's option defaults
        for task_id, builder in recipes.tasks().items():
            register_task(task_id, builder, config=configs.get(task_id))


# Ids the recipes of an extra would serve, recognised without importing it (for the hint below).
_MUJOCO_V5 = frozenset(MUJOCO_TASK_IDS)
_EXTRAS = {"mujoco": ("mujoco", "the ten MuJoCo -v5 tasks"), "ale_py": ("atari", "every Atari <Game>-v5")}


def missing_extras() -> dict[str, str]:
    """Extras whose built-in tasks are unavailable because their package is not installed:
    ``{extra: what it would add}``."""
    return {extra: what for needs, (extra, what) in _EXTRAS.items() if importlib.util.find_spec(needs) is None}


def _missing_extra_hint(task_id: str) -> str | None:
    """How to get ``task_id`` (bare, ``shmpool/`` or ``shmpool-recipe/``) when it is a built-in task whose extra is
    not installed."""
    namespace, _, name = task_id.rpartition("/")
    if namespace not in ("", TWIN_NAMESPACE, RECIPE_NAMESPACE):
        return None
    missing = missing_extras()
    if "mujoco" in missing and name in _MUJOCO_V5:
        return f"{task_id} is a built-in shmpool task: pip install 'shmpool[mujoco]'"
    if "atari" in missing and name.endswith("-v5") and name not in _MUJOCO_V5:
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


def recipe_constructors(task_id: str, num_envs: int, env_kwargs: dict) -> Any:
    """The recipe ``task_id``'s envs: ``builder(num_envs=n, **env_kwargs)``, one constructor per
    env (or a ``Batched``).  The one way every face hands a recipe its options."""
    _load_builtin_tasks()
    return _TASKS[task_id](num_envs=num_envs, **env_kwargs)


def recipe_id(task_id: str) -> str:
    """``Pong-v5`` -> ``shmpool-recipe/Pong-v5``: the recipe's id in gymnasium's registry."""
    return f"{RECIPE_NAMESPACE}/{task_id}"


def recipe_task(env_id: Any) -> str | None:
    """The recipe an id names in the gymnasium faces (see the module docstring), or None for a
    gymnasium id (or anything that is no recipe's id)."""
    if not isinstance(env_id, str) or ":" in env_id:
        return None
    namespace, _, name = env_id.rpartition("/")
    if namespace != RECIPE_NAMESPACE and (namespace not in ("", TWIN_NAMESPACE)
                                          or name in gymnasium.envs.registration.registry):
        return None   # gymnasium's id (Ant-v5, shmpool/Ant-v5) keeps meaning gymnasium's env
    _load_builtin_tasks()
    return name if name in _TASKS else None


def _check_extra(env_id: str) -> None:
    """An id no installed package serves but a missing extra's recipe would: gymnasium's error for
    it with the extra named (``pip install 'shmpool[atari]'``), as ``make`` says it."""
    hint = _missing_extra_hint(env_id)
    if hint is None:
        return
    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error as exc:
        raise type(exc)(f"{exc} ({hint})") from exc


def _recipes_for_faces(env_id: str, num_envs: int, env_kwargs: dict) -> Any:
    """What ``Pool``/``VectorEnv``/``ShmVecEnv`` build for an id: a recipe's envs, or None."""
    task = recipe_task(env_id)
    if task is None:
        _check_extra(env_id)
        return None
    return recipe_constructors(task, num_envs, env_kwargs)


know_recipes(_recipes_for_faces)


def _recipe_env(task_id: str, **kwargs: Any) -> gymnasium.Env:
    """``gymnasium.make`` of a recipe id: one env of the recipe."""
    fns = recipe_constructors(task_id, 1, kwargs)
    if not isinstance(fns, list):
        raise gymnasium.error.Error(f"{task_id} is a batched recipe: build it with a vector face "
                                    f"(shmpool.make_vec({task_id!r}, num_envs=...))")
    return fns[0]()


def _recipe_ids() -> list[str]:
    """Every recipe's id, read without importing mujoco (its ids are listed) or the Atari recipes."""
    ids = list(importlib.import_module(_BATCH_PONG).tasks())
    if "mujoco" not in missing_extras():
        ids += MUJOCO_TASK_IDS
    if "atari" not in missing_extras():
        ids += atari_games(importlib.import_module("ale_py.roms").get_all_rom_ids())
    return ids


def register_recipes() -> list[str]:
    """Put the recipes in gymnasium's registry (``import shmpool`` does this once): every recipe as
    ``shmpool-recipe/<id>``, and as ``shmpool/<id>`` where gymnasium has no ``<id>`` of its own.
    ``gymnasium.make_vec`` of them builds a shmpool VectorEnv of the recipe, ``gymnasium.make`` one
    recipe env (SB3's ``make_vec_env`` calls that in each env).  Returns the ids registered now."""
    registry = gymnasium.envs.registration.registry
    added = []
    for task in _recipe_ids():
        names = [recipe_id(task)] + ([] if task in registry else [twin_id(task)])
        for name in names:
            if name in registry:
                continue
            gymnasium.register(id=name, entry_point=functools.partial(_recipe_env, task),
                               vector_entry_point=functools.partial(vector_entry_point, name))
            added.append(name)
    return added


def _affinity_cpus(offset: int | None, num_threads: int | None) -> list[int] | None:
    """EnvPool's ``thread_affinity_offset``: workers use allowed cpus from ``offset`` on."""
    if offset is None or offset < 0:  # EnvPool's default -1: no particular core
        return None
    allowed = allowed_cpus()
    cpus = allowed[offset:] if num_threads is None else allowed[offset:offset + num_threads]
    if not cpus:
        raise ValueError(f"thread_affinity_offset={offset} is past the {len(allowed)} allowed cpus {allowed}")
    return cpus


def _envpool_seed(seed: Any) -> int | None:
    """The pool's base seed for EnvPool's ``seed``: EnvPool seeds env ``i``'s C++ generator with
    ``seed + i`` as an unsigned 32-bit number, so a negative seed (``-1``) wraps around."""
    seed = check_seed(seed)
    return None if seed is None else seed % 2**32


def _task_config(task_id: str, spec: EnvSpec | None, env_kwargs: dict) -> tuple[dict, float | None]:
    """EnvPool's task-specific config keys (after the common ones) and the reward threshold."""
    if task_id in _TASKS:
        return {**_TASK_CONFIGS.get(task_id, {}), **env_kwargs}, None
    steps = env_kwargs.get("max_episode_steps", spec.max_episode_steps)
    rest = {k: v for k, v in env_kwargs.items() if k != "max_episode_steps"}
    return {"max_episode_steps": steps, "reward_threshold": spec.reward_threshold, **rest}, spec.reward_threshold


def _pool_names(kwargs: dict, num_threads: int | None, offset: int | None) -> tuple[int | None, Any]:
    """``num_workers`` and ``cpus`` (taken out of ``kwargs``): the Pool's names of EnvPool's
    ``num_threads`` and ``thread_affinity_offset``; returns (num_threads, cpus or None)."""
    num_workers = kwargs.pop("num_workers", None)
    if num_workers is not None:
        num_workers = check_count("num_workers", num_workers)
        if num_threads and num_threads != num_workers:
            raise ValueError(f"num_workers={num_workers} and num_threads={num_threads} both set the number of "
                             "worker processes: give one")
        num_threads = num_workers
    cpus = kwargs.pop("cpus", None)
    if cpus is not None and offset is not None:
        raise ValueError(f"cpus={cpus!r} and thread_affinity_offset={offset} both choose the workers' cores: "
                         "give one")
    return num_threads, cpus


# make's keywords beyond its signature: EnvPool's render options and the Pool's names for its threads.
MAKE_KEYWORDS = frozenset({"render_mode", "render_env_id", "gym_reset_return_info", "num_workers", "cpus"})


# gymnasium's older ALE ids (ale-py registers them): Pong-v0, Pong-v4, PongNoFrameskip-v4, ...
_OLD_ALE_ID = re.compile(r"(?P<game>[A-Za-z]+?)(?:NoFrameskip|Deterministic)?-v[04]")


def warn_if_recipe_is_v5(task_id: str) -> None:
    """A UserWarning when ``task_id`` is one of gymnasium's older ALE ids of a game with an Atari recipe:
    EnvPool users write ``Pong-v4`` meaning EnvPool's preprocessed Pong, which here is ``Pong-v5``; gymnasium's
    env by that id (raw frames) is still what is built, since asking for it is legitimate."""
    found = _OLD_ALE_ID.fullmatch(task_id)
    recipe = f"{found['game']}-v5" if found else None
    if recipe in _TASKS:
        warnings.warn(f"{task_id} is gymnasium's ALE env (raw 210x160 RGB frames, no EnvPool preprocessing), built "
                      f"as asked; EnvPool's {recipe} (84x84 gray frames, 4 stacked, frame skip 4, no-op resets) is "
                      f"shmpool's recipe: shmpool.make({recipe!r})", UserWarning, stacklevel=3)


def make(
    task_id: str,
    env_type: str = "gymnasium",
    num_envs: int = 1,
    batch_size: int | None = None,
    num_threads: int | None = None,
    seed: int | None = 42,
    thread_affinity_offset: int | None = None,
    **kwargs: Any,
) -> EnvPoolEnv:
    """EnvPool's ``envpool.make`` over a shmpool :class:`VectorEnv`: an :class:`EnvPoolEnv`,
    which is a ``gymnasium.Env`` and a ``gymnasium.vector.VectorEnv`` (as EnvPool's env).

    - ``task_id``: a task with a shmpool recipe (:func:`list_tasks`: the MuJoCo v5 tasks
      when ``mujoco`` is installed, every Atari ``<Game>-v5`` with EnvPool's preprocessing
      when ``ale_py`` is installed) or any gymnasium id.  A recipe's id comes first, as in
      EnvPool: ``make("Ant-v5")`` is the recipe, where the gymnasium faces mean gymnasium's
      Ant by ``"Ant-v5"`` (and the recipe by ``"shmpool-recipe/Ant-v5"``).
    - ``env_type``: ``"gymnasium"`` (gymnasium's 5-tuple) or ``"gym"``: EnvPool's old gym
      API that CleanRL's EnvPool scripts use (``reset()`` returns the observations,
      ``step`` returns ``(obs, reward, done, info)`` with ``info["TimeLimit.truncated"]``).
      ``"dm"`` raises ``NotImplementedError`` saying why.
    - ``num_envs``; ``batch_size`` (``None``/0: ``num_envs``): how many envs
      ``recv()`` returns.
    - ``num_threads`` (``None``/0: one per allowed core, at most ``num_envs``): the number
      of worker processes; more than ``num_envs`` is accepted (EnvPool's extra threads
      idle; here one worker per env).  ``num_workers`` (the Pool's name) is the same.
    - ``seed`` (default 42, as EnvPool): env ``i`` is seeded ``seed + i`` (modulo 2**32, so
      ``-1`` works as in EnvPool) at its first reset; ``None``: unseeded.
    - ``thread_affinity_offset``: workers are pinned to the allowed cpus
      ``allowed[offset:offset + num_threads]`` (``None``/-1: all allowed cpus); or ``cpus``,
      the Pool's list of cores.
    - ``render_mode`` (``"rgb_array"``/``"human"``) and ``render_env_id``: EnvPool's
      ``render(env_ids)``.  ``gym_reset_return_info`` (``env_type="gym"`` only, default
      False): ``reset()`` returns ``(obs, info)``.
    - ``**kwargs``: keywords named like VectorEnv/pool parameters
      (``wait_policy``, ``autoreset_mode``, ...) configure the pool, the rest go
      to the env (the task's options, or ``gymnasium.make``).  ``info_ram=True`` (Atari)
      adds EnvPool's ``info["ram"]``, which EnvPool always sends (it costs a pickled info).

    ``env.config`` / ``env.spec.config`` have EnvPool's keys (26 for an Atari task, 11 for
    CartPole-v1); ``docs/porting/envpool.md`` lists what differs from envpool 1.2.5.
    """
    if env_type == "dm":
        raise NotImplementedError(
            "env_type='dm' is not implemented: EnvPool's dm_env face returns a TimeStep whose observation is a "
            "per-task namedtuple of every state key, generated from its C++ env spec; shmpool runs gymnasium envs, "
            "which have no such spec. Use env_type='gymnasium' (or 'gym' for the old 4-tuple API).")
    if env_type not in ENV_TYPES:
        raise ValueError(f"env_type must be 'gymnasium', 'gym' or 'dm', got {env_type!r}")
    check_typos("make", kwargs, POOL_KEYWORDS | VECTOR_PARAMETERS | keywords_of(make) | MAKE_KEYWORDS)
    render_mode = kwargs.pop("render_mode", None)
    if render_mode not in RENDER_MODES:
        raise ValueError("render_mode must be one of None, 'rgb_array', or 'human'")
    render_env_id = kwargs.pop("render_env_id", 0)
    return_info = kwargs.pop("gym_reset_return_info", env_type == "gymnasium")
    if env_type == "gymnasium" and not return_info:
        raise ValueError("env_type='gymnasium' always returns an info dict from reset(); "
                         "gym_reset_return_info=False is for env_type='gym'")
    num_envs = check_count("num_envs", num_envs)
    num_threads, cpus = _pool_names(kwargs, num_threads, thread_affinity_offset)
    workers = min(num_threads, num_envs) if num_threads else None   # EnvPool's 0 means "the default"
    pool_kwargs = dict(num_workers=workers, batch_size=batch_size or None, seed=_envpool_seed(seed),
                       cpus=_affinity_cpus(thread_affinity_offset, workers) if cpus is None else cpus)
    _load_builtin_tasks()
    env_kwargs, vector_kwargs = _split_vector_kwargs(kwargs)
    # The envs render to arrays; "human" shows them in the trainer's process, as EnvPool does.
    env_render = {} if render_mode is None else {"render_mode": "rgb_array"}
    face = dict(env_type=env_type, render_mode=render_mode, render_env_id=render_env_id, config={})
    try:
        spec = None if task_id in _TASKS else _find_spec(task_id)
        if spec is not None:
            warn_if_recipe_is_v5(task_id)
        if spec is None:
            env_fns = recipe_constructors(task_id, num_envs, {**env_kwargs, **env_render})
            env = EnvPoolEnv(env_fns, **face, **pool_kwargs, **vector_kwargs)
        else:
            env = EnvPoolEnv(task_id, num_envs, **face, **pool_kwargs, **vector_kwargs, **env_kwargs, **env_render)
    except gymnasium.error.Error as exc:
        hint = _missing_extra_hint(task_id)
        if hint is None:
            raise
        raise type(exc)(f"{exc} ({hint})") from exc
    task_config, reward_threshold = _task_config(task_id, spec, env_kwargs)
    config = base_config(num_envs, env.batch_size, num_threads or 0,
                         -1 if thread_affinity_offset is None else thread_affinity_offset,
                         seed, bool(return_info))
    env.set_config({**config, **task_config}, reward_threshold)
    return env
