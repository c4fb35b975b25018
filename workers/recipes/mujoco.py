"""Lean MuJoCo recipes with gymnasium's v5 semantics, built on the ``mujoco`` bindings.

Every env here loads the XML model gymnasium's ``<Task>-v5`` loads, steps it with
one ``mj_step(model, data, nstep=frame_skip)`` call and assembles the observation
by slice assignment.  Observations, rewards, termination, reset noise (drawn from
``self.np_random`` in gymnasium's order, so a seed gives the same initial state)
and the numeric ``info`` values are gymnasium's, with ``TimeLimit`` built in
(``truncated`` after ``max_episode_steps`` steps, gymnasium's registered limit by
default).  Observations are float64 arrays of shape ``observation_space.shape``;
rewards are Python/numpy float64 scalars.

What is left out: rendering, gymnasium's env checker/order enforcing, custom
``xml_file``s of other shapes (the kwarg is accepted for models with the same
layout).  Call :func:`register` to make the task ids (``"Ant-v5"``, ...)
buildable with ``shmpool.make``.
"""
from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import gymnasium
import mujoco
import numpy as np
from gymnasium.spaces import Box

__all__ = ["TASKS", "MujocoRecipe", "tasks"]


def _asset(xml_file: str) -> str:
    """gymnasium's resolution of ``xml_file``: bare names live in its mujoco assets."""
    if xml_file.startswith((".", "/", "~")):
        return os.path.expanduser(xml_file)
    import gymnasium.envs.mujoco as gm  # only for the assets folder's location
    return os.path.join(os.path.dirname(gm.__file__), "assets", xml_file)


def _sumsq(x: np.ndarray) -> Any:
    """``np.sum(np.square(x))``: gymnasium's reduction order (and dtype: float32 actions
    give a float32 cost), so costs match bit for bit."""
    return np.square(x).sum()


def _load_model(path: str) -> mujoco.MjModel:
    """``MjModel.from_xml_path`` with MuJoCo's warnings raised as Python ``UserWarning``s: its
    default handler appends them to MUJOCO_LOG.TXT in the working directory (gymnasium's
    ant.xml, for one, uses the deprecated 'settotalmass')."""
    texts: list[str] = []
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(texts.append)
    try:
        model = mujoco.MjModel.from_xml_path(path)
    finally:
        mujoco.set_mju_user_warning(previous)
    for text in dict.fromkeys(texts):
        warnings.warn(f"MuJoCo: {text} ({os.path.basename(path)})", UserWarning, stacklevel=3)
    return model


def _skip_island_discovery(model: mujoco.MjModel) -> None:
    """Turn off constraint-island discovery (on by default since MuJoCo 3.3) where it cannot
    change a bit: with a single kinematic tree every constraint joins the same island, so the
    solver's problem is the whole one, in the same order, with or without discovery.  Saves
    ~6 % of Ant-v5's native instructions per step; ``tests/faces/test_recipes_mujoco.py`` checks the
    trajectories bit for bit against gymnasium's (which keeps the default)."""
    flag = getattr(mujoco.mjtDisableBit, "mjDSBL_ISLAND", None)
    if flag is not None and getattr(model, "ntree", 2) == 1:
        model.opt.disableflags |= int(flag)


