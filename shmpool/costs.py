"""What one env step is known to cost, and whether envs that cheap earn a worker process beside a trainer.

Handing a shard to a worker costs a post, a wake-up of a sleeping core and a wait for it: beside
a trainer whose torch threads hold the other core, that hand-off cost more than stepping 32
CartPoles here (CleanRL's ppo.py on 2 cores: the default layout 0.80-0.90x SyncVectorEnv, every
env in this process 0.95-0.98x; docs/performance.md).  Envs whose whole batch costs less than
``IN_PROCESS_BELOW_S`` per step are then stepped in this process; heavier ones (Ant-v5: 187 us an
env) keep their workers, which win there.

The cost is *known*, never measured on the user's envs: the layout (how many worker processes) is
settled before any env exists, and no env is built, reset or stepped for the pool's own purposes.
An env's effects outside its process are real (a log it appends to, a counter it draws its id
from, a server it drives), so a probe env stepped even in a forked copy of the trainer added
episodes nobody played (issue 69).  What is read instead is which env a constructor builds, from
the objects themselves and without calling anything (``named_env_id``): a gymnasium id given to the
pool, an id a ``functools.partial`` carries, or one a function holds in its closure or constants
(CleanRL's ``make_env(env_id, ...)`` thunks, SB3's ``make_vec_env``, ``lambda: gym.make("CartPole-v1")``).
The id's registered entry point then names the kind of env, and ``STEP_COST_S`` holds what one step
of each cheap kind costs.  A constructor that names no id, or more than one, or an id whose kind is
not in the table, keeps the default layout.  Keyword arguments to ``gymnasium.make`` other than a
render mode that does no work per step make the cost unknown too, and so does a constructor that
holds the string ``"human"`` anywhere (``render_mode="human"`` draws every step).
"""
from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium

# Below this much env work per step (all envs), a trainer's process steps them itself.
IN_PROCESS_BELOW_S = 1e-3

# One step of each kind of env known to be cheap, with gymnasium.make's wrappers and
# RecordEpisodeStatistics: the 90th percentile of 3,000 random-action steps on a 2-vCPU Intel host,
# 2026-11-29, rounded up (the median is 3-32 us).  Keyed by entry point, which names the class whatever
# the id's version.  Every other kind is not known to be cheap.
STEP_COST_S = {
    "gymnasium.envs.classic_control.cartpole:CartPoleEnv": 8e-6,
    "gymnasium.envs.classic_control.mountain_car:MountainCarEnv": 20e-6,
    "gymnasium.envs.classic_control.continuous_mountain_car:Continuous_MountainCarEnv": 4e-6,
    "gymnasium.envs.classic_control.pendulum:PendulumEnv": 13e-6,
    "gymnasium.envs.classic_control.acrobot:AcrobotEnv": 34e-6,
    "gymnasium.envs.toy_text.frozen_lake:FrozenLakeEnv": 7e-6,
    "gymnasium.envs.toy_text.cliffwalking:CliffWalkingEnv": 6e-6,
    "gymnasium.envs.toy_text.taxi:TaxiEnv": 12e-6,   # Taxi-v4, measured beside a CI run (p90 11 us)
    "gymnasium.envs.toy_text.blackjack:BlackjackEnv": 19e-6,
}

# Render modes that do no work in ``step`` (an image is made only when ``render()`` is called).
IDLE_RENDER_MODES = (None, "rgb_array", "ansi")

# Libraries whose functions a constructor passes through (gymnasium.make, SB3's make_vec_env, the pool's own
# wrappers): their closures hold the user's values, their code's strings are theirs, not the user's.
LIBRARIES = ("gymnasium", "shmpool", "stable_baselines3")

_MAX_DEPTH = 4   # partials of closures of partials...: deeper than any constructor a script writes


@dataclass(frozen=True)
class KnownCost:
    """What one step of a pool's envs is known to cost: ``env_id`` (as the constructors name it),
    its registered ``entry_point`` and ``seconds`` of one step from ``STEP_COST_S``."""

    env_id: str
    entry_point: str
    seconds: float

    def describe(self) -> str:
        """The known cost, as ``repr(pool)`` says it."""
        return f"{self.env_id} ({self.entry_point}) steps in about {self.seconds * 1e6:.0f} µs"


def known_cost(fns: list[Callable[[], Any]]) -> KnownCost | None:
    """What one step of the envs ``fns`` build is known to cost, read from the constructors without
    calling them; None when any of them names no id, several ids, or one of unknown cost."""
    found = None
    for fn in {id(f): f for f in fns}.values():   # each distinct constructor once
        env_id = named_env_id(fn)
        if env_id is None or (found is not None and env_id != found):
            return None
        found = env_id
    if found is None:
        return None
    entry_point = str(gymnasium.registry[found].entry_point)
    seconds = STEP_COST_S.get(entry_point)
    return None if seconds is None else KnownCost(found, entry_point, seconds)


def named_env_id(fn: Any) -> str | None:
    """The one registered gymnasium id a constructor names (see the module's docstring), or None."""
    ids = set()
    for value, kwargs in _named_values(fn, 0, set()):
        if (kwargs is not None and not _idle_kwargs(kwargs)) or value == "human":
            return None   # gymnasium.make's keyword arguments, or a window drawn every step, change what a step costs
        if isinstance(value, str) and value in gymnasium.registry:
            ids.add(value)
        elif isinstance(value, gymnasium.envs.registration.EnvSpec) and value.id in gymnasium.registry:
            ids.add(value.id)
    return ids.pop() if len(ids) == 1 else None


def cheap_enough(cost: KnownCost | None, num_envs: int) -> bool:
    """Whether ``num_envs`` envs of ``cost`` are stepped faster here than handed out."""
    return cost is not None and cost.seconds * num_envs < IN_PROCESS_BELOW_S


def _named_values(obj: Any, depth: int, seen: set[int]) -> Iterator[tuple[Any, dict | None]]:
    """The values a constructor carries (partial arguments, closure cells, code constants), with the
    keyword dict a ``make_by_id``-style partial passes to ``gymnasium.make`` (None elsewhere).
    Reads attributes only: nothing is called."""
    if depth > _MAX_DEPTH or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, functools.partial):
        dicts = [a for a in obj.args if isinstance(a, dict)]
        for arg in obj.args:
            if not isinstance(arg, dict):
                yield arg, (dicts[0] if len(dicts) == 1 else None)
                yield from _named_values(arg, depth + 1, seen)
        for value in obj.keywords.values():
            yield value, None
        yield from _named_values(obj.func, depth + 1, seen)
    elif isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:   # a cell not yet filled
                continue
            yield value, None
            yield from _named_values(value, depth + 1, seen)
        if (getattr(obj, "__module__", None) or "").partition(".")[0] not in LIBRARIES:
            for const in obj.__code__.co_consts:   # the script's own code: gymnasium.make's holds "human"
                if isinstance(const, str):
                    yield const, None


def _idle_kwargs(kwargs: dict) -> bool:
    """Whether ``gymnasium.make(id, **kwargs)`` steps as ``gymnasium.make(id)`` does."""
    return all(key == "render_mode" and value in IDLE_RENDER_MODES for key, value in kwargs.items())
