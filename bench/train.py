"""Trainer in the loop: env steps/s of a PPO-shaped training loop, per vector-env system.

    python -m bench train                                  # CartPole-v1 N=8,32 every system
    python -m bench train --tasks Pong-v5,Ant-v5 --num-envs 32
    python -m bench train --device gpu                     # the policy on cuda, or GPU-shaped without a GPU
    python -m bench train --systems "SB3 PPO DummyVecEnv,SB3 PPO SubprocVecEnv,SB3 PPO ShmVecEnv"   # SB3's PPO

The loop (bench/ppo.py: a policy forward every step, a PPO update every rollout, torch at its own
threads) is the same for every system; only the vector env under it changes: gymnasium Sync/Async, SB3
Dummy/Subproc, EnvPool, shmpool.make sync/async (N/2), and on request SB3's own PPO.learn (rl-zoo
hyperparameters) over SB3's VecEnvs and ShmVecEnv.  A repetition trains whole rollout+update iterations
for --seconds.  Reported: steps/s median (min–max), ratios to SyncVectorEnv and to the best gymnasium
vector env, the spread over repetitions, the share of the loop inside env.step.  --save writes
results/train.json and .md.  How to read it: bench/README.md, "train".
"""
from __future__ import annotations

import argparse
import functools
import os
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from . import cli, report, subjects
from ._timing import Case, Sample, clock, summarize
from .envs import gym_env_fn
from .ppo import GPU_SHAPED, PPOConfig, Trainer, default_rollout_steps

SB3_PPO = {"SB3 PPO DummyVecEnv": subjects.SB3_DUMMY, "SB3 PPO SubprocVecEnv": subjects.SB3_SUBPROC,
           "SB3 PPO ShmVecEnv": subjects.SHM_VEC}
SYSTEMS = (*subjects.ALL_SYSTEMS, subjects.POOL_SYNC_UNPINNED, subjects.POOL_SYNC_PROCESSES,
           subjects.POOL_ASYNC_PARENT, *SB3_PPO)   # default: ALL_SYSTEMS
# Box bounds cast to float32 warn on every env built (workers too): noise in the middle of the table.
BOX_PRECISION = ("Box low's precision lowered", "Box high's precision lowered")
TASKS = ("CartPole-v1", "Pong-v5", "Ant-v5")
DEFAULT_TASKS = ("CartPole-v1",)
DEFAULT_NUM_ENVS = (8, 32)
SEED = 0


# --- one timed subject: the loop over one system -------------------------------------------------

class TrainingRun:
    """A :class:`~bench.ppo.Trainer` over one system, as a subject of ``run_interleaved``."""

    def __init__(self, system: str, task: str, n: int, rollout_steps: int | None, device: str) -> None:
        self.env = subjects.open_stepper(system, task, n, seed=SEED)
        try:
            steps = rollout_steps or default_rollout_steps(self.env.batch)
            self.trainer = Trainer(self.env, PPOConfig(rollout_steps=steps), seed=SEED, device=device)
        except BaseException:
            self.env.close()
            raise
        self.info = {**self.env.info, "batch": self.env.batch, "rollout_steps": steps}

    def measure(self, seconds: float, warmup: float) -> Sample:
        if warmup > 0:
            self.trainer.run(warmup)
        in_env = self.trainer.env_seconds
        steps, elapsed = self.trainer.run(seconds)
        return Sample(steps, elapsed, parts_s={"env.step": self.trainer.env_seconds - in_env})

    def close(self) -> None:
        self.env.close()


def zoo_hyperparameters(task: str) -> tuple[dict[str, Any], bool]:
    """rl-baselines3-zoo's PPO keywords for ``task`` and whether it runs under ``VecNormalize``."""
    if task == "CartPole-v1":
        def linear(start: float) -> Any:   # rl-zoo's ``lin_<start>``: start × the remaining progress (1 → 0)
            return lambda remaining: remaining * start
        return {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                "ent_coef": 0.0, "learning_rate": linear(1e-3), "clip_range": linear(0.2)}, False
    return {}, True   # the zoo's MuJoCo defaults: SB3's own PPO defaults, normalized


class SB3Training:
    """SB3's ``PPO.learn`` over one of SB3's VecEnvs, timed in whole rollout+update iterations as
    :class:`TrainingRun` times its loop (a callback stops ``learn`` at the first rollout past the time)."""

    def __init__(self, system: str, task: str, n: int, device: str) -> None:
        from stable_baselines3 import PPO
        from stable_baselines3.common.vec_env import VecNormalize
        kwargs, normalize = zoo_hyperparameters(task)
        self.vec = subjects.open_vec(SB3_PPO[system], task, n, seed=SEED)
        try:
            venv = VecNormalize(self.vec.env) if normalize else self.vec.env
            self.model = PPO("MlpPolicy", venv, seed=SEED, device=device, **kwargs)
        except BaseException:
            self.vec.close()
            raise
        self.info = {**self.vec.info, "n_steps": self.model.n_steps, "normalize": normalize}

    def measure(self, seconds: float, warmup: float) -> Sample:
        from stable_baselines3.common.callbacks import BaseCallback
        model, marks = self.model, {"learn": clock(), "rollouts": 0.0}

        class IterationClock(BaseCallback):
            def _on_rollout_start(self) -> None:
                now = marks["rollout"] = clock()
                if "start" not in marks and now - marks["learn"] >= warmup:
                    marks.update(start=now, steps=model.num_timesteps, rollouts=0.0)
                elif "start" in marks and now - marks["start"] >= seconds:
                    marks.update(end=now, steps=model.num_timesteps - marks["steps"])

            def _on_rollout_end(self) -> None:
                marks["rollouts"] += clock() - marks["rollout"]

            def _on_step(self) -> bool:
                return "end" not in marks

        model.learn(total_timesteps=10**12, callback=IterationClock(), reset_num_timesteps=False)
        return Sample(marks["steps"], marks["end"] - marks["start"], parts_s={"rollouts": marks["rollouts"]})

    def close(self) -> None:
        self.vec.close()


