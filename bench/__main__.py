"""``python -m bench <command> [options]``: one entry point for every benchmark.

Each command is a module of this package with a ``main(argv) -> int``; ``python -m bench``
alone runs ``core``.  ``python -m bench <command> --help`` says what it measures, its options
and how to read it; docs/benchmarks.md lists the same commands.
"""
from __future__ import annotations

import importlib
import sys

# command -> (module, what it measures): the one list `--help` prints and docs/benchmarks.md repeats.
COMMANDS = {
    "core": ("bench.core", "env-only steps/s of shmpool sync/async against gymnasium's Sync/AsyncVectorEnv "
                           "(CartPole-v1, Ant-v5), and the empty-env round trip against a C spin ping-pong"),
    "cleanrl": ("bench.cleanrl", "CleanRL's own ppo.py / ppo_continuous_action.py, only the vector-env line "
                                 "swapped: SPS as the scripts print it, and whether training was identical"),
    "train": ("bench.train", "env steps/s inside a PPO-shaped training loop (or SB3's PPO.learn) per vector-env "
                             "system: gymnasium, SB3, EnvPool, shmpool"),
    "tasks": ("bench.tasks", "the built-in Pong-v5/Ant-v5 recipes against EnvPool and gymnasium, env-only, with "
                             "single-core µs per step (--costs-only: of any recipe), and BatchPong-v0 against one "
                             "env at a time"),
    "throughput": ("bench.throughput", "EnvPool's table: frames/s per system against the number of cores "
                                       "(--cpus, --numa), or against N (--num-envs: the PoolVecEnv sweep)"),
    "latency": ("bench.latency", "per-call and per-env-step latency percentiles of sync step and async "
                                 "recv/send over N and batch size (--png plots them; --ray: RayPool beside Pool)"),
    "fairness": ("bench.fairness", "async evenness: per-env step counts max/min with batch_size < num_envs beside "
                                   "EnvPool, and each worker's CPU and run-queue share"),
    "deploy": ("bench.deploy", "env-only and a GPU-shaped loop under a CPU quota (--cpu-quota, root), and the "
                               "workers' CPU while the trainer is busy elsewhere"),
}


def usage() -> str:
    """The docstring and one line per command: what it measures."""
    width = max(map(len, COMMANDS))
    return __doc__.strip() + "\n\ncommands:\n" + "\n".join(
        f"  {name:{width}}  {what}" for name, (_, what) in COMMANDS.items())


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = (argv[0], argv[1:]) if argv and not argv[0].startswith("-") else ("core", argv)
    if name not in COMMANDS:
        print(f"unknown command {name!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = COMMANDS[name][0]
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise   # the command's own dependency is missing: its message says which
        print(f"{name}: {module} is not in this checkout", file=sys.stderr)
        return 2
    return loaded.main(rest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