class MujocoRecipe(gymnasium.Env):
    """Shared machinery: model loading, reset with noise, frame-skipped stepping, time limit.

    Subclasses set ``default_xml``/``default_frame_skip``/``default_max_episode_steps`` and
    implement ``_reset_state`` (write ``data.qpos``/``data.qvel``), ``_write_obs``
    (fill ``self._obs``, float64 ``(obs_size,)``) and ``_transition(action)``
    (step the model, write the observation, return ``(reward, terminated, info)``;
    it writes the observation itself so terms shared with the reward are computed once).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    default_xml: ClassVar[str] = ""
    default_frame_skip: ClassVar[int] = 5
    default_max_episode_steps: ClassVar[int] = 1000
    # mj_rnePostConstraint fills cfrc_ext; only tasks that read contact forces pay for it.
    needs_rne: ClassVar[bool] = False

    def __init__(self, obs_size: int, xml_file: str | None = None, frame_skip: int | None = None,
                 max_episode_steps: int | None = None) -> None:
        self.model = _load_model(_asset(xml_file or self.default_xml))
        _skip_island_discovery(self.model)
        self.data = mujoco.MjData(self.model)
        self.init_qpos = self.data.qpos.copy()
        self.init_qvel = self.data.qvel.copy()
        self.frame_skip = self.default_frame_skip if frame_skip is None else frame_skip
        self.dt = self.model.opt.timestep * self.frame_skip
        self.max_episode_steps = self.default_max_episode_steps if max_episode_steps is None else max_episode_steps
        self._elapsed = 0
        # Views into MjData are bound once: attribute lookups on MjData cost ~100 ns each.
        self._qpos, self._qvel, self._ctrl = self.data.qpos, self.data.qvel, self.data.ctrl
        low, high = self.model.actuator_ctrlrange.copy().astype(np.float32).T
        self.action_space = Box(low=low, high=high, dtype=np.float32)
        self.observation_space = Box(-np.inf, np.inf, shape=(obs_size,), dtype=np.float64)
        self._obs = np.zeros(obs_size, dtype=np.float64)
        self._copy_obs = True
        self.metadata = {"render_modes": [], "render_fps": int(np.round(1.0 / self.dt))}

    def bind_obs(self, out: np.ndarray | None = None) -> np.ndarray:
        """Write observations straight into ``out`` (float64, ``observation_space.shape``),
        e.g. the env's slot in a shared-memory batch; returns the buffer in use.

        While bound, ``reset``/``step`` return ``out`` itself (no copy): its contents are
        valid until the next ``reset``/``step``.  ``bind_obs(None)`` goes back to a private
        buffer and fresh copies."""
        if out is None:
            out, self._copy_obs = np.zeros(self.observation_space.shape, dtype=np.float64), True
        else:
            if out.shape != self.observation_space.shape or out.dtype != np.float64:
                raise ValueError(f"obs buffer must be float64 {self.observation_space.shape}, "
                                 f"got {out.dtype} {out.shape}")
            self._copy_obs = False
        self._obs = out
        self._bind_views()
        return out

    # --- the per-task parts ---------------------------------------------------------
    def _bind_views(self) -> None:
        """Rebind any views a subclass keeps into ``self._obs`` (after ``bind_obs``)."""

    def _reset_state(self) -> None:
        raise NotImplementedError

    def _write_obs(self) -> None:
        raise NotImplementedError

    def _transition(self, action: np.ndarray) -> tuple[Any, bool, dict[str, Any]]:
        raise NotImplementedError

    def _reset_info(self) -> dict[str, Any]:
        return {}

    # --- gymnasium API --------------------------------------------------------------
    def _simulate(self, action: np.ndarray) -> None:
        self._ctrl[:] = action
        mujoco.mj_step(self.model, self.data, nstep=self.frame_skip)
        if self.needs_rne:
            mujoco.mj_rnePostConstraint(self.model, self.data)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Returns ``(obs float64 (obs_size,), info)``; noise as gymnasium draws it."""
        super().reset(seed=seed)
        mujoco.mj_resetData(self.model, self.data)
        self._reset_state()
        mujoco.mj_forward(self.model, self.data)
        self._elapsed = 0
        self._write_obs()
        return (self._obs.copy() if self._copy_obs else self._obs), self._reset_info()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, Any, bool, bool, dict[str, Any]]:
        """``action``: ``(nu,)`` float32 (or float64); returns gymnasium's 5-tuple with a fresh obs."""
        reward, terminated, info = self._transition(action)   # also refreshes self._obs
        self._elapsed += 1
        # A copy unless bound: callers (SAME_STEP autoreset, replay buffers) may keep it.
        obs = self._obs.copy() if self._copy_obs else self._obs
        return obs, reward, terminated, self._elapsed >= self.max_episode_steps, info

    def _uniform_state(self, scale: float) -> None:
        """qpos, qvel += U(-scale, scale), drawn in gymnasium's order."""
        rng = self.np_random
        self._qpos[:] = self.init_qpos + rng.uniform(low=-scale, high=scale, size=self.model.nq)
        self._qvel[:] = self.init_qvel + rng.uniform(low=-scale, high=scale, size=self.model.nv)

    def _uniform_normal_state(self, scale: float) -> None:
        """qpos += U(-scale, scale), qvel += scale * N(0, 1), drawn in gymnasium's order."""
        rng = self.np_random
        self._qpos[:] = self.init_qpos + rng.uniform(low=-scale, high=scale, size=self.model.nq)
        self._qvel[:] = self.init_qvel + scale * rng.standard_normal(self.model.nv)