def open_training(system: str, task: str, n: int, rollout_steps: int | None, device: str) -> TrainingRun | SB3Training:
    if system in SB3_PPO:
        return SB3Training(system, task, n, device)
    return TrainingRun(system, task, n, rollout_steps, device)


# --- the run ---------------------------------------------------------------------------------------

def unavailable(system: str, task: str, device: str) -> str | None:
    """Why ``system`` cannot run ``task`` here (a missing package, SB3's PPO without a GPU), or None."""
    if system in SB3_PPO and device == GPU_SHAPED:
        return "SB3's PPO has no GPU-shaped form: its policy runs where torch can put it"
    modules = {subjects.SB3_DUMMY: "stable_baselines3", subjects.SB3_SUBPROC: "stable_baselines3",
               subjects.ENVPOOL: "envpool",
               **dict.fromkeys(SB3_PPO, "stable_baselines3")}
    try:
        if system in modules:
            __import__(modules[system])
        if system not in (subjects.ENVPOOL, *subjects.SHMPOOL):
            gym_env_fn(task)().close()
    except (ImportError, gym.error.DependencyNotInstalled) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def run(args: argparse.Namespace, err: Any) -> tuple[list[report.Group], dict[str, str]]:
    """Every (task, N) cell, its systems interleaved; returns the groups and the skipped (task · system)."""
    skipped = {f"{t} · {s}": why for t in args.tasks for s in args.systems
               if (why := unavailable(s, t, args.device))}

    def cases(task: str, n: int) -> list[Case]:
        return [Case(s, functools.partial(open_training, s, task, n, args.rollout_steps, args.device))
                for s in args.systems if f"{task} · {s}" not in skipped]
    return report.run_cells([(t, n) for t in args.tasks for n in args.num_envs], cases, args, err,
                            len(args.systems)), skipped


# --- the report ------------------------------------------------------------------------------------

def header(groups: Sequence[report.Group]) -> tuple[str, ...]:
    return ("task", "N", "system", "env steps/s: median (min–max)",
            f"÷ {anchor(groups[0]) if groups else subjects.SYNC_VEC}",
            "÷ best gymnasium vector env", "max/min over reps", "share of the loop in env.step (SB3 PPO: rollouts)")


def anchor(g: report.Group) -> str:
    """What the ratios are taken against: SyncVectorEnv, or the first system when it did not run."""
    return subjects.SYNC_VEC if g.ran(subjects.SYNC_VEC) or not g.cases else g.cases[0].name


def best_gym(g: report.Group) -> str | None:
    """The faster of SyncVectorEnv and AsyncVectorEnv in this cell (by median), or None."""
    rates = [(r.median, s) for s in subjects.GYM_VECTOR if (r := g.rate(s)) is not None]
    return max(rates)[1] if rates else None


def spread(g: report.Group, system: str) -> float | None:
    s = g.rate(system)
    return None if s is None or s.lo <= 0 else s.hi / s.lo


def rows(groups: Sequence[report.Group]) -> list[list[str]]:
    out = []
    for g in groups:
        best = best_gym(g)
        for case in g.cases:
            sp = spread(g, case.name)
            share = summarize(g.records, case.name, lambda s: sum(s.parts_s.values()) / s.seconds)
            out.append([g.task, str(g.num_envs), case.name, report.fmt_summary(g.rate(case.name)),
                        report.fmt_ratio(g.ratio(case.name, anchor(g))),
                        report.fmt_ratio(g.ratio(case.name, best)) if best else "—",
                        "—" if sp is None else f"{sp:.2f}",
                        "—" if share is None else f"{share.median:.0%}"])
    return out


