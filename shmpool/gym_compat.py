"""The one room where shmpool meets the installed gymnasium's version: 1.1 on, 1.0, or 0.29.x (``LEGACY``).

Everything of gymnasium that exists in one version only, and everything the faces do differently
under the two, is decided here once, at import; the rest of shmpool imports these names and has no
version test of its own.  Installing shmpool never moves the user's gymnasium (``gymnasium>=0.29.1``).

Under gymnasium 1.1 on, every name below is gymnasium's own and every function is what the faces did
before this module existed.  Under 1.0, the same but for ``AutoresetMode`` (1.1's enum, a stand-in here):
1.0's vector envs autoreset on the next step only and their metadata has no ``autoreset_mode``, so
shmpool's default is NEXT_STEP and its metadata has none either; ``autoreset_mode=`` is shmpool's own
keyword there (as under 0.29, kept rather than refused: a script written for it keeps working) and
``"same_step"`` gives 1.1's layout, ``final_obs``/``final_info``.  Under 0.29, shmpool's faces behave as
0.29's ``AsyncVectorEnv``:

- **One autoreset, on the same step.**  0.29's vector envs reset an ending env inside the step
  that ended it and return the reset observation; the last observation and info are in
  ``infos["final_observation"]`` / ``infos["final_info"]`` (object arrays, ``None`` for the envs
  that did not end) with their ``_final_observation`` / ``_final_info`` masks.  So the pool runs
  SAME_STEP (``DEFAULT_AUTORESET``) and :func:`present_infos` renames and re-lays its infos.
  (The EnvPool face keeps EnvPool's next-step autoreset under 0.29 too: ``shmpool.envpool_env``.)
  ``autoreset_mode=`` is *mapped*, not refused: 0.29's ``AsyncVectorEnv`` has no such keyword, so
  no 0.29 code passes it by habit, and code written for shmpool's own keyword (an EnvPool script
  that wants EnvPool's next-step autoreset) keeps working; ``"same_step"`` is 0.29's behaviour
  above, ``"next_step"``/``"disabled"`` are the pool's modes as under 1.x, with 0.29's info layout.
- **0.29's info layout.**  0.29's ``VectorEnv._add_info`` batches numbers (python's or numpy's)
  into arrays of their type and keeps everything else, dicts and arrays included, as one object
  per env; 1.x recurses into dicts and stacks arrays.  :func:`present_infos` rebuilds 0.29's
  layout from each env's own info.  So a leaf inside an env's dict must keep the value the env gave
  where 1.x's batching would change it (``KEEP_NESTED_VALUES``: a None among floats is not NaN).
- **Reset arguments.**  0.29 passes ``seed=``/``options=`` to an env's ``reset`` only when they
  are given (:func:`reset_kwargs`); 1.x always passes both.
- **Dict observations are OrderedDicts** (what 0.29's Dict spaces sample and its vector envs
  batch into), ``DICT_TYPE``.
- **call's refused names and message** (:func:`not_callable`), and the metadata (0.29's has no
  ``autoreset_mode``, :func:`vector_metadata`).
- ``AutoresetMode`` and ``VectorizeMode`` (1.x's enums) are stand-ins of the same members and values;
  ``batch_differing_spaces`` (``observation_mode="different"``, a 1.x keyword) is refused with the
  reason; ``is_space_dtype_shape_equiv`` is shmpool's own rule for the spaces the pool lays out.
"""
from __future__ import annotations

import enum
from collections import OrderedDict
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from .info_rows import unbatch_info

__all__ = ["DEFAULT_AUTORESET", "DICT_TYPE", "FINAL_OBS_AS_OBJECTS", "GYMNASIUM_VERSION", "HAS_AUTORESET_MODE",
           "KEEP_NESTED_VALUES", "LEGACY", "NOT_CALLABLE", "AutoresetMode", "VectorizeMode",
           "batch_differing_spaces", "hosted_autoreset_mode", "is_space_dtype_shape_equiv", "not_callable",
           "own_info", "present_infos", "reset_kwargs", "same_step_info", "vector_metadata"]