def _norm(v: np.ndarray) -> np.float64:
    """``np.linalg.norm(v)`` for a 1-d float vector, by the same arithmetic (sqrt of dot).

    A numpy float64, not a Python float: Python floats are "weak" under NEP 50, so
    ``float + np.float32`` would round a reward to float32 where gymnasium's stays float64."""
    return np.float64(math.sqrt(v.dot(v)))


class Ant(MujocoRecipe):
    """Ant-v5: obs float64 (105,) = qpos[2:] (13), qvel (14), clipped cfrc_ext[1:] (78)."""

    default_xml = "ant.xml"
    needs_rne = True

    def __init__(self, xml_file: str | None = None, frame_skip: int = 5, max_episode_steps: int | None = None,
                 forward_reward_weight: float = 1, ctrl_cost_weight: float = 0.5, contact_cost_weight: float = 5e-4,
                 healthy_reward: float = 1.0, main_body: int = 1, terminate_when_unhealthy: bool = True,
                 healthy_z_range: tuple[float, float] = (0.2, 1.0),
                 contact_force_range: tuple[float, float] = (-1.0, 1.0), reset_noise_scale: float = 0.1) -> None:
        model = _load_model(_asset(xml_file or self.default_xml))
        super().__init__(model.nq - 2 + model.nv + (model.nbody - 1) * 6, xml_file, frame_skip, max_episode_steps)
        self._fw, self._cw, self._kw = forward_reward_weight, ctrl_cost_weight, contact_cost_weight
        self._healthy_reward, self._terminate = healthy_reward, terminate_when_unhealthy
        self._zmin, self._zmax = healthy_z_range
        self._flo, self._fhi = contact_force_range
        self._noise = reset_noise_scale
        self._body_xy = self.data.xpos[main_body, :2]
        self._cfrc = self.data.cfrc_ext
        self._clipped = np.zeros_like(self._cfrc)   # (nbody, 6): clipped contact forces, reused
        self._npos = self.model.nq - 2
        self._nqv = self._npos + self.model.nv
        self._clipped_obs = self._clipped[1:].reshape(-1)
        self._bind_views()

    def _bind_views(self) -> None:
        self._obs_state = self._obs[:self._nqv]   # qpos[2:], qvel: the state the healthy check tests

    def _reset_state(self) -> None:
        self._uniform_normal_state(self._noise)

    def _write_obs(self) -> None:
        obs = self._obs
        obs[:self._npos] = self._qpos[2:]
        obs[self._npos:self._nqv] = self._qvel
        # maximum/minimum: np.clip's Python-level dispatch costs ~2 µs more, same values.
        np.minimum(np.maximum(self._cfrc, self._flo, out=self._clipped), self._fhi, out=self._clipped)
        obs[self._nqv:] = self._clipped_obs   # world body (row 0) is left out, as in v5

    def _reset_info(self) -> dict[str, Any]:
        q = self._qpos
        return {"x_position": q[0], "y_position": q[1], "distance_from_origin": _norm(q[0:2])}

    def _transition(self, action: np.ndarray) -> tuple[Any, bool, dict[str, Any]]:
        xy = self._body_xy
        x0, y0 = xy[0], xy[1]   # indexing: unpacking a numpy array costs ~1 µs more
        self._simulate(action)
        dt = self.dt
        vx, vy = (xy[0] - x0) / dt, (xy[1] - y0) / dt
        self._write_obs()   # also fills self._clipped
        q = self._qpos
        healthy = self._zmin <= q[2] <= self._zmax
        if healthy:
            # gymnasium tests np.isfinite(qpos ++ qvel).all(); one sum is NaN/inf exactly when an
            # element is, since MuJoCo resets any state with |value| > 1e10 (no overflow possible).
            healthy = math.isfinite(self._obs_state.sum() + q[0] + q[1])
        forward = vx * self._fw
        survive = healthy * self._healthy_reward
        ctrl = self._cw * _sumsq(action)
        contact = self._kw * _sumsq(self._clipped)
        reward = (forward + survive) - (ctrl + contact)
        info = {"x_position": q[0], "y_position": q[1], "distance_from_origin": _norm(q[0:2]),
                "x_velocity": vx, "y_velocity": vy, "reward_forward": forward, "reward_ctrl": -ctrl,
                "reward_contact": -contact, "reward_survive": survive}
        return reward, (not healthy) and self._terminate, info


