"""EnvPool's throughput table: FPS of every system against the number of cores (or of envs), env-only.

    python -m bench throughput --task CartPole-v1 --workers 1,2
    python -m bench throughput --task Ant-v5 --workers 1,2 --recipe --json t.json
    python -m bench throughput --task CartPole-v1 --workers 1,2,4 --cpus 0-1,8-9 --numa
    python -m bench throughput --num-envs 1,2,4,8,16 --systems sb3-dummy,sb3,shmvecenv   # the PoolVecEnv sweep

A column with W workers limits every system to the first W allowed cores (the process's affinity,
children included); shmpool pins W workers, EnvPool runs W threads; N = 8 × W, async batch N/2; FPS =
env steps/s × frame skip.  --numa: one pool per NUMA node, summed.  --num-envs: columns are N on the whole
core budget.  How to read it: bench/README.md, "throughput".
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from shmpool.topology import SYSFS_NODES, allowed_cpus, format_cpu_list, numa_nodes, resolve_cpus, split_by_node

from . import cli, report, subjects
from ._timing import Case, Record, Summary, run_interleaved, summarize
from .envs import ATARI_TASKS, gym_env_fn, recipe_env

FOR_LOOP, SUBPROCESS, SB3, DUMMY, SHMVEC = "For-loop", "Subprocess", "SB3 SubprocVecEnv", "SB3 DummyVecEnv", "ShmVecEnv"
EP_SYNC, EP_ASYNC, EP_NUMA = "EnvPool (sync)", "EnvPool (async)", "EnvPool (numa+async)"
SP_SYNC, SP_ASYNC, SP_NUMA = "shmpool (sync)", "shmpool (async)", "shmpool (numa+async)"
SPR_SYNC, SPR_ASYNC = "shmpool recipe (sync)", "shmpool recipe (async)"
ALL_SYSTEMS = (FOR_LOOP, SUBPROCESS, SB3, DUMMY, SHMVEC, EP_SYNC, EP_ASYNC, EP_NUMA, SP_SYNC, SP_ASYNC, SP_NUMA,
               SPR_SYNC, SPR_ASYNC)
ON_REQUEST = (DUMMY, SHMVEC)   # the PoolVecEnv rows: run when --systems names them
NUMA_SYSTEMS = (EP_NUMA, SP_NUMA)
RECIPE_SYSTEMS = (SPR_SYNC, SPR_ASYNC)
ENVPOOL_SYSTEMS = (EP_SYNC, EP_ASYNC, EP_NUMA)
SB3_SYSTEMS = (SB3, DUMMY, SHMVEC)
# Short names accepted by --systems besides the row titles.
ALIASES = {"for-loop": FOR_LOOP, "subprocess": SUBPROCESS, "sb3": SB3, "sb3-dummy": DUMMY, "shmvecenv": SHMVEC,
           "envpool-sync": EP_SYNC, "envpool-async": EP_ASYNC, "envpool-numa": EP_NUMA, "shmpool-sync": SP_SYNC,
           "shmpool-async": SP_ASYNC, "shmpool-numa": SP_NUMA, "recipe-sync": SPR_SYNC, "recipe-async": SPR_ASYNC,
           "shmpool sync": SP_SYNC, "shmpool async": SP_ASYNC}
# frame_skip per task, EnvPool's FPS multiplier: Pong-v5 steps 4 emulator frames.  Gymnasium's MuJoCo and
# classic-control tasks count one step as one frame (EnvPool's Ant numbers do the same).
FRAME_SKIP = {"Pong-v5": 4}
DEFAULT_ENVS_PER_WORKER = 8


# --- cores and NUMA nodes ---------------------------------------------------------------------

@contextlib.contextmanager
def affinity(cpus: Sequence[int]) -> Iterator[None]:
    """Run the block with this thread's (hence new children's and threads') affinity set to ``cpus``."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def describe_nodes(cpus: Sequence[int], nodes: dict[int, list[int]]) -> str:
    """One line: how many nodes hold the allowed cores, and which."""
    if not nodes:
        return "no NUMA information (sysfs has no nodes)"
    held = {k: v for k, on in nodes.items() if (v := [c for c in on if c in cpus])}
    parts = "; ".join(f"node{k}: cpus {format_cpu_list(v)}" for k, v in held.items())
    return f"{'one NUMA node' if len(held) <= 1 else f'{len(held)} NUMA nodes'} ({parts})"


# --- the systems of one cell ------------------------------------------------------------------

