"""``python -m bench <command> [options]``: one entry point for every benchmark.

Each command is a module of this package with a ``main(argv) -> int``; ``python -m bench``
alone runs ``core``.  ``python -m bench <command> --help`` shows its options.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "core": "bench.core",            # issue 2's core targets
    "train": "bench.train",          # env steps/s inside a PPO-shaped training loop, per vector env
    "tasks": "bench.tasks",          # recipes vs EnvPool
    "soak": "bench.soak",            # leaks under random use
    "recipe-cost": "bench.recipe_cost",
    "throughput": "bench.throughput",  # EnvPool's table: FPS per system and core count
    "latency": "bench.latency",      # seed 004: step/recv latency percentiles
    "poolvec": "bench.poolvec",      # seed 001: DummyVecEnv vs SubprocVecEnv vs ShmVecEnv
    "plot": "bench.plot",            # a latency JSON -> PNG
    "batch-pong": "bench.batch_pong",  # issue 4: a natively batched env vs one env at a time
    "distributed": "bench.distributed",  # issue 7: RayPool on a local Ray cluster vs one local Pool
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
    return importlib.import_module(COMMANDS[name]).main(rest)


raise SystemExit(main(sys.argv[1:]))
