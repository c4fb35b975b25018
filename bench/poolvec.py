"""The PoolVecEnv experiments (an SB3 VecEnv blog's model): SB3's DummyVecEnv vs SubprocVecEnv vs shmpool's ShmVecEnv.

    python -m bench poolvec                                   # CartPole, Acrobot, HumanoidStandup
    python -m bench poolvec --tasks CartPole-v1 --num-envs 1,2,4 --json p.json --png p.png
    python -m bench poolvec --quick                           # CartPole only, N=1,2, 0.2 s, 1 repeat

For every task and every N (default 1, 2, 4, ... up to 8 × the cores) it times three SB3
``VecEnv``s stepping N copies of ``gym.make(task)`` with one fixed array of seeded random
actions: DummyVecEnv (one process), SubprocVecEnv (one process per env, ``start_method="fork"``)
and ``shmpool.sb3.ShmVecEnv([fn] * N, cpus=...)`` (min(N, cores) pinned workers).  Every case
runs with the process's affinity set to the same core budget (``--cpus``, default the allowed
cpus), so the children of SubprocVecEnv share those cores as shmpool's workers do.  Throughput
is env steps/s (median of interleaved repetitions, warm-up not timed); the table gives each
system's ratio to DummyVecEnv at the same N.

The blog's efficiency model, per system and task, is fitted by least squares over every
repetition (numpy only, t_os >= 0)::

    fps_parallel / fps_dummy ≈ N·t_env / (N·t_env + t_os)

``t_env`` is *measured*, not fitted: DummyVecEnv's seconds per env step at N=1 (the ratio
depends on t_env and t_os only through t_os/t_env, so they cannot be fitted jointly from
ratios).  The formula saturates at 1, so a system that beats DummyVecEnv (heavy envs on
several cores) reads t_os ≈ 0.  A second fit, "P-scaled", reads the blog's formula as the
efficiency per usable core: ratio ≈ P · N·t_env / (N·t_env + t_os) with P = min(N, cores),
t_os then in core-seconds; both are reported (JSON: ``t_os_*`` and ``per_core_*``).
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import shmpool
from shmpool.topology import allowed_cpus, resolve_cpus

from . import cli
from ._timing import Case, Record, Sample, Summary, run_interleaved, summarize, timed_loop
from .numa import format_cpu_list
from .report import consoles, environment, markdown_table, progress, write_json
from .subjects import fixed_random_actions
from .throughput import Limited, child_affinity, sb3_status

DUMMY, SUBPROC, SHM = "DummyVecEnv", "SubprocVecEnv", "ShmVecEnv (shmpool)"
SYSTEMS = (DUMMY, SUBPROC, SHM)
PARALLEL = (SUBPROC, SHM)
DEFAULT_TASKS = ("CartPole-v1", "Acrobot-v1", "HumanoidStandup-v5")
QUICK_TASKS = ("CartPole-v1",)


# --- subjects --------------------------------------------------------------------------------

class VecSubject:
    """One SB3 VecEnv of ``n`` envs: ``step`` of the fixed actions, ``n`` env steps per call."""

    def __init__(self, system: str, task: str, n: int, cpus: Sequence[int], actions: np.ndarray) -> None:
        fns = [functools.partial(gym.make, task)] * n
        if system == DUMMY:
            from stable_baselines3.common.vec_env import DummyVecEnv
            self.env = DummyVecEnv(fns)
            self.info: dict[str, Any] = {"num_envs": n, "processes": 0}
        elif system == SUBPROC:
            from stable_baselines3.common.vec_env import SubprocVecEnv
            # fork: children take the case's affinity (a forkserver keeps the one it started with).
            self.env = SubprocVecEnv(fns, start_method="fork")
            self.info = {"num_envs": n, "processes": n, "start_method": "fork",
                         "child_affinity": child_affinity(self.env.processes)}
        else:
            from shmpool.sb3 import ShmVecEnv
            self.env = ShmVecEnv(fns, cpus=list(cpus))
            pool = self.env.pool
            self.info = {"num_envs": n, "num_workers": pool.num_workers, "cpus": list(pool.cpus)}
        self.units = n
        try:
            self.env.seed(0)
            self.env.reset()
        except BaseException:
            self.env.close()
            raise
        self._step = functools.partial(self.env.step, actions)

    def measure(self, seconds: float, warmup: float) -> Sample:
        return timed_loop(self._step, self.units, seconds, warmup)

    def close(self) -> None:
        self.env.close()


# --- the efficiency model --------------------------------------------------------------------

def model(n: np.ndarray, t_env: float, t_os: float, cores: np.ndarray | float = 1.0) -> np.ndarray:
    """The blog's ratio fps_parallel / fps_dummy = P · N·t_env / (N·t_env + t_os)."""
    n = np.asarray(n, dtype=float)
    return np.asarray(cores, dtype=float) * n * t_env / (n * t_env + t_os)


