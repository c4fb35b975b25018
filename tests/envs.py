"""Small envs for the tests: a Dict-observation env with mixed infos, one that fails on demand, and the
:class:`Gate` a test holds a call pending with."""
from __future__ import annotations

import functools
import os
import signal
import time
import uuid

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Gate:
    """Holds an env's call until the test opens it, in place of a fixed sleep: the call stays pending exactly as
    long as the test needs, on a quiet machine or a loaded one.

    The gate is a file's existence, so it crosses any start method (fork, spawn, AsyncVectorEnv's workers) and
    a process killed while held leaves nothing behind (a ``multiprocessing.Event`` whose waiter was killed makes
    the next ``set()`` wait for it forever).  :meth:`hold` polls every :data:`POLL_S` and gives up after
    :data:`CAP_S` with a RuntimeError, so a test that never opens it fails instead of hanging."""

    POLL_S = 0.002
    CAP_S = 30.0

    def __init__(self, folder: str | os.PathLike) -> None:
        self.path = os.path.join(folder, f"gate-{uuid.uuid4().hex}")

    @property
    def is_open(self) -> bool:
        return os.path.exists(self.path)

    def open(self) -> None:
        with open(self.path, "w"):
            pass

    def hold(self) -> None:
        """Return once the gate is open (at once if it is)."""
        deadline = time.monotonic() + self.CAP_S
        while not self.is_open:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test never opened its gate ({self.CAP_S} s)")
            time.sleep(self.POLL_S)


class DictEnv(gym.Env):
    """Dict observations with every leaf kind, random episode lengths, numeric and other infos."""

    metadata = {"render_modes": []}

    def __init__(self, max_len: int = 12):
        self.observation_space = spaces.Dict({
            "pos": spaces.Box(-1.0, 1.0, (3,), np.float32),
            "count": spaces.Discrete(50),
            "flags": spaces.MultiBinary(2),
            "pair": spaces.Tuple((spaces.MultiDiscrete([3, 4]), spaces.Box(0, 255, (2, 2), np.uint8))),
        })
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.max_len = max_len
        self.t = 0
        self.marker = "fresh"

    def _obs(self):
        r = self.np_random
        return {
            "pos": r.uniform(-1, 1, 3).astype(np.float32),
            "count": self.t,
            "flags": r.integers(0, 2, 2).astype(np.int8),
            "pair": (r.integers(0, [3, 4]).astype(np.int64), r.integers(0, 256, (2, 2)).astype(np.uint8)),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        info = {"start": float(self.np_random.uniform()), "label": "reset"}
        if options and "note" in options:
            info["note"] = options["note"]
        return self._obs(), info

    def step(self, action):
        self.t += 1
        reward = float(np.sum(action)) + float(self.np_random.normal())
        terminated = bool(self.np_random.uniform() < 0.08)
        truncated = self.t >= self.max_len
        info = {"t": self.t, "score": np.float32(reward), "even": self.t % 2 == 0}
        if self.t % 3 == 0:
            info["tag"] = f"step{self.t}"
            info["vec"] = np.arange(2) * self.t
        return self._obs(), reward, terminated, truncated, info

    def get_marker(self, suffix=""):
        return self.marker + suffix


class FaultyEnv(gym.Env):
    """CartPole-like env that fails in a chosen way at a chosen step."""

    def __init__(self, fail_in: str = "never", at: int = 0, how: str = "raise"):
        self.observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.fail_in, self.at, self.how = fail_in, at, how
        self.steps = 0
        if fail_in == "make":
            self._fail("make")

    def _fail(self, where):
        if self.how == "raise":
            raise ValueError(f"injected failure in {where}")
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.how == "exit":
            os._exit(3)
        if self.how == "hang":
            time.sleep(3600)
        if self.how == "sleep":  # slow, not broken (tests/faults/matrix.py's SLOW_STEP_S)
            time.sleep(3.0)
        if self.how == "bad_obs":
            return np.zeros(5, np.float32)
        if self.how == "bad_dtype":
            return np.zeros(4, np.complex64)
        if self.how == "nan_reward":
            return "nan_reward"
        if self.how == "fork":  # a bare fork whose child returns from step (it ends itself 0.3 s later)
            if os.fork() == 0:
                import threading
                threading.Timer(0.3, os._exit, (0,)).start()
        return None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        if self.fail_in == "reset":
            self._fail("reset")
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.steps += 1
        obs, reward = np.full(4, self.steps, np.float32), 1.0
        if self.fail_in == "step" and self.steps >= self.at:
            bad = self._fail("step")
            if isinstance(bad, str):
                reward = float("nan")
            elif bad is not None:
                obs = bad
        return obs, reward, False, False, {}

    def close(self):
        if self.fail_in == "close":
            self._fail("close")

    def render(self):
        if self.fail_in == "render":
            self._fail("render")
        return np.zeros((2, 2, 3), np.uint8)

    def probe(self):
        """A method for ``call``: fails when told to fail in ``call``."""
        if self.fail_in == "call":
            self._fail("call")
        return self.steps


class EmptyEnv(gym.Env):
    """Does nothing: measures the pool's own round trip."""

    observation_space = spaces.Box(0, 1, (1,), np.float32)
    action_space = spaces.Discrete(2)
    _obs = np.zeros(1, np.float32)

    def reset(self, *, seed=None, options=None):
        return self._obs, {}

    def step(self, action):
        return self._obs, 0.0, False, False, {}


class ProbeEnv(EmptyEnv):
    """Reports what the worker process looks like from inside."""

    def probe(self):
        from threadpoolctl import threadpool_info
        return {
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "pools": [p["num_threads"] for p in threadpool_info()],
            "sigint": signal.getsignal(signal.SIGINT),
        }


class BigObsEnv(gym.Env):
    """Image observations and fixed-length episodes: every env ends on the same step."""

    observation_space = spaces.Box(0, 255, (64, 64, 4), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self, length: int = 3):
        self.length = length
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8), {}

    def step(self, action):
        self.t += 1
        obs = np.full(self.observation_space.shape, self.t, np.uint8)
        return obs, 1.0, self.t >= self.length, False, {"frame": obs.copy()}


