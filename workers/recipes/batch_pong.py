"""BatchPong: a Pong-like game for many envs at once, in numpy (no Python loop over envs).

After BlackHC's ``batch_pong_poc`` (one numpy call steps every env of a batch).  Not Atari Pong:
a small continuous game with the same shape.

The game (units: the field is the square [0, 1] x [0, 1], y pointing up):

- Two paddles of height ``2 * PADDLE_HALF``: the agent's on the right (its face at
  ``x = RIGHT_FACE``), the opponent's on the left (face at ``x = LEFT_FACE``).
- Actions (``Discrete(3)``): 0 stay, 1 up (+y), 2 down (-y); the paddle moves
  ``PADDLE_SPEED`` per step, kept inside the field.
- The opponent tracks the ball's y plus an aim offset (drawn uniformly in
  ``[-OPPONENT_AIM, OPPONENT_AIM]`` at each serve and each time the agent hits the ball; a
  little wider than its paddle's reach, so it misses now and then and angles its returns)
  while the ball comes towards it, and returns to the centre otherwise, at most
  ``OPPONENT_SPEED`` per step (slower than the agent: steep balls beat it).
- The ball (radius ``BALL_RADIUS``) moves by its velocity each step and bounces off the
  top and bottom walls (mirror).  A ball crossing a paddle's face line while the paddle
  covers it (``|y - paddle| <= PADDLE_HALF + BALL_RADIUS``) is hit back: its speed grows by
  ``SPEED_UP`` (up to ``MAX_SPEED``) and it leaves at an angle set by where it hit (the
  paddle's centre sends it straight, its edges at up to ``MAX_BOUNCE_SIN``).
- A ball past the left edge (x < 0) is a point for the agent (reward +1), past the
  right edge (x > 1) a point for the opponent (reward -1).  After a point the ball is
  served from the centre: random y in [0.25, 0.75], random side, random angle
  (|sin| <= 0.5) at ``SERVE_SPEED``.
- ``terminated`` when either side reaches ``WIN_SCORE`` (21) points;
  ``truncated`` at ``max_episode_steps`` steps (default 27,000 as Atari's v5 envs: 108,000
  frames at frame skip 4; a 21-point game here takes ~1,500-4,000 steps).  The step that ends
  an episode has ``infos["agent_score"]`` and ``infos["opponent_score"]`` (int64).

Observation (float32, 6): ball x, ball y, ball vx / MAX_SPEED, ball vy / MAX_SPEED, the
agent's paddle y, the opponent's paddle y; positions in [0, 1], velocities in [-1, 1].

Randomness and reproducibility: per-env ``np.random.Generator`` objects are far too slow
for thousands of envs, and one Generator per batch would make an env's trajectory depend
on its neighbours.  Each env instead has a 64-bit key (from its seed) and a counter; its
random numbers are a counter-based hash (splitmix64) of the two, computed for all envs in
one numpy pass.  So **an env's trajectory depends only on its own seed and its own
actions**: the same seed and actions give the same trajectory whatever the batch size,
the shard layout, the other envs or which subset is stepped together, and ``PongEnv``
(one env) reproduces any env of a ``BatchPong``.  An env reset with ``seed=None``
continues its stream (a never-seeded env gets a key from the OS's entropy).  The physics
uses only +, -, *, / and sqrt (correctly rounded everywhere), so numpy's SIMD and scalar
paths agree bit for bit.
"""
from __future__ import annotations

import functools
import os

import gymnasium
import numpy as np
from gymnasium import spaces

from shmpool.autoreset_modes import DISABLED, NEXT_STEP, SAME_STEP
from shmpool.batched import Batched, BatchEnv

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_SEED_SALT = np.uint64(0x5EED0F0BA7C490A6)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def seed_keys(seeds) -> np.ndarray:
    """The 64-bit key of each int seed (non-negative, as gymnasium's)."""
    arr = np.array([int(s) & 0xFFFFFFFFFFFFFFFF for s in seeds], dtype=np.uint64)
    return _mix(arr ^ _SEED_SALT)