def fit_t_os(n: Sequence[float], ratio: Sequence[float], t_env: float,
             cores: Sequence[float] | float = 1.0) -> tuple[float, float]:
    """Least-squares ``t_os >= 0`` (seconds) of :func:`model` for measured ``t_env``: (t_os, rms residual).

    numpy only: a log grid of t_os/t_env over 12 decades (plus 0), then two finer grids around
    the best point.  The residual is one-dimensional and smooth, so this finds its minimum to
    ~1e-4 relative."""
    n = np.asarray(n, dtype=float)
    r = np.asarray(ratio, dtype=float)
    p = np.broadcast_to(np.asarray(cores, dtype=float), n.shape)
    if n.size == 0 or not t_env > 0:
        return math.nan, math.nan

    def sse(k: np.ndarray) -> np.ndarray:   # k = t_os / t_env, one row per candidate
        pred = p * n / (n + k[:, None])
        return ((pred - r) ** 2).sum(axis=1)

    grid = np.concatenate([[0.0], np.logspace(-6, 6, 2401)])   # steps of ~1.2 %
    i = int(np.argmin(sse(grid)))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    for _ in range(2):
        fine = np.linspace(lo, hi, 2001)
        j = int(np.argmin(sse(fine)))
        lo, hi = fine[max(j - 1, 0)], fine[min(j + 1, fine.size - 1)]
    best = fine[j]
    rms = float(math.sqrt(sse(np.array([best]))[0] / n.size))
    return float(best * t_env), rms


# --- the plan --------------------------------------------------------------------------------

@dataclass
class TaskRun:
    task: str
    num_envs: list[int]
    records: dict[int, list[Record]] = field(default_factory=dict)   # N -> records of that N
    skipped: str | None = None
    fits: dict[str, dict[str, Any]] = field(default_factory=dict)
    t_env: float | None = None

    def fps(self, system: str, n: int) -> Summary | None:
        return summarize(self.records.get(n, []), system, lambda s: s.rate)

    def ratio(self, system: str, n: int) -> float | None:
        a, b = self.fps(system, n), self.fps(DUMMY, n)
        return None if a is None or b is None else a.median / b.median


def mujoco_missing(task: str) -> str | None:
    """Why ``task`` cannot be made here (mujoco missing, unknown id), or None."""
    try:
        env = gym.make(task)
    except gym.error.DependencyNotInstalled as exc:
        return f"needs mujoco ({exc})"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    env.close()
    return None


def fit(run: TaskRun, cores: int) -> None:
    """``t_env`` from DummyVecEnv at the smallest N (N=1 by default), ``t_os`` per parallel system."""
    n0 = min(run.num_envs)
    dummy0 = run.fps(DUMMY, n0)
    if dummy0 is None:
        return
    # seconds per env step: at N=n0 DummyVecEnv steps n0 envs per call, sequentially.
    run.t_env = 1.0 / dummy0.median
    for system in PARALLEL:
        ns, rs = [], []
        for n in run.num_envs:
            d = run.fps(DUMMY, n)
            if d is None:
                continue
            for r in run.records.get(n, []):
                if r.case == system and r.sample is not None:
                    ns.append(n)
                    rs.append(r.sample.rate / d.median)
        if not ns:
            continue
        t_os, rms = fit_t_os(ns, rs, run.t_env, 1.0)
        t_os_p, rms_p = fit_t_os(ns, rs, run.t_env, [min(n, cores) for n in ns])
        run.fits[system] = {"t_os_s": t_os, "t_os_us": t_os * 1e6, "rms": rms, "points": len(ns),
                            "cores": cores, "per_core_t_os_s": t_os_p, "per_core_t_os_us": t_os_p * 1e6,
                            "per_core_rms": rms_p}


