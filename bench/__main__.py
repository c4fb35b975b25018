"""``python -m bench <command> [options]``: one entry point for every benchmark.

Each command is a module of this package with a ``main(argv) -> int``; ``python -m bench``
alone runs ``core``.  ``python -m bench <command> --help`` shows its options.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "core": "bench.core",            # env-only steps/s vs gymnasium's vector envs, and the raw round trip
    "train": "bench.train",          # env steps/s inside a PPO-shaped training loop, per vector-env system
    "fairness": "bench.fairness",    # how evenly async recv serves the envs, and waiting beside a trainer
    "tasks": "bench.tasks",          # the Pong/Ant recipes vs EnvPool and gymnasium, env-only
    "soak": "bench.soak",            # leaks under random use
    "recipe-cost": "bench.recipe_cost",  # single-core µs per step: recipe vs gymnasium's env
    "throughput": "bench.throughput",  # EnvPool's table: FPS per system and core count
    "latency": "bench.latency",      # step/recv latency percentiles, per call and per env step
    "autoreset": "bench.autoreset",  # SAME_STEP autoreset (ShmVecEnv, VectorEnv) vs the NEXT_STEP pool, env-only
    "poolvec": "bench.poolvec",      # SB3's DummyVecEnv vs SubprocVecEnv vs ShmVecEnv over N, fitted overhead
    "plot": "bench.plot",            # a latency JSON -> PNG
    "batch-pong": "bench.batch_pong",  # a natively batched env vs one env at a time
    "distributed": "bench.distributed",  # RayPool on a local Ray cluster vs one local Pool
    "fallback": "bench.fallback",    # what leaves that travel pickled (Text) cost against Box-only Dict obs
    "deploy": "bench.deploy",        # under a CPU quota, and the workers' CPU while a trainer is busy elsewhere
    "sb3-ppo": "bench.sb3_ppo",      # SB3 PPO learn() wall time over DummyVecEnv, SubprocVecEnv, ShmVecEnv
    "cleanrl": "bench.cleanrl",      # CleanRL's own ppo.py / ppo_continuous_action.py, the one-line vector-env swap
}


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\ncommands: " + ", ".join(COMMANDS))
        return 0
    name, rest = (argv[0], argv[1:]) if argv and not argv[0].startswith("-") else ("core", argv)
    if name not in COMMANDS:
        print(f"unknown command {name!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name])
    except ModuleNotFoundError as exc:
        if exc.name != COMMANDS[name]:
            raise   # the command's own dependency is missing: its message says which
        print(f"{name}: {COMMANDS[name]} is not in this checkout", file=sys.stderr)
        return 2
    return module.main(rest)


raise SystemExit(main(sys.argv[1:]))
