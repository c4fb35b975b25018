"""The envs the benchmarks step besides plain ``gym.make(id)``: one home, importable alone.

Only gymnasium and numpy are imported here (ale_py and the recipes lazily), so worker processes,
Ray nodes (``bench latency --ray`` pickles this module by value) and other bench
modules such as ``bench.recipe_cost`` can use it without pulling in a benchmark.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import gymnasium as gym
import numpy as np

ATARI_TASKS = ("Pong-v5",)   # EnvPool-style ids whose gymnasium twin is gym_atari's wrapper stack


class EmptyEnv(gym.Env):
    """An env whose step does nothing and returns a preallocated observation: what the machinery alone costs.

    Observation: ``(1,)`` float32 zeros; action: ``Discrete(2)``; never ends."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self._obs = np.zeros(1, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self._obs, {}

    def step(self, action):
        return self._obs, 0.0, False, False, {}


class DictObsEnv(EmptyEnv):
    """Returns one prebuilt Dict observation and never ends: ``{"box": (16,), "pos": (2,)}`` float32,
    or with ``text`` a ``Text(16)`` leaf instead of ``pos`` (it travels pickled per env: what that costs)."""

    def __init__(self, text: bool = False) -> None:
        box = gym.spaces.Box(-1.0, 1.0, (16,), np.float32)
        other = gym.spaces.Text(16) if text else gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({"box": box, "text" if text else "pos": other})
        self._obs = {"box": np.zeros(16, np.float32),
                     **({"text": "hellofallback123"} if text else {"pos": np.zeros(2, np.float32)})}


# Ids of the benchmark's own envs, for ``--tasks`` beside gymnasium's.
BENCH_ENVS = {"DictObs-v0": functools.partial(DictObsEnv), "DictTextObs-v0": functools.partial(DictObsEnv, text=True)}


def gym_atari(task: str) -> gym.Env:
    """gymnasium's equivalent of shmpool's Atari recipe (and of EnvPool's ``<Game>-v5``): the raw
    ALE env without frame skip or sticky actions, ``AtariPreprocessing`` (30 no-ops, 4
    frames max-pooled, 84x84 INTER_AREA gray) and a 4-frame stack: ``(4, 84, 84)`` uint8.
    No fire reset: gymnasium has no wrapper for it."""
    try:
        import ale_py
    except ImportError as exc:
        raise gym.error.DependencyNotInstalled(f"ale_py: {exc}") from exc
    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{task}", frameskip=1, repeat_action_probability=0.0)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
    return gym.wrappers.FrameStackObservation(env, 4)


def gym_env_fn(task: str) -> Callable[[], gym.Env]:
    """A picklable constructor of gymnasium's env for ``task``: :func:`gym_atari` for the Atari
    ids of :data:`ATARI_TASKS`, the bench's own of :data:`BENCH_ENVS`, else ``gym.make(task)``."""
    if task in BENCH_ENVS:
        return BENCH_ENVS[task]
    if task in ATARI_TASKS:
        return functools.partial(gym_atari, task)
    return functools.partial(gym.make, task)


def recipe_env(task: str) -> Callable[[], gym.Env] | None:
    """shmpool's own recipe constructor for ``task`` (what ``shmpool.make(task)`` steps), or None when
    shmpool has none or its optional dependency (mujoco, ale_py) is missing."""
    try:
        if task in ATARI_TASKS:
            from shmpool.workers.recipes import atari
            return functools.partial(atari.AtariEnv, atari.GAMES[task])
        from shmpool.workers.recipes import mujoco
    except ImportError:
        return None
    return mujoco.TASKS.get(task)