class _Planar(MujocoRecipe):
    """HalfCheetah/Hopper/Walker2d/Swimmer: obs = qpos[skip:], qvel (clipped to +-10 where
    ``clip_qvel``); forward reward from qpos[0]."""

    skip: ClassVar[int] = 1
    clip_qvel: ClassVar[bool] = False

    def __init__(self, xml_file: str | None, frame_skip: int | None, max_episode_steps: int | None,
                 forward_reward_weight: float, ctrl_cost_weight: float, reset_noise_scale: float) -> None:
        model = _load_model(_asset(xml_file or self.default_xml))
        super().__init__(model.nq - self.skip + model.nv, xml_file, frame_skip, max_episode_steps)
        self._fw, self._cw, self._noise = forward_reward_weight, ctrl_cost_weight, reset_noise_scale
        self._npos = self.model.nq - self.skip
        self._bind_views()

    def _bind_views(self) -> None:
        self._pos_out, self._vel_out = self._obs[:self._npos], self._obs[self._npos:]

    def _check_raw_state(self) -> None:
        """Hook run while ``self._obs`` holds qpos[skip:] and the *unclipped* qvel."""

    def _write_obs(self) -> None:
        self._pos_out[:] = self._qpos[self.skip:]
        vel = self._vel_out
        vel[:] = self._qvel
        if self.clip_qvel:
            self._check_raw_state()
            # maximum/minimum: np.clip's Python-level dispatch costs ~2 µs more, same values.
            np.minimum(np.maximum(vel, -10.0, out=vel), 10.0, out=vel)


class HalfCheetah(_Planar):
    """HalfCheetah-v5: obs float64 (17,); never terminates."""

    default_xml = "half_cheetah.xml"

    def __init__(self, xml_file: str | None = None, frame_skip: int = 5, max_episode_steps: int | None = None,
                 forward_reward_weight: float = 1.0, ctrl_cost_weight: float = 0.1,
                 reset_noise_scale: float = 0.1) -> None:
        super().__init__(xml_file, frame_skip, max_episode_steps, forward_reward_weight, ctrl_cost_weight,
                         reset_noise_scale)

    def _reset_state(self) -> None:
        self._uniform_normal_state(self._noise)

    def _reset_info(self) -> dict[str, Any]:
        return {"x_position": self._qpos[0]}

    def _transition(self, action: np.ndarray) -> tuple[Any, bool, dict[str, Any]]:
        x0 = self._qpos[0]
        self._simulate(action)
        x1 = self._qpos[0]
        vx = (x1 - x0) / self.dt
        self._write_obs()
        forward = self._fw * vx
        ctrl = self._cw * _sumsq(action)
        return forward - ctrl, False, {"x_position": x1, "x_velocity": vx, "reward_forward": forward,
                                       "reward_ctrl": -ctrl}


class _Hopping(_Planar):
    """Hopper/Walker2d: healthy reward and termination on height and angle."""

    clip_qvel = True

    def __init__(self, xml_file: str | None, frame_skip: int | None, max_episode_steps: int | None,
                 forward_reward_weight: float, ctrl_cost_weight: float, healthy_reward: float,
                 terminate_when_unhealthy: bool, healthy_z_range: tuple[float, float],
                 healthy_angle_range: tuple[float, float], reset_noise_scale: float) -> None:
        super().__init__(xml_file, frame_skip, max_episode_steps, forward_reward_weight, ctrl_cost_weight,
                         reset_noise_scale)
        self._healthy_reward, self._terminate = healthy_reward, terminate_when_unhealthy
        self._zmin, self._zmax = healthy_z_range
        self._amin, self._amax = healthy_angle_range

    def _healthy(self) -> bool:
        q = self._qpos
        return self._zmin < q[1] < self._zmax and self._amin < q[2] < self._amax

    def _reset_state(self) -> None:
        self._uniform_state(self._noise)

    def _reset_info(self) -> dict[str, Any]:
        q = self._qpos
        return {"x_position": q[0], "z_distance_from_origin": q[1] - self.init_qpos[1]}

    def _transition(self, action: np.ndarray) -> tuple[Any, bool, dict[str, Any]]:
        q = self._qpos
        x0 = q[0]
        self._simulate(action)
        x1 = q[0]
        vx = (x1 - x0) / self.dt
        self._write_obs()
        healthy = self._healthy()
        forward = self._fw * vx
        survive = healthy * self._healthy_reward
        ctrl = self._cw * _sumsq(action)
        info = {"x_position": x1, "z_distance_from_origin": q[1] - self.init_qpos[1], "x_velocity": vx,
                "reward_forward": forward, "reward_ctrl": -ctrl, "reward_survive": survive}
        return (forward + survive) - ctrl, (not healthy) and self._terminate, info


