"""Natively batched envs: one object steps a worker's whole shard in one call.

A worker normally holds one env object per env and steps them one by one.  An
env written with numpy over all its instances (``shmpool.workers.recipes.batch_pong.BatchPong``,
gymnasium's ``CartPoleVectorEnv``) is much cheaper stepped as a batch, so a
worker can host one *batched* env for its shard instead::

    from shmpool.batched import Batched
    from shmpool.workers.recipes.batch_pong import BatchPong

    pool = shmpool.Pool(Batched(BatchPong), num_envs=16384)   # BatchPong(n, start) per worker

``Batched(make_fn)``: ``make_fn(n, start)`` builds the batched env of one
worker's shard, ``n`` envs whose global ids are ``start..start+n-1``.  It may
return a :class:`BatchEnv` (this module's protocol) or a gymnasium
``VectorEnv`` with ``n`` envs (adapted by :class:`VectorEnvAdapter`).
``shmpool.make("BatchPong-v0", num_envs=...)`` builds one the same way.

The :class:`BatchEnv` protocol
------------------------------
Attributes: ``num_envs``, ``single_observation_space``, ``single_action_space``,
``metadata`` (and optionally ``render_mode``, ``spec``); class attributes
``autoreset_modes`` (the modes it implements) and ``supports_subsets``.

- ``bind(obs, reward, terminated, truncated, autoreset_mode)`` is called once,
  before anything else, with the shard's rows of the shared-memory result
  arrays (leading axis ``num_envs``; ``obs`` is a dict/tuple of arrays for
  Dict/Tuple spaces; ``reward`` float64, flags bool).  Results are written
  there in place, never returned.
- ``reset(env_ids, seeds, options) -> infos``: reset the envs ``env_ids``
  (int64 array of *local* indices ``0..num_envs-1``, unique, ascending);
  ``seeds[k]`` (int or None) is the seed of ``env_ids[k]``; ``options`` is
  None, one dict for all, or a list with one entry per ``env_ids`` entry.
  Writes their ``obs`` rows (the worker zeroes their reward and flags).
- ``step(env_ids, actions) -> infos``: step ``env_ids`` (as above; any subset
  when ``supports_subsets``) with ``actions[k]`` for ``env_ids[k]`` (batched
  like the action space; valid during the call only) and write their
  ``obs``, ``reward``, ``terminated``, ``truncated`` rows.  Autoreset is the
  env's job, in the mode given to ``bind``: under NEXT_STEP an env whose
  episode ended is reset by its next step (reward 0, flags False, its action
  ignored), as gymnasium's vector envs do.
- ``infos`` use gymnasium's vector layout *over the rows of* ``env_ids``:
  ``infos[key]`` has one entry per ``env_ids`` entry and ``infos["_" + key]``
  is its bool mask ({} when there is nothing to say).  Numeric 1-d columns go
  through shared memory; anything else through the worker's side channel.
- ``close()``.

Per-env ``call``/``get_attr``/``set_attr``/``apply`` are refused on a batched
shard (there is no object per env).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np

from .autoreset_modes import DISABLED, NEXT_STEP, SAME_STEP, parse_autoreset_mode
from .gym_compat import hosted_autoreset_mode
from .spacetree import tree_of

__all__ = ["BatchEnv", "Batched", "BatchedEnvs", "VectorEnvAdapter", "as_batch_env", "check_hosting",
           "hosting_info"]


class BatchEnv:
    """Base class (and documentation) of the batched env protocol; see the module docstring."""

    num_envs: int
    single_observation_space: gymnasium.spaces.Space
    single_action_space: gymnasium.spaces.Space
    metadata: dict = {}
    render_mode: str | None = None
    spec = None
    #: autoreset modes this env implements (shmpool.autoreset_modes names)
    autoreset_modes: tuple[str, ...] = (NEXT_STEP,)
    #: whether ``step`` accepts any subset of its envs (async send/recv needs it)
    supports_subsets: bool = True

    def bind(self, obs, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
             autoreset_mode: str = NEXT_STEP) -> None:
        mode = parse_autoreset_mode(autoreset_mode)
        if mode not in self.autoreset_modes:
            raise NotImplementedError(
                f"{type(self).__name__} does not implement autoreset_mode {mode!r} "
                f"(it implements {', '.join(self.autoreset_modes)})")
        self.obs, self.reward, self.terminated, self.truncated = obs, reward, terminated, truncated
        self.autoreset_mode = mode

    def reset(self, env_ids: np.ndarray, seeds: Sequence[int | None], options=None) -> dict:
        raise NotImplementedError

    def step(self, env_ids: np.ndarray, actions) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        pass


class VectorEnvAdapter(BatchEnv):
    """Hosts a gymnasium ``VectorEnv`` as a :class:`BatchEnv`.

    A gymnasium VectorEnv steps all its envs at once, so ``step`` takes the whole
    shard only (the pool refuses ``batch_size < num_envs``), and the pool's
    autoreset mode must be the env's own.  Seeds: gymnasium's Sync/Async vector
    envs get the list of seeds; any other VectorEnv (e.g. ``CartPoleVectorEnv``,
    which takes one int) gets the seed of its first env."""

    supports_subsets = False

    def __init__(self, env: gymnasium.vector.VectorEnv) -> None:
        self.env = env
        self.num_envs = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        self.render_mode = getattr(env, "render_mode", None)
        self.spec = getattr(env, "spec", None)
        self.autoreset_modes = (parse_autoreset_mode(hosted_autoreset_mode(env, self.metadata)),)
        self._lists = isinstance(env, (gymnasium.vector.SyncVectorEnv, gymnasium.vector.AsyncVectorEnv))
        self._split_obs = tree_of(self.single_observation_space).split

    def _check_all(self, env_ids: np.ndarray, what: str) -> None:
        if len(env_ids) != self.num_envs:
            raise ValueError(
                f"a gymnasium VectorEnv {what}s all its envs at once: got {len(env_ids)} of its "
                f"{self.num_envs} envs; use batch_size=num_envs or a shmpool.batched.BatchEnv")

    def _write(self, obs, reward, terminated, truncated) -> None:
        for dst, src in zip(self._split_obs(self.obs), self._split_obs(obs)):
            dst[...] = src
        if reward is not None:
            self.reward[...] = reward
            self.terminated[...] = terminated
            self.truncated[...] = truncated

    def reset(self, env_ids, seeds, options=None) -> dict:
        if isinstance(options, list):
            raise ValueError("a gymnasium VectorEnv takes one options dict for all its envs, not one per env")
        if len(env_ids) != self.num_envs:
            mask = np.zeros(self.num_envs, dtype=bool)
            mask[env_ids] = True
            options = {**(options or {}), "reset_mask": mask}
        seeds = list(seeds)
        if all(s is None for s in seeds):
            seed = None
        elif self._lists:
            seed = [None] * self.num_envs
            for j, s in zip(env_ids, seeds):
                seed[j] = s
        else:
            seed = seeds[0]
        obs, infos = self.env.reset(seed=seed, options=options)
        self._write(obs, None, None, None)
        return _rows(infos, env_ids, self.num_envs)

    def step(self, env_ids, actions) -> dict:
        self._check_all(env_ids, "step")
        obs, reward, terminated, truncated, infos = self.env.step(actions)
        self._write(obs, reward, terminated, truncated)
        return infos

    def close(self) -> None:
        self.env.close()


def _rows(infos: dict, env_ids: np.ndarray, n: int) -> dict:
    """Infos over all ``n`` envs, restricted to the rows ``env_ids``."""
    if not infos or len(env_ids) == n:
        return infos
    out = {}
    for key, value in infos.items():
        if isinstance(value, dict):
            out[key] = _rows(value, env_ids, n)
        else:
            out[key] = np.asarray(value)[env_ids]
    return out


def as_batch_env(env: Any, n: int) -> BatchEnv:
    """What ``make_fn`` returned, as a :class:`BatchEnv` of ``n`` envs."""
    if isinstance(env, gymnasium.vector.VectorEnv):
        env = VectorEnvAdapter(env)
    elif not all(hasattr(env, a) for a in ("bind", "reset", "step", "single_observation_space",
                                          "single_action_space", "num_envs")):
        raise TypeError(f"make_fn returned a {type(env).__name__}: expected a shmpool.batched.BatchEnv "
                        "or a gymnasium VectorEnv")
    if env.num_envs != n:
        raise ValueError(f"make_fn(n={n}, start) built a batched env of {env.num_envs} envs")
    return env


class Batched:
    """Tells :class:`shmpool.Pool` to host one batched env per worker.

    ``make_fn(n, start)`` builds the batched env of a shard of ``n`` envs whose
    global ids start at ``start`` (a :class:`BatchEnv` or a gymnasium
    ``VectorEnv``); it is cloudpickled to the workers.  ``num_envs`` is the
    pool's size when the pool is not given one."""

    def __init__(self, make_fn: Callable[[int, int], Any], num_envs: int | None = None) -> None:
        if not callable(make_fn):
            raise TypeError(f"Batched needs a callable make_fn(n, start), got {type(make_fn).__name__}")
        self.make_fn = make_fn
        self.num_envs = num_envs

    def sized(self, num_envs: int | None) -> BatchedEnvs:
        """The pool's view: ``num_envs`` envs, sliced into shards like a list of env constructors."""
        if num_envs is None:
            num_envs = self.num_envs
        elif self.num_envs is not None and num_envs != self.num_envs:
            raise ValueError(f"num_envs={num_envs} but Batched(..., num_envs={self.num_envs})")
        if num_envs is None:
            raise ValueError("num_envs is required with a Batched env")
        return BatchedEnvs(self.make_fn, num_envs)

    def __repr__(self) -> str:
        return f"Batched({getattr(self.make_fn, '__name__', self.make_fn)!r}, num_envs={self.num_envs})"


