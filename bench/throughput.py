"""EnvPool's throughput table: FPS of every system against the number of cores, env-only.

    python -m bench throughput --task CartPole-v1 --workers 1,2
    python -m bench throughput --task Ant-v5 --workers 1,2 --recipe --md t.md --json t.json --png t.png
    python -m bench throughput --task CartPole-v1 --workers 1,2,4 --cpus 0-1,8-9 --numa
    python -m bench throughput --quick          # a few seconds

Rows are systems, columns the number of workers W (cores).  A cell with W workers
limits every system to the first W cores of the allowed set (``--cpus`` or the
process's affinity), taskset-like: the benchmark process itself (parent loop,
gymnasium/SB3 subprocesses, EnvPool threads) runs with its affinity set to those
W cores for the whole cell and gets its old affinity back afterwards; on top of
that shmpool pins its W workers one per core and EnvPool gets ``num_threads=W``
(pinned with ``thread_affinity_offset`` when the W cores are consecutive).
Every system steps ``num_envs = envs_per_worker × W`` envs (default 8 × W) with
one fixed array of seeded random actions; async rows use ``batch_size =
num_envs / 2``.  A cell is FPS = env steps/s × frame_skip (EnvPool's unit);
warm-up is not timed.  ``--numa`` adds the numa+async rows: one pool per NUMA
node of the cell's cores, each pinned to its node and created while the parent
runs on that node (so the pages it touches are first-touched there, as are the
workers' own), driven round-robin from one thread, throughput summed.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import shmpool
from shmpool.topology import allowed_cpus, resolve_cpus

from . import cli
from ._timing import Case, Record, Sample, Summary, clock, run_interleaved, summarize, timed_loop
from .envs import gym_env_fn
from .numa import Topology, format_cpu_list, read_topology
from .report import consoles, environment, markdown_table, progress, version_of, write_json
from .subjects import ASYNC_VEC as GYM_ASYNC
from .subjects import SYNC_VEC as GYM_SYNC
from .subjects import GymVector, fixed_random_actions, pool_info
from .tasks import TASKS

FOR_LOOP, SUBPROCESS, SB3, SAMPLE_FACTORY = "For-loop", "Subprocess", "SB3 SubprocVecEnv", "Sample Factory"
EP_SYNC, EP_ASYNC, EP_NUMA = "EnvPool (sync)", "EnvPool (async)", "EnvPool (numa+async)"
SP_SYNC, SP_ASYNC, SP_NUMA = "shmpool (sync)", "shmpool (async)", "shmpool (numa+async)"
SPR_SYNC, SPR_ASYNC = "shmpool recipe (sync)", "shmpool recipe (async)"
ALL_SYSTEMS = (FOR_LOOP, SUBPROCESS, SB3, SAMPLE_FACTORY, EP_SYNC, EP_ASYNC, EP_NUMA, SP_SYNC, SP_ASYNC, SP_NUMA,
               SPR_SYNC, SPR_ASYNC)
NUMA_SYSTEMS = (EP_NUMA, SP_NUMA)
RECIPE_SYSTEMS = (SPR_SYNC, SPR_ASYNC)
# Short names accepted by --systems besides the row titles.
ALIASES = {"for-loop": FOR_LOOP, "subprocess": SUBPROCESS, "sb3": SB3, "sample-factory": SAMPLE_FACTORY,
           "envpool-sync": EP_SYNC,
           "envpool-async": EP_ASYNC, "envpool-numa": EP_NUMA, "shmpool-sync": SP_SYNC, "shmpool-async": SP_ASYNC,
           "shmpool-numa": SP_NUMA, "recipe-sync": SPR_SYNC, "recipe-async": SPR_ASYNC,
           "shmpool sync": SP_SYNC, "shmpool async": SP_ASYNC}
# frame_skip per task, EnvPool's FPS multiplier: Pong-v5 steps 4 emulator frames.  Gymnasium's MuJoCo and
# classic-control tasks count one step as one frame (EnvPool's Ant numbers do the same).
FRAME_SKIP = {"Pong-v5": 4}
DEFAULT_ENVS_PER_WORKER = 8


# --- affinity --------------------------------------------------------------------------------

@contextlib.contextmanager
def affinity(cpus: Sequence[int]) -> Iterator[None]:
    """Run the block with this thread's (hence new children's and threads') affinity set to ``cpus``."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def consecutive(cpus: Sequence[int]) -> bool:
    return list(cpus) == list(range(cpus[0], cpus[0] + len(cpus)))


