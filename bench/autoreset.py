"""SAME_STEP autoreset at full speed: SB3's ShmVecEnv and gymnasium's SAME_STEP face vs the NEXT_STEP pool.

    python -m bench autoreset                                  # CartPole-v1, N=32, 3 × 2 s
    python -m bench autoreset --tasks CartPole-v1,Acrobot-v1 --num-envs 8,32 --repeats 5
    python -m bench autoreset --quick                          # N=8, 0.2 s, 1 repeat (the tests)

Env-only: every system steps N copies of ``gym.make(task)`` with one fixed batch of seeded
random actions (``bench.subjects.fixed_random_actions``; on CartPole every env keeps pushing one
way, so episodes end every ~10 steps and a step of 32 envs ends about three of them).  Systems,
interleaved (repetition 1 of every system, then repetition 2, ...):

- ``Pool NEXT_STEP``: ``shmpool.Pool(task, N).step`` — the pool's default mode, the anchor;
- ``Pool SAME_STEP``: the same pool with ``autoreset_mode="same_step"``: an ending step resets at
  once and returns the last observation in ``infos["final_obs"]``;
- ``VectorEnv SAME_STEP``: ``shmpool.VectorEnv(..., autoreset_mode=SAME_STEP)`` (copied observations,
  gymnasium's face);
- ``ShmVecEnv``: ``shmpool.sb3.ShmVecEnv`` (SAME_STEP, SB3's list of info dicts with
  ``terminal_observation``), through SB3's ``VecEnv.step``;
- ``SyncVectorEnv SAME_STEP`` and ``SB3 DummyVecEnv``: the one-process references for scale.

Ratios are of medians, against ``Pool NEXT_STEP`` of the same run.  The target: ShmVecEnv's
env-only throughput within 5 % of the NEXT_STEP pool's (issue 11).  What separates them is what
SAME_STEP adds per ended episode (the final observation, its info) and what SB3's face adds per
step (copying the observations, one info dict per env).
"""
from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

import shmpool

from . import cli
from ._timing import Case, Sample, run_interleaved, timed_loop
from .report import (
    Group,
    Target,
    consoles,
    environment,
    fmt_ratio,
    fmt_summary,
    markdown_table,
    print_failures,
    show_table,
    write_json,
)
from .subjects import fixed_random_actions, pool_info

POOL_NEXT, POOL_SAME, VECTOR_SAME, SHM_VEC = "Pool NEXT_STEP", "Pool SAME_STEP", "VectorEnv SAME_STEP", "ShmVecEnv"
SYNC_SAME, DUMMY = "SyncVectorEnv SAME_STEP", "SB3 DummyVecEnv"
SYSTEMS = (POOL_NEXT, POOL_SAME, VECTOR_SAME, SHM_VEC, SYNC_SAME, DUMMY)
DEFAULT_JSON = None


class Stepping:
    """Any of the systems, stepped with one fixed batch of actions."""

    def __init__(self, env: Any, step: Callable[[], Any], n: int, info: dict[str, Any]) -> None:
        self.env, self._step, self.n, self.info = env, step, n, info

    def measure(self, seconds: float, warmup: float) -> Sample:
        return timed_loop(self._step, self.n, seconds, warmup)

    def close(self) -> None:
        self.env.close()