def run_all(runs: list[TaskRun], args: argparse.Namespace, err: Any) -> None:
    total = sum(len(r.num_envs) for r in runs if r.skipped is None) * len(SYSTEMS) * args.repeats
    with progress(err, total) as update:
        for run in runs:
            if run.skipped is not None:
                continue
            space = gym.make(run.task).action_space
            for n in run.num_envs:
                def on_start(case: Case, rep: int, n: int = n, task: str = run.task) -> None:
                    update(description=f"{task} N={n} · {case.name} · rep {rep + 1}/{args.repeats}")

                def on_done(r: Record) -> None:
                    update(advance=1, last="failed" if r.sample is None else f"{r.case}: {r.sample.rate:,.0f} steps/s")

                acts = fixed_random_actions(space, n)
                cases = [Case(s, functools.partial(Limited, functools.partial(VecSubject, s, run.task, n,
                                                                              args.cpus, acts), args.cpus))
                         for s in SYSTEMS]
                run.records[n] = run_interleaved(cases, repeats=args.repeats, seconds=args.seconds,
                                                 warmup=args.warmup, on_start=on_start, on_done=on_done)
            fit(run, len(args.cpus))


# --- the report ------------------------------------------------------------------------------

def fmt_fps(s: Summary | None) -> str:
    return "error" if s is None else f"{s.median:,.0f}"


def fmt_ratio(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}×"


TABLE_HEADER = ("task", "N", f"{DUMMY} steps/s", f"{SUBPROC} steps/s", f"{SHM} steps/s",
                f"{SUBPROC} ÷ Dummy", f"{SHM} ÷ Dummy")
FIT_HEADER = ("task", "t_env µs (Dummy, N=1)", f"t_os µs {SUBPROC}", f"t_os µs {SHM}", "rms Subproc / shmpool",
              "smallest t_os", f"P-scaled t_os µs {SUBPROC}", f"P-scaled t_os µs {SHM}", "P-scaled rms")


def table_rows(runs: Sequence[TaskRun]) -> list[list[str]]:
    rows = []
    for run in runs:
        if run.skipped is not None:
            continue
        for n in run.num_envs:
            rows.append([run.task, str(n), *(fmt_fps(run.fps(s, n)) for s in SYSTEMS),
                         *(fmt_ratio(run.ratio(s, n)) for s in PARALLEL)])
    return rows


def fit_rows(runs: Sequence[TaskRun]) -> list[list[str]]:
    rows = []
    for run in runs:
        if run.skipped is not None or run.t_env is None:
            continue
        f = [run.fits.get(s) for s in PARALLEL]

        def col(key: str, fmt: str, f: list = f) -> list[str]:
            return [format(x[key], fmt) if x else "—" for x in f]

        have = {s: x["t_os_us"] for s, x in zip(PARALLEL, f) if x}
        smallest = min(have, key=have.get) if have else "—"
        rows.append([run.task, f"{run.t_env * 1e6:.2f}", *col("t_os_us", ".1f"), " / ".join(col("rms", ".3f")),
                     smallest, *col("per_core_t_os_us", ".1f"), " / ".join(col("per_core_rms", ".3f"))])
    return rows