class BatchPong(BatchEnv):
    """``num_envs`` Pong games stepped together; the :class:`~shmpool.batched.BatchEnv` protocol.

    ``BatchPong(n, start=0, max_episode_steps=27000)``: ``start`` is the global id of the
    first env (the protocol's ``make_fn(n, start)``; it only salts the keys of never-seeded
    envs).  Implements the NEXT_STEP, SAME_STEP and DISABLED autoreset modes.  Outside a
    pool, call :meth:`bind_own` to get result arrays of its own."""

    PADDLE_HALF = 0.075
    PADDLE_SPEED = 0.035
    OPPONENT_SPEED = 0.02
    OPPONENT_AIM = 0.095
    BALL_RADIUS = 0.0125
    LEFT_FACE, RIGHT_FACE = 0.06, 0.94
    SERVE_SPEED = 0.02
    MAX_SPEED = 0.045
    SPEED_UP = 1.04
    MAX_BOUNCE_SIN = 0.866   # ~60 degrees
    WIN_SCORE = 21

    metadata = {"render_modes": []}
    autoreset_modes = (NEXT_STEP, SAME_STEP, DISABLED)
    supports_subsets = True

    def __init__(self, num_envs: int, start: int = 0, max_episode_steps: int = 27000) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        self.num_envs = n = int(num_envs)
        self.start = int(start)
        self.max_episode_steps = int(max_episode_steps)
        self.single_observation_space = spaces.Box(
            np.array([0, 0, -1, -1, 0, 0], np.float32), np.array([1, 1, 1, 1, 1, 1], np.float32), dtype=np.float32)
        self.single_action_space = spaces.Discrete(3)
        f = np.zeros
        self.bx, self.by, self.vx, self.vy, self.speed = f(n), f(n), f(n), f(n), f(n)
        self.py, self.oy = np.full(n, 0.5), np.full(n, 0.5)
        self.aim = f(n)
        self.agent_score, self.opponent_score = f(n, np.int64), f(n, np.int64)
        self.t = f(n, np.int64)
        self.key, self.ctr = f(n, np.uint64), f(n, np.uint64)
        self.keyed = f(n, bool)
        self.ended = f(n, bool)            # NEXT_STEP: reset at the next step
        self._all = np.arange(n, dtype=np.int64)
        self.obs = None

    # --- protocol -------------------------------------------------------------

    def bind_own(self, autoreset_mode: str = NEXT_STEP) -> BatchPong:
        """Bind fresh arrays of its own (use outside a pool); returns self."""
        n = self.num_envs
        self.bind(np.zeros((n, 6), np.float32), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), autoreset_mode)
        return self

    def reset(self, env_ids: np.ndarray, seeds=None, options=None) -> dict:
        ids = np.asarray(env_ids, dtype=np.int64)
        if seeds is not None:
            given = [(k, s) for k, s in enumerate(seeds) if s is not None]
            if given:
                pos = np.array([k for k, _ in given], dtype=np.int64)
                self.key[ids[pos]] = seed_keys([s for _, s in given])
                self.ctr[ids[pos]] = 0
                self.keyed[ids[pos]] = True
        fresh = ids[~self.keyed[ids]]
        if len(fresh):
            base = np.uint64(int.from_bytes(os.urandom(8), "little"))
            self.key[fresh] = _mix(base + (fresh + self.start).astype(np.uint64) * _GOLDEN)
            self.ctr[fresh] = 0
            self.keyed[fresh] = True
        self._reset_rows(ids)
        self.reward[ids] = 0.0
        self.terminated[ids] = False
        self.truncated[ids] = False
        self._write_obs(ids)
        return {}

    def step(self, env_ids: np.ndarray, actions) -> dict:
        ids = np.asarray(env_ids, dtype=np.int64)
        actions = np.asarray(actions)
        infos: dict = {}
        if self.autoreset_mode == NEXT_STEP:
            again = self.ended[ids]
            if again.any():
                redo = ids[again]
                self._reset_rows(redo)
                self.reward[redo] = 0.0
                self.terminated[redo] = False
                self.truncated[redo] = False
                self._write_obs(redo)
                keep = ~again
                ids, actions = ids[keep], actions[keep]
                if not len(ids):
                    return infos
                rows = np.flatnonzero(keep)
                infos = self._physics(ids, actions)
                return _spread(infos, rows, len(keep))
        return self._physics(ids, actions)

    # --- the game -------------------------------------------------------------

    def _uniform(self, ids: np.ndarray, k: int) -> list[np.ndarray]:
        """``k`` uniforms in [0, 1) per env of ``ids`` from its (key, counter)."""
        key, ctr = self.key[ids], self.ctr[ids]
        self.ctr[ids] = ctr + np.uint64(k)
        return [(_mix(key + (ctr + np.uint64(j)) * _GOLDEN) >> _S11).astype(np.float64) * (2.0 ** -53)
                for j in range(k)]

    def _serve(self, ids: np.ndarray) -> None:
        uy, ua, ud, uaim = self._uniform(ids, 4)
        self.aim[ids] = self.OPPONENT_AIM * (2.0 * uaim - 1.0)
        speed = np.full(len(ids), self.SERVE_SPEED)
        vy = speed * (ua - 0.5)                         # |sin| <= 0.5
        vx = np.sqrt(speed * speed - vy * vy)
        self.bx[ids] = 0.5
        self.by[ids] = 0.25 + 0.5 * uy
        self.vx[ids] = np.where(ud < 0.5, -vx, vx)
        self.vy[ids] = vy
        self.speed[ids] = speed

    def _reset_rows(self, ids: np.ndarray) -> None:
        self.py[ids] = 0.5
        self.oy[ids] = 0.5
        self.agent_score[ids] = 0
        self.opponent_score[ids] = 0
        self.t[ids] = 0
        self.ended[ids] = False
        self._serve(ids)

    def _write_obs(self, ids) -> None:
        m = self.MAX_SPEED
        self.obs[ids] = np.stack([self.bx[ids], self.by[ids], self.vx[ids] / m, self.vy[ids] / m,
                                  self.py[ids], self.oy[ids]], axis=1)

    def _bounce(self, hit, y, paddle, speed, sign):
        """New (vx, vy, speed) for balls that hit a paddle (``sign``: direction of the new vx)."""
        reach = self.PADDLE_HALF + self.BALL_RADIUS
        offset = np.clip((y - paddle) / reach, -1.0, 1.0)
        new_speed = np.minimum(speed * self.SPEED_UP, self.MAX_SPEED)
        vy = new_speed * offset * self.MAX_BOUNCE_SIN
        vx = sign * np.sqrt(new_speed * new_speed - vy * vy)
        return vx, vy, new_speed

    def _physics(self, ids: np.ndarray, actions: np.ndarray) -> dict:
        full = len(ids) == self.num_envs and np.array_equal(ids, self._all)
        idx = slice(None) if full else ids
        r, half = self.BALL_RADIUS, self.PADDLE_HALF
        lo, hi = half, 1.0 - half

        # Paddles: the agent's from its action, the opponent's tracking the ball.
        move = np.where(actions == 1, 1.0, np.where(actions == 2, -1.0, 0.0))
        py = np.clip(self.py[idx] + self.PADDLE_SPEED * move, lo, hi)
        bx, by, vx, vy, speed = self.bx[idx], self.by[idx], self.vx[idx], self.vy[idx], self.speed[idx]
        oy = self.oy[idx]
        target = np.where(vx < 0, by + self.aim[idx], 0.5)
        oy = np.clip(oy + np.clip(target - oy, -self.OPPONENT_SPEED, self.OPPONENT_SPEED), lo, hi)

        # Ball: move, mirror off the walls.
        nx, ny = bx + vx, by + vy
        low, high = ny < r, ny > 1.0 - r
        ny = np.where(low, 2 * r - ny, np.where(high, 2 * (1.0 - r) - ny, ny))
        vy = np.where(low | high, -vy, vy)

        # Paddles: a ball crossing a face line where the paddle covers it is hit back.
        reach = half + r
        right = (vx > 0) & (bx + r <= self.RIGHT_FACE) & (nx + r > self.RIGHT_FACE)
        left = (vx < 0) & (bx - r >= self.LEFT_FACE) & (nx - r < self.LEFT_FACE)
        frac = np.where(right, (self.RIGHT_FACE - r - bx), np.where(left, (self.LEFT_FACE + r - bx), 0.0))
        frac = frac / np.where(vx == 0, 1.0, vx)
        yc = by + (ny - by) * frac
        hit_r = right & (np.abs(yc - py) <= reach)
        hit_l = left & (np.abs(yc - oy) <= reach)
        hit = hit_r | hit_l
        if hit.any():
            paddle = np.where(hit_r, py, oy)
            sign = np.where(hit_r, -1.0, 1.0)
            hvx, hvy, hspeed = self._bounce(hit, yc, paddle, speed, sign)
            vx = np.where(hit, hvx, vx)
            vy = np.where(hit, hvy, vy)
            speed = np.where(hit, hspeed, speed)
            nx = np.where(hit_r, self.RIGHT_FACE - r, np.where(hit_l, self.LEFT_FACE + r, nx))
            ny = np.where(hit, yc, ny)
            if hit_r.any():   # the opponent picks a new aim for the ball coming back
                back = ids[hit_r]
                self.aim[back] = self.OPPONENT_AIM * (2.0 * self._uniform(back, 1)[0] - 1.0)

        # Points.
        agent_point, opponent_point = nx < 0.0, nx > 1.0
        reward = agent_point.astype(np.float64) - opponent_point
        if full:
            self.bx, self.by, self.vx, self.vy, self.speed = nx, ny, vx, vy, speed
            self.py, self.oy = py, oy
        else:
            self.bx[ids], self.by[ids], self.vx[ids], self.vy[ids], self.speed[ids] = nx, ny, vx, vy, speed
            self.py[ids], self.oy[ids] = py, oy
        self.agent_score[idx] += agent_point
        self.opponent_score[idx] += opponent_point
        scored = agent_point | opponent_point
        if scored.any():
            self._serve(ids[scored])
        t = self.t[idx] + 1
        self.t[idx] = t
        agent_score, opponent_score = self.agent_score[idx], self.opponent_score[idx]
        terminated = (agent_score >= self.WIN_SCORE) | (opponent_score >= self.WIN_SCORE)
        truncated = t >= self.max_episode_steps
        self.reward[idx] = reward
        self.terminated[idx] = terminated
        self.truncated[idx] = truncated
        done = terminated | truncated
        self._write_obs(idx)
        if not done.any():
            return {}
        scores = {"agent_score": np.where(done, agent_score, 0), "_agent_score": done,
                  "opponent_score": np.where(done, opponent_score, 0), "_opponent_score": done}
        ended = ids[done]
        if self.autoreset_mode == NEXT_STEP:
            self.ended[ended] = True
            return scores
        if self.autoreset_mode == SAME_STEP:
            final_obs = np.full(len(ids), None, dtype=object)
            rows = np.flatnonzero(done)
            for row, ob in zip(rows, self.obs[ended].copy()):
                final_obs[row] = ob
            self._reset_rows(ended)
            self._write_obs(ended)
            return {"final_obs": final_obs, "_final_obs": done, "final_info": scores, "_final_info": done}
        return scores


