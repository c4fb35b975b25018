"""shmpool's built-in task recipes (Pong-v5, Ant-v5) against EnvPool and gymnasium, env-only.

    python -m bench.tasks                        # every available task at its N (Pong-v5, Ant-v5: 8, 32)
    python -m bench.tasks --json /tmp/tasks.json # also write every raw measurement
    python -m bench.tasks --quick                # a few seconds, for tests

For each (task, N), one run measures, with interleaved repetitions (each opens
a fresh env/pool; opening is not timed):

- gymnasium ``SyncVectorEnv`` and ``AsyncVectorEnv`` (shared memory) over ``gym.make(task)``
  (Pong-v5: ``ALE/Pong-v5`` with ``frameskip=1, repeat_action_probability=0`` under
  ``AtariPreprocessing`` + ``FrameStackObservation(4)``, the same preprocessing);
- shmpool sync (``pool.step``) and async (``batch_size = N/2``: ``recv``, then
  ``send`` the batch straight back) over shmpool's recipe for the task;
- EnvPool sync (``step`` of all N, ``batch_size = N``) and async (``batch_size =
  N/2``, ``async_reset``, ``recv``, ``send(action, env_id)``) over EnvPool's C++ env,
  with ``num_threads`` = shmpool's number of workers.

Every system gets the same fixed, seeded array of random actions drawn uniformly from
the action space (async systems send its first ``batch_size`` rows).  The action
distribution matters: MuJoCo's cost per step depends on how many contacts the bodies
make, and full-range random actions make an Ant flail and touch the floor a lot, so
compare numbers only between runs with the same actions.  Throughput is env steps/s.
"""
from __future__ import annotations

import argparse
import functools
import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from shmpool.topology import allowed_cpus

from . import cli
from ._timing import Case, Sample, run_interleaved, timed_loop
from .envs import gym_atari
from .report import (
    Group,
    Target,
    consoles,
    environment,
    fmt_ratio,
    fmt_summary,
    markdown_table,
    print_failures,
    progress,
    say_skipped,
    version_of,
    write_results,
)
from .subjects import (
    ACTION_SEED,
    ASYNC_VEC,
    POOL_ASYNC,
    POOL_SYNC,
    SYNC_VEC,
    GymVector,
    PoolAsync,
    PoolSync,
    fixed_random_actions,
)

EP_SYNC, EP_ASYNC = "EnvPool sync", "EnvPool async"
SYSTEMS = (SYNC_VEC, ASYNC_VEC, POOL_SYNC, POOL_ASYNC, EP_SYNC, EP_ASYNC)