def markdown(runs: Sequence[TaskRun], args: argparse.Namespace, env: dict[str, Any]) -> str:
    cores = len(args.cpus)
    lines = [
        f"## PoolVecEnv experiments - {env['cpu_model']}, {cores} cores", "",
        markdown_table(TABLE_HEADER, table_rows(runs)), "",
        "### Efficiency model fit", "",
        markdown_table(FIT_HEADER, fit_rows(runs)), "",
        f"`{args.command}` · {env['date']} · cpus {format_cpu_list(args.cpus)} · python {env['python']}, "
        f"gymnasium {env['gymnasium']}, sb3 {env.get('stable_baselines3') or '—'}, shmpool {env['shmpool']}, "
        f"mujoco {env.get('mujoco') or '—'}", "",
        f"Every case runs with the process's affinity set to cpus {format_cpu_list(args.cpus)} (the same core "
        f"budget): DummyVecEnv in this process, SubprocVecEnv with N processes (fork), ShmVecEnv with "
        f"min(N, {cores}) pinned workers. Env steps/s with fixed seeded random actions; median of {args.repeats} "
        f"interleaved repetitions of {args.seconds:g} s, warm-up {args.warmup:g} s not timed. Ratio = system "
        f"÷ DummyVecEnv at the same N.",
        "",
        "Fit: the blog's ratio ≈ N·t_env / (N·t_env + t_os), least squares (t_os ≥ 0) over every repetition "
        "(numpy grid search); t_env is measured (DummyVecEnv's seconds per env step at N=1), not fitted — "
        "ratios only determine t_os/t_env. The formula saturates at 1: where a system beats DummyVecEnv "
        "(heavy envs on several cores) its t_os reads ~0. \"P-scaled\": the same fit of "
        "ratio ≈ P·N·t_env / (N·t_env + t_os), P = min(N, cores) (the blog's formula per usable core; t_os "
        "in core-seconds). Raw samples in the JSON.",
    ]
    lines += [f"\n{r.task}: not run — {r.skipped}" for r in runs if r.skipped is not None]
    return "\n".join(lines) + "\n"


def json_data(runs: Sequence[TaskRun], args: argparse.Namespace, env: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "benchmark": "bench.poolvec",
        "environment": env,
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "md", "png")},
        "systems": list(SYSTEMS),
        "actions": "fixed seeded random actions (bench.tasks.fixed_random_actions, seed 0)",
        "model": "ratio = N*t_env / (N*t_env + t_os), t_os >= 0; t_env = 1 / DummyVecEnv steps/s at the "
                 "smallest N; per_core_*: ratio = P * N*t_env / (N*t_env + t_os), P = min(N, cores)",
        "tasks": [],
    }
    for run in runs:
        item: dict[str, Any] = {"task": run.task, "num_envs": run.num_envs, "skipped": run.skipped,
                                "t_env_s": run.t_env, "fits": run.fits, "cells": []}
        for n in run.num_envs:
            cell: dict[str, Any] = {"num_envs": n, "systems": {}}
            for s in SYSTEMS:
                fps = run.fps(s, n)
                cell["systems"][s] = {
                    "samples": [r.to_json() for r in run.records.get(n, []) if r.case == s],
                    "median_fps": fps and fps.median, "min_fps": fps and fps.lo, "max_fps": fps and fps.hi,
                    "ratio_to_dummy": run.ratio(s, n),
                }
            item["cells"].append(cell)
        data["tasks"].append(item)
    return data