class CounterEnv(gym.Env):
    """Observation: how many steps since the last reset; info ``tag`` (a string, so it
    travels on the side channel) says the same.  ``big_at``: that step's info also holds
    ``2**70``, which no batch array can take; ``delay``: seconds slept per step."""

    observation_space = spaces.Box(0, 1e9, (1,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, big_at: int = -1, delay: float = 0.0, tag: bool = True):
        self.big_at = big_at
        self.delay = delay
        self.tag = tag
        self.n = 0

    def _info(self) -> dict:
        return {"tag": f"t{self.n}"} if self.tag else {}

    def reset(self, *, seed=None, options=None):
        self.n = 0
        return np.zeros(1), self._info()

    def step(self, action):
        if self.delay:
            time.sleep(self.delay)
        self.n += 1
        info = self._info()
        if self.n == self.big_at:
            info["big"] = 2**70
        return np.array([float(self.n)]), 0.0, False, False, info


class SomeOwnElapsed(gym.Wrapper):
    """CartPole (3-step episodes) whose envs reset with an even seed report their own
    ``elapsed_step`` (1000 plus the steps since reset) in every info; the others report none,
    so a batch mixes envs with and without their own count."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1", max_episode_steps=3))
        self.own = False
        self.t = 0

    def _tagged(self, info: dict) -> dict:
        return {**info, "elapsed_step": 1000 + self.t} if self.own else info

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.own = seed % 2 == 0
        self.t = 0
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, self._tagged(info)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        return obs, reward, terminated, truncated, self._tagged(info)


def same(a, b, path: str) -> None:
    """Exact equality: the same types (numpy scalars vs python numbers too), dict keys, array
    dtypes and shapes, and values; object arrays element by element."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if a.dtype == object:
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{path}[{i}]")
        else:
            np.testing.assert_array_equal(a, b, err_msg=path)
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


class Journal(gym.Env):
    """Writes what happens to it to its own file: its effects outside its process are real, as a
    dataset recorder's or SB3's ``Monitor`` log's are."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, path):
        self.path = path
        self.write("build")

    def write(self, what):
        with open(self.path, "a") as f:
            f.write(what + "\n")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.write("reset")
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.write("step")
        return np.zeros(2, np.float32), 0.0, False, False, {}


def journals(folder, n: int) -> list[list[str]]:
    """What happened to each of ``n`` :class:`Journal` envs written under ``folder``, env by env."""
    return [(folder / f"env{i}.log").read_text().split() for i in range(n)]


def journal_fns(folder, n: int) -> list:
    """One constructor per env, each writing its own journal under ``folder``."""
    return [functools.partial(Journal, str(folder / f"env{i}.log")) for i in range(n)]


class ScriptEnv(gym.Env):
    """Observation: steps since the last reset.  ``infos[t]`` (t = that count) is the info that
    step returns (default ``{}``; a callable: what it returns); ``reset_info`` the reset's; ``raise_at[t]`` an exception
    raised instead of returning; ``obs_none_at`` a step that returns ``None`` as its observation."""

    observation_space = spaces.Box(0, 1e9, (1,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, infos=None, reset_info=None, raise_at=None, obs_none_at=-1, by_total=False):
        self.infos = infos or {}
        self.by_total = by_total   # ``infos`` keyed by steps over all episodes, not since the reset
        self.total = 0
        self.reset_info = reset_info or {}
        self.raise_at = raise_at or {}
        self.obs_none_at = obs_none_at
        self.t = 0
        self.resets = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.resets += 1
        info = self.reset_info(self.resets) if callable(self.reset_info) else dict(self.reset_info)
        return np.zeros(1), info

    def step(self, action):
        self.t += 1
        self.total += 1
        if self.t in self.raise_at:
            raise self.raise_at[self.t]
        obs = None if self.t == self.obs_none_at else np.array([float(self.t)])
        info = self.infos.get(self.total if self.by_total else self.t, {})
        return obs, 1.0, False, False, info() if callable(info) else info

    def double(self, x):
        return 2 * x