def targets(groups: Sequence[report.Group]) -> list[report.Target]:
    """What a trainer-in-the-loop shmpool should reach (sync, the one-line swap), checked on this run."""
    cores = len(os.sched_getaffinity(0))
    share = (f"the {cores} cores are shared by the env workers, this process and torch's threads: waiting that "
             "spins or yields on one side takes the cores the other side needs (see the lines below)")
    goals = []
    for g in groups:
        best = best_gym(g)
        goal = 1.0 if g.task == "CartPole-v1" else 1.5
        if g.task == "CartPole-v1" or g.num_envs == 32:
            goals.append(report.Target(f"{g.task} N={g.num_envs}: shmpool sync ≥ {goal:g}× the best gymnasium vector "
                                       f"env ({best})", goal, g.ratio(subjects.POOL_SYNC, best) if best else None,
                                       moves=share + ("; CartPole's env steps are so cheap that there is little "
                                                      "to win over the for-loop, and much to lose"
                                                      if g.task == "CartPole-v1" else "")))
        if g.num_envs >= 32:
            goals.append(report.Target(f"{g.task} N={g.num_envs}: shmpool sync max/min over repetitions ≤ 1.3×", 1.3,
                                       spread(g, subjects.POOL_SYNC), at_most=True,
                                       moves="other processes on the box, and wake-ups that miss (a sleeping worker "
                                       "or trainer thread woken late stalls the whole step)"))
    return goals


def markdown(args: argparse.Namespace, env: dict[str, Any], groups: Sequence[report.Group], skipped: dict[str, str],
             goals: Sequence[report.Target]) -> str:
    lines = [
        report.header("Trainer in the loop", args, env, f"torch {env['torch']} ({env['torch_threads']} threads"
                      f"{''.join(f', {k}={v}' for k, v in sorted(env['omp_env'].items()))}), policy on "
                      + (f"{GPU_SHAPED} (no GPU here: bench/README.md, train)" if env["device"] == GPU_SHAPED
                         else env["device"])),
        "",
        "Env steps/s of the PPO-shaped loop (policy forward every step, PPO update every rollout), "
        "median (min–max); ratios of medians in the same run; the last column is the median share of the "
        "loop's wall time spent inside the vector env's step (the rest: the policy, the update, the loop):",
        "",
        report.markdown_table(header(groups), rows(groups)),
    ]
    lines += [f"\n{where} skipped — {reason}" for where, reason in skipped.items()]
    goal_lines = [t.line() for t in goals] or ["- none for these cells (they are set for CartPole at every N and "
                                               "for Pong-v5/Ant-v5 at N=32)"]
    lines += ["", "### Targets (medians of this run)", "", *goal_lines, "",
              "What moves the ratios: bench/README.md, \"train\"."]
    return "\n".join(lines)


# --- command line ------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench train", __doc__)
    p.add_argument("--tasks", help=f"comma list of {', '.join(TASKS)} (default {','.join(DEFAULT_TASKS)})")
    p.add_argument("--num-envs", help="comma list of N (default 8,32)")
    p.add_argument("--systems", help=f"comma list of systems (default: {', '.join(subjects.ALL_SYSTEMS)}; "
                                     f"also {subjects.POOL_SYNC_UNPINNED}, {subjects.POOL_SYNC_PROCESSES}, "
                                     f"{subjects.POOL_ASYNC_PARENT})")
    p.add_argument("--rollout-steps", type=int,
                   help="loop steps between updates (default 1024 / batch, at least 8: ~1,024 transitions)")
    p.add_argument("--torch-threads", type=int, help="torch.set_num_threads (default: torch's own choice)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="where the policy runs: gpu is cuda when torch sees one, else the GPU-shaped loop (each "
                        "forward pass and minibatch step a 3 ms device wait and 0.5 ms of host CPU, random actions)")
    cli.add_run_options(p, cli.RunDefaults(seconds=(4.0, 0.5), warmup=(0.5, 0.01),
                                           json=str(report.RESULTS / "train.json")),
                        quick="CartPole-v1 N=8, SyncVectorEnv and shmpool sync, 1 repeat of 0.5 s",
                        seconds_help="timed seconds per repetition, in whole rollout+update iterations")
    args = cli.parse(p, argv)
    args.tasks = cli.comma_list(args.tasks) if args.tasks else list(DEFAULT_TASKS)
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown:
        p.error(f"unknown task(s) {unknown}; tasks: {', '.join(TASKS)}")
    if args.num_envs:
        args.num_envs = cli.positive_ints(p, "--num-envs", args.num_envs)
    else:
        args.num_envs = [8] if args.quick else list(DEFAULT_NUM_ENVS)
    if args.systems:
        args.systems = cli.choice_list(p, "--systems", args.systems, SYSTEMS)
    else:
        args.systems = [subjects.SYNC_VEC, subjects.POOL_SYNC] if args.quick else list(subjects.ALL_SYSTEMS)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for message in BOX_PRECISION:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                          *(f"ignore:{m}" for m in BOX_PRECISION)]))   # children
    import torch
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if args.device == "gpu":
        args.device = "cuda" if torch.cuda.is_available() else GPU_SHAPED
    env = {**report.environment(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
           "device": args.device,
           "omp_env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_", "MKL_", "KMP_"))}}
    err = report.stderr_console()
    groups, skipped = run(args, err)
    goals = targets(groups)
    text = markdown(args, env, groups, skipped, goals)
    return report.finish(args, "bench.train", env, text, err, groups, skipped=skipped,
                         cells=[g.to_json() for g in groups], targets=[t.to_json() for t in goals])


if __name__ == "__main__":
    raise SystemExit(main())