class Hopper(_Hopping):
    """Hopper-v5: obs float64 (11,) = qpos[1:] (5), clip(qvel, -10, 10) (6)."""

    default_xml = "hopper.xml"
    default_frame_skip = 4

    def __init__(self, xml_file: str | None = None, frame_skip: int = 4, max_episode_steps: int | None = None,
                 forward_reward_weight: float = 1.0, ctrl_cost_weight: float = 1e-3, healthy_reward: float = 1.0,
                 terminate_when_unhealthy: bool = True, healthy_state_range: tuple[float, float] = (-100.0, 100.0),
                 healthy_z_range: tuple[float, float] = (0.7, float("inf")),
                 healthy_angle_range: tuple[float, float] = (-0.2, 0.2), reset_noise_scale: float = 5e-3) -> None:
        super().__init__(xml_file, frame_skip, max_episode_steps, forward_reward_weight, ctrl_cost_weight,
                         healthy_reward, terminate_when_unhealthy, healthy_z_range, healthy_angle_range,
                         reset_noise_scale)
        self._smin, self._smax = healthy_state_range
        self._state_ok = True

    def _check_raw_state(self) -> None:
        # gymnasium tests all(lo < s < hi) for s = state_vector()[2:] = qpos[2:] ++ raw qvel, which
        # is obs[1:] before the velocity clip: one contiguous view, two reductions.  Equivalent to
        # the elementwise test: a NaN makes min/max NaN and both comparisons false.
        state = self._obs[1:]
        self._state_ok = bool(self._smin < state.min() and state.max() < self._smax)

    def _healthy(self) -> bool:
        return self._state_ok and super()._healthy()


class Walker2d(_Hopping):
    """Walker2d-v5: obs float64 (17,) = qpos[1:] (8), clip(qvel, -10, 10) (9)."""

    default_xml = "walker2d_v5.xml"
    default_frame_skip = 4

    def __init__(self, xml_file: str | None = None, frame_skip: int = 4, max_episode_steps: int | None = None,
                 forward_reward_weight: float = 1.0, ctrl_cost_weight: float = 1e-3, healthy_reward: float = 1.0,
                 terminate_when_unhealthy: bool = True, healthy_z_range: tuple[float, float] = (0.8, 2.0),
                 healthy_angle_range: tuple[float, float] = (-1.0, 1.0), reset_noise_scale: float = 5e-3) -> None:
        super().__init__(xml_file, frame_skip, max_episode_steps, forward_reward_weight, ctrl_cost_weight,
                         healthy_reward, terminate_when_unhealthy, healthy_z_range, healthy_angle_range,
                         reset_noise_scale)


class Swimmer(_Planar):
    """Swimmer-v5: obs float64 (8,) = qpos[2:] (3), qvel (5); never terminates."""

    default_xml = "swimmer.xml"
    default_frame_skip = 4
    skip = 2

    def __init__(self, xml_file: str | None = None, frame_skip: int = 4, max_episode_steps: int | None = None,
                 forward_reward_weight: float = 1.0, ctrl_cost_weight: float = 1e-4,
                 reset_noise_scale: float = 0.1) -> None:
        super().__init__(xml_file, frame_skip, max_episode_steps, forward_reward_weight, ctrl_cost_weight,
                         reset_noise_scale)

    def _reset_state(self) -> None:
        self._uniform_state(self._noise)

    def _reset_info(self) -> dict[str, Any]:
        q = self._qpos
        return {"x_position": q[0], "y_position": q[1], "distance_from_origin": _norm(q[0:2])}

    def _transition(self, action: np.ndarray) -> tuple[Any, bool, dict[str, Any]]:
        q = self._qpos
        x0, y0 = q[0], q[1]
        self._simulate(action)
        x1, y1 = q[0], q[1]
        vx, vy = (x1 - x0) / self.dt, (y1 - y0) / self.dt
        self._write_obs()
        forward = self._fw * vx
        ctrl = self._cw * _sumsq(action)
        info = {"x_position": x1, "y_position": y1, "distance_from_origin": _norm(q[0:2]), "x_velocity": vx,
                "y_velocity": vy, "reward_forward": forward, "reward_ctrl": -ctrl}
        return forward - ctrl, False, info


