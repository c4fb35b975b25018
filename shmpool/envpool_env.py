"""EnvPool's env object over a shmpool :class:`~shmpool.vector.VectorEnv`: what ``shmpool.make`` returns.

envpool 1.2.5's gymnasium env is both a ``gymnasium.vector.VectorEnv`` and a
``gymnasium.Env`` (so ``gymnasium.Wrapper(env)`` works, as CleanRL's EnvPool scripts
use it), with single-env ``observation_space``/``action_space``, a ``spec`` whose
``config`` lists every option, ``all_env_ids``/``is_async``, float32 rewards, int32
``env_id``/``lives``/``elapsed_step``/``terminated`` infos without gymnasium's ``_key``
masks, ``reset(env_ids)`` for some envs, and ``render(env_ids)``.  :class:`EnvPoolEnv`
gives the same on top of the shmpool VectorEnv; ``docs/porting/envpool.md`` lists what
differs and why.

``env_type="gym"`` is EnvPool's old gym API (envpool < 1.0, which CleanRL's EnvPool
scripts are written for): ``reset()`` returns the observations only, ``step``/``recv``
return ``(obs, reward, done, info)`` with ``info["TimeLimit.truncated"]``.
"""
from __future__ import annotations

import collections
import os
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.spaces import Discrete, MultiDiscrete

from ._elapsed import ElapsedSteps
from .autoreset_modes import NEXT_STEP, SAME_STEP
from .gym_compat import AutoresetMode
from .gymnasium_face import VectorEnv
from .surface import PoolSurface

__all__ = ["ENV_TYPES", "EnvPoolEnv", "EnvPoolSpec", "base_config"]

#: ``env_type`` values ``make`` builds; ``"dm"`` is refused (see ``make``).
ENV_TYPES = ("gymnasium", "gym")
RENDER_MODES = (None, "rgb_array", "human")
# Info keys EnvPool's C++ specs declare as int32 / float32 (Atari's and every task's); env_id is
# the face's own, always int32.
_CAST_INFOS = {"lives": np.int32, "elapsed_step": np.int32, "terminated": np.int32, "reward": np.float32}
_POOL_INFOS = {"env_id"}   # what the pool's recv adds to the envs' infos
_XLA_REFUSAL = (
    "xla() is not available in shmpool: EnvPool's xla() registers XLA custom calls that hand "
    "actions to its C++ thread pool inside the trainer's process; shmpool's envs run in worker "
    "processes reached through shared memory, which XLA cannot call into. Use send()/recv() "
    "(or step) outside jax.jit.")


def base_config(num_envs: int, batch_size: int, num_threads: int, thread_affinity_offset: int,
                seed: int, gym_reset_return_info: bool) -> dict[str, Any]:
    """The config keys every EnvPool task has, in EnvPool's order and with its defaults."""
    return {"num_envs": num_envs, "batch_size": batch_size, "num_threads": num_threads, "max_num_players": 1,
            "thread_affinity_offset": thread_affinity_offset,
            "base_path": os.path.dirname(os.path.abspath(__file__)), "seed": seed, "env_seed": [],
            "gym_reset_return_info": gym_reset_return_info}


class EnvPoolSpec:
    """EnvPool's ``env.spec``: ``config`` (a namedtuple of every option, EnvPool's keys and
    order), the single-env ``observation_space``/``action_space`` (also as
    ``gymnasium_observation_space``/``gymnasium_action_space``) and ``reward_threshold``."""

    def __init__(self, config: dict[str, Any], observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 reward_threshold: float | None = None) -> None:
        config_type = collections.namedtuple("Config", list(config))
        self.config = config_type(**config)
        self.observation_space = self.gymnasium_observation_space = observation_space
        self.action_space = self.gymnasium_action_space = action_space
        self.reward_threshold = reward_threshold

    def __repr__(self) -> str:
        return f"EnvPoolSpec({', '.join(f'{k}={v!r}' for k, v in self.config._asdict().items())})"


def _render(env: gymnasium.Env) -> Any:
    return env.render()