def _open(system: str, task: str, n: int) -> Stepping:
    make = functools.partial(gym.make, task)
    if system in (POOL_NEXT, POOL_SAME):
        mode = "next_step" if system == POOL_NEXT else "same_step"
        env = shmpool.Pool(task, n, seed=0, autoreset_mode=mode)
        info = pool_info(env)
    elif system == VECTOR_SAME:
        env = shmpool.VectorEnv(task, n, seed=0, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        info = pool_info(env.pool)
    elif system == SHM_VEC:
        from shmpool.sb3 import ShmVecEnv
        env = ShmVecEnv([make] * n, seed=0)
        info = pool_info(env.pool)
    elif system == SYNC_SAME:
        env = gym.vector.SyncVectorEnv([make] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        info = {}
    elif system == DUMMY:
        from stable_baselines3.common.vec_env import DummyVecEnv
        env = DummyVecEnv([make] * n)
        info = {}
    else:
        raise ValueError(f"unknown system {system!r}; systems: {', '.join(SYSTEMS)}")
    try:
        actions = fixed_random_actions(gym.make(task).action_space, n)
        if system in (SHM_VEC, DUMMY):
            env.reset()
        else:
            env.reset(seed=0)
        step = functools.partial(env.step, actions)
    except BaseException:
        env.close()
        raise
    return Stepping(env, step, n, info)


def _have_sb3() -> bool:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return False
    return True


def run(args: argparse.Namespace, err: Any) -> list[Group]:
    systems = [s for s in SYSTEMS if _have_sb3() or s not in (SHM_VEC, DUMMY)]
    groups = []
    for task in args.tasks:
        for n in args.num_envs:
            cases = [Case(s, functools.partial(_open, s, task, n)) for s in systems]
            err.print(f"{task} N={n}: {len(cases)} systems × {args.repeats} repetitions", highlight=False)
            records = run_interleaved(cases, repeats=args.repeats, seconds=args.seconds, warmup=args.warmup)
            groups.append(Group(task, n, cases, records))
    return groups


HEADER = ["task", "N", "system", "env steps/s: median (min–max)", f"÷ {POOL_NEXT}"]
TITLE = "Env-only steps/s, SAME_STEP systems against the NEXT_STEP pool (same run)"


def rows(groups: Sequence[Group]) -> list[list[str]]:
    return [[g.task, str(g.num_envs), c.name, fmt_summary(g.rate(c.name)), fmt_ratio(g.ratio(c.name, POOL_NEXT))]
            for g in groups for c in g.cases]


def targets(groups: Sequence[Group]) -> list[Target]:
    moves = ("what SAME_STEP adds per ended episode (final observation and info) and SB3's face per step "
             "(observation copy, a list of info dicts)")
    return [Target(f"{g.task} N={g.num_envs}: ShmVecEnv ≥ 0.95× the NEXT_STEP pool", 0.95,
                   g.ratio(SHM_VEC, POOL_NEXT), moves=moves)
            for g in groups if g.ran(SHM_VEC)]


def header_line(args: argparse.Namespace, env: dict[str, Any]) -> str:
    return (f"`{args.command}` · {env['cpu_model']} · cpus {env['sched_getaffinity']} · load average "
            f"{env['loadavg_at_start'][0]:.2f} at start · {args.repeats} interleaved repetitions × "
            f"{args.seconds:g} s (warm-up {args.warmup:g} s)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench autoreset", __doc__)
    p.add_argument("--tasks", help="comma list of gymnasium ids (default CartPole-v1)")
    p.add_argument("--num-envs", help="comma list of N (default 32; --quick 8)")
    cli.add_run_options(p, cli.RunDefaults(json=DEFAULT_JSON), quick="CartPole-v1 N=8, 0.2 s, 1 repeat")
    args = cli.parse(p, argv)
    args.tasks = cli.comma_list(args.tasks) if args.tasks else ["CartPole-v1"]
    args.num_envs = cli.positive_ints(p, "--num-envs", args.num_envs) if args.num_envs else (
        [8] if args.quick else [32])
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out, err = consoles(180)
    env = environment()
    groups = run(args, err)
    goals = targets(groups)
    print(f"shmpool autoreset benchmark — {header_line(args, env)}\n", file=out.file, flush=True)
    show_table(out, TITLE, HEADER, rows(groups))
    print("\n".join(["### Targets (medians of this run)", "", *(t.line() for t in goals)]), file=out.file, flush=True)
    if args.json:
        write_json(args.json, {"benchmark": "bench.autoreset", "environment": env,
                               "config": {k: v for k, v in vars(args).items() if k != "json"},
                               "throughput": [g.to_json() for g in groups],
                               "targets": [t.to_json() for t in goals]})
        text = "\n".join([f"## shmpool autoreset benchmark — {env['date']}", "", header_line(args, env), "",
                          TITLE + ":", "", markdown_table(HEADER, rows(groups)), "",
                          "### Targets (medians of this run)", "", *(t.line() for t in goals)])
        Path(args.json).with_suffix(".md").write_text(text + "\n")
        err.print(f"raw measurements written to {args.json}, the report to {Path(args.json).with_suffix('.md')}")
    return 1 if print_failures(groups, err) else 0


if __name__ == "__main__":
    raise SystemExit(main())
