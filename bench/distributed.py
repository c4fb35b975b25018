"""RayPool on a local multi-node Ray cluster against one local Pool on the same cores.

    python -m bench distributed                      # empty env, CartPole-v1, Pong (if ale-py), 3 reps
    python -m bench distributed --tasks CartPole-v1 --num-envs 32 --batch-size 16
    python -m bench distributed --quick              # a few seconds after the cluster is up, for tests

The driver (this process) is the *agent*, the envs on the nodes are the
*observers* (as in ``python -m bench latency``):

- **agent latency**: one driver call, ``step(actions)`` over all N (sync) or
  ``recv()`` of ``batch`` envs plus ``send()`` of their actions (async);
- **observer latency**: per env step, from the driver sending its action to the
  ``recv()`` that returns it (async only);
- **overhead per batch**: the RayPool's agent latency minus the local Pool's at
  the same N and batch, p50 — what crossing Ray costs per driver call.  The
  ``empty`` task (an env whose step does nothing) measures it with no env work.

A local cluster of ``--nodes`` Ray nodes (1 CPU, small object store each) is
started here; RayPool runs one pool per node with one worker pinned to its own
core, the local Pool the same number of workers on the same cores.  All of it
(driver, Ray daemons, workers) shares this machine, so the Ray side also pays
for its daemons' CPU; on a real cluster they are on other machines, and the
network (not loopback) carries the sub-batches.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from . import cli, envs
from ._timing import Case, Record, percentiles_of, run_interleaved
from .envs import EmptyEnv, gym_atari
from .report import RESULTS, markdown_table, write_json
from .subjects import POOL, RAY, Latency, open_vec

DEFAULT_JSON = str(RESULTS / "distributed.json")
REPORTED = (50, 95, 99)
MEASURED = (5, 50, 95, 99)
PONG = "Pong"   # ALE Pong-v5 with EnvPool's preprocessing (bench.envs.gym_atari): 84x84 gray, frame skip 4, 4 stacked


# --- envs: bench.envs, pickled by value (the nodes need not import this package) ----------------


def env_spec(task: str) -> tuple[Any, dict]:
    """``(env, kwargs)`` for ``Pool``/``RayPool``: an id, or a constructor for the synthetic tasks."""
    if task == "empty":
        return EmptyEnv, {}
    if task == PONG:
        return functools.partial(gym_atari, "Pong-v5"), {}
    return task, {}


def task_available(task: str) -> str | None:
    """None, or why the task cannot run here."""
    try:
        env, _ = env_spec(task)
        (gym.make(env) if isinstance(env, str) else env()).close()
    except Exception as exc:  # ale-py missing, unknown id, ...
        return f"{type(exc).__name__}: {exc}"
    return None


def open_cell(system: str, task: str, mode: str, n: int, batch: int, cpus: list[int]) -> Latency:
    """One pool (local: ``len(cpus)`` pinned workers; Ray: one pool of one worker per node's core),
    every driver call timed."""
    env, kwargs = env_spec(task)
    if system == "local":
        vec = open_vec(POOL, env, n, batch=batch, asynchronous=mode == "async", num_workers=len(cpus), cpus=cpus,
                       **kwargs)
    else:
        vec = open_vec(RAY, env, n, batch=batch, asynchronous=mode == "async", num_workers=1,
                       per_pool_kwargs=[{"cpus": [c]} for c in cpus], **kwargs)
    vec.info["cpus"] = cpus
    space = vec.action_space
    return Latency(vec, np.zeros((batch, *space.shape), dtype=space.dtype), MEASURED)


# --- the cluster ---------------------------------------------------------------------------------


def start_cluster(nodes: int, store_mb: int):
    """A local Ray cluster of ``nodes`` nodes (1 CPU each) and a driver connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    args = {"num_cpus": 1, "object_store_memory": store_mb * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**args, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(**args)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    return cluster


class _Echo:
    def echo(self, x: Any) -> Any:
        return x


def ray_round_trip_us(payload_bytes: int = 0, calls: int = 300) -> dict[str, float]:
    """p50/p95 µs of ``ray.get(actor.echo.remote(x))`` to an actor on the last node: Ray's floor per call."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = [n["NodeID"] for n in ray.nodes() if n["Alive"]][-1]
    strategy = NodeAffinitySchedulingStrategy(node, soft=False)
    actor = ray.remote(_Echo).options(num_cpus=0, scheduling_strategy=strategy).remote()
    x = np.zeros(payload_bytes, dtype=np.uint8)
    try:
        for _ in range(20):
            ray.get(actor.echo.remote(x))
        lat = []
        for _ in range(calls):
            t = time.perf_counter_ns()
            ray.get(actor.echo.remote(x))
            lat.append((time.perf_counter_ns() - t) / 1e3)
    finally:
        ray.kill(actor)
    return percentiles_of(np.array(lat), (50, 95))


def stop_cluster(cluster) -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


# --- report ----------------------------------------------------------------------------------------


def cell_json(task: str, mode: str, system: str, n: int, b: int, records: list[Record]) -> dict[str, Any]:
    """Median over repetitions of the rate and of each latency percentile."""
    out: dict[str, Any] = {"task": task, "mode": mode, "system": system, "num_envs": n, "batch_size": b}
    ok = [r for r in records if r.sample is not None]
    out["reps"] = len(ok)
    if ok:
        out["env_steps_per_s"] = float(np.median([r.sample.rate * b for r in ok]))
        out["env_steps_per_s_range"] = [min(r.sample.rate * b for r in ok), max(r.sample.rate * b for r in ok)]
        out["calls"] = int(sum(r.sample.count for r in ok))
        out["agent_latency_us"] = {k: float(np.median([r.sample.latency_us[k] for r in ok]))
                                   for k in (*(f"p{q}" for q in REPORTED), "max")}
        obs = [r.info["observer_latency_us"] for r in ok if mode == "async" and r.info.get("observer_latency_us")]
        if obs:
            out["observer_latency_us"] = {k: float(np.median([o[k] for o in obs])) for k in obs[0]}
        out["driver_cpu_us_per_call"] = float(np.median([r.info["driver_cpu_us_per_call"] for r in ok]))
        measured = ("observer_latency_us", "driver_cpu_us_per_call", "observer_note", "observer_steps")
        out["pool"] = {k: v for k, v in ok[0].info.items() if k not in measured}
        out["setup_s"] = round(float(np.median([r.setup_s for r in ok])), 3)
    errors = [r.error for r in records if r.error]
    if errors:
        out["error"] = errors[0]
    return out


def with_overheads(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``overhead_us`` (Ray p50 − local p50 of the same task, mode, N, batch) to the Ray cells."""
    local = {(c["task"], c["mode"], c["num_envs"], c["batch_size"]): c for c in cells if c["system"] == "local"}
    for c in cells:
        twin = local.get((c["task"], c["mode"], c["num_envs"], c["batch_size"]))
        if c["system"] == "ray" and twin and "agent_latency_us" in c and "agent_latency_us" in twin:
            c["overhead_us"] = {q: c["agent_latency_us"][q] - twin["agent_latency_us"][q] for q in ("p50", "p95")}
            c["throughput_ratio"] = c["env_steps_per_s"] / twin["env_steps_per_s"]
    return cells


HEADER = ("task", "mode", "system", "N", "batch", "env steps/s", "p50 µs", "p95 µs", "p99 µs",
          "env p50 µs", "env p95 µs", "driver CPU µs", "overhead p50 µs", "Ray / local")


def fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "—"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.2f}M{unit}"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.1f}k{unit}"
    return f"{v:.0f}{unit}" if abs(v) >= 100 else f"{v:.1f}{unit}"


def rows(cells: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for c in cells:
        head = [c["task"], c["mode"], c["system"], str(c["num_envs"]), str(c["batch_size"])]
        if "agent_latency_us" not in c:
            out.append([*head, "error", *("—" for _ in HEADER[6:])])
            continue
        a, o = c["agent_latency_us"], c.get("observer_latency_us", {})
        over = c.get("overhead_us", {}).get("p50")
        ratio = c.get("throughput_ratio")
        out.append([*head, fmt(c["env_steps_per_s"]), fmt(a["p50"]), fmt(a["p95"]), fmt(a["p99"]),
                    fmt(o.get("p50")), fmt(o.get("p95")), fmt(c["driver_cpu_us_per_call"]), fmt(over),
                    "—" if ratio is None else f"{ratio:.2f}"])
    return out


# --- command line --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench distributed", __doc__)
    p.add_argument("--tasks", help=f"comma list: empty, CartPole-v1, {PONG}, or gymnasium ids "
                                   f"(default empty,CartPole-v1,{PONG}; --quick: empty,CartPole-v1)")
    p.add_argument("--nodes", type=int, help="Ray nodes = cores used (default: the allowed cores, at least 2)")
    p.add_argument("--num-envs", type=int, help="N (default 8 per node)")
    p.add_argument("--batch-size", type=int, help="async batch (default N/2)")
    p.add_argument("--modes", default="sync,async", help="comma list of sync, async (default both)")
    p.add_argument("--store-mb", type=int, default=80, help="object store per node, MB (default 80)")
    cli.add_run_options(p, cli.RunDefaults(seconds=(3.0, 0.3), warmup=(0.5, 0.1), json=DEFAULT_JSON),
                        quick="empty and CartPole-v1, 1 repeat of 0.3 s")
    args = cli.parse(p, argv)
    if args.tasks is None:
        args.tasks = "empty,CartPole-v1" if args.quick else f"empty,CartPole-v1,{PONG}"
    args.tasks = cli.comma_list(args.tasks)
    args.modes = cli.comma_list(args.modes)
    if not args.modes or any(m not in ("sync", "async") for m in args.modes):
        p.error(f"--modes must be a comma list of sync, async, got {','.join(args.modes) or 'nothing'}")
    cpus = sorted(os.sched_getaffinity(0))
    if args.nodes is None:
        args.nodes = max(2, len(cpus))
    if args.nodes < 1:
        p.error("--nodes must be >= 1")
    args.cpus = [cpus[k % len(cpus)] for k in range(args.nodes)]
    try:
        import ray  # noqa: F401
    except ImportError:
        p.error("needs ray: pip install 'ray>=2.9'")
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, str, str, int, int]]:
    cells = []
    for task in args.tasks:
        n = args.num_envs or 8 * args.nodes
        b = args.batch_size or max(1, n // 2)
        if b > n:
            raise SystemExit(f"--batch-size {b} is more than N={n}")
        for mode in args.modes:
            for system in ("local", "ray"):
                cells.append((task, mode, system, n, n if mode == "sync" else b))
    return cells


def main(argv: Sequence[str] | None = None) -> int:
    import cloudpickle

    args = parse_args(argv)
    from ray import cloudpickle as ray_cloudpickle

    # The nodes need not import this package: the envs (pickled by shmpool) and _Echo (by Ray) go by value.
    for module in (sys.modules[__name__], envs):
        cloudpickle.register_pickle_by_value(module)
        ray_cloudpickle.register_pickle_by_value(module)
    skipped = {t: why for t in args.tasks if (why := task_available(t))}
    for t, why in skipped.items():
        print(f"skipped {t}: {why}", file=sys.stderr)
    args.tasks = [t for t in args.tasks if t not in skipped]
    cells = plan(args)
    t0 = time.monotonic()
    cluster = start_cluster(args.nodes, args.store_mb)
    startup = time.monotonic() - t0
    try:
        pong_obs = 4 * 84 * 84   # bytes of one Pong observation (uint8)
        floor = {"empty": ray_round_trip_us(0), "8 Pong obs (221 KiB)": ray_round_trip_us(8 * pong_obs)}
        results = []
        for key in dict.fromkeys((task, mode) for task, mode, *_ in cells):
            group = [c for c in cells if (c[0], c[1]) == key]
            cases = [Case(f"{task} {mode} {system}", functools.partial(open_cell, system, task, mode, n, b, args.cpus))
                     for task, mode, system, n, b in group]
            print(f"{key[0]} {key[1]}: {', '.join(c.name.split()[-1] for c in cases)} × {args.repeats}",
                  file=sys.stderr, flush=True)
            records = run_interleaved(cases, repeats=args.repeats, seconds=args.seconds, warmup=args.warmup)
            for (task, mode, system, n, b), case in zip(group, cases):
                results.append(cell_json(task, mode, system, n, b, [r for r in records if r.case == case.name]))
    finally:
        stop_cluster(cluster)
    results = with_overheads(results)
    lines = [
        f"## RayPool vs local Pool — {time.strftime('%Y-%m-%dT%H:%M:%S%z')}",
        "",
        f"`{args.command}` · {args.nodes} local Ray nodes (1 CPU, {args.store_mb} MB store each) on cpus {args.cpus} · "
        f"cluster start-up {startup:.1f} s · {args.repeats} × {args.seconds:g} s per cell (medians) · "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "",
        "Ray's floor, one actor call round trip (`ray.get(actor.echo.remote(x))`, p50 / p95 µs): "
        + "; ".join(f"{k} {fmt(v['p50'])} / {fmt(v['p95'])}" for k, v in floor.items()) + ".",
        "",
        "Agent = one driver call (sync: `step` over N; async: `recv` of batch + `send`), µs; env = one env step "
        "from its `send` to the `recv` returning it; driver CPU = the driver process's CPU time per call (all "
        "threads); overhead = Ray p50 − local p50 per call.",
        "",
        markdown_table(HEADER, rows(results)),
    ]
    print("\n".join(lines), flush=True)
    if args.json:
        write_json(args.json, {"benchmark": "bench.distributed",
                               "config": {k: v for k, v in vars(args).items() if k != "json"},
                               "cluster_startup_s": startup, "ray_round_trip_us": floor, "skipped": skipped,
                               "cells": results})
        print(f"cells written to {args.json}", file=sys.stderr)
    failed = [c for c in results if "error" in c]
    for c in failed:
        print(f"{c['task']} {c['mode']} {c['system']} failed:\n{c['error']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