def _spread(infos: dict, rows: np.ndarray, size: int) -> dict:
    """Infos over a subset of rows, spread back over ``size`` rows (masks False elsewhere)."""
    out: dict = {}
    for key, value in infos.items():
        if isinstance(value, dict):
            out[key] = _spread(value, rows, size)
            continue
        value = np.asarray(value)
        full = np.zeros(size, dtype=value.dtype) if value.dtype != object else np.full(size, None, dtype=object)
        full[rows] = value
        out[key] = full
    return out


class PongEnv(gymnasium.Env):
    """One BatchPong game as a ``gymnasium.Env``: the same rules (a ``BatchPong`` of one env).

    The one-env-at-a-time reference: ``gymnasium.vector.SyncVectorEnv([PongEnv] * n)`` gives,
    env for env, what a pool hosting ``BatchPong`` gives with the same seeds and actions."""

    metadata = {"render_modes": []}

    def __init__(self, max_episode_steps: int = 27000) -> None:
        self._game = BatchPong(1, 0, max_episode_steps).bind_own(DISABLED)
        self.observation_space = self._game.single_observation_space
        self.action_space = self._game.single_action_space
        self._ids = np.zeros(1, dtype=np.int64)
        self._act = np.zeros(1, dtype=np.int64)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._game.reset(self._ids, [seed], options)
        return self._game.obs[0].copy(), {}

    def step(self, action):
        self._act[0] = action
        g = self._game
        infos = g.step(self._ids, self._act)
        info = {k: v[0] for k, v in infos.items() if not k.startswith("_") and infos["_" + k][0]}
        return g.obs[0].copy(), float(g.reward[0]), bool(g.terminated[0]), bool(g.truncated[0]), info


def _batch_pong(num_envs: int, **kwargs) -> Batched:
    """``BatchPong-v0``: one ``BatchPong`` per worker (kwargs: ``max_episode_steps``)."""
    return Batched(functools.partial(BatchPong, **kwargs), num_envs=num_envs)


def tasks() -> dict:
    """``{task id: builder}`` for ``shmpool.make``: ``BatchPong-v0``."""
    return {"BatchPong-v0": _batch_pong}