# --- subjects --------------------------------------------------------------------------------

def counted_loop(step: Callable[[], object], units_per_call: int, total: int, warmup: float) -> Sample:
    """Like ``timed_loop`` but for a fixed amount of work: call ``step`` until ``total`` units are done."""
    end = clock() + warmup
    while clock() < end:
        step()
    done = 0
    start = clock()
    while done < total:
        step()
        done += units_per_call
    return Sample(done, clock() - start)


@dataclass
class Budget:
    """How long a repetition runs: ``seconds`` of stepping, or ``total_steps`` env steps."""

    seconds: float
    total_steps: int | None = None

    def run(self, step: Callable[[], object], units: int, warmup: float) -> Sample:
        if self.total_steps is not None:
            return counted_loop(step, units, self.total_steps, warmup)
        return timed_loop(step, units, self.seconds, warmup)


def child_affinity(processes: Sequence[Any]) -> list[list[int]]:
    """The distinct cpu sets the env processes may run on (recorded: they must be the cell's cores)."""
    return sorted({tuple(sorted(os.sched_getaffinity(p.pid))) for p in processes}, key=lambda t: (len(t), t))


class Stepper:
    """Base of the subjects here: ``self._step()`` does ``self.units`` env steps."""

    units: int
    info: dict[str, Any]
    budget: Budget

    def _step(self) -> None:
        raise NotImplementedError

    def measure(self, seconds: float, warmup: float) -> Sample:
        return self.budget.run(self._step, self.units, warmup)


class GymSubject(Stepper):
    """gymnasium's SyncVectorEnv (For-loop) or AsyncVectorEnv (Subprocess, shared memory)."""

    def __init__(self, system: str, make_env: Callable[[], gym.Env], n: int, actions: np.ndarray,
                 budget: Budget) -> None:
        self.inner = GymVector(GYM_SYNC if system == FOR_LOOP else GYM_ASYNC, make_env, n, actions)
        self.units, self.budget = n, budget
        self.info = {"num_envs": n, "processes": 0 if system == FOR_LOOP else n}
        if system == SUBPROCESS:
            self.info["child_affinity"] = child_affinity(self.inner.env.processes)
        self._step = self.inner._step

    def close(self) -> None:
        self.inner.close()


class SB3Subject(Stepper):
    """Stable-Baselines3's SubprocVecEnv: one process per env, everything pickled."""

    def __init__(self, make_env: Callable[[], gym.Env], n: int, actions: np.ndarray, budget: Budget) -> None:
        from stable_baselines3.common.vec_env import SubprocVecEnv
        # "fork", not SB3's default forkserver: a forkserver keeps the affinity it was started with
        # (the first cell's cores) and hands it to every later child; fork children take the cell's.
        self.env = SubprocVecEnv([make_env] * n, start_method="fork")
        self.units, self.budget = n, budget
        self.info = {"num_envs": n, "processes": n, "start_method": "fork",
                     "child_affinity": child_affinity(self.env.processes)}
        try:
            self.env.reset()
        except BaseException:
            self.env.close()
            raise
        self._step = functools.partial(self.env.step, actions)

    def close(self) -> None:
        self.env.close()