class BatchedEnvs:
    """``num_envs`` envs built by one ``make_fn``: slicing gives a shard (what a worker is sent)."""

    def __init__(self, make_fn: Callable[[int, int], Any], num_envs: int) -> None:
        self.make_fn = make_fn
        self.num_envs = num_envs

    def __len__(self) -> int:
        return self.num_envs

    def __getitem__(self, item: slice) -> BatchedEnvs:
        if not isinstance(item, slice):
            raise TypeError("a batched env is sliced into shards, not indexed")
        return BatchedEnvs(self.make_fn, len(range(self.num_envs)[item]))

    def build(self, start: int) -> BatchEnv:
        return as_batch_env(self.make_fn(self.num_envs, start), self.num_envs)


def hosting_info(env: BatchEnv) -> dict:
    """What the pool checks about a worker's batched env (sent with its spaces)."""
    return {"kind": "vector" if isinstance(env, VectorEnvAdapter) else "batch", "type": type(env).__name__,
            "subsets": bool(getattr(env, "supports_subsets", True)),
            "autoreset_modes": tuple(getattr(env, "autoreset_modes", (NEXT_STEP,)))}


def check_hosting(info: dict | None, num_envs: int, batch_size: int, autoreset_mode: str) -> None:
    """Parent side: refuse a pool its batched envs cannot serve (``info`` from ``hosting_info``,
    None for plain envs: nothing to check)."""
    if info is None:
        return
    what = "a gymnasium VectorEnv" if info["kind"] == "vector" else f"the batched env {info['type']}"
    if not info["subsets"] and batch_size != num_envs:
        raise ValueError(
            f"batch_size={batch_size} < num_envs={num_envs}, but {what} steps all its envs at once and "
            "cannot step the subsets async send/recv gives it; use batch_size=num_envs or a "
            "shmpool.batched.BatchEnv")
    if autoreset_mode not in info["autoreset_modes"]:
        modes = ", ".join(info["autoreset_modes"])
        if info["kind"] == "vector":
            raise ValueError(f"the pool's autoreset_mode is {autoreset_mode!r} but {what} autoresets with "
                             f"{modes}: they must match")
        raise NotImplementedError(f"{what} does not implement autoreset_mode {autoreset_mode!r} "
                                  f"(it implements {modes})")


# Re-exported for envs that implement the modes.
MODES = (NEXT_STEP, SAME_STEP, DISABLED)