class InvertedPendulum(MujocoRecipe):
    """InvertedPendulum-v5: obs float64 (4,) = qpos, qvel; reward 1 (int) while |angle| <= 0.2."""

    default_xml = "inverted_pendulum.xml"
    default_frame_skip = 2

    def __init__(self, xml_file: str | None = None, frame_skip: int = 2, max_episode_steps: int | None = None,
                 reset_noise_scale: float = 0.01) -> None:
        super().__init__(4, xml_file, frame_skip, max_episode_steps)
        self._noise = reset_noise_scale

    def _reset_state(self) -> None:
        self._uniform_state(self._noise)

    def _write_obs(self) -> None:
        self._obs[:2] = self._qpos
        self._obs[2:] = self._qvel

    def _transition(self, action: np.ndarray) -> tuple[Any, bool, dict[str, Any]]:
        self._simulate(action)
        self._write_obs()
        obs = self._obs
        terminated = bool(not np.isfinite(obs).all() or abs(obs[1]) > 0.2)
        reward = int(not terminated)
        return reward, terminated, {"reward_survive": reward}


class InvertedDoublePendulum(MujocoRecipe):
    """InvertedDoublePendulum-v5: obs float64 (9,) = qpos[:1], sin(qpos[1:]), cos(qpos[1:]),
    clip(qvel, +-10), clip(qfrc_constraint[0], +-10); ends when the tip is at height <= 1."""

    default_xml = "inverted_double_pendulum.xml"

    def __init__(self, xml_file: str | None = None, frame_skip: int = 5, max_episode_steps: int | None = None,
                 healthy_reward: float = 10.0, reset_noise_scale: float = 0.1) -> None:
        super().__init__(9, xml_file, frame_skip, max_episode_steps)
        self._healthy_reward, self._noise = healthy_reward, reset_noise_scale
        self._tip = self.data.site_xpos[0]
        self._qfrc_constraint = self.data.qfrc_constraint

    def _reset_state(self) -> None:
        self._uniform_normal_state(self._noise)

    def _write_obs(self) -> None:
        obs, q = self._obs, self._qpos
        obs[0] = q[0]
        np.sin(q[1:], out=obs[1:3])
        np.cos(q[1:], out=obs[3:5])
        np.clip(self._qvel, -10, 10, out=obs[5:8])
        obs[8] = min(max(self._qfrc_constraint[0], -10.0), 10.0)

    def _transition(self, action: np.ndarray) -> tuple[Any, bool, dict[str, Any]]:
        self._simulate(action)
        x, _, y = self._tip
        self._write_obs()
        terminated = bool(y <= 1)
        v1, v2 = self._qvel[1], self._qvel[2]
        dist_penalty = 0.01 * x**2 + (y - 2) ** 2
        vel_penalty = 1e-3 * v1**2 + 5e-3 * v2**2
        alive = self._healthy_reward * int(not terminated)
        info = {"reward_survive": alive, "distance_penalty": -dist_penalty, "velocity_penalty": -vel_penalty}
        return alive - dist_penalty - vel_penalty, terminated, info