GYMNASIUM_VERSION = tuple(int(p) for p in gymnasium.__version__.split(".")[:2] if p.isdigit())
#: gymnasium 0.29.x is installed (the vector API before 1.0).
LEGACY = GYMNASIUM_VERSION < (1, 0)
#: gymnasium has ``AutoresetMode`` (1.1 on): its vector envs take ``autoreset_mode=``.
HAS_AUTORESET_MODE = GYMNASIUM_VERSION >= (1, 1)
#: Whether the pool's batch keeps each env's own value of a leaf inside its info dicts where 1.x's batching (the first
#: env's value decides the array) would change it: a None or an int stored into a float array becomes NaN or a float,
#: a float into an int array an int.  0.29 keeps such a dict whole, one object per env, so the face's rebuilt layout
#: (:func:`present_infos`) must find the values the envs gave.
KEEP_NESTED_VALUES = LEGACY
#: Whether the vector envs batch an info key ``final_obs`` as one object per env whatever its values (1.1's
#: ``_add_info``, for SAME_STEP's final observations; 0.29's layout is rebuilt from each env's own info anyway), not
#: as any other key (1.0's, which has no SAME_STEP: an env's own ``final_obs`` arrays are stacked there).
FINAL_OBS_AS_OBJECTS = GYMNASIUM_VERSION != (1, 0)


if HAS_AUTORESET_MODE:
    from gymnasium.vector import AutoresetMode  # noqa: F401  (re-exported)
else:
    class AutoresetMode(enum.Enum):
        """gymnasium 1.1's ``AutoresetMode``, which 0.29 and 1.0 lack: the same members and values, so
        ``autoreset_mode=`` (shmpool's keyword there) takes the same names under every version."""

        NEXT_STEP = "NextStep"
        SAME_STEP = "SameStep"
        DISABLED = "Disabled"


if LEGACY:
    class VectorizeMode(enum.Enum):
        """The modes 0.29's (experimental) ``gymnasium.make_vec`` knows; ``"custom"`` is its
        name for 1.x's ``"vector_entry_point"``."""

        ASYNC = "async"
        SYNC = "sync"
        VECTOR_ENTRY_POINT = "custom"

    #: What a VectorEnv built without ``autoreset_mode`` runs: 0.29's only autoreset.
    DEFAULT_AUTORESET = AutoresetMode.SAME_STEP
    #: Names ``call`` refuses (0.29's worker refuses them with a ValueError).
    NOT_CALLABLE = ("reset", "step", "seed", "close")
    _NOT_CALLABLE_MESSAGE = "Trying to call function `{name}` with `_call`. Use `{name}` directly instead."
else:
    from gymnasium.envs.registration import VectorizeMode  # noqa: F401  (re-exported)

    #: 1.x's default autoreset (1.0's only one).
    DEFAULT_AUTORESET = AutoresetMode.NEXT_STEP
    NOT_CALLABLE = ("reset", "step", "close", "_setattr", "_check_spaces")
    _NOT_CALLABLE_MESSAGE = "Trying to call function `{name}` with `call`, use `{name}` directly instead."


#: The mapping a Dict space's values are: what ``Dict.sample()`` gives and the vector envs batch into.
DICT_TYPE: type[dict] = OrderedDict if LEGACY else dict


def not_callable(name: str) -> ValueError:
    """The error ``call(name)`` raises for a name in ``NOT_CALLABLE``, as the installed
    gymnasium's ``AsyncVectorEnv`` words it."""
    return ValueError(_NOT_CALLABLE_MESSAGE.format(name=name))


def reset_kwargs(seed: Any, options: Any) -> dict[str, Any]:
    """The keywords an env's ``reset`` gets from a vector env: both always under 1.x; under 0.29
    only those given (its ``AsyncVectorEnv`` leaves out a None seed and None options)."""
    if not LEGACY:
        return {"seed": seed, "options": options}
    return {k: v for k, v in (("seed", seed), ("options", options)) if v is not None}


def hosted_autoreset_mode(env: Any, metadata: dict) -> Any:
    """The autoreset of a gymnasium VectorEnv the pool hosts as a batched shard: 1.x's metadata says
    it.  Under 0.29 one is refused: its autoreset puts ``final_observation`` in infos, which the
    pool's batched shards do not read (host its envs one by one instead: ``VectorEnv(env_fns)``)."""
    if LEGACY:
        raise TypeError(f"hosting a gymnasium VectorEnv ({type(env).__name__}) in a pool needs gymnasium>=1.0; "
                        "under gymnasium 0.29 give the pool its env constructors instead")
    return metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)