def open_groups(kind: str, env: Any, groups: list[list[int]], sizes: list[int], batch_of: Callable[[int], int]
                ) -> list[Any]:
    """One vec per cpu group, each opened while this thread runs on its cpus (what the parent touches
    is first-touched there): shmpool pins a worker per core, EnvPool runs a thread per core (pinned
    with ``thread_affinity_offset`` when the cores are consecutive: EnvPool pins absolute cpu ids)."""
    vecs = []
    try:
        for cpus, n in zip(groups, sizes):
            if kind == subjects.ENVPOOL:
                consecutive = list(cpus) == list(range(cpus[0], cpus[0] + len(cpus)))
                options = {"num_threads": len(cpus), "thread_affinity_offset": cpus[0] if consecutive else -1}
            else:
                options = {"num_workers": len(cpus), "cpus": cpus}
            with affinity(cpus):
                vecs.append(subjects.open_vec(kind, env, n, batch=batch_of(n), **options))
    except BaseException:
        for v in vecs:
            v.close()
        raise
    return vecs


def open_system(system: str, task: str, cell: Cell, per_worker: int) -> subjects.EnvOnly:
    """``system``'s envs for one cell, stepped with seeded random actions; ``info`` records its pools and the
    cpus the cell may use."""
    make_env = gym_env_fn(task)
    actions = functools.partial(subjects.fixed_random_actions,
                                subjects.action_space_of(make_env))   # n -> n seeded random actions
    n, one = cell.num_envs, [cell.cpus[:cell.cores]]
    sizes = [per_worker * len(g) for g in cell.groups] if cell.sweep is None else [n]
    half = {EP_ASYNC, EP_NUMA, SP_ASYNC, SP_NUMA, SPR_ASYNC}
    batch_of = (lambda k: max(1, k // 2)) if system in half else (lambda k: k)
    if system in (FOR_LOOP, SUBPROCESS, SB3, DUMMY, SHMVEC):
        kind = {FOR_LOOP: subjects.SYNC_VEC, SUBPROCESS: subjects.ASYNC_VEC, SB3: subjects.SB3_SUBPROC,
                DUMMY: subjects.SB3_DUMMY, SHMVEC: subjects.SHM_VEC}[system]
        # fork, not SB3's default forkserver: a forkserver keeps the affinity it was started with
        # (the first cell's cores) and hands it to every later child; fork children take the cell's.
        options = {SB3: {"start_method": "fork"}, SHMVEC: {"cpus": one[0]}}.get(system, {})
        vecs = [subjects.open_vec(kind, make_env, n, **options)]
    elif system in ENVPOOL_SYSTEMS:
        vecs = open_groups(subjects.ENVPOOL, task, cell.groups if system == EP_NUMA else one, sizes, batch_of)
    else:
        env = recipe_env(task) if system in RECIPE_SYSTEMS else make_env
        vecs = open_groups(subjects.POOL, env, cell.groups if system == SP_NUMA else one, sizes, batch_of)
    subject = subjects.EnvOnly(vecs, actions)
    subject.info = {"pools": [{**v.info, "num_envs": v.num_envs} for v in vecs], "affinity": cell.cpus}
    if hasattr(vecs[0].env, "processes"):
        subject.info["child_affinity"] = subjects.child_affinity(vecs[0].env.processes)
    return subject


# --- the plan --------------------------------------------------------------------------------

@dataclass
class Cell:
    """One column: ``cores`` workers' cpus (``cpus``, split by NUMA node into ``groups``), ``num_envs`` envs;
    ``sweep``: N when the columns sweep N (--num-envs), else None."""

    workers: int
    cpus: list[int]
    groups: list[list[int]]
    num_envs: int
    cores: int
    sweep: int | None = None
    cases: list[Case] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)

    @property
    def label(self) -> str:
        return str(self.workers) if self.sweep is None else f"N={self.sweep}"

    def where(self) -> str:
        return f"W={self.workers} N={self.num_envs}"

    def fps(self, system: str, frame_skip: int) -> Summary | None:
        return summarize(self.records, system, lambda s: s.rate * frame_skip)

    def to_json(self, frame_skip: int) -> dict[str, Any]:
        out: dict[str, Any] = {"workers": self.workers, "cpus": self.cpus, "numa_groups": self.groups,
                               "num_envs": self.num_envs, "systems": {}}
        for case in self.cases:
            fps = self.fps(case.name, frame_skip)
            out["systems"][case.name] = {
                "samples": [r.to_json() for r in self.records if r.case == case.name],
                "median_fps": fps and fps.median, "min_fps": fps and fps.lo, "max_fps": fps and fps.hi}
        return out


@dataclass
class Plan:
    task: str
    frame_skip: int
    cpus: list[int]
    nodes: dict[int, list[int]]
    systems: list[str]
    skipped: dict[str, str]
    cells: list[Cell]
    notes: list[str]


def envpool_status(task: str) -> tuple[str | None, str | None]:
    """(EnvPool's version, None) if it installs and has ``task``, else (None, why not)."""
    try:
        import envpool
    except Exception as exc:   # ImportError, or a broken binary wheel
        return None, f"not installed ({type(exc).__name__}: {exc})"
    if task not in envpool.list_all_envs():
        return None, f"EnvPool {envpool.__version__} has no task {task!r}"
    return envpool.__version__, None


def make_plan(args: argparse.Namespace) -> Plan:
    cpus, nodes = args.cpus, numa_nodes(args.numa_root)
    systems, skipped, notes = list(args.systems), {}, []
    if args.numa and args.num_envs is None:
        single = len(split_by_node(cpus, nodes)) <= 1
        notes.append(f"--numa: {describe_nodes(cpus, nodes)}"
                     + ("; a one-node machine: numa+async runs one pool, the same as async" if single else ""))
    else:
        systems = [s for s in systems if s not in NUMA_SYSTEMS]
    if not args.recipe:
        systems = [s for s in systems if s not in RECIPE_SYSTEMS]
    elif recipe_env(args.task) is None:
        skipped.update({s: f"shmpool has no recipe for {args.task}" for s in RECIPE_SYSTEMS if s in systems})
    if any(s in systems for s in ENVPOOL_SYSTEMS):
        why = envpool_status(args.task)[1]
        if why:
            skipped.update({s: why for s in ENVPOOL_SYSTEMS if s in systems})
    if any(s in systems for s in SB3_SYSTEMS) and not report.version_of("stable_baselines3"):
        skipped.update({s: "not installed (stable_baselines3 does not import)" for s in SB3_SYSTEMS if s in systems})
    systems = [s for s in systems if s not in skipped]
    if any(s in systems for s in ENVPOOL_SYSTEMS):
        gym_side = (f"gymnasium's `gym.make({args.task!r})`" if args.task not in ATARI_TASKS else
                    f"gymnasium's `ALE/{args.task}` (frameskip=1, no sticky actions) + `AtariPreprocessing` + "
                    "`FrameStackObservation(4)`, EnvPool's preprocessing")
        notes.append("EnvPool rows step EnvPool's own C++ implementation of the task; every other row steps "
                     + gym_side + (" (recipe rows: shmpool's own recipe)" if args.recipe else ""))
    cells = []
    if args.num_envs is not None:
        cells = [Cell(len(cpus), cpus, [cpus[:min(n, len(cpus))]], n, min(n, len(cpus)), n) for n in args.num_envs]
    for w in args.workers if args.num_envs is None else ():
        if w > len(cpus):
            notes.append(f"{w} workers skipped: only {len(cpus)} cpus {format_cpu_list(cpus)}")
            continue
        cells.append(Cell(w, cpus[:w], split_by_node(cpus[:w], nodes), args.envs_per_worker * w, w))
    return Plan(args.task, args.frame_skip, cpus, nodes, systems, skipped, cells, notes)


def run(plan: Plan, args: argparse.Namespace, err: Any) -> None:
    with report.progress(err, len(plan.cells) * len(plan.systems) * args.repeats) as update:
        for cell in plan.cells:
            def on_start(case: Case, rep: int, cell: Cell = cell) -> None:
                update(description=f"{plan.task} W={cell.workers} N={cell.num_envs} · {case.name} · "
                       f"rep {rep + 1}/{args.repeats}")

            def on_done(r: Record) -> None:
                update(advance=1, last="failed" if r.sample is None
                       else f"{r.case}: {r.sample.rate * plan.frame_skip:,.0f} FPS")

            cell.cases = [Case(s, functools.partial(open_system, s, plan.task, cell, args.envs_per_worker))
                          for s in plan.systems]
            with affinity(cell.cpus):   # the whole cell, taskset-like: this process and every child it starts
                cell.records = run_interleaved(cell.cases, repeats=args.repeats, seconds=args.seconds,
                                               warmup=args.warmup, on_start=on_start, on_done=on_done)


# --- the report ------------------------------------------------------------------------------

def title(plan: Plan, env: dict[str, Any]) -> str:
    return f"{plan.task} - {env['cpu_model']} (FPS, frame_skip {plan.frame_skip})"


def baseline(plan: Plan) -> str | None:
    """The row every row's ratio divides by: For-loop when it was measured in the last column, else the first row
    that was; None when none was."""
    last = plan.cells[-1] if plan.cells else None
    measured = [s for s in plan.systems if last is not None and last.fps(s, plan.frame_skip) is not None]
    return FOR_LOOP if FOR_LOOP in measured else next(iter(measured), None)


def ratio(plan: Plan, system: str, base: str) -> str:
    """``system``'s FPS over ``base``'s in the last column (the most cores), as ``8.00``; ``—`` if either failed."""
    last = plan.cells[-1]
    f, b = last.fps(system, plan.frame_skip), last.fps(base, plan.frame_skip)
    return "—" if f is None or b is None or b.median <= 0 else f"{f.median / b.median:.2f}"


def markdown(plan: Plan, args: argparse.Namespace, env: dict[str, Any]) -> str:
    """EnvPool's table (one row per system, one column per number of workers or N, FPS medians as whole numbers,
    then each row over a baseline row of the same run) and its notes."""
    base = baseline(plan)
    rows = [[s, *("error" if (f := c.fps(s, plan.frame_skip)) is None else f"{f.median:,.0f}" for c in plan.cells),
             *([ratio(plan, s, base)] if base else [])] for s in plan.systems]
    ratio_title = [f"÷ {base} (at {plan.cells[-1].label})"] if base else []
    mode = f"{args.seconds:g} s per repetition"
    columns = (f"Columns: workers W (cores); a cell limits every system to the first W cpus (process affinity, "
               f"taskset-like; shmpool workers pinned one per core; EnvPool num_threads=W). num_envs = "
               f"{args.envs_per_worker} × W for every system" if args.num_envs is None else
               f"Columns: N envs, every system on cpus {format_cpu_list(plan.cpus)} (process affinity); shmpool "
               f"and EnvPool with min(N, {len(plan.cpus)}) workers/threads")
    lines = [f"<!-- {plan.task} - {env['cpu_model']} -->", "",
             report.markdown_table([title(plan, env), *(c.label for c in plan.cells), *ratio_title], rows), "",
             f"<!-- {plan.task} - {env['cpu_model']} -->", "",
             f"`{args.command}` · {env['date']} · cpus {format_cpu_list(plan.cpus)} · python {env['python']}, "
             f"gymnasium {env['gymnasium']}, shmpool {env['shmpool']}, envpool {env.get('envpool') or '—'}, "
             f"sb3 {env.get('stable_baselines3') or '—'}", "",
             f"{columns}; async rows: batch_size = num_envs/2. FPS = env steps/s × frame_skip ({plan.frame_skip}); "
             f"median of {args.repeats} interleaved repetitions, {mode}, warm-up {args.warmup:g} s not timed. Raw "
             "measurements in the JSON."]
    if base:
        lines.append(f"\n÷ {base}: each row's FPS over {base}'s in the same run, in the last column "
                     f"({plan.cells[-1].label}).")
    lines += [f"\n{n}" for n in plan.notes]
    lines += [f"\n{s}: not run — {why}" for s, why in plan.skipped.items()]
    return "\n".join(lines) + "\n"


def nothing_to_measure(plan: Plan, args: argparse.Namespace) -> str | None:
    """Why this run would measure nothing (every column or every row skipped), or None."""
    if not plan.cells:
        n = len(plan.cpus)
        use = f"--workers {n}" if n == 1 else f"--workers up to {n}"
        return (f"nothing to measure: every column was skipped (--workers {','.join(map(str, args.workers))} on "
                f"{n} cpu{'s' if n > 1 else ''}: use {use})")
    if not plan.systems:
        return "nothing to measure: every system was skipped (the reasons above)"
    return None


def json_data(plan: Plan, args: argparse.Namespace, env: dict[str, Any]) -> dict[str, Any]:
    groups = split_by_node(plan.cpus, plan.nodes)
    return {"benchmark": "bench.throughput", "environment": env, "config": report.config_of(args),
            "task": plan.task, "frame_skip": plan.frame_skip, "cpus": plan.cpus,
            "num_envs_rule": f"{args.envs_per_worker} x workers; async batch_size = num_envs // 2",
            "actions": "fixed seeded random actions (bench.subjects.fixed_random_actions, seed 0)",
            "numa": {"nodes": plan.nodes, "groups": groups, "single": len(groups) <= 1},
            "systems": plan.systems, "skipped": plan.skipped, "notes": plan.notes, "ratio_baseline": baseline(plan),
            "cells": [c.to_json(plan.frame_skip) for c in plan.cells]}


# --- command line ----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench throughput", __doc__)
    p.add_argument("--task", default="CartPole-v1", help="gymnasium/EnvPool task id (default CartPole-v1)")
    p.add_argument("--workers", help="comma list of worker (core) counts (default 1,2,4,... up to the cpus)")
    p.add_argument("--num-envs", help="comma list of N: sweep N on the whole core budget instead of workers")
    p.add_argument("--cpus", help="taskset syntax, e.g. 0-7,16-23 (default: this process's allowed cpus)")
    p.add_argument("--numa", action="store_true", help="add the numa+async rows (one pool per NUMA node)")
    p.add_argument("--numa-root", default=SYSFS_NODES, help=argparse.SUPPRESS)
    p.add_argument("--envs-per-worker", type=int, default=DEFAULT_ENVS_PER_WORKER,
                   help=f"num_envs = this × workers (default {DEFAULT_ENVS_PER_WORKER})")
    p.add_argument("--frame-skip", type=int, help="FPS multiplier (default: 4 for Pong-v5, else 1)")
    p.add_argument("--recipe", action="store_true", help="add rows for shmpool over its own recipe (shmpool.make's)")
    p.add_argument("--systems", help="comma list of rows to run (row titles or short names; default all but "
                                     f"{', '.join(ON_REQUEST)})")
    cli.add_run_options(p, cli.RunDefaults(), quick="0.2 s, 1 repeat")
    args = cli.parse(p, argv)
    try:
        args.cpus = resolve_cpus(args.cpus)
    except ValueError as exc:
        p.error(str(exc))
    if args.workers:
        args.workers = cli.positive_ints(p, "--workers", args.workers)
    else:
        args.workers = sorted({min(2 ** i, len(args.cpus)) for i in range(len(args.cpus).bit_length() + 1)})
    args.num_envs = sorted(cli.positive_ints(p, "--num-envs", args.num_envs)) if args.num_envs else None
    if args.systems:
        names = {s.lower(): s for s in ALL_SYSTEMS} | ALIASES
        unknown = [t for t in cli.comma_list(args.systems) if t.lower() not in names]
        if unknown:
            p.error(f"unknown system {unknown[0]!r}; known: {', '.join(ALL_SYSTEMS)} or {', '.join(ALIASES)}")
        chosen = {names[t.lower()] for t in cli.comma_list(args.systems)}
        args.systems = [s for s in ALL_SYSTEMS if s in chosen]
        args.recipe = args.recipe or any(s in RECIPE_SYSTEMS for s in chosen)
    else:
        args.systems = [s for s in ALL_SYSTEMS if s not in ON_REQUEST]
    args.frame_skip = args.frame_skip or FRAME_SKIP.get(args.task, 1)
    if args.envs_per_worker < 1:
        p.error("--envs-per-worker must be >= 1")
    if args.task not in ATARI_TASKS:   # Pong-v5 is EnvPool's id (our recipe), not a gymnasium one
        try:
            gym.spec(args.task)
        except gym.error.Error as exc:
            p.error(f"--task {args.task!r}: {exc}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    err = report.stderr_console()
    plan = make_plan(args)
    for line in plan.notes + [f"{s}: not run — {why}" for s, why in plan.skipped.items()]:
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    env = {**report.environment(), "envpool": envpool_status(args.task)[0],
           "stable_baselines3": report.version_of("stable_baselines3"), "allowed_cpus_at_start": allowed_cpus()}
    nothing = nothing_to_measure(plan, args)
    if nothing:   # an empty table with status 0 read as a run that worked (taskset -c 0 ... --workers 2)
        err.print(nothing, style="red", highlight=False, markup=False, soft_wrap=True)
        return 2
    run(plan, args, err)
    text = markdown(plan, args, env)
    print(text, flush=True)   # the table once, as markdown (EnvPool's format)
    if args.json:
        report.write_results(args.json, json_data(plan, args, env), text, err)
    return 1 if report.print_failures(plan.cells, err) else 0


if __name__ == "__main__":
    raise SystemExit(main())