class Reacher(MujocoRecipe):
    """Reacher-v5: obs float64 (10,) = cos(qpos[:2]), sin(qpos[:2]), qpos[2:] (target),
    qvel[:2], (fingertip - target)[:2]; 50 steps, never terminates."""

    default_xml = "reacher.xml"
    default_frame_skip = 2
    default_max_episode_steps = 50

    def __init__(self, xml_file: str | None = None, frame_skip: int = 2, max_episode_steps: int | None = None,
                 reward_dist_weight: float = 1, reward_control_weight: float = 1) -> None:
        super().__init__(10, xml_file, frame_skip, max_episode_steps)
        self._dw, self._cw = reward_dist_weight, reward_control_weight
        self._fingertip = self.data.body("fingertip").xpos
        self._target = self.data.body("target").xpos
        self.goal = np.zeros(2)

    def _reset_state(self) -> None:
        rng = self.np_random
        qpos = rng.uniform(low=-0.1, high=0.1, size=self.model.nq) + self.init_qpos
        while True:   # rejection sampling, as gymnasium draws it
            self.goal = rng.uniform(low=-0.2, high=0.2, size=2)
            if _norm(self.goal) < 0.2:
                break
        qpos[-2:] = self.goal
        qvel = self.init_qvel + rng.uniform(low=-0.005, high=0.005, size=self.model.nv)
        qvel[-2:] = 0
        self._qpos[:] = qpos
        self._qvel[:] = qvel

    def _write_obs(self) -> None:
        obs, q = self._obs, self._qpos
        np.cos(q[:2], out=obs[0:2])
        np.sin(q[:2], out=obs[2:4])
        obs[4:6] = q[2:]
        obs[6:8] = self._qvel[:2]
        np.subtract(self._fingertip[:2], self._target[:2], out=obs[8:10])

    def _transition(self, action: np.ndarray) -> tuple[Any, bool, dict[str, Any]]:
        self._simulate(action)
        self._write_obs()
        reward_dist = -_norm(self._fingertip - self._target) * self._dw
        reward_ctrl = -_sumsq(action) * self._cw
        return reward_dist + reward_ctrl, False, {"reward_dist": reward_dist, "reward_ctrl": reward_ctrl}


class _Humanoid(MujocoRecipe):
    """Humanoid/HumanoidStandup: obs = qpos[2:], qvel, cinert[1:], cvel[1:], qfrc_actuator[6:],
    cfrc_ext[1:] (float64 (348,) for gymnasium's models)."""

    needs_rne = True

    def __init__(self, xml_file: str | None, frame_skip: int | None, max_episode_steps: int | None,
                 reset_noise_scale: float) -> None:
        model = _load_model(_asset(xml_file or self.default_xml))
        nb = model.nbody - 1
        size = (model.nq - 2) + model.nv + nb * 10 + nb * 6 + (model.nv - 6) + nb * 6
        super().__init__(size, xml_file, frame_skip, max_episode_steps)
        self._noise = reset_noise_scale
        d = self.data
        self._parts = [self._qpos[2:], self._qvel, d.cinert[1:].reshape(-1), d.cvel[1:].reshape(-1),
                       d.qfrc_actuator[6:], d.cfrc_ext[1:].reshape(-1)]
        self._bind_views()
        self._cfrc, self._ten_length, self._ten_velocity = d.cfrc_ext, d.ten_length, d.ten_velocity

    def _bind_views(self) -> None:
        # (source, destination) pairs of flat views, bound once per buffer.
        self._copies = []
        start = 0
        for src in self._parts:
            self._copies.append((src, self._obs[start:start + src.size]))
            start += src.size

    def _reset_state(self) -> None:
        self._uniform_state(self._noise)

    def _write_obs(self) -> None:
        for src, dst in self._copies:
            dst[:] = src


class Humanoid(_Humanoid):
    """Humanoid-v5: obs float64 (348,); ends when the torso height leaves (1, 2)."""

    default_xml = "humanoid.xml"

    def __init__(self, xml_file: str | None = None, frame_skip: int = 5, max_episode_steps: int | None = None,
                 forward_reward_weight: float = 1.25, ctrl_cost_weight: float = 0.1,
                 contact_cost_weight: float = 5e-7, contact_cost_range: tuple[float, float] = (-np.inf, 10.0),
                 healthy_reward: float = 5.0, terminate_when_unhealthy: bool = True,
                 healthy_z_range: tuple[float, float] = (1.0, 2.0), reset_noise_scale: float = 1e-2) -> None:
        super().__init__(xml_file, frame_skip, max_episode_steps, reset_noise_scale)
        self._fw, self._cw, self._kw = forward_reward_weight, ctrl_cost_weight, contact_cost_weight
        self._kmin, self._kmax = contact_cost_range
        self._healthy_reward, self._terminate = healthy_reward, terminate_when_unhealthy
        self._zmin, self._zmax = healthy_z_range
        self._mass = self.model.body_mass
        self._total_mass = self._mass.sum()
        self._xipos = self.data.xipos

    def _mass_center(self) -> np.ndarray:
        # gymnasium's mass_center, same einsum so the sums round the same way.
        return (np.einsum("b,bj->j", self._mass, self._xipos) / self._total_mass)[0:2]

    def _reset_info(self) -> dict[str, Any]:
        q = self._qpos
        return {"x_position": q[0], "y_position": q[1], "tendon_length": self._ten_length.copy(),
                "tendon_velocity": self._ten_velocity.copy(), "distance_from_origin": _norm(q[0:2])}

    def _transition(self, action: np.ndarray) -> tuple[Any, bool, dict[str, Any]]:
        before = self._mass_center()
        self._simulate(action)
        vx, vy = (self._mass_center() - before) / self.dt
        self._write_obs()
        q = self._qpos
        healthy = self._zmin < q[2] < self._zmax
        forward = self._fw * vx
        survive = healthy * self._healthy_reward
        ctrl = self._cw * _sumsq(self._ctrl)
        contact = min(max(self._kw * _sumsq(self._cfrc), self._kmin), self._kmax)
        info = {"x_position": q[0], "y_position": q[1], "tendon_length": self._ten_length.copy(),
                "tendon_velocity": self._ten_velocity.copy(), "distance_from_origin": _norm(q[0:2]),
                "x_velocity": vx, "y_velocity": vy, "reward_survive": survive, "reward_forward": forward,
                "reward_ctrl": -ctrl, "reward_contact": -contact}
        return (forward + survive) - (ctrl + contact), (not healthy) and self._terminate, info


