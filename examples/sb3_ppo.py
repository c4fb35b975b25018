"""SB3 PPO on CartPole-v1 with its envs in a shmpool pool (``ShmVecEnv``).

Hyperparameters are rl-baselines3-zoo's tuned PPO CartPole-v1 entry
(hyperparams/ppo.yml): 8 envs, n_steps 32, batch 256, gae_lambda 0.8,
gamma 0.98, 20 epochs, no entropy bonus, learning rate and clip range
decaying linearly from 1e-3 and 0.2, 1e5 steps.  The only shmpool-specific
part is ``vec_env_cls=ShmVecEnv`` (``--vec-env dummy|subproc`` runs the same
script on SB3's own VecEnvs for comparison).

    python examples/sb3_ppo.py                       # full run, ~1e5 steps
    python examples/sb3_ppo.py --total-timesteps 2048 --eval-episodes 2   # smoke test
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

from shmpool.sb3 import ShmVecEnv


def linear(start: float) -> Callable[[float], float]:
    """rl-zoo's ``lin_<start>``: SB3 passes progress_remaining, 1 -> 0 over training."""
    def schedule(progress_remaining: float) -> float:
        return progress_remaining * start
    return schedule


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--total-timesteps", type=int, default=100_000)
    p.add_argument("--n-envs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vec-env", choices=["shm", "dummy", "subproc"], default="shm")
    p.add_argument("--num-workers", type=int, default=None,
                   help="shmpool worker processes (default: one per allowed core, at most n-envs)")
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--eval-envs", type=int, default=4)
    p.add_argument("--verbose", type=int, default=0)
    return p.parse_args()


def vec_env_args(args: argparse.Namespace) -> dict:
    if args.vec_env == "shm":
        return {"vec_env_cls": ShmVecEnv, "vec_env_kwargs": {"num_workers": args.num_workers}}
    return {"vec_env_cls": DummyVecEnv if args.vec_env == "dummy" else SubprocVecEnv}


def main() -> None:
    args = parse_args()
    # The policy is tiny: more torch threads only fight the env workers for the 2 cores.
    torch.set_num_threads(1)
    start = time.perf_counter()
    env = make_vec_env(args.env_id, n_envs=args.n_envs, seed=args.seed, **vec_env_args(args))
    model = PPO(
        "MlpPolicy", env,
        n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
        learning_rate=linear(1e-3), clip_range=linear(0.2),
        seed=args.seed, device="cpu", verbose=args.verbose,
    )
    model.learn(total_timesteps=args.total_timesteps)
    train_s = time.perf_counter() - start
    env.close()

    eval_env = make_vec_env(args.env_id, n_envs=args.eval_envs, seed=args.seed + 10_000, **vec_env_args(args))
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes, deterministic=True)
    eval_env.close()
    total_s = time.perf_counter() - start
    print(f"{args.env_id} {args.vec_env}: {model.num_timesteps} steps in {train_s:.1f} s "
          f"({model.num_timesteps / train_s:.0f} steps/s incl. updates); total wall time {total_s:.1f} s")
    print(f"eval mean return {mean:.1f} +/- {std:.1f} over {args.eval_episodes} episodes (deterministic)")


if __name__ == "__main__":
    main()