# --- the tasks -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TaskDef:
    """One benchmark task: how each system builds it, and at which N it is measured.

    ``recipe`` returns the constructor of shmpool's recipe env (raises ImportError
    when its optional dependency is missing); ``gym_id`` is what the gymnasium rows
    ``gym.make``, or ``gym_env`` (a picklable callable) builds their env when plain
    ``gym.make`` is not the same task; ``envpool_id`` is EnvPool's task id.  ``missing`` marks a task
    whose shmpool side does not exist yet (it is listed, not run)."""

    task: str
    num_envs: tuple[int, ...]
    recipe: Callable[[], Callable[[], gym.Env]] | None = None
    gym_id: str | None = None
    envpool_id: str | None = None
    missing: str | None = None
    gym_env: Callable[[], gym.Env] | None = None

    def gym_fn(self) -> Callable[[], gym.Env]:
        """What one env of the gymnasium rows is built with."""
        return self.gym_env if self.gym_env is not None else functools.partial(gym.make, self.gym_id)

    def unavailable(self) -> str | None:
        """Why this task cannot run here, or None."""
        if self.missing is not None:
            return self.missing
        try:
            self.recipe()
            self.gym_fn()().close()
        except (gym.error.DependencyNotInstalled, ImportError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None


def _mujoco_recipe(task: str) -> Callable[[], Callable[[], gym.Env]]:
    def recipe() -> Callable[[], gym.Env]:
        from shmpool.workers.recipes import mujoco as recipes
        return recipes.TASKS[task]
    return recipe


def _atari_recipe(task: str) -> Callable[[], Callable[[], gym.Env]]:
    def recipe() -> Callable[[], gym.Env]:
        from shmpool.workers.recipes import atari as recipes
        return functools.partial(recipes.AtariEnv, recipes.GAMES[task])
    return recipe


TASKS: dict[str, TaskDef] = {
    t.task: t for t in (
        TaskDef("Pong-v5", (8, 32), recipe=_atari_recipe("Pong-v5"), gym_id="ALE/Pong-v5", envpool_id="Pong-v5",
                gym_env=functools.partial(gym_atari, "Pong-v5")),
        TaskDef("Ant-v5", (8, 32), recipe=_mujoco_recipe("Ant-v5"), gym_id="Ant-v5", envpool_id="Ant-v5"),
    )
}
# BatchPong-v0 is measured by bench.batch_pong (a natively batched env against the same game one
# env at a time: other systems than the rows above), and reported here beside them.
BATCH_PONG = "BatchPong-v0"
BATCH_PONG_N = (1024, 16384)
DEFAULT_TASKS = (*TASKS, BATCH_PONG)


# --- EnvPool ---------------------------------------------------------------------------------

def envpool_version() -> tuple[str | None, str | None]:
    """(version, None) if EnvPool imports, else (None, why not)."""
    try:
        import envpool
    except Exception as exc:   # ImportError, or a broken binary wheel
        return None, f"{type(exc).__name__}: {exc}"
    return envpool.__version__, None


class EnvPoolSubject:
    """EnvPool's C++ env: sync (``step`` of all N) or async (``batch_size = N/2``, recv/send)."""

    def __init__(self, system: str, task: str, n: int, num_threads: int, actions: np.ndarray) -> None:
        import envpool
        self.batch = n if system == EP_SYNC else max(1, n // 2)
        self.env = envpool.make(task, env_type="gymnasium", num_envs=n, batch_size=self.batch,
                                num_threads=num_threads, seed=0)
        cfg = self.env.config
        self.info = {"num_threads": cfg["num_threads"], "batch_size": cfg["batch_size"],
                     "thread_affinity_offset": cfg["thread_affinity_offset"]}
        acts = np.asarray(actions, dtype=self.env.action_space.dtype)
        if system == EP_SYNC:
            self.env.reset()
            self._step = functools.partial(self.env.step, acts)
        else:
            self.actions = acts[: self.batch]
            self.env.async_reset()
            self._step = self._recv_send

    def _recv_send(self) -> None:
        *_, info = self.env.recv()
        self.env.send(self.actions, info["env_id"])

    def measure(self, seconds: float, warmup: float) -> Sample:
        return timed_loop(self._step, self.batch, seconds, warmup)

    def close(self) -> None:
        self.env.close()
        del self.env, self._step
        gc.collect()   # EnvPool's threads stop when the C++ pool is destroyed


# --- the run ---------------------------------------------------------------------------------

def throughput_cases(spec: TaskDef, n: int, num_workers: int, with_envpool: bool) -> list[Case]:
    probe = spec.gym_fn()()
    actions = fixed_random_actions(probe.action_space, n)
    probe.close()
    recipe = spec.recipe()
    gym_fn = spec.gym_fn()
    cases = [
        Case(SYNC_VEC, functools.partial(GymVector, SYNC_VEC, gym_fn, n, actions)),
        Case(ASYNC_VEC, functools.partial(GymVector, ASYNC_VEC, gym_fn, n, actions)),
        Case(POOL_SYNC, functools.partial(PoolSync, recipe, n, actions)),
        Case(POOL_ASYNC, functools.partial(PoolAsync, recipe, n, actions)),
    ]
    if with_envpool:
        cases += [Case(s, functools.partial(EnvPoolSubject, s, spec.envpool_id, n, num_workers, actions))
                  for s in (EP_SYNC, EP_ASYNC)]
    return cases


@dataclass(frozen=True)
class Plan:
    cells: list[tuple[TaskDef, int]]
    skipped: dict[str, str]
    envpool: str | None       # EnvPool's version, or None
    envpool_note: str | None  # why EnvPool rows are missing


def make_plan(args: argparse.Namespace) -> Plan:
    cells, skipped = [], {}
    for name in args.tasks:
        if name == BATCH_PONG:
            continue
        spec = TASKS.get(name)
        reason = f"unknown task (known: {', '.join(DEFAULT_TASKS)})" if spec is None else spec.unavailable()
        if reason is not None:
            skipped[name] = reason
            continue
        cells += [(spec, n) for n in (args.num_envs or spec.num_envs)]
    version, note = envpool_version()
    if args.no_envpool:
        version, note = None, "not run (--no-envpool)"
    return Plan(cells, skipped, version, note)


def pool_workers(n: int) -> int:
    """The number of workers shmpool picks by default for N envs (EnvPool gets as many threads)."""
    return min(len(allowed_cpus()), n)


def run(plan: Plan, args: argparse.Namespace, err: Any) -> list[Group]:
    per_cell = len(SYSTEMS) if plan.envpool else len(SYSTEMS) - 2
    groups = []
    with progress(err, len(plan.cells) * per_cell * args.repeats) as update:
        for spec, n in plan.cells:
            def on_start(case: Case, rep: int, where: str = f"{spec.task} N={n}") -> None:
                update(description=f"{where} · {case.name} · rep {rep + 1}/{args.repeats}")

            cases = throughput_cases(spec, n, pool_workers(n), plan.envpool is not None)
            records = run_interleaved(cases, repeats=args.repeats, seconds=args.seconds, warmup=args.warmup,
                                      on_start=on_start, on_done=lambda _: update(advance=1))
            groups.append(Group(spec.task, n, cases, records))
    return groups


# --- single-core cost per step -----------------------------------------------------------------

def step_costs(task: str, steps: int, repeats: int) -> dict[str, float] | None:
    """µs per ``env.step`` on one core: recipe, its physics (emulator) share, gymnasium, Python
    overheads (``bench.recipe_cost``), plus EnvPool's C++ env on one thread stepping N=32 in one batch."""
    if not task.endswith("-v5") or task not in TASKS or TASKS[task].recipe is None:
        return None
    from .recipe_cost import measure
    costs = measure(task, steps, repeats, 50)
    if envpool_version()[0] is not None:
        costs["EnvPool, 1 thread"] = envpool_cost(TASKS[task].envpool_id, steps, repeats)
    return costs


def envpool_cost(task: str, steps: int, repeats: int, n: int = 32) -> float:
    """Median µs per env step of EnvPool with one thread stepping ``n`` envs per call, fed fresh
    uniform random actions every step (as ``bench.recipe_cost`` feeds the single envs)."""
    import envpool
    env = envpool.make(task, env_type="gymnasium", num_envs=n, batch_size=n, num_threads=1, seed=0)
    try:
        space = env.single_action_space
        calls = max(1, steps // n)
        rng = np.random.default_rng(ACTION_SEED)
        if isinstance(space, gym.spaces.Discrete):
            acts = rng.integers(0, space.n, size=(calls, n)).astype(space.dtype)
        else:
            acts = rng.uniform(space.low, space.high, size=(calls, n, *space.shape)).astype(space.dtype)
        env.reset()
        for a in acts:   # warm-up
            env.step(a)
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for a in acts:
                env.step(a)
            samples.append(1e6 * (time.perf_counter() - t0) / (calls * n))
        return sorted(samples)[len(samples) // 2]
    finally:
        env.close()


# --- the report ------------------------------------------------------------------------------

HEADER = ("task", "N", *SYSTEMS, "shmpool sync ÷ EnvPool sync", "shmpool async ÷ EnvPool async",
          "shmpool sync ÷ SyncVectorEnv", "shmpool async ÷ SyncVectorEnv",
          "EnvPool sync ÷ SyncVectorEnv", "EnvPool async ÷ SyncVectorEnv")
COST_HEADER = ("task", "recipe µs/step", "physics µs/step", "gymnasium µs/step", "gymnasium ÷ recipe",
               "gym unwrapped µs/step", "Python overhead: recipe", "Python overhead: gymnasium",
               "EnvPool µs/step (1 thread, N=32)")


def rows(groups: Sequence[Group]) -> list[list[str]]:
    return [
        [g.task, str(g.num_envs), *(fmt_summary(g.rate(s)) if g.rate(s) or g.ran(s) else "—" for s in SYSTEMS),
         fmt_ratio(g.ratio(POOL_SYNC, EP_SYNC)), fmt_ratio(g.ratio(POOL_ASYNC, EP_ASYNC)),
         fmt_ratio(g.ratio(POOL_SYNC, SYNC_VEC)), fmt_ratio(g.ratio(POOL_ASYNC, SYNC_VEC)),
         fmt_ratio(g.ratio(EP_SYNC, SYNC_VEC)), fmt_ratio(g.ratio(EP_ASYNC, SYNC_VEC))]
        for g in groups
    ]


def cost_rows(costs: dict[str, dict[str, float]]) -> list[list[str]]:
    def us(v: float | None) -> str:
        return "—" if v is None else f"{v:.1f}"
    return [[task, us(c["recipe"]), us(c["physics"]), us(c["gymnasium"]), fmt_ratio(c["gymnasium"] / c["recipe"]),
             us(c["gym unwrapped"]), us(c["recipe overhead"]), us(c["gym overhead"]), us(c.get("EnvPool, 1 thread"))]
            for task, c in costs.items()]


def batch_pong(args: argparse.Namespace) -> dict | None:
    """bench.batch_pong's measurement at the task's N (or ``--num-envs``), when asked for."""
    if BATCH_PONG not in args.tasks:
        return None
    from . import batch_pong as bp
    sizes = args.num_envs or ([64, 256] if args.quick else list(BATCH_PONG_N))
    bp_args = argparse.Namespace(num_envs=sizes, workers=pool_workers(max(sizes)), seconds=args.seconds,
                                 warmup=args.warmup, repeats=args.repeats, baseline_envs=1024)
    return bp.run(bp_args)


def batch_pong_ratio(data: dict | None, n: int) -> float | None:
    """BatchPong-v0 through shmpool ÷ the same game stepped one env at a time (SyncVectorEnv)."""
    if data is None:
        return None
    from .batch_pong import SYNC
    r = next((r for r in data["results"] if r["num_envs"] == n), None)
    return None if r is None else r["ratios"].get(SYNC)


def targets(groups: Sequence[Group], bp: dict | None = None) -> list[Target]:
    def ratio(task: str, n: int, num: str, den: str) -> float | None:
        g = next((g for g in groups if g.task == task and g.num_envs == n), None)
        return None if g is None else g.ratio(num, den)

    parity = ("both sides are physics-bound on the same cores (EnvPool's C++ threads, our pinned workers), so the "
              "margin comes only from less native work per step; other processes on the box take from both")
    return [
        Target("Pong-v5 N=32 shmpool async ≥ 1.1× EnvPool async", 1.1, ratio("Pong-v5", 32, POOL_ASYNC, EP_ASYNC),
               moves=parity),
        Target("Pong-v5 N=32 shmpool sync ≥ 1.1× EnvPool sync", 1.1, ratio("Pong-v5", 32, POOL_SYNC, EP_SYNC),
               moves=parity),
        Target("Ant-v5 N=32 shmpool async ≥ 1.1× EnvPool async", 1.1, ratio("Ant-v5", 32, POOL_ASYNC, EP_ASYNC),
               moves=parity),
        Target("Ant-v5 N=32 shmpool sync ≥ 1.1× EnvPool sync", 1.1, ratio("Ant-v5", 32, POOL_SYNC, EP_SYNC),
               moves=parity),
        Target("BatchPong-v0 N=16384 ≥ 100× one env at a time", 100.0, batch_pong_ratio(bp, 16384),
               moves="the shard size per worker (one numpy call per shard) against Python's per-env cost"),
    ]


def report(args: argparse.Namespace, env: dict[str, Any], plan: Plan, groups: list[Group],
           costs: dict[str, dict[str, float]], out: Any, bp: dict | None = None) -> tuple[list[Target], str]:
    """Print the report once, as markdown; returns the targets and the report (for the results file)."""
    goals = targets(groups, bp)
    tp_rows, c_rows = rows(groups), cost_rows(costs)
    workers = sorted({r.info["num_workers"] for g in groups for r in g.records
                      if r.case == POOL_SYNC and "num_workers" in r.info})
    hosted = any(r.info.get("parent_shard") is not None for g in groups for r in g.records if r.case == POOL_SYNC)
    lines = [
        f"## shmpool task benchmark — {env['date']}",
        "",
        f"`{args.command}` · {env['cpu_model']} · cpus {env['sched_getaffinity']} · "
        f"python {env['python']}, numpy {env['numpy']}, gymnasium {env['gymnasium']}, mujoco {env['mujoco']}, "
        f"envpool {env['envpool'] or 'unavailable'}, ale-py {env.get('ale_py') or 'unavailable'} · "
        f"{args.repeats} interleaved repetitions × {args.seconds:g} s (warm-up {args.warmup:g} s)",
        "",
        f"shmpool workers {workers or '—'} (pinned, default wait policy"
        f"{'; sync: the last shard stepped in this process (parent_shard)' if hosted else ''}); EnvPool "
        "num_threads = shmpool's workers, default thread affinity; async: batch_size = N/2. Actions: one fixed "
        f"array of random actions, uniform over the action space (seed {ACTION_SEED}), the same for every system — the "
        "action distribution changes MuJoCo's cost a lot (full-range random actions cause many contacts), "
        "so compare only runs with the same actions. Pong-v5: every system runs EnvPool's preprocessing "
        "(30 no-ops, 4 frames max-pooled, 84x84 INTER_AREA gray, 4-frame stack); gymnasium's rows are "
        "`ALE/Pong-v5` (frameskip=1, no sticky actions) + `AtariPreprocessing` + `FrameStackObservation(4)`.",
        "",
        "Throughput, env steps/s, median (min–max); ratios of medians:",
        "",
        markdown_table(HEADER, tp_rows),
    ]
    if plan.envpool is None:
        lines += ["", f"EnvPool rows unavailable — {plan.envpool_note}"]
    lines += [f"\n{task}: skipped — {reason}" for task, reason in plan.skipped.items()]
    if c_rows:
        lines += ["", f"Single-core cost per env step (µs, median of {args.cost_repeats} interleaved runs of "
                  f"{args.cost_steps} steps; `bench.recipe_cost`; physics = ctrl write + mj_step×frame_skip + "
                  "mj_rnePostConstraint (Atari: the native floor, ALE frames + screen reads + max-pool + "
                  "cv2 resize, in a bare loop); Python overhead = step with physics stubbed out (Atari: recipe "
                  "minus that floor; gymnasium's wrapped env, minus the same floor); EnvPool = one C++ "
                  "thread stepping N=32 per call; all sides get fresh uniform random actions every step):",
                  "", markdown_table(COST_HEADER, c_rows)]
    if bp is not None:
        from .batch_pong import report as bp_report
        lines += ["", bp_report(bp)]
    lines += ["", "### Targets (medians of this run)", "", *(t.line() for t in goals)]
    text = "\n".join(lines)
    print(text, file=out.file, flush=True)   # once, as markdown: the tables sit inside the explanations
    return goals, text


def json_data(args: argparse.Namespace, env: dict[str, Any], plan: Plan, groups: list[Group],
              costs: dict[str, dict[str, float]], goals: list[Target], bp: dict | None = None) -> dict[str, Any]:
    return {
        "benchmark": "bench.tasks",
        "environment": env,
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "actions": {"distribution": "uniform over the action space, one fixed array per (task, N)",
                    "seed": ACTION_SEED},
        "skipped": plan.skipped,
        "envpool_note": plan.envpool_note,
        "throughput": [g.to_json() for g in groups],
        "step_cost_us": costs,
        "batch_pong": bp,
        "targets": [t.to_json() for t in goals],
    }


# --- command line ----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench.tasks", __doc__)
    p.add_argument("--tasks", help=f"comma list (default {','.join(DEFAULT_TASKS)})")
    p.add_argument("--num-envs", help="comma list of N for every task (default: each task's own)")
    p.add_argument("--cost-steps", type=int, help="steps per side for the single-core cost (default 2000, --quick 200)")
    p.add_argument("--cost-repeats", type=int, help="repetitions of the single-core cost (default 3, --quick 1)")
    p.add_argument("--no-envpool", action="store_true", help="leave out the EnvPool rows")
    cli.add_run_options(p, cli.RunDefaults(), quick="0.2 s, 1 repeat, N=8, short single-core cost")
    args = cli.parse(p, argv, cost_steps=(2000, 200), cost_repeats=(3, 1))
    args.tasks = cli.comma_list(args.tasks) if args.tasks else list(DEFAULT_TASKS)
    if args.num_envs:
        args.num_envs = cli.positive_ints(p, "--num-envs", args.num_envs)
    else:
        args.num_envs = [8] if args.quick else None
    if args.cost_steps < 1 or args.cost_repeats < 1:
        p.error("--cost-steps and --cost-repeats must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out, err = consoles(240)
    plan = make_plan(args)
    say_skipped(plan.skipped, err)
    if plan.envpool is None:
        err.print(f"[yellow]EnvPool rows unavailable[/yellow] — {plan.envpool_note}", highlight=False)
    env = {**environment(), "envpool": plan.envpool, "ale_py": version_of("ale_py"), "os_cpu_count": os.cpu_count()}
    groups = run(plan, args, err)
    costs = {}
    for task in dict.fromkeys(spec.task for spec, _ in plan.cells):
        err.print(f"single-core cost per step: {task}", highlight=False)
        c = step_costs(task, args.cost_steps, args.cost_repeats)
        if c is not None:
            costs[task] = c
    if BATCH_PONG in args.tasks:
        err.print(f"{BATCH_PONG}: batched in shmpool's workers vs one env at a time (bench.batch_pong)",
                  highlight=False)
    bp = batch_pong(args)
    goals, text = report(args, env, plan, groups, costs, out, bp)
    if args.json:
        write_results(args.json, json_data(args, env, plan, groups, costs, goals, bp), text, err)
    return 1 if print_failures(groups, err) else 0


if __name__ == "__main__":
    raise SystemExit(main())