class PoolSubject(Stepper):
    """shmpool pools, one per cpu group (``--numa``: one per node), driven from this thread.

    Sync (one group): ``pool.step`` of all envs.  Async: ``batch_size = n/2`` per pool,
    ``recv`` then ``send`` the batch straight back, the pools in turn.  Each pool is
    created while this thread runs on its cpus, so what the parent touches at creation
    is first-touched on that node; the workers are pinned there and touch their envs."""

    def __init__(self, env: Any, groups: list[list[int]], per_worker: int, asynchronous: bool,
                 actions: Callable[[int], np.ndarray], budget: Budget) -> None:
        self.pools: list[shmpool.Pool] = []
        self.budget = budget
        self.asynchronous = asynchronous
        try:
            for cpus in groups:
                n = per_worker * len(cpus)
                batch = max(1, n // 2) if asynchronous else n
                with affinity(cpus):
                    pool = shmpool.Pool(env, n, num_workers=len(cpus), cpus=cpus, seed=0,
                                        batch_size=batch)
                self.pools.append(pool)
            self.info = {"pools": [{**pool_info(p), "num_envs": p.num_envs} for p in self.pools]}
            if asynchronous:
                self.acts = [actions(p.batch_size) for p in self.pools]
                for p in self.pools:
                    # The seeded first reset untimed (an Atari one reloads its ROM, ~0.2 s per
                    # env), as for the sync rows; then the async loop starts from reset envs.
                    p.reset()
                    p.async_reset()
                self.units = sum(p.batch_size for p in self.pools)
                self._step = self._recv_send
            else:
                (pool,) = self.pools
                pool.reset()
                self.units = pool.num_envs
                self._step = functools.partial(pool.step, actions(pool.num_envs))
        except BaseException:
            self.close()
            raise

    def _recv_send(self) -> None:
        for pool, acts in zip(self.pools, self.acts):
            *_, infos = pool.recv()
            pool.send(acts, infos["env_id"])

    def close(self) -> None:
        for p in self.pools:
            p.close()
        self.pools = []


class EnvPoolSubject(Stepper):
    """EnvPool's C++ envs: sync (``step`` of all), async or numa+async (one pool per group,
    ``batch_size = n/2``, recv/send in turn).  ``num_threads`` = the group's cores, pinned with
    ``thread_affinity_offset`` when they are consecutive (EnvPool pins to absolute cpu ids)."""

    def __init__(self, task: str, groups: list[list[int]], per_worker: int, asynchronous: bool,
                 actions: Callable[[int], np.ndarray], budget: Budget) -> None:
        import envpool
        self.envs, self.budget, self.info = [], budget, {"pools": []}
        try:
            for cpus in groups:
                n = per_worker * len(cpus)
                batch = max(1, n // 2) if asynchronous else n
                offset = cpus[0] if consecutive(cpus) else -1
                with affinity(cpus):
                    env = envpool.make(task, env_type="gymnasium", num_envs=n, batch_size=batch,
                                       num_threads=len(cpus), seed=0, thread_affinity_offset=offset)
                self.envs.append(env)
                cfg = env.config
                self.info["pools"].append({"num_envs": n, "num_threads": cfg["num_threads"],
                                           "batch_size": cfg["batch_size"], "cpus": list(cpus),
                                           "thread_affinity_offset": cfg["thread_affinity_offset"]})
            if asynchronous:
                self.acts = [np.asarray(actions(e.config["batch_size"]), dtype=e.action_space.dtype)
                             for e in self.envs]
                for e in self.envs:
                    e.async_reset()
                self.units = sum(e.config["batch_size"] for e in self.envs)
                self._step = self._recv_send
            else:
                (env,) = self.envs
                env.reset()
                n = env.config["num_envs"]
                self.units = n
                self._step = functools.partial(env.step, np.asarray(actions(n), dtype=env.action_space.dtype))
        except BaseException:
            self.close()
            raise

    def _recv_send(self) -> None:
        for env, acts in zip(self.envs, self.acts):
            *_, info = env.recv()
            env.send(acts, info["env_id"])

    def close(self) -> None:
        for e in self.envs:
            e.close()
        self.envs = []
        self.__dict__.pop("_step", None)
        gc.collect()   # EnvPool's threads stop when the C++ pool is destroyed


class Limited:
    """A subject opened and measured with the process's affinity set to ``cpus``; closing restores it."""

    def __init__(self, open_: Callable[[], Any], cpus: Sequence[int]) -> None:
        self.cpus = list(cpus)
        self.old = os.sched_getaffinity(0)
        os.sched_setaffinity(0, self.cpus)
        try:
            self.inner = open_()
        except BaseException:
            os.sched_setaffinity(0, self.old)
            raise
        self.info = {**getattr(self.inner, "info", {}), "affinity": self.cpus}

    def measure(self, seconds: float, warmup: float) -> Sample:
        return self.inner.measure(seconds, warmup)

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            os.sched_setaffinity(0, self.old)


# --- the plan --------------------------------------------------------------------------------

@dataclass
class Cell:
    """One column: W workers on ``cpus``; ``groups`` = the cpus split by NUMA node."""

    workers: int
    cpus: list[int]
    groups: list[list[int]]
    num_envs: int
    cases: list[Case] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)

    def fps(self, system: str, frame_skip: int) -> Summary | None:
        return summarize(self.records, system, lambda s: s.rate * frame_skip)

    def to_json(self, frame_skip: int) -> dict[str, Any]:
        out: dict[str, Any] = {"workers": self.workers, "cpus": self.cpus, "numa_groups": self.groups,
                               "num_envs": self.num_envs, "systems": {}}
        for case in self.cases:
            fps = self.fps(case.name, frame_skip)
            out["systems"][case.name] = {
                "samples": [r.to_json() for r in self.records if r.case == case.name],
                "median_fps": fps and fps.median, "min_fps": fps and fps.lo, "max_fps": fps and fps.hi,
            }
        return out


@dataclass
class Plan:
    task: str
    frame_skip: int
    cpus: list[int]
    topology: Topology
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


def sb3_status() -> tuple[str | None, str | None]:
    """(stable-baselines3's version, None) if it imports, else (None, why not)."""
    version = version_of("stable_baselines3")
    return (version, None) if version else (None, "not installed (stable_baselines3 does not import)")


def sample_factory_status() -> str:
    """Why the Sample Factory row is not run.  Its latest release (2.1.1) pins gymnasium<1.0 and
    numpy<2.0, so it cannot share an environment with shmpool's gymnasium>=1.0 (nor EnvPool's
    numpy 2 wheels); its sampler would have to be measured in an environment of its own."""
    try:
        import sample_factory
    except Exception as exc:
        return (f"not installed ({type(exc).__name__}); sample-factory 2.1.1 requires gymnasium<1.0 and "
                f"numpy<2.0, this environment has gymnasium {gym.__version__} and numpy {np.__version__}")
    return (f"sample-factory {getattr(sample_factory, '__version__', '?')} is importable, but this benchmark "
            "does not drive its sampler (it needs gymnasium<1.0, which shmpool does not support)")


def recipe_env(task: str) -> Callable[[], gym.Env] | None:
    """shmpool's own recipe constructor for ``task`` (``shmpool.make``'s), or None."""
    spec = TASKS.get(task)
    if task not in shmpool.list_tasks() or spec is None or spec.recipe is None:
        return None
    try:
        return spec.recipe()
    except ImportError:
        return None


def make_plan(args: argparse.Namespace) -> Plan:
    cpus = args.cpus
    topo = read_topology(args.numa_root, allowed=cpus)
    systems = list(args.systems)
    skipped: dict[str, str] = {}
    notes: list[str] = []
    if args.numa:
        notes.append(f"--numa: {topo.describe()}"
                     + ("; a one-node machine: numa+async runs one pool, the same as async" if topo.single else ""))
    else:
        systems = [s for s in systems if s not in NUMA_SYSTEMS]
    if not args.recipe:
        systems = [s for s in systems if s not in RECIPE_SYSTEMS]
    elif recipe_env(args.task) is None:
        for s in RECIPE_SYSTEMS:
            if s in systems:
                skipped[s] = f"shmpool has no recipe for {args.task}"
    if any(s in systems for s in (EP_SYNC, EP_ASYNC, EP_NUMA)):
        version, why = envpool_status(args.task)
        if version is None:
            skipped.update({s: why for s in (EP_SYNC, EP_ASYNC, EP_NUMA) if s in systems})
    if SB3 in systems:
        version, why = sb3_status()
        if version is None:
            skipped[SB3] = why
    if SAMPLE_FACTORY in systems:
        skipped[SAMPLE_FACTORY] = sample_factory_status()
    systems = [s for s in systems if s not in skipped]
    if any(s in systems for s in (EP_SYNC, EP_ASYNC, EP_NUMA)):
        spec = TASKS.get(args.task)
        gym_side = (f"gymnasium's `gym.make({args.task!r})`" if spec is None or spec.gym_env is None else
                    f"gymnasium's `{spec.gym_id}` (frameskip=1, no sticky actions) + `AtariPreprocessing` + "
                    "`FrameStackObservation(4)`, EnvPool's preprocessing")
        notes.append("EnvPool rows step EnvPool's own C++ implementation of the task; every other row steps "
                     + gym_side + (" (recipe rows: shmpool's own recipe)" if args.recipe else ""))

    cells = []
    for w in args.workers:
        if w > len(cpus):
            notes.append(f"{w} workers skipped: only {len(cpus)} cpus {format_cpu_list(cpus)}")
            continue
        cell_cpus = cpus[:w]
        groups = [g for _, g in topo.split(cell_cpus)]
        cells.append(Cell(w, cell_cpus, groups, args.envs_per_worker * w))
    return Plan(args.task, args.frame_skip, cpus, topo, systems, skipped, cells, notes)


def cell_cases(plan: Plan, cell: Cell, args: argparse.Namespace) -> list[Case]:
    make_env = gym_env_fn(plan.task)
    probe = make_env()
    space = probe.action_space
    probe.close()
    actions = functools.partial(fixed_random_actions, space)    # n -> n seeded random actions
    n, k, budget = cell.num_envs, args.envs_per_worker, Budget(args.seconds, args.total_steps)
    one = [cell.cpus]
    recipe = recipe_env(plan.task)
    openers: dict[str, Callable[[], Any]] = {
        FOR_LOOP: lambda: GymSubject(FOR_LOOP, make_env, n, actions(n), budget),
        SUBPROCESS: lambda: GymSubject(SUBPROCESS, make_env, n, actions(n), budget),
        SB3: lambda: SB3Subject(make_env, n, actions(n), budget),
        EP_SYNC: lambda: EnvPoolSubject(plan.task, one, k, False, actions, budget),
        EP_ASYNC: lambda: EnvPoolSubject(plan.task, one, k, True, actions, budget),
        EP_NUMA: lambda: EnvPoolSubject(plan.task, cell.groups, k, True, actions, budget),
        SP_SYNC: lambda: PoolSubject(make_env, one, k, False, actions, budget),
        SP_ASYNC: lambda: PoolSubject(make_env, one, k, True, actions, budget),
        SP_NUMA: lambda: PoolSubject(make_env, cell.groups, k, True, actions, budget),
        SPR_SYNC: lambda: PoolSubject(recipe, one, k, False, actions, budget),
        SPR_ASYNC: lambda: PoolSubject(recipe, one, k, True, actions, budget),
    }
    return [Case(s, functools.partial(Limited, openers[s], cell.cpus)) for s in plan.systems]


def run(plan: Plan, args: argparse.Namespace, err: Any) -> None:
    with progress(err, len(plan.cells) * len(plan.systems) * args.repeats) as update:
        for cell in plan.cells:
            def on_start(case: Case, rep: int, cell: Cell = cell) -> None:
                update(description=f"{plan.task} W={cell.workers} N={cell.num_envs} · {case.name} · "
                       f"rep {rep + 1}/{args.repeats}")

            def on_done(r: Record) -> None:
                update(advance=1, last="failed" if r.sample is None
                       else f"{r.case}: {r.sample.rate * plan.frame_skip:,.0f} FPS")

            cell.cases = cell_cases(plan, cell, args)
            old = os.sched_getaffinity(0)
            try:
                cell.records = run_interleaved(cell.cases, repeats=args.repeats, seconds=args.seconds,
                                               warmup=args.warmup, on_start=on_start, on_done=on_done)
            finally:
                os.sched_setaffinity(0, old)


# --- the report ------------------------------------------------------------------------------

def title(plan: Plan, env: dict[str, Any]) -> str:
    return f"{plan.task} - {env['cpu_model']} (FPS, frame_skip {plan.frame_skip})"


def table(plan: Plan) -> tuple[list[str], list[list[str]]]:
    """EnvPool's table: one row per system, one column per number of workers, FPS medians."""
    header = [str(c.workers) for c in plan.cells]
    rows = []
    for system in plan.systems:
        cells = []
        for c in plan.cells:
            fps = c.fps(system, plan.frame_skip)
            cells.append("error" if fps is None else f"{fps.median:.2f}")
        rows.append([system, *cells])
    return header, rows


def markdown(plan: Plan, args: argparse.Namespace, env: dict[str, Any]) -> str:
    header, rows = table(plan)
    name = title(plan, env)
    mode = (f"{args.total_steps} env steps" if args.total_steps else f"{args.seconds:g} s") + " per repetition"
    lines = [
        f"<!-- {plan.task} - {env['cpu_model']} -->", "",
        markdown_table([name, *header], rows), "",
        f"<!-- {plan.task} - {env['cpu_model']} -->", "",
        f"`{args.command}` · {env['date']} · cpus {format_cpu_list(plan.cpus)} · python {env['python']}, "
        f"gymnasium {env['gymnasium']}, shmpool {env['shmpool']}, envpool {env.get('envpool') or '—'}, "
        f"sb3 {env.get('stable_baselines3') or '—'}", "",
        f"Columns: workers W (cores); a cell limits every system to the first W cpus (process affinity, "
        f"taskset-like; shmpool workers pinned one per core; EnvPool num_threads=W). num_envs = "
        f"{args.envs_per_worker} × W for every system; async rows: batch_size = num_envs/2. FPS = env steps/s × "
        f"frame_skip ({plan.frame_skip}); median of {args.repeats} interleaved repetitions, {mode}, "
        f"warm-up {args.warmup:g} s not timed. Raw measurements in the JSON.",
    ]
    lines += [f"\n{n}" for n in plan.notes]
    lines += [f"\n{s}: not run — {why}" for s, why in plan.skipped.items()]
    return "\n".join(lines) + "\n"


def json_data(plan: Plan, args: argparse.Namespace, env: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "bench.throughput",
        "environment": env,
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "md", "png")},
        "task": plan.task, "frame_skip": plan.frame_skip, "cpus": plan.cpus,
        "num_envs_rule": f"{args.envs_per_worker} x workers; async batch_size = num_envs // 2",
        "actions": "fixed seeded random actions (bench.tasks.fixed_random_actions, seed 0)",
        "numa": plan.topology.to_json(),
        "systems": plan.systems, "skipped": plan.skipped, "notes": plan.notes,
        "cells": [c.to_json(plan.frame_skip) for c in plan.cells],
    }


