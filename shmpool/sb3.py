"""Stable-Baselines3 face: ``ShmVecEnv``, an SB3 ``VecEnv`` over a shmpool ``Pool``.

Drop-in for ``DummyVecEnv`` / ``SubprocVecEnv``::

    from stable_baselines3.common.env_util import make_vec_env
    from shmpool.sb3 import ShmVecEnv

    venv = make_vec_env("CartPole-v1", n_envs=8, vec_env_cls=ShmVecEnv,
                        vec_env_kwargs={"num_workers": 2})

The pool runs in gymnasium's SAME_STEP autoreset mode, which is SB3's: an
ending step resets the env at once, returns the reset observation and puts
the last one in ``info["terminal_observation"]``.  This module turns the
pool's batched gymnasium infos back into SB3's list of per-env dicts.

What "identical to DummyVecEnv" means here: the same observations (same
dtypes), rewards (float32, as DummyVecEnv's buffer), dones and info dicts
with the same keys and equal values.  Numeric info scalars cross the pool in
batched arrays, as gymnasium batches them, which forgets whether the env gave
a python or a numpy scalar: values whose batch dtype is bool, int64 or
float64 (what python ``bool``/``int``/``float`` become) come back as python
scalars, every other dtype as a numpy scalar of that dtype (an env's
``np.float32`` stays ``np.float32``).  So an env's python scalars and
arrays round-trip exactly; an env's ``np.int64``/``np.float64``/``np.bool_``
scalar comes back as the equal python scalar.  Like gymnasium's vector infos,
a key's batch dtype is set by the first env that reports it in a step.

Requires the optional dependency ``stable-baselines3`` (``pip install shmpool[sb3]``).
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import concatenate, create_empty_array

try:
    from stable_baselines3.common.env_util import is_wrapped
    from stable_baselines3.common.vec_env.base_vec_env import (
        VecEnv,
        VecEnvIndices,
        VecEnvObs,
        VecEnvStepReturn,
    )
    from stable_baselines3.common.vec_env.patch_gym import _patch_env
except ImportError as _exc:  # pragma: no cover - exercised only without SB3
    raise ImportError("shmpool.sb3 needs stable-baselines3: pip install 'shmpool[sb3]' "
                      "(or 'stable-baselines3>=2.3')") from _exc

from .arguments import POOL_KEYWORDS, check_typos, env_constructors, keywords_of, refuse_env_instances
from .autoreset_modes import SAME_STEP, parse_autoreset_mode
from .errors import EnvError
from .info_rows import unbatch_info
from .pool import Pool
from .state import Pending
from .surface import PoolSurface

__all__ = ["ShmVecEnv"]

# What SAME_STEP adds to the batched infos of a step in which episodes ended.
_FINAL_KEYS = frozenset({"final_obs", "_final_obs", "final_info", "_final_info"})


# --- run inside the workers (through Pool.apply) --------------------------------


def _patched(fn: Callable[[], gym.Env]) -> gym.Env:
    return _patch_env(fn())  # what DummyVecEnv does with each constructor's env


def _env_method(env: gym.Env, name: str, args: tuple, kwargs: dict) -> Any:
    return env.get_wrapper_attr(name)(*args, **kwargs)


def _get_attr(env: gym.Env, name: str) -> Any:
    return env.get_wrapper_attr(name)


def _set_attr(env: gym.Env, name: str, value: Any) -> None:
    setattr(env, name, value)  # SB3 sets on the outermost env, not set_wrapper_attr


# --- parent side: infos and observations -------------------------------------


def _copy_obs(obs: Any) -> Any:
    """Fresh arrays for the pool's views (they are overwritten by the next step); Dict
    observations become an ``OrderedDict`` of arrays, as DummyVecEnv returns them."""
    if isinstance(obs, dict):
        return OrderedDict((k, _copy_obs(v)) for k, v in obs.items())
    if isinstance(obs, tuple):
        return tuple(_copy_obs(v) for v in obs)
    return np.array(obs)


def _raise_env_exception(exc: EnvError) -> NoReturn:
    """An env's exception re-raised as itself (DummyVecEnv lets it through), chained to the
    pool's ``EnvError`` (which names the env and holds the worker's traceback); the
    ``EnvError`` itself when the exception could not be unpickled."""
    if exc.remote_exception is not None:
        raise exc.remote_exception from exc
    raise exc


@contextlib.contextmanager
def _env_exceptions() -> Iterator[None]:
    """``_raise_env_exception`` around a block."""
    try:
        yield
    except EnvError as exc:
        _raise_env_exception(exc)


# --- the VecEnv ----------------------------------------------------------------


class ShmVecEnv(VecEnv):
    """An SB3 ``VecEnv`` whose envs run in a shmpool ``Pool`` (pinned workers, shared memory).

    ``env_fns`` is any of:

    - a list of env constructors, as for ``SubprocVecEnv`` (what ``make_vec_env`` passes);
    - one constructor plus ``num_envs``;
    - a gymnasium id plus ``num_envs`` (extra keyword arguments that are not ``Pool``
      arguments go to ``gymnasium.make``), or a recipe id (``"Pong-v5"`` with EnvPool's
      options, ``"shmpool-recipe/Ant-v5"``; see ``shmpool.registration``);
    - an existing ``Pool`` (or ``shmpool.distributed.RayPool``) built with
      ``autoreset_mode="same_step"`` (``ShmVecEnv`` then owns it and closes it).

    ``start_method`` and ``**pool_kwargs`` (``num_workers``, ``cpus``, ``wait_policy``,
    ``step_timeout``, ``seed``...) go to ``Pool``; ``start_method=None`` is the pool's
    default, not SubprocVecEnv's forkserver.

    Shapes and dtypes, with ``n = num_envs``:

    - ``reset()`` -> obs: ``(n, *obs_shape)`` in the space's dtype; Dict spaces give an
      ``OrderedDict`` of such arrays, Tuple spaces a tuple.  ``reset_infos``: list of n dicts.
    - ``step(actions)``: ``actions`` shaped ``(n, *action_shape)``; returns obs as above,
      rewards ``(n,)`` float32 (as DummyVecEnv), dones ``(n,)`` bool
      (``terminated | truncated``) and a list of n info dicts, each with
      ``"TimeLimit.truncated"`` and, for a done env, ``"terminal_observation"``.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]] | Callable[[], gym.Env] | str | PoolSurface,
        start_method: str | None = None,
        *,
        num_envs: int | None = None,
        **pool_kwargs: Any,
    ) -> None:
        self._pool = self._build_pool(env_fns, start_method, num_envs, pool_kwargs)
        self._life = self._pool.lifecycle   # the one state: whether a step is pending, whether closed
        super().__init__(self._pool.num_envs, self._pool.single_observation_space,
                         self._pool.single_action_space)
        # DummyVecEnv exposes the env's own metadata (render_fps etc.), not VecEnv's stub.
        self.metadata = dict(self._pool.metadata)

    @staticmethod
    def _build_pool(env_fns, start_method, num_envs, pool_kwargs) -> PoolSurface:
        if isinstance(env_fns, PoolSurface):
            if start_method is not None or num_envs is not None or pool_kwargs:
                raise TypeError("ShmVecEnv(pool) takes no other arguments: the pool is already built")
            if env_fns.autoreset_mode != SAME_STEP:
                raise ValueError(
                    f"ShmVecEnv needs a pool with autoreset_mode='same_step' (SB3's autoreset), "
                    f"got {env_fns.autoreset_mode!r}")
            return env_fns
        check_typos("ShmVecEnv", pool_kwargs, POOL_KEYWORDS | keywords_of(ShmVecEnv.__init__))
        mode = pool_kwargs.pop("autoreset_mode", SAME_STEP)
        if parse_autoreset_mode(mode) != SAME_STEP:
            raise ValueError(f"ShmVecEnv always uses autoreset_mode='same_step' (SB3's), got {mode!r}")
        refuse_env_instances(env_fns)   # before it is taken for a constructor or a list of them
        if isinstance(env_fns, str):
            # A gymnasium id or a recipe id (Pong-v5, with EnvPool's options), as every face resolves it.
            env_kwargs = {k: pool_kwargs.pop(k) for k in list(pool_kwargs) if k not in POOL_KEYWORDS}
            fns = env_constructors(env_fns, num_envs, env_kwargs)
            if not isinstance(fns, list):
                raise ValueError(
                    f"{env_fns} is a batched recipe (one object steps a worker's envs), which SB3's VecEnv cannot "
                    "host: it asks every env for its attributes (render_mode, ...) one by one. Use "
                    f"shmpool.make_vec({env_fns!r}, num_envs=...) or shmpool.make")
        elif callable(env_fns):
            if num_envs is None:
                raise ValueError("num_envs is required when the env is given by one callable")
            fns = [env_fns] * num_envs
        else:
            fns = list(env_fns)
            if num_envs is not None and num_envs != len(fns):
                raise ValueError(f"num_envs={num_envs} but {len(fns)} env constructors were given")
        return Pool([functools.partial(_patched, f) for f in fns], start_method=start_method,
                    autoreset_mode=SAME_STEP, **pool_kwargs)

    @property
    def pool(self) -> PoolSurface:
        """The underlying ``shmpool.Pool`` (or ``RayPool``)."""
        return self._pool

    def __repr__(self) -> str:
        """``ShmVecEnv(num_envs=n) over Pool(...)``: the pool's plan (layout, waits, crowding)."""
        return f"{type(self).__name__}(num_envs={self.num_envs}) over {self._pool!r}"

    # --- stepping -------------------------------------------------------------

    def reset(self) -> VecEnvObs:
        """Reset every env with the seeds/options set by ``seed()``/``set_options()`` (used
        once, as SB3 does); returns the observations, keeps infos in ``reset_infos``."""
        if self._life.pending is Pending.STEP:
            # SB3: a reset cancels a pending step; the pool must finish it first.
            self._pool.step_wait()
        # As DummyVecEnv: an env without options is reset with no ``options`` argument.
        with _env_exceptions():
            obs, infos = self._pool.reset(seed=list(self._seeds), options=[o or None for o in self._options])
        self.reset_infos = [unbatch_info(infos, i) for i in range(self.num_envs)]
        self._reset_seeds()
        self._reset_options()
        return _copy_obs(obs)

    def step_async(self, actions: np.ndarray | list) -> None:
        """Start stepping every env; ``actions`` is ``(num_envs, *action_shape)``, or for Dict/Tuple
        action spaces a list with one action (dict/tuple) per env, as SB3 passes them."""
        if isinstance(actions, list) and isinstance(self.action_space, (gym.spaces.Dict, gym.spaces.Tuple)):
            actions = concatenate(self.action_space, actions, create_empty_array(self.action_space, self.num_envs))
        self._pool.step_async(actions)

    def step_wait(self) -> VecEnvStepReturn:
        """``(obs, rewards float32 (n,), dones bool (n,), infos list of n dicts)``."""
        try:   # _env_exceptions, inline: the context manager costs 2 µs a step
            obs, rewards, terminated, truncated, infos = self._pool.step_wait()
        except EnvError as exc:
            _raise_env_exception(exc)
        dones = terminated | truncated
        return _copy_obs(obs), rewards.astype(np.float32), dones, self._sb3_infos(infos, terminated, truncated)

    def _sb3_infos(self, infos: dict, terminated: np.ndarray, truncated: np.ndarray) -> list[dict]:
        n = self.num_envs
        if not infos:  # nothing reported and, in SAME_STEP mode, no episode ended
            return [{"TimeLimit.truncated": False} for _ in range(n)]
        # SAME_STEP puts an ended env's reset info at the top level and its last step's info
        # under final_info; the top level without the final_* keys is everyone's own info.
        ended = infos.get("_final_obs")
        final = infos.get("final_info")
        top = {k: v for k, v in infos.items() if k not in _FINAL_KEYS}
        # The common case (no env reported anything but the final_* of ended episodes) builds
        # the n dicts in one comprehension: at N=32 the per-env loop was most of CartPole's cost.
        ended_ids = [] if ended is None else ended.nonzero()[0].tolist()
        if top:
            just_reset = set(ended_ids)
            out = []
            for i in range(n):
                info = unbatch_info(top, i)
                if i in just_reset:
                    self.reset_infos[i] = info   # an ended env's own info is its reset info
                else:
                    info["TimeLimit.truncated"] = False
                out.append(info)
        else:
            out = [{"TimeLimit.truncated": False} for _ in range(n)]
            for i in ended_ids:
                self.reset_infos[i] = {}
        for i in ended_ids:
            info = unbatch_info(final, i) if final is not None and infos["_final_info"][i] else {}
            info["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            info["terminal_observation"] = infos["final_obs"][i]
            out[i] = info
        return out

    def close(self) -> None:
        """Close the envs and stop the workers.  Idempotent."""
        if self._life.pending is Pending.STEP:
            try:
                self._pool.step_wait()
            except Exception:
                pass  # closing anyway; the pool reports nothing more useful here
        self._pool.close()

    @property
    def closed(self) -> bool:
        return self._pool.closed

    # --- rendering --------------------------------------------------------------

    def get_images(self) -> Sequence[np.ndarray | None]:
        """``env.render()`` of every env: ``(H, W, 3)`` uint8 arrays when ``render_mode`` is
        ``"rgb_array"``, else a warning and ``None`` per env (as DummyVecEnv)."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.",
                stacklevel=2)
            return [None] * self.num_envs
        return self._apply(_env_method, list(range(self.num_envs)), "render", (), {})

    # --- attributes and methods -------------------------------------------------

    def _indices(self, indices: VecEnvIndices) -> list[int]:
        """SB3's ``_get_indices`` (None, int or iterable), with negative indices counted from
        the end as DummyVecEnv's list indexing does."""
        if isinstance(indices, (int, np.integer)):
            indices = [indices]
        ids = list(self._get_indices(indices))
        n = self.num_envs
        out = []
        for i in ids:
            if not -n <= i < n:
                raise IndexError(f"env index {i} is out of range for {n} envs")
            out.append(int(i) % n)
        return out

    def _apply(self, fn: Callable[..., Any], ids: list[int], *args: Any) -> list[Any]:
        """``fn(env, *args)`` in the chosen envs; an env's exception is re-raised as itself
        (as DummyVecEnv would let it through), chained to the pool's ``EnvError``."""
        with _env_exceptions():
            return list(self._pool.apply(fn, *args, env_ids=ids))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """``env.get_wrapper_attr(attr_name)`` of the chosen envs, in ``indices`` order."""
        ids = self._indices(indices)
        return self._apply(_get_attr, ids, attr_name) if ids else []

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """``setattr(env, attr_name, value)`` on the chosen envs (the outermost wrapper, as SB3);
        ``value`` is the same for each, even if it is a list."""
        ids = self._indices(indices)
        if ids:
            self._apply(_set_attr, ids, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        """``env.get_wrapper_attr(method_name)(*args, **kwargs)`` in the chosen envs only, results
        in ``indices`` order.  Arguments may be anything cloudpickle can send."""
        ids = self._indices(indices)
        return self._apply(_env_method, ids, method_name, method_args, method_kwargs) if ids else []

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether each chosen env has ``wrapper_class`` in its wrapper chain."""
        ids = self._indices(indices)
        return self._apply(is_wrapped, ids, wrapper_class) if ids else []