def write_png(path: str, runs: Sequence[TaskRun], cores: int, env: dict[str, Any]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in runs if r.skipped is None]
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(4.5 * max(1, len(shown)), 4), squeeze=False)
    colors = {DUMMY: "tab:gray", SUBPROC: "tab:orange", SHM: "tab:blue"}
    for ax, run in zip(axes[0], shown):
        xs = np.array(run.num_envs, dtype=float)
        ax.axhline(1.0, color=colors[DUMMY], ls=":", label=DUMMY)
        for s in PARALLEL:
            pts = [(n, run.fps(s, n), run.fps(DUMMY, n)) for n in run.num_envs]
            pts = [(n, a, d) for n, a, d in pts if a is not None and d is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1].median / p[2].median for p in pts], "o", color=colors[s],
                        label=s)
                ax.vlines([p[0] for p in pts], [p[1].lo / p[2].median for p in pts],
                          [p[1].hi / p[2].median for p in pts], color=colors[s], alpha=0.5)
            f = run.fits.get(s)
            if f and run.t_env:
                dense = np.geomspace(xs.min(), xs.max(), 200)
                ax.plot(dense, model(dense, run.t_env, f["t_os_s"]), "-", color=colors[s], alpha=0.7,
                        label=f"fit t_os={f['t_os_us']:.1f} µs")
                ax.plot(dense, model(dense, run.t_env, f["per_core_t_os_s"], np.minimum(dense, cores)), "--",
                        color=colors[s], alpha=0.4, label=f"P-scaled fit t_os={f['per_core_t_os_us']:.1f} µs")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(n) for n in run.num_envs])
        ax.axvline(cores, color="k", alpha=0.2)
        ax.set_xlabel("N envs")
        ax.set_ylabel("steps/s ÷ DummyVecEnv")
        ax.set_ylim(bottom=0)
        ax.set_title(run.task + (f"  (t_env {run.t_env * 1e6:.1f} µs)" if run.t_env else ""), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"PoolVecEnv experiments - {env['cpu_model']}, {cores} cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_errors(runs: Sequence[TaskRun], err: Any) -> int:
    failed = [(run, n, r) for run in runs for n, rs in run.records.items() for r in rs if r.error is not None]
    for run, n, r in failed:
        err.print(f"{run.task} N={n} · {r.case} · rep {r.rep + 1} failed:", style="red", markup=False,
                  highlight=False)
        sys.stderr.write(r.error.rstrip() + "\n")
    return len(failed)


# --- command line ----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench poolvec", __doc__)
    p.add_argument("--tasks", help=f"comma list of gymnasium ids (default {','.join(DEFAULT_TASKS)})")
    p.add_argument("--num-envs", help="comma list of N (default 1,2,4,... up to 8 × the cores)")
    p.add_argument("--cpus", help="core budget, taskset syntax (default: this process's allowed cpus)")
    p.add_argument("--md", metavar="PATH", help="write the markdown tables here")
    p.add_argument("--png", metavar="PATH", help="write the ratio-vs-N grid here")
    cli.add_run_options(p, cli.RunDefaults(seconds=(1.0, 0.2)), quick="CartPole-v1, N=1,2, 0.2 s, 1 repeat")
    args = cli.parse(p, argv)
    try:
        args.cpus = resolve_cpus(args.cpus)
    except ValueError as exc:
        p.error(str(exc))
    quick = args.quick
    if args.tasks:
        args.tasks = cli.comma_list(args.tasks)
        if not args.tasks:
            p.error("--tasks is empty")
        for t in args.tasks:
            try:
                gym.spec(t)
            except gym.error.Error as exc:
                p.error(f"--tasks {t!r}: {exc}")
    else:
        args.tasks = list(QUICK_TASKS if quick else DEFAULT_TASKS)
    if args.num_envs:
        args.num_envs = sorted(cli.positive_ints(p, "--num-envs", args.num_envs))
    elif quick:
        args.num_envs = [1, 2]
    else:
        top = 8 * len(args.cpus)
        args.num_envs = sorted({min(2 ** i, top) for i in range(top.bit_length() + 1)})
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _, err = consoles()   # progress on stderr; stdout gets the tables once, as markdown
    version, why = sb3_status()
    if version is None:
        err.print(f"stable-baselines3 is required: {why}", highlight=False, markup=False)
        return 2
    runs = []
    for task in args.tasks:
        run = TaskRun(task, list(args.num_envs))
        run.skipped = mujoco_missing(task)
        if run.skipped:
            err.print(f"{task}: not run — {run.skipped}", highlight=False, markup=False)
        runs.append(run)
    env = {**environment(), "stable_baselines3": version, "allowed_cpus_at_start": allowed_cpus(),
           "shmpool_version": shmpool.__version__}
    run_all(runs, args, err)
    text = markdown(runs, args, env)
    print(text, flush=True)
    if args.md:
        Path(args.md).write_text(text)
    if args.json:
        write_json(args.json, json_data(runs, args, env))
    if args.png:
        write_png(args.png, runs, len(args.cpus), env)
    for kind, path in (("markdown", args.md), ("raw measurements", args.json), ("plot", args.png)):
        if path:
            err.print(f"{kind} written to {path}", highlight=False)
    return 1 if print_errors(runs, err) else 0


if __name__ == "__main__":
    raise SystemExit(main())

