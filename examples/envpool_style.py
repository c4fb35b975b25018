"""EnvPool's asynchronous loop, run by shmpool: only the import line differs from EnvPool code.

The loop is the one in EnvPool's README ("Asynchronous API": make with num_envs and
batch_size, async_reset, then recv -> send(action, env_id)).  The README snippet does
not run as printed (``batch_size`` and ``env_id`` are undefined, ``info.env_id`` is an
attribute access on a dict, actions are drawn from ``range(batch_size)``), so this is
the runnable form EnvPool's own ``examples/env_step.py`` uses, with gymnasium's 5-tuple
``recv()``.  The default task is CartPole-v1 (EnvPool has it too); ``--task Pong-v5`` runs
shmpool's built-in Atari recipe with EnvPool's preprocessing (extra ``[atari]``), and any
gymnasium id works.

    python examples/envpool_style.py --num-envs 64 --batch-size 16 --steps 20000
    python examples/envpool_style.py --task Pong-v5 --num-envs 16 --batch-size 8 --steps 2000
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import shmpool.vector as envpool  # was: import envpool


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="CartPole-v1")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=20_000, help="recv/send rounds")
    args = p.parse_args()
    num_envs, batch_size = args.num_envs, args.batch_size

    # make asynchronous
    env = envpool.make(args.task, env_type="gymnasium", num_envs=num_envs, batch_size=batch_size)
    action_num = env.action_space.n
    env.async_reset()  # send the initial reset signal to all envs
    start = time.perf_counter()
    episodes = 0
    for _ in range(args.steps):
        obs, rew, term, trunc, info = env.recv()
        env_id = info["env_id"]
        assert len(env_id) == batch_size and obs.shape[0] == batch_size
        episodes += int(np.sum(term | trunc))
        action = np.random.randint(action_num, size=len(env_id))
        env.send(action, env_id)
    elapsed = time.perf_counter() - start
    env.close()
    print(f"{args.task}: {args.steps} recv/send rounds of {batch_size} envs out of {num_envs}, "
          f"{episodes} episodes ended, {args.steps * batch_size / elapsed:,.0f} env steps/s")


if __name__ == "__main__":
    main()