class HumanoidStandup(_Humanoid):
    """HumanoidStandup-v5: obs float64 (348,); reward for torso height; never terminates."""

    default_xml = "humanoidstandup.xml"

    def __init__(self, xml_file: str | None = None, frame_skip: int = 5, max_episode_steps: int | None = None,
                 uph_cost_weight: float = 1, ctrl_cost_weight: float = 0.1, impact_cost_weight: float = 5e-7,
                 impact_cost_range: tuple[float, float] = (-np.inf, 10.0), reset_noise_scale: float = 1e-2) -> None:
        super().__init__(xml_file, frame_skip, max_episode_steps, reset_noise_scale)
        self._cw, self._kw = ctrl_cost_weight, impact_cost_weight   # uph_cost_weight is unused in v5 too
        self._kmin, self._kmax = impact_cost_range
        self._timestep = self.model.opt.timestep

    def _reset_info(self) -> dict[str, Any]:
        q = self._qpos
        return {"x_position": q[0], "y_position": q[1], "z_distance_from_origin": q[2] - self.init_qpos[2],
                "tendon_length": self._ten_length.copy(), "tendon_velocity": self._ten_velocity.copy()}

    def _transition(self, action: np.ndarray) -> tuple[Any, bool, dict[str, Any]]:
        self._simulate(action)
        self._write_obs()
        q = self._qpos
        uph = (q[2] - 0) / self._timestep
        ctrl = self._cw * _sumsq(self._ctrl)
        impact = min(max(self._kw * _sumsq(self._cfrc), self._kmin), self._kmax)
        info = {**self._reset_info(), "reward_linup": uph, "reward_quadctrl": -ctrl, "reward_impact": -impact}
        return uph - ctrl - impact + 1, False, info


# --- registration ---------------------------------------------------------------------

TASKS: dict[str, type[MujocoRecipe]] = {
    "Ant-v5": Ant, "HalfCheetah-v5": HalfCheetah, "Hopper-v5": Hopper, "Walker2d-v5": Walker2d,
    "Swimmer-v5": Swimmer, "InvertedPendulum-v5": InvertedPendulum,
    "InvertedDoublePendulum-v5": InvertedDoublePendulum, "Reacher-v5": Reacher, "Humanoid-v5": Humanoid,
    "HumanoidStandup-v5": HumanoidStandup,
}


def _builder(cls: type[MujocoRecipe]) -> Callable[..., list[Callable[[], gymnasium.Env]]]:
    def build(num_envs: int = 1, **kwargs: Any) -> list[Callable[[], gymnasium.Env]]:
        """``num_envs`` constructors of ``cls(**kwargs)`` (picklable: a class and a dict)."""
        return [functools.partial(cls, **kwargs)] * num_envs
    return build


def tasks() -> dict[str, Callable[..., list[Callable[[], gymnasium.Env]]]]:
    """``{task id: builder}`` for every recipe (``shmpool.registration`` registers them).

    The ids equal gymnasium's, so ``shmpool.make("Ant-v5", ...)`` builds recipes instead of
    ``gymnasium.make("Ant-v5")`` envs (``make_vec``/``VectorEnv("Ant-v5")`` still build
    gymnasium's)."""
    return {task_id: _builder(cls) for task_id, cls in TASKS.items()}
