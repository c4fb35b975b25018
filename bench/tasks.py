"""shmpool's built-in task recipes (Pong-v5, Ant-v5) against EnvPool and gymnasium, env-only.

    python -m bench.tasks                        # Pong-v5, Ant-v5 at N=8, 32; BatchPong-v0 at 1,024, 16,384

gymnasium Sync/Async over the equivalent wrappers, shmpool sync/async over its recipe, EnvPool sync/async
over its C++ env (num_threads = shmpool's workers), one fixed array of seeded uniform random actions for
all; then each task's single-core µs per step (recipe, physics, Python; EnvPool on one thread) and BatchPong-v0
in shmpool's workers against one env at a time.  How to read it: bench/README.md, "tasks".
"""
from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from shmpool.batched import Batched

from . import cli, report, subjects
from ._timing import Case, Sample, timed_loop
from .envs import gym_env_fn, recipe_env
from .recipe_cost import TASKS as MUJOCO_RECIPES
from .recipe_cost import step_costs

EP_SYNC, EP_ASYNC = "EnvPool sync", "EnvPool async"
TASK_SYSTEMS = (*subjects.SYSTEMS, EP_SYNC, EP_ASYNC)
TASK_SIZES = {"Pong-v5": (8, 32), "Ant-v5": (8, 32)}   # the recipes: EnvPool's ids, shmpool.make's tasks
BATCH_PONG, BATCH_PONG_SIZES, BASELINE_ENVS = "BatchPong-v0", (1024, 16384), 1024
DEFAULT_TASKS = (*TASK_SIZES, BATCH_PONG)


# --- the recipes' cells ------------------------------------------------------------------------

def unavailable(task: str) -> str | None:
    """Why ``task``'s recipe or gymnasium twin cannot run here, or None."""
    if task not in TASK_SIZES:
        return f"unknown task (known: {', '.join(DEFAULT_TASKS)})"
    if recipe_env(task) is None:
        return f"shmpool's recipe for {task} does not import (mujoco or ale_py missing)"
    try:
        gym_env_fn(task)().close()
    except Exception as exc:   # DependencyNotInstalled, ImportError
        return f"{type(exc).__name__}: {exc}"
    return None


def pool_workers(n: int) -> int:
    """The number of workers shmpool picks by default for N envs (EnvPool gets as many threads)."""
    return min(len(os.sched_getaffinity(0)), n)


