"""Single-core cost of one ``env.step``: shmpool's MuJoCo/Atari recipe vs gymnasium's env, its physics floor
and the Python around each; ``python -m bench tasks`` reports it (``--costs-only``: that table alone).
"""
from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np

from . import subjects
from .envs import gym_atari

try:
    import mujoco
except ImportError:   # Atari only
    mujoco = None
# shmpool's MuJoCo recipes by task id (imported by name: a recipe module is not a first-party import everywhere)
TASKS = {} if mujoco is None else importlib.import_module("shmpool.workers.recipes.mujoco").TASKS

Runner = Callable[[np.ndarray], int]   # steps a block of actions, returns elapsed ns


def _stepper(env: gym.Env, seed: int) -> Runner:
    """Times ``env.step`` over a block of actions; resets (untimed) at episode ends."""
    env.reset(seed=seed)
    step, clock = env.step, time.perf_counter_ns

    def run(actions: np.ndarray) -> int:
        total = 0
        for a in actions:
            t0 = clock()
            _, _, terminated, truncated, _ = step(a)
            total += clock() - t0
            if terminated or truncated:
                env.reset()
        return total
    return run


def _time_physics(env) -> list[int]:
    """Accumulates ``[ns, calls]`` spent in the recipe's ``_simulate`` (ctrl write, ``mj_step``,
    ``mj_rnePostConstraint`` where needed), i.e. the physics share of its own steps."""
    acc, simulate, clock = [0, 0], env._simulate, time.perf_counter_ns

    def timed(action: np.ndarray) -> None:
        t0 = clock()
        simulate(action)
        acc[0] += clock() - t0
        acc[1] += 1
    env._simulate = timed
    return acc


def _interleaved(runners: dict[str, Runner], actions: np.ndarray, block: int, repeats: int,
                 counters: Sequence[list[int]] = ()) -> dict[str, float]:
    """Median over ``repeats`` of µs/step per runner, blocks of ``block`` steps alternating; ``counters``
    (:func:`_time_physics`'s) are zeroed after the warm-up, so they count the timed steps only."""
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for run in runners.values():   # warm-up: caches, lazy imports, the env checker's first call
        run(actions[:block])
    for acc in counters:
        acc[:] = [0, 0]
    for _ in range(repeats):
        totals = dict.fromkeys(runners, 0)
        for start in range(0, len(actions), block):
            chunk = actions[start:start + block]
            for name, run in runners.items():
                totals[name] += run(chunk)
        for name in runners:
            samples[name].append(totals[name] / 1e3 / len(actions))
    return {name: statistics.median(v) for name, v in samples.items()}


def _is_atari(task: str) -> bool:
    if task in TASKS:
        return False
    try:
        from shmpool.workers.recipes.atari import GAMES
    except ImportError:
        return False
    return task in GAMES


def measure_atari(task: str, steps: int, repeats: int, block: int) -> dict[str, float | None]:
    """Median µs/step of the Atari recipe and gymnasium's wrapped env (Atari has no physics split here)."""
    from shmpool.workers.recipes.atari import GAMES, AtariEnv

    recipe, reference = AtariEnv(GAMES[task]), gym_atari(task)
    actions = np.random.default_rng(0).integers(0, recipe.action_space.n, size=steps)
    result = _interleaved({"recipe": _stepper(recipe, 0), "gymnasium": _stepper(reference, 0)}, actions, block, repeats)
    return {**result, "physics": None, "gym unwrapped": None, "recipe overhead": None, "gym overhead": None}


def measure(task: str, steps: int, repeats: int, block: int) -> dict[str, float | None]:
    """Median µs/step of each side for ``task`` (keys as in the printed columns)."""
    if _is_atari(task):
        return measure_atari(task, steps, repeats, block)
    def sides() -> tuple[gym.Env, gym.Env, gym.Env]:
        reference = gym.make(task)
        unwrapped = gym.wrappers.TimeLimit(gym.make(task).unwrapped, reference.spec.max_episode_steps)
        return TASKS[task](), reference, unwrapped

    recipe, reference, unwrapped = sides()
    space = reference.action_space
    rng = np.random.default_rng(0)
    actions = rng.uniform(space.low, space.high, size=(steps, *space.shape)).astype(np.float32)
    physics = _time_physics(recipe)
    result = _interleaved({"recipe": _stepper(recipe, 0), "gymnasium": _stepper(reference, 0),
                           "gym unwrapped": _stepper(unwrapped, 0)}, actions, block, repeats, [physics])
    result["physics"] = physics[0] / 1e3 / physics[1]
    real = mujoco.mj_step, mujoco.mj_rnePostConstraint
    mujoco.mj_step = lambda m, d, nstep=1: None
    mujoco.mj_rnePostConstraint = lambda m, d: None
    try:
        recipe, reference, _ = sides()
        overhead = _interleaved({"recipe overhead": _stepper(recipe, 0), "gym overhead": _stepper(reference, 0)},
                                actions, block, repeats)
    finally:
        mujoco.mj_step, mujoco.mj_rnePostConstraint = real
    return {**result, **overhead}


def envpool_cost(task: str, steps: int, repeats: int, n: int = 32) -> float:
    """Median µs per env step of EnvPool with one thread stepping ``n`` envs per call, fed fresh
    uniform random actions every step (as the single envs above are)."""
    vec = subjects.open_vec(subjects.ENVPOOL, task, n, num_threads=1)
    try:
        space, calls = vec.action_space, max(1, steps // n)
        rng = np.random.default_rng(subjects.ACTION_SEED)
        if isinstance(space, gym.spaces.Discrete):
            acts = rng.integers(0, space.n, size=(calls, n)).astype(space.dtype)
        else:
            acts = rng.uniform(space.low, space.high, size=(calls, n, *space.shape)).astype(space.dtype)
        vec.reset()
        for a in acts:   # warm-up
            vec.env.step(a)
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for a in acts:
                vec.env.step(a)
            samples.append(1e6 * (time.perf_counter() - t0) / (calls * n))
        return statistics.median(samples)
    finally:
        vec.close()


def step_costs(task: str, steps: int, repeats: int, with_envpool: bool = True) -> dict[str, float | None]:
    """:func:`measure` (blocks of 50 steps), plus EnvPool's µs per step on one thread (``with_envpool``)."""
    costs = measure(task, steps, repeats, 50)
    if with_envpool:
        costs["EnvPool, 1 thread"] = envpool_cost(task, steps, repeats)
    return costs

