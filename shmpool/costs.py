"""What one env step costs, and whether envs that cheap earn a worker process beside a trainer.

Handing a shard to a worker costs a post, a wake-up of a sleeping core and a wait for it: beside
a trainer whose torch threads hold the other core, that hand-off cost more than stepping 32
CartPoles here (CleanRL's ppo.py on 2 cores: the default layout 0.80-0.90x SyncVectorEnv, every
env in this process 0.95-0.98x; docs/performance.md).  Envs whose whole batch costs less than
``IN_PROCESS_BELOW_S`` per step are then stepped in this process; heavier ones (Ant-v5: 187 us an
env) keep their workers, which win there.  The cost is measured on a probe env built from the
pool's last constructor (scripts give env 0 the extras: video, rendering), stepped with random actions
and closed: never one of the pool's envs, so trajectories are untouched.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# Below this much env work per step (all envs), a trainer's process steps them itself.
IN_PROCESS_BELOW_S = 1e-3
PROBE_STEPS = 100          # steps timed on the probe env (the first, cold one is not counted)
PROBE_BUDGET_S = 0.05      # at most this long stepping it


def step_cost(make_env: Callable[[], Any], steps: int = PROBE_STEPS, budget_s: float = PROBE_BUDGET_S) -> float | None:
    """Seconds of one ``step`` of an env built by ``make_env`` (random actions, reset when an
    episode ends): the lower quartile of the steps timed, what a step costs when nothing else
    runs.  The median of the first 24 steps swung 13-28 us for CartPole in CleanRL's script on
    a 2-vCPU VM, and 32 of them sit near ``IN_PROCESS_BELOW_S``: the layout flipped from run to
    run (a worker at 0.66x SyncVectorEnv).  The lower quartile of 100 steps stayed 10-16 us.
    None when it cannot be measured (the constructor or the env raised: the pool's own
    start-up reports that)."""
    env = None
    try:
        env = make_env()
        env.action_space.seed(0)
        env.reset(seed=0)
        times = []
        deadline = time.perf_counter() + budget_s
        for k in range(steps + 1):
            action = env.action_space.sample()
            start = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(action)
            if k:   # the first step pays one-off checks (gymnasium's env checker)
                times.append(time.perf_counter() - start)
            if terminated or truncated:
                env.reset()
            if time.perf_counter() > deadline:
                break
        if not times:
            return None
        times.sort()
        return times[len(times) // 4]
    except Exception:
        return None
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:
                pass


def cheap_enough(cost: float | None, num_envs: int) -> bool:
    """Whether ``num_envs`` envs of ``cost`` seconds a step are stepped faster here than handed out."""
    return cost is not None and cost * num_envs < IN_PROCESS_BELOW_S