def _strip_masks(infos: dict) -> dict:
    """gymnasium's vector infos without the ``_key`` masks (EnvPool has none), nested dicts too.
    Keys need not be strings: gymnasium's batching itself makes ``{1: None}`` of some final infos."""
    return {k: _strip_masks(v) if isinstance(v, dict) else v for k, v in infos.items()
            if not (isinstance(k, str) and k.startswith("_") and k[1:] in infos)}


class EnvPoolEnv(VectorEnv, gymnasium.Env):
    """``envpool.make(...)``'s env: a shmpool :class:`VectorEnv` with EnvPool's face.

    Built by :func:`shmpool.make`; ``env_fns``/``num_envs``/``**pool_kwargs`` are the
    VectorEnv's.  ``config`` is EnvPool's config dict (``env.config``, ``env.spec.config``).
    ``autoreset_mode`` defaults to EnvPool's, the next step (an ending step's row holds that
    episode's last observation, reward and infos; the env's next step resets it), under either
    gymnasium: code written for EnvPool reads an ending game's ``info["lives"]``,
    ``info["terminated"]`` and ``info["reward"]`` on that row (CleanRL's EnvPool scripts do).

    With ``n`` envs answering (``num_envs`` for ``reset()``/``step(actions)``,
    ``len(env_id)`` for ``reset(env_id)``, ``batch_size`` for ``recv()``):

    - ``reset(env_id=None)`` -> ``(obs, info)`` (``env_type="gym"``: ``obs`` only unless
      ``gym_reset_return_info=True``); ``obs`` batched ``(n, *obs_shape)``.
    - ``step(action, env_id=None)`` / ``recv()`` -> ``(obs, reward, terminated, truncated, info)``
      (``env_type="gym"``: ``(obs, reward, done, info)``); rewards float32 ``(n,)``, flags bool
      ``(n,)``.
    - ``info``: the envs' own keys batched ``(n, ...)`` without ``_key`` masks, plus
      ``env_id`` (int32), ``players["env_id"]`` (int32) and ``elapsed_step`` (int32, counted
      here when the env does not report it); ``lives``/``terminated`` int32, ``reward``
      float32 when the env reports them (the Atari tasks do), and the Atari tasks' ``ram``
      (uint8 ``(n, 128)``) when built with ``info_ram=True``.
    """

    def __init__(self, env_fns: Any, num_envs: int | None = None, *, env_type: str = "gymnasium",
                 config: dict[str, Any] | None = None, reward_threshold: float | None = None,
                 render_mode: str | None = None,
                 render_env_id: int = 0, autoreset_mode: str | AutoresetMode | None = None,
                 **pool_kwargs: Any) -> None:
        if autoreset_mode is None and not (isinstance(env_fns, PoolSurface)):
            # The VectorEnv's own default is gymnasium 0.29's same-step autoreset under 0.29.
            autoreset_mode = NEXT_STEP
        super().__init__(env_fns, num_envs, autoreset_mode=autoreset_mode, **pool_kwargs)
        if env_type not in ENV_TYPES:
            raise ValueError(f"env_type must be one of {ENV_TYPES}, got {env_type!r}")
        self.env_type = env_type
        # EnvPool exposes the single-env spaces (``env.action_space.n``).
        self.observation_space = self.single_observation_space
        self.action_space = self.single_action_space
        self.set_config(config or {}, reward_threshold)
        self.render_mode = render_mode
        self.metadata["render_modes"] = ["rgb_array", "human"]
        self._render_env_id = int(render_env_id)
        self._all_env_ids = np.arange(self.num_envs, dtype=np.int32)
        self._discrete = isinstance(self.single_action_space, (Discrete, MultiDiscrete))
        # ``elapsed_step`` for envs that do not report it.
        self._elapsed = ElapsedSteps(self.num_envs, same_step=self._pool.autoreset_mode == SAME_STEP)

    # --- EnvPool's attributes --------------------------------------------------------

    def set_config(self, config: dict[str, Any], reward_threshold: float | None = None) -> None:
        """Record EnvPool's config (``make`` does this once the pool is built)."""
        self._config = dict(config)
        self.spec = EnvPoolSpec(self._config, self.single_observation_space, self.single_action_space,
                                reward_threshold)

    @property
    def config(self) -> dict[str, Any]:
        """Every option, EnvPool's keys (26 for an Atari task, 11 for CartPole-v1)."""
        return dict(self._config)

    @property
    def all_env_ids(self) -> np.ndarray:
        """``np.arange(num_envs, dtype=np.int32)``."""
        return self._all_env_ids

    @property
    def is_async(self) -> bool:
        """True when ``recv()`` returns fewer envs than there are (``batch_size < num_envs``)."""
        return 0 < self.batch_size != self.num_envs

    def __len__(self) -> int:
        return self.num_envs

    def xla(self) -> Any:
        """Refused: see the message."""
        raise NotImplementedError(_XLA_REFUSAL)

    def seed(self, seed: int | Sequence[int] | None = None) -> None:
        """EnvPool's abandoned ``seed()``: warns and does nothing (seed through ``make`` or ``reset``)."""
        warnings.warn("The `seed` function in envpool is abandoned. You can set seed by "
                      "shmpool.make(..., seed=seed) or reset(seed=...) instead.", stacklevel=2)

    # --- reset / step / send / recv ----------------------------------------------------

    def reset(self, env_id: np.ndarray | Sequence[int] | None = None, *, seed: int | Sequence[int] | None = None,
              options: dict[str, Any] | None = None) -> Any:
        """Reset every env, or the envs ``env_id`` (positional, as EnvPool): their rows only,
        in ``env_id`` order.  ``options["reset_mask"]`` is the same as ``env_id`` given as a
        mask.  ``seed`` reseeds (EnvPool ignores it; shmpool can honour it)."""
        if env_id is not None:
            ids = np.asarray(env_id, dtype=np.int32).reshape(-1)
            if options is not None and options.get("reset_mask") is not None:
                raise ValueError("Pass either env_id or options['reset_mask'], not both.")
            mask = np.zeros(self.num_envs, dtype=bool)
            mask[ids] = True
            options = {**(options or {}), "reset_mask": mask}
        else:
            ids = None
        obs, infos = super().reset(seed=seed, options=options)
        reset_ids = self._all_env_ids if ids is None else ids
        if ids is not None:
            obs = _rows(obs, ids)
            infos = _rows(infos, ids)
        self._elapsed.restart(ids)
        info = self._info(infos, reset_ids, None, None)
        if self.env_type == "gym" and not self._config.get("gym_reset_return_info", False):
            return obs
        return obs, info

    def step(self, action: Any, env_id: np.ndarray | None = None) -> tuple:
        """Step every env (``env_id`` None) or the envs ``env_id`` (then ``recv()``'s batch)."""
        action = self._action(action)
        if env_id is None:
            obs, rew, term, trunc, infos = super().step(action)
            return self._result(obs, rew, term, trunc, infos, self._all_env_ids)
        super().send(action, env_id)
        return self._recv()

    def send(self, action: Any, env_id: np.ndarray | None = None) -> None:
        """Start stepping the envs ``env_id`` (every env when None); returns at once."""
        super().send(self._action(action), env_id)

    def recv(self, reset: bool = False, return_info: bool = True) -> tuple:
        """The first ``batch_size`` envs to finish, in completion order (``info["env_id"]``).
        ``reset``/``return_info`` are EnvPool's internal flags, accepted and unused."""
        return self._recv()

    def async_reset(self) -> None:
        """Reset every env without waiting; the results arrive through ``recv()``."""
        super().async_reset()
        self._elapsed.end_all()

    def _recv(self) -> tuple:
        obs, rew, term, trunc, infos = super().recv()
        ids = np.asarray(infos["env_id"], dtype=np.int32)
        return self._result(obs, rew, term, trunc, infos, ids)

    # --- rendering ---------------------------------------------------------------------

    def render(self, env_ids: Any = None, camera_id: int | None = None) -> np.ndarray | None:
        """Frames ``(k, H, W, 3)`` uint8 of the envs ``env_ids`` (default: ``render_env_id``, 0);
        ``render_mode="human"`` shows one env's frame in an OpenCV window and returns None."""
        if self.render_mode not in ("rgb_array", "human"):
            raise RuntimeError("render_mode must be set to 'rgb_array' or 'human' when creating this env")
        if camera_id is not None and camera_id != -1:
            raise NotImplementedError("camera_id selects a MuJoCo camera in EnvPool; shmpool renders with each "
                                      "env's own render()")
        if env_ids is None:
            env_ids = [self._render_env_id]
        ids = [int(i) for i in np.asarray(env_ids).reshape(-1)]
        frames = np.stack(self.pool.apply(_render, env_ids=ids))
        if self.render_mode == "rgb_array":
            return frames
        if len(ids) != 1:
            raise ValueError("render_mode='human' only supports a single env_id")
        import cv2
        cv2.imshow(f"{type(self).__name__}-render", np.ascontiguousarray(frames[0][:, :, ::-1]))
        cv2.waitKey(1)
        return None

    # --- internals ---------------------------------------------------------------------

    def _action(self, action: Any) -> Any:
        # EnvPool casts an action array to the space's dtype (floats for Discrete truncate).
        if self._discrete and isinstance(action, np.ndarray) and action.dtype.kind == "f":
            return action.astype(self.single_action_space.dtype)
        return action

    def _result(self, obs, rew, term, trunc, infos: dict, ids: np.ndarray) -> tuple:
        info = self._info(infos, ids, term, trunc)
        rew = np.asarray(rew, dtype=np.float32)
        if self.env_type == "gym":
            info["TimeLimit.truncated"] = trunc
            return obs, rew, term | trunc, info
        return obs, rew, term, trunc, info

    def _info(self, infos: dict, ids: np.ndarray, term: np.ndarray | None, trunc: np.ndarray | None) -> dict:
        """EnvPool's info dict for the result rows ``ids`` (int32); counts ``elapsed_step`` on
        when ``term``/``trunc`` are given (a step's results), reads it otherwise (a reset's)."""
        # The parent runs this once per step or recv, on a core the workers share: few numpy calls.
        # Nothing but the pool's env_id (replaced below) is the common case.
        info = {} if infos.keys() <= _POOL_INFOS else _strip_masks(infos)
        if info:
            for key in _CAST_INFOS.keys() & info.keys():
                info[key] = np.asarray(info[key]).astype(_CAST_INFOS[key], copy=False)
        elapsed = self._elapsed.rows(ids) if term is None else self._elapsed.advance(ids, term, trunc)
        own = info.get("elapsed_step")   # an env's own count (the Atari recipe's) comes first
        if own is None:
            info["elapsed_step"] = elapsed
        else:
            reported = infos.get("_elapsed_step")   # which rows reported one: the others keep the count
            if reported is not None and not reported.all():
                info["elapsed_step"] = np.where(reported, own, elapsed).astype(np.int32, copy=False)
        env_id = ids.copy()          # the caller's own copy (ids may be the pool's)
        info["env_id"] = env_id
        players = info.get("players")
        info["players"] = {"env_id": env_id.copy()} if players is None else {**players, "env_id": env_id.copy()}
        return info

    def __repr__(self) -> str:
        """EnvPool's ``EnvPoolEnv(<config>)`` and the pool's plan: ``... over Pool(...)``."""
        config = ", ".join(f"{k}={v!r}" for k, v in self._config.items())
        return f"{type(self).__name__}({config}) over {self._pool!r}"

    __str__ = __repr__


def _rows(batch: Any, ids: np.ndarray) -> Any:
    """Rows ``ids`` of a batched observation or info tree (dicts and tuples recursed)."""
    if isinstance(batch, dict):
        return {k: _rows(v, ids) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_rows(v, ids) for v in batch)
    return batch[ids]