def vector_metadata(env_metadata: dict, mode: Any) -> dict:
    """A vector env's metadata: a copy of its envs', plus ``autoreset_mode`` from gymnasium 1.1 on (0.29's and 1.0's
    vector envs have none)."""
    out = dict(env_metadata)
    if HAS_AUTORESET_MODE:
        out["autoreset_mode"] = mode
    return out


# --- spaces -----------------------------------------------------------------------------

_FUNDAMENTAL = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def _same_type_shape_dtype(a: spaces.Space, b: spaces.Space) -> bool:
    """Whether two spaces share type, shapes and dtypes (bounds may differ), for the spaces the
    pool lays out in shared memory; NotImplementedError for others (the caller compares them)."""
    if isinstance(a, spaces.Dict):
        return (isinstance(b, spaces.Dict) and a.spaces.keys() == b.spaces.keys()
                and all(_same_type_shape_dtype(a[k], b[k]) for k in a.spaces))
    if isinstance(a, spaces.Tuple):
        return (isinstance(b, spaces.Tuple) and len(a) == len(b)
                and all(_same_type_shape_dtype(x, y) for x, y in zip(a, b)))
    if isinstance(a, _FUNDAMENTAL):
        return isinstance(b, type(a)) and a.shape == b.shape and a.dtype == b.dtype
    raise NotImplementedError(f"no type/shape/dtype rule for {type(a).__name__}")


def _no_differing_spaces(spaces_: list) -> spaces.Space:
    raise ValueError("observation_mode='different' needs gymnasium>=1.0 (gymnasium 0.29's vector envs take one "
                     "observation space for every env): give envs with equal observation spaces, or upgrade")


if LEGACY:
    is_space_dtype_shape_equiv = _same_type_shape_dtype
    batch_differing_spaces = _no_differing_spaces
else:
    from gymnasium.spaces.utils import is_space_dtype_shape_equiv  # noqa: F401  (re-exported)
    from gymnasium.vector.utils import batch_differing_spaces  # noqa: F401  (re-exported)


# --- infos ------------------------------------------------------------------------------

# What the pool's SAME_STEP adds to a step's infos (gymnasium 1.x's names).
_FINAL_KEYS = ("final_obs", "_final_obs", "final_info", "_final_info")
# Keys the pool's recv adds to every row, without a mask: they stay as they are.
_POOL_KEYS = ("env_id",)


def _add_info_0_29(infos: dict, info: dict, i: int, n: int) -> None:
    """gymnasium 0.29's ``VectorEnv._add_info``: a number (python's or numpy's, not np.bool_)
    into an array of its type, anything else into an object array (None elsewhere); one
    ``_key`` mask per key; dicts are not recursed."""
    for key, value in info.items():
        array = infos.get(key)
        if array is None:
            kind = type(value)
            if kind in (int, float, bool) or issubclass(kind, np.number):
                array = np.zeros(n, dtype=kind)
            else:
                array = np.full(n, None, dtype=object)
            infos[key], infos[f"_{key}"] = array, np.zeros(n, dtype=bool)
        array[i] = value
        infos[f"_{key}"][i] = True


# Under 0.29 an env's own keys of the pool's final keys' names travel under this prefix (:func:`own_info`), from
# every reset and step, so that in the pool's batch (1.x's layout) they never meet the pool's ``final_obs`` and
# ``final_info`` of another env (a string ``final_info`` beside an ended env's dict raised; an env's ``_final_obs``
# met the pool's mask of ``final_obs``); the prefix on an env's key that already starts with it keeps the
# renaming reversible.  :func:`present_infos` gives them back under their own names.
_OWN_KEY = "\x1fenv-info\x1f"


def _own_key(key: Any) -> bool:
    return type(key) is str and (key in _FINAL_KEYS or key.startswith(_OWN_KEY))


def _own_info_0_29(info: Any) -> Any:
    if not isinstance(info, dict) or not any(_own_key(key) for key in info):
        return info
    return {(_OWN_KEY + key if _own_key(key) else key): value for key, value in info.items()}


def _own_info_1_x(info: Any) -> Any:
    return info