def write_png(path: str, plan: Plan, env: dict[str, Any]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [c.workers for c in plan.cells]
    for system in plan.systems:
        ys = [c.fps(system, plan.frame_skip) for c in plan.cells]
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        if not pts:
            continue
        style = "-" if system.startswith("shmpool") else "--"
        line, = ax.plot([p[0] for p in pts], [p[1].median for p in pts], style, marker="o", label=system)
        ax.vlines([p[0] for p in pts], [p[1].lo for p in pts], [p[1].hi for p in pts], color=line.get_color(),
                  alpha=0.5)
    ax.set_xlabel("workers (cores)")
    ax.set_ylabel(f"FPS (env steps/s × frame_skip {plan.frame_skip})")
    ax.set_xticks(xs)
    ax.set_ylim(bottom=0)
    ax.set_title(title(plan, env), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_errors(plan: Plan, err: Any) -> int:
    failed = [(c, r) for c in plan.cells for r in c.records if r.error is not None]
    for c, r in failed:
        err.print(f"W={c.workers} · {r.case} · rep {r.rep + 1} failed:", style="red", markup=False, highlight=False)
        sys.stderr.write(r.error.rstrip() + "\n")
    return len(failed)


# --- command line ----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench throughput", __doc__)
    p.add_argument("--task", default="CartPole-v1", help="gymnasium/EnvPool task id (default CartPole-v1)")
    p.add_argument("--workers", help="comma list of worker (core) counts (default 1,2,4,... up to the cpus)")
    p.add_argument("--cpus", help="taskset syntax, e.g. 0-7,16-23 (default: this process's allowed cpus)")
    p.add_argument("--numa", action="store_true", help="add the numa+async rows (one pool per NUMA node)")
    p.add_argument("--numa-root", default="/sys/devices/system/node", help=argparse.SUPPRESS)
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--total-steps", type=int, help="env steps per repetition instead of --seconds")
    p.add_argument("--envs-per-worker", type=int, default=DEFAULT_ENVS_PER_WORKER,
                   help=f"num_envs = this × workers (default {DEFAULT_ENVS_PER_WORKER})")
    p.add_argument("--frame-skip", type=int, help="FPS multiplier (default: 4 for Pong-v5, else 1)")
    p.add_argument("--recipe", action="store_true", help="add rows for shmpool over its own recipe (shmpool.make's)")
    p.add_argument("--systems", help="comma list of rows to run (row titles or short names; default all)")
    p.add_argument("--md", metavar="PATH", help="write the markdown table here")
    p.add_argument("--png", metavar="PATH", help="write a plot of FPS against workers here")
    cli.add_run_options(p, cli.RunDefaults(), quick="0.2 s, 1 repeat", seconds_in=budget)
    args = cli.parse(p, argv)
    try:
        args.cpus = resolve_cpus(args.cpus)
    except ValueError as exc:
        p.error(str(exc))
    if args.workers:
        args.workers = cli.positive_ints(p, "--workers", args.workers)
    else:
        args.workers = sorted({min(2 ** i, len(args.cpus)) for i in range(len(args.cpus).bit_length() + 1)})
    if args.systems:
        names = {s.lower(): s for s in ALL_SYSTEMS} | ALIASES
        chosen = []
        for t in (t.strip() for t in args.systems.split(",") if t.strip()):
            if t.lower() not in names:
                p.error(f"unknown system {t!r}; known: {', '.join(ALL_SYSTEMS)} or {', '.join(ALIASES)}")
            chosen.append(names[t.lower()])
        args.systems = [s for s in ALL_SYSTEMS if s in chosen]
        args.recipe = args.recipe or any(s in RECIPE_SYSTEMS for s in chosen)
    else:
        args.systems = list(ALL_SYSTEMS)
    args.frame_skip = args.frame_skip or FRAME_SKIP.get(args.task, 1)
    if args.envs_per_worker < 1:
        p.error("--envs-per-worker must be >= 1")
    if args.total_steps is not None and args.total_steps < 1:
        p.error("--total-steps must be >= 1")
    if args.task not in TASKS:   # Pong-v5 is EnvPool's id (our recipe), not a gymnasium one
        try:
            gym.spec(args.task)
        except gym.error.Error as exc:
            p.error(f"--task {args.task!r}: {exc}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _, err = consoles()
    plan = make_plan(args)
    for note in plan.notes:
        err.print(note, highlight=False, markup=False)
    for system, why in plan.skipped.items():
        err.print(f"{system}: not run — {why}", highlight=False, markup=False)
    env = {**environment(), "envpool": envpool_status(args.task)[0], "stable_baselines3": sb3_status()[0],
           "allowed_cpus_at_start": allowed_cpus()}
    run(plan, args, err)
    text = markdown(plan, args, env)
    print(text, flush=True)   # the table once, as markdown (EnvPool's format)
    if args.md:
        Path(args.md).write_text(text)
    if args.json:
        write_json(args.json, json_data(plan, args, env))
    if args.png:
        write_png(args.png, plan, env)
    for kind, path in (("markdown", args.md), ("raw measurements", args.json), ("plot", args.png)):
        if path:
            err.print(f"{kind} written to {path}", highlight=False)
    return 1 if print_errors(plan, err) else 0


if __name__ == "__main__":
    raise SystemExit(main())
