"""SB3's PPO as users run it: wall time of ``model.learn`` over DummyVecEnv, SubprocVecEnv and ShmVecEnv.

    python -m bench sb3-ppo                          # CartPole-v1 N=8,32 and Ant-v5 N=8
    python -m bench sb3-ppo --tasks CartPole-v1 --num-envs 8 --timesteps 8192 --repeats 5
    python -m bench sb3-ppo --torch-threads 1        # torch pinned to one thread

Each repetition builds a fresh ``PPO("MlpPolicy", venv, seed=0, device="cpu")`` (not timed) and times
``learn(total_timesteps)`` with torch at its default thread count (``--torch-threads N`` sets it, as
rl-zoo's ``--num-threads`` does); a callback also times the rollout
phases (policy forward + ``venv.step``), so the table shows how much of the wall time the vector env
can move at all.  Systems alternate within a repetition.

Hyperparameters are rl-baselines3-zoo's for PPO: CartPole-v1 ``n_steps=32, batch_size=256,
gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0``, learning rate and clip range decaying linearly
from 1e-3 and 0.2 (the zoo's ``n_envs=8``; N=32 keeps the per-env settings); Ant-v5 the zoo's MuJoCo
defaults: SB3's PPO defaults (``n_steps=2048, batch_size=64, n_epochs=10``) under ``VecNormalize``.
``--timesteps`` defaults to two PPO rollouts+updates' worth (at least 8,192 steps).

Ratios are of median wall times, ``DummyVecEnv ÷ system`` (higher is faster), in the same run.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .cli import comma_list, parser, positive_ints
from .envs import gym_env_fn
from .report import environment, markdown_table, write_json

DUMMY, SUBPROC, SHM = "DummyVecEnv", "SubprocVecEnv", "ShmVecEnv"
SYSTEMS = (DUMMY, SUBPROC, SHM)
RESULTS = Path(__file__).parent / "results"


def _linear(start: float) -> Callable[[float], float]:
    """rl-zoo's ``lin_<start>``: ``start`` times the remaining progress (1 → 0)."""
    return lambda progress_remaining: progress_remaining * start


def hyperparameters(task: str) -> tuple[dict[str, Any], bool]:
    """The zoo's PPO keywords for ``task`` and whether it runs under ``VecNormalize``."""
    if task == "CartPole-v1":
        return {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                "ent_coef": 0.0, "learning_rate": _linear(1e-3), "clip_range": _linear(0.2)}, False
    return {}, True   # the zoo's MuJoCo defaults: SB3's own PPO defaults, normalized


def open_venv(system: str, task: str, n: int, normalize: bool):
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    from shmpool.sb3 import ShmVecEnv
    fns = [gym_env_fn(task)] * n
    venv = {DUMMY: DummyVecEnv, SUBPROC: SubprocVecEnv, SHM: ShmVecEnv}[system](fns)
    return VecNormalize(venv) if normalize else venv


def measure(system: str, task: str, n: int, timesteps: int) -> dict[str, Any]:
    """One ``learn``: wall seconds, and seconds spent in rollout phases."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    class RolloutClock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds, self._start = 0.0, 0.0

        def _on_rollout_start(self) -> None:
            self._start = time.perf_counter()

        def _on_rollout_end(self) -> None:
            self.seconds += time.perf_counter() - self._start

        def _on_step(self) -> bool:
            return True

    kwargs, normalize = hyperparameters(task)
    venv = open_venv(system, task, n, normalize)
    try:
        model = PPO("MlpPolicy", venv, seed=0, device="cpu", **kwargs)
        clock = RolloutClock()
        t0 = time.perf_counter()
        model.learn(total_timesteps=timesteps, callback=clock)
        wall = time.perf_counter() - t0
    finally:
        venv.close()
    return {"system": system, "wall_s": wall, "rollout_s": clock.seconds, "timesteps": model.num_timesteps}


def default_timesteps(task: str, n: int) -> int:
    kwargs, _ = hyperparameters(task)
    return max(8192, 2 * kwargs.get("n_steps", 2048) * n)


def run(tasks: Sequence[str], sizes: Sequence[int], systems: Sequence[str], repeats: int,
        timesteps: int | None) -> list[dict[str, Any]]:
    groups = []
    for task in tasks:
        for n in sizes:
            steps = timesteps or default_timesteps(task, n)
            runs: dict[str, list[dict]] = {s: [] for s in systems}
            for rep in range(repeats):
                for s in systems:
                    r = measure(s, task, n, steps)
                    runs[s].append(r)
                    print(f"{task} N={n} rep {rep + 1}: {s} {r['wall_s']:.2f} s "
                          f"(rollouts {r['rollout_s']:.2f} s)", flush=True)
            groups.append({"task": task, "num_envs": n, "timesteps": steps, "runs": runs})
    return groups


HEADER = ("task", "N", "system", "learn() wall s: median (min–max)", "DummyVecEnv ÷ system", "rollout s (share)",
          "rollouts: DummyVecEnv ÷ system")


def rows(groups: Sequence[dict[str, Any]]) -> list[list[str]]:
    out = []
    for g in groups:
        runs = g["runs"]
        base = statistics.median(r["wall_s"] for r in runs[DUMMY]) if DUMMY in runs else None
        base_roll = statistics.median(r["rollout_s"] for r in runs[DUMMY]) if DUMMY in runs else None
        for s, rs in runs.items():
            wall = [r["wall_s"] for r in rs]
            roll = [r["rollout_s"] for r in rs]
            mw, mr = statistics.median(wall), statistics.median(roll)
            out.append([g["task"], str(g["num_envs"]), s, f"{mw:.2f} ({min(wall):.2f}–{max(wall):.2f})",
                        f"{base / mw:.2f}×" if base else "—", f"{mr:.2f} ({mr / mw:.0%})",
                        f"{base_roll / mr:.2f}×" if base_roll else "—"])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser("python -m bench sb3-ppo", __doc__)
    ap.add_argument("--tasks", default=None, help="comma-separated (default: CartPole-v1 at N=8,32 and Ant-v5 at N=8)")
    ap.add_argument("--num-envs", default="8", help="comma-separated N (with --tasks; default 8)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--timesteps", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch.set_num_threads(n) first (default: torch's own count, as a user's script has)")
    ap.add_argument("--json", type=Path, default=RESULTS / "sb3_ppo.json")
    a = ap.parse_args(argv)
    systems = comma_list(a.systems)
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown systems {unknown}; systems: {', '.join(SYSTEMS)}")
    if a.tasks is None:
        plan = [(["CartPole-v1"], [8, 32]), (["Ant-v5"], [8])]
    else:
        plan = [(comma_list(a.tasks), positive_ints(ap, "--num-envs", a.num_envs))]
    import torch
    if a.torch_threads is not None:
        torch.set_num_threads(a.torch_threads)
    groups = [g for tasks, sizes in plan for g in run(tasks, sizes, systems, a.repeats, a.timesteps)]
    print(f"\nSB3 PPO (rl-zoo hyperparameters), {a.repeats} interleaved repetitions, "
          f"torch at {torch.get_num_threads()} threads\n")
    print(markdown_table(HEADER, rows(groups)))
    write_json(a.json, {"environment": environment(), "torch_threads": torch.get_num_threads(), "groups": groups})
    print(f"\nwrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