#: ``own_info(info)``: an env's info dict (from ``reset`` or ``step``) as the worker hands it to the pool.  1.x: as it
#: is (its vector envs' ``final_obs``/``final_info`` are their own keys, an env's of those names meets them as in
#: ``AsyncVectorEnv``).  0.29: the env's keys of those names renamed (``_OWN_KEY``), since under 0.29 they are
#: ordinary keys that its vector envs return unchanged.
own_info = _own_info_0_29 if LEGACY else _own_info_1_x


def same_step_info(final: dict, reset_info: dict) -> dict:
    """What a worker's SAME_STEP returns for an ended env: the pool's ``final`` (``final_obs``, ``final_info``)
    with the env's reset info (already through :func:`own_info`), as 1.x's ``AsyncVectorEnv`` merges them (a
    reset info's ``final_obs`` replaces the pool's there; under 0.29 it was renamed and cannot)."""
    return {**final, **reset_info}


def _env_key(key: Any) -> Any:
    """An env's own key as the env gave it (:func:`own_info`)."""
    return key[len(_OWN_KEY):] if type(key) is str and key.startswith(_OWN_KEY) else key


def _needs_relayout(infos: dict) -> bool:
    """Whether 1.x's layout of an env's own ``infos`` differs from 0.29's: nested dicts or stacked
    arrays (numbers and object arrays are batched alike by both), or keys of an env's that travel renamed."""
    for key, value in infos.items():
        if isinstance(value, dict) or (type(key) is str and key.startswith((_OWN_KEY, "_" + _OWN_KEY))):
            return True
        if isinstance(value, np.ndarray) and value.ndim > 1:
            return True
    return False


def _legacy_infos(infos: dict, rows: int, autoreset: Any = None, terminated: np.ndarray | None = None,
                  truncated: np.ndarray | None = None) -> dict:
    """The pool's batched infos (gymnasium 1.x's layout) in gymnasium 0.29's: each env's own info
    rebuilt and batched again with 0.29's rules, in env order (the first env with a key decides
    its array, as in 0.29); an ended env's info is its reset info plus ``final_observation`` and
    ``final_info`` (its last step's info), as 0.29's worker builds it.

    Only the rows whose episode ended under SAME_STEP (``autoreset``, ``terminated | truncated``) carry
    the pool's ``final_obs``/``final_info``: in every other row a key of those names is the env's own,
    an ordinary key under 0.29, and stays as the env gave it."""
    if not infos:
        return infos
    ended = None
    if autoreset is AutoresetMode.SAME_STEP and terminated is not None:
        ended = terminated | truncated
        if not ended.any():
            ended = None
    if ended is None and not _needs_relayout(infos):
        return infos
    kept = {k: infos[k] for k in _POOL_KEYS if k in infos}
    everything = {k: v for k, v in infos.items() if k not in kept}
    if ended is not None:
        own_keys = {k: v for k, v in everything.items() if k not in _FINAL_KEYS}
        final_obs = infos.get("final_obs")
        final_info = infos.get("final_info", {})
        final_mask = infos.get("_final_info")
    out: dict = {}
    for i in range(rows):
        if ended is None or not ended[i]:
            own = {_env_key(k): v for k, v in unbatch_info(everything, i).items()}
        else:
            own = {_env_key(k): v for k, v in unbatch_info(own_keys, i).items()}
            own["final_observation"] = None if final_obs is None else final_obs[i]
            last = unbatch_info(final_info, i) if final_mask is None or final_mask[i] else {}
            own["final_info"] = {_env_key(k): v for k, v in last.items()}
        if own:
            _add_info_0_29(out, own, i, rows)
    out.update(kept)
    return out


def _infos_as_they_are(infos: dict, rows: int, autoreset: Any = None, terminated: np.ndarray | None = None,
                       truncated: np.ndarray | None = None) -> dict:
    return infos


#: ``present_infos(infos, rows, autoreset=None, terminated=None, truncated=None)``: the pool's batched infos of
#: ``rows`` results as the installed gymnasium's vector envs lay them out (1.x: as they are).  ``autoreset`` (the
#: face's ``AutoresetMode``) and a step's flags say which rows carry the pool's own final keys (none for a reset).
present_infos = _legacy_infos if LEGACY else _infos_as_they_are