def task_cases(task: str, n: int, with_envpool: bool) -> list[Case]:
    gym_env = gym_env_fn(task)
    actions = subjects.fixed_random_actions(subjects.action_space_of(gym_env), n)
    cases = subjects.headline_cases(gym_env, recipe_env(task), n, actions)
    if with_envpool:
        cases += [Case(EP_SYNC, functools.partial(subjects.env_only, subjects.ENVPOOL, task, n, actions,
                                                  num_threads=pool_workers(n))),
                  Case(EP_ASYNC, functools.partial(subjects.env_only, subjects.ENVPOOL, task, n, actions,
                                                   batch=max(1, n // 2), num_threads=pool_workers(n)))]
    return cases


# --- BatchPong-v0 --------------------------------------------------------------------------------

BP_POOL, BP_INPROC, BP_SYNC, BP_LOOP = ("shmpool BatchPong", "BatchPong in-process", "SyncVectorEnv(PongEnv)",
                                        "loop PongEnv")


def pong_actions(n: int, sets: int = 8) -> list[np.ndarray]:
    """``sets`` batches of random Pong actions (0-2), drawn before timing and cycled."""
    rng = np.random.default_rng(subjects.ACTION_SEED)
    return [rng.integers(0, 3, n, dtype=np.int64) for _ in range(sets)]


class PongInProcess:
    """One ``BatchPong(n)`` stepped in this process (one core, no pool), cycled random actions."""

    def __init__(self, n: int) -> None:
        from shmpool.workers.recipes.batch_pong import BatchPong
        self.n, self.env, self.ids = n, BatchPong(n).bind_own(), np.arange(n, dtype=np.int64)
        self.env.reset(self.ids, list(range(n)))

    def measure(self, seconds: float, warmup: float) -> Sample:
        acts = pong_actions(self.n)
        k = [0]

        def one() -> None:
            k[0] = (k[0] + 1) % len(acts)
            self.env.step(self.ids, acts[k[0]])
        return timed_loop(one, self.n, seconds, warmup)

    def close(self) -> None:
        pass


class PongLoop(PongInProcess):
    """A plain loop over ``n`` one-env ``PongEnv``s, resetting each one whose episode ended."""

    def __init__(self, n: int) -> None:
        from shmpool.workers.recipes.batch_pong import PongEnv
        self.n, self.envs = n, [PongEnv() for _ in range(n)]
        for i, env in enumerate(self.envs):
            env.reset(seed=i)

    def measure(self, seconds: float, warmup: float) -> Sample:
        acts, k = [a.tolist() for a in pong_actions(self.n)], [0]

        def one() -> None:
            k[0] = (k[0] + 1) % len(acts)
            for env, a in zip(self.envs, acts[k[0]]):
                _, _, terminated, truncated, _ = env.step(a)
                if terminated or truncated:
                    env.reset()
        return timed_loop(one, self.n, seconds, warmup)


def batch_pong_cases(n: int, workers: int) -> list[Case]:
    from shmpool.workers.recipes.batch_pong import BatchPong, PongEnv
    base = min(n, BASELINE_ENVS)   # one env at a time costs the same per env whatever N
    return [Case(BP_POOL, functools.partial(subjects.env_only, subjects.POOL, Batched(BatchPong), n, pong_actions(n),
                                            num_workers=workers)),
            Case(BP_INPROC, functools.partial(PongInProcess, n)),
            Case(BP_SYNC, functools.partial(subjects.env_only, subjects.SYNC_VEC, PongEnv, base, pong_actions(base))),
            Case(BP_LOOP, functools.partial(PongLoop, base))]


# --- the run ---------------------------------------------------------------------------------

def make_plan(args: argparse.Namespace) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """The (task, N) cells to run and the tasks skipped, with why."""
    cells, skipped = [], {}
    for task in args.tasks:
        reason = None if task == BATCH_PONG else unavailable(task)
        if reason is not None:
            skipped[task] = reason
        elif task == BATCH_PONG:
            cells += [(task, n) for n in args.num_envs or ([64, 256] if args.quick else BATCH_PONG_SIZES)]
        else:
            cells += [(task, n) for n in args.num_envs or TASK_SIZES[task]]
    return cells, skipped


# --- the report ------------------------------------------------------------------------------

HEADER = ("task", "N", *TASK_SYSTEMS, "shmpool sync ÷ EnvPool sync", "shmpool async ÷ EnvPool async",
          "shmpool sync ÷ SyncVectorEnv", "shmpool async ÷ SyncVectorEnv",
          "EnvPool sync ÷ SyncVectorEnv", "EnvPool async ÷ SyncVectorEnv")
COST_HEADER = ("task", "recipe µs/step", "physics µs/step", "gymnasium µs/step", "gymnasium ÷ recipe",
               "gym unwrapped µs/step", "Python overhead: recipe", "Python overhead: gymnasium",
               "EnvPool µs/step (1 thread, N=32)")
BP_HEADER = ("N", BP_POOL, BP_INPROC, BP_SYNC, BP_LOOP, "× SyncVectorEnv", "× loop")


RATIOS = ((subjects.POOL_SYNC, EP_SYNC), (subjects.POOL_ASYNC, EP_ASYNC), (subjects.POOL_SYNC, subjects.SYNC_VEC),
          (subjects.POOL_ASYNC, subjects.SYNC_VEC),
          (EP_SYNC, subjects.SYNC_VEC), (EP_ASYNC, subjects.SYNC_VEC))


def rows(groups: Sequence[report.Group]) -> list[list[str]]:
    return [[g.task, str(g.num_envs),
             *(report.fmt_summary(g.rate(s)) if g.rate(s) or g.ran(s) else "—" for s in TASK_SYSTEMS),
             *(report.fmt_ratio(g.ratio(a, b)) for a, b in RATIOS)] for g in groups if g.task != BATCH_PONG]


def cost_rows(costs: dict[str, dict[str, float]]) -> list[list[str]]:
    def us(v: float | None) -> str:
        return "—" if v is None else f"{v:.1f}"
    return [[task, us(c["recipe"]), us(c["physics"]), us(c["gymnasium"]),
             report.fmt_ratio(c["gymnasium"] / c["recipe"]),
             us(c["gym unwrapped"]), us(c["recipe overhead"]), us(c["gym overhead"]), us(c.get("EnvPool, 1 thread"))]
            for task, c in costs.items()]


def batch_pong_rows(groups: Sequence[report.Group]) -> list[list[str]]:
    return [[f"{g.num_envs:,}", *(report.fmt_summary(g.rate(s)) for s in BP_HEADER[1:5]),
             report.fmt_ratio(g.ratio(BP_POOL, BP_SYNC)), report.fmt_ratio(g.ratio(BP_POOL, BP_LOOP))]
            for g in groups if g.task == BATCH_PONG]


def targets(groups: Sequence[report.Group]) -> list[report.Target]:
    def ratio(task: str, n: int, num: str, den: str) -> float | None:
        g = next((g for g in groups if g.task == task and g.num_envs == n), None)
        return None if g is None else g.ratio(num, den)

    parity = ("both sides are physics-bound on the same cores (EnvPool's C++ threads, our pinned workers), so the "
              "margin comes only from less native work per step; other processes on the box take from both")
    return [*(report.Target(f"{task} N=32 shmpool {mode} ≥ 1.1× EnvPool {mode}", 1.1, ratio(task, 32, ours, theirs),
                            moves=parity)
              for task in TASK_SIZES for mode, ours, theirs in (("async", subjects.POOL_ASYNC, EP_ASYNC),
                                                                ("sync", subjects.POOL_SYNC, EP_SYNC))),
            report.Target("BatchPong-v0 N=16384 ≥ 100× one env at a time", 100.0,
                          ratio(BATCH_PONG, 16384, BP_POOL, BP_SYNC),
                          moves="the shard size per worker (one numpy call per shard) against Python's per-env cost")]


def write_report(args: argparse.Namespace, env: dict[str, Any], groups: list[report.Group], skipped: dict[str, str],
                 envpool_note: str | None, costs: dict[str, dict[str, float]], goals: list[report.Target]) -> str:
    """The report once, as markdown: the tables sit inside the explanations."""
    workers = sorted({r.info["num_workers"] for g in groups for r in g.records
                      if r.case == subjects.POOL_SYNC and "num_workers" in r.info})
    hosted = any(r.info.get("parent_shard") is not None for g in groups for r in g.records
                 if r.case == subjects.POOL_SYNC)
    lines = [
        report.header("shmpool task benchmark", args, env, f"python {env['python']}, numpy {env['numpy']}, "
                      f"gymnasium {env['gymnasium']}, mujoco {env['mujoco']}, "
                      f"envpool {env['envpool'] or 'unavailable'}, ale-py {env.get('ale_py') or 'unavailable'}"), "",
        f"shmpool workers {workers or '—'} (pinned, default wait policy"
        f"{'; sync: the last shard stepped in this process (parent_shard)' if hosted else ''}); EnvPool "
        "num_threads = shmpool's workers, default thread affinity; async: batch_size = N/2. Actions: one fixed "
        f"array of random actions, uniform over the action space (seed {subjects.ACTION_SEED}), the same for every "
        "system — the action distribution changes MuJoCo's cost a lot (full-range random actions cause many "
        "contacts), so compare only runs with the same actions. Pong-v5: every system runs EnvPool's preprocessing "
        "(30 no-ops, 4 frames max-pooled, 84x84 INTER_AREA gray, 4-frame stack); gymnasium's rows are "
        "`ALE/Pong-v5` (frameskip=1, no sticky actions) + `AtariPreprocessing` + `FrameStackObservation(4)`.", "",
        "Throughput, env steps/s, median (min–max); ratios of medians:", "",
        report.markdown_table(HEADER, rows(groups)),
    ]
    if args.costs_only:   # the header line, then the cost table alone
        del lines[4:]
    if envpool_note is not None:
        lines += ["", f"EnvPool rows unavailable — {envpool_note}"]
    lines += [f"\n{task}: skipped — {reason}" for task, reason in skipped.items()]
    if costs:
        lines += ["", f"Single-core cost per env step (µs, median of {args.cost_repeats} interleaved runs of "
                  f"{args.cost_steps} steps; physics = ctrl write + mj_step×frame_skip + "
                  "mj_rnePostConstraint; Python overhead = step with physics stubbed out (MuJoCo only); EnvPool "
                  "= one C++ thread stepping N=32 per call; all sides get fresh uniform random actions every step):",
                  "", report.markdown_table(COST_HEADER, cost_rows(costs))]
    if any(g.task == BATCH_PONG for g in groups):
        lines += ["", "### BatchPong-v0: steps/s (median of repetitions, min-max)", "",
                  report.markdown_table(BP_HEADER, batch_pong_rows(groups)), "",
                  f"One-at-a-time sides step min(N, {BASELINE_ENVS:,}) envs; their per-env cost does not depend on N."]
    if not args.costs_only:
        lines += ["", "### Targets (medians of this run)", "", *(t.line() for t in goals)]
    return "\n".join(lines)


# --- command line ----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench.tasks", __doc__)
    p.add_argument("--tasks", help=f"comma list (default {','.join(DEFAULT_TASKS)})")
    p.add_argument("--num-envs", help="comma list of N for every task (default: each task's own)")
    p.add_argument("--cost-steps", type=int, help="steps per side for the single-core cost (default 2000, --quick 200)")
    p.add_argument("--cost-repeats", type=int, help="repetitions of the single-core cost (default 3, --quick 1)")
    p.add_argument("--no-envpool", action="store_true", help="leave out the EnvPool rows")
    p.add_argument("--costs-only", action="store_true", help="only the single-core cost per step, of any MuJoCo "
                   "recipe or Atari <Game>-v5 in --tasks ('all': every MuJoCo recipe)")
    cli.add_run_options(p, cli.RunDefaults(), quick="0.2 s, 1 repeat, N=8, short single-core cost")
    args = cli.parse(p, argv, cost_steps=(2000, 200), cost_repeats=(3, 1))
    args.tasks = cli.comma_list(args.tasks) if args.tasks else list(DEFAULT_TASKS)
    if args.costs_only and args.tasks == ["all"]:
        args.tasks = list(MUJOCO_RECIPES)
    if args.num_envs:
        args.num_envs = cli.positive_ints(p, "--num-envs", args.num_envs)
    else:
        args.num_envs = [8] if args.quick else None
    if args.cost_steps < 1 or args.cost_repeats < 1:
        p.error("--cost-steps and --cost-repeats must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    err = report.stderr_console()
    cells, skipped = ([], {}) if args.costs_only else make_plan(args)
    report.say_skipped(skipped, err)
    envpool = report.version_of("envpool")
    envpool_note = ("not run (--no-envpool)" if args.no_envpool else
                    None if envpool else "not installed (envpool does not import)")
    if envpool_note:
        err.print(f"[yellow]EnvPool rows unavailable[/yellow] — {envpool_note}", highlight=False)
    env = {**report.environment(), "envpool": envpool if not args.no_envpool else None,
           "ale_py": report.version_of("ale_py"), "os_cpu_count": os.cpu_count()}
    groups = report.run_cells(cells, lambda task, n: batch_pong_cases(n, pool_workers(n)) if task == BATCH_PONG else
                              task_cases(task, n, envpool_note is None), args, err, len(TASK_SYSTEMS))
    costs = {}
    cost_tasks = args.tasks if args.costs_only else [t for t, _ in cells]
    for task in dict.fromkeys(t for t in cost_tasks if t != BATCH_PONG):
        err.print(f"single-core cost per step: {task}", highlight=False)
        costs[task] = step_costs(task, args.cost_steps, args.cost_repeats, with_envpool=envpool_note is None)
    goals = targets(groups)
    text = write_report(args, env, groups, skipped, envpool_note, costs, goals)
    return report.finish(args, "bench.tasks", env, text, err, groups,
                         actions={"distribution": "uniform over the action space, one fixed array per (task, N)",
                                  "seed": subjects.ACTION_SEED},
                         skipped=skipped, envpool_note=envpool_note, throughput=[g.to_json() for g in groups],
                         step_cost_us=costs, targets=[t.to_json() for t in goals])


if __name__ == "__main__":
    raise SystemExit(main())
