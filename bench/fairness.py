"""Async evenness: how evenly ``recv``/``send`` advances every env, beside EnvPool.

    python -m bench.fairness                       # CartPole 12/4, 32/16; Pong-v5, Ant-v5 8/4, 32/16
    python -m bench.fairness --tasks CartPole-v1 --policies auto,block,yield,hybrid
    python -m bench.fairness --pins pinned,unpinned # also workers free to run on any allowed core
    python -m bench.fairness --quick               # a few seconds

Each row builds the pool as a new user would (``shmpool.make(task, env_type="gymnasium",
num_envs=N, batch_size=B, seed=0)``, plus ``wait_policy`` and ``pin``) and EnvPool as
``envpool.make(task, env_type="gymnasium", num_envs=N, batch_size=B, num_threads=2, seed=0)``;
``async_reset``, a warm-up, then ``cycles`` × (``recv``, ``send`` random actions back to the
envs it returned), counting each env's steps through ``info["env_id"]``.

Columns: ``spread`` = max/min of the per-env step counts (1.00 = every env advanced
equally; the median over repetitions, min-max beside it), ``steps/s`` = env steps per second
of the counted cycles, and for shmpool each worker's CPU share of the wall time (psutil).
Targets (EnvPool reaches 1.00-1.02 here): spread ≤ 1.25 on CartPole, ≤ 1.10 on Pong-v5 and Ant-v5.
``--max-leads auto,none`` adds rows without shmpool's lead limit (pure completion order) to see its cost.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

DEFAULT_ROWS = [("CartPole-v1", 12, 4), ("CartPole-v1", 32, 16), ("Pong-v5", 8, 4), ("Pong-v5", 32, 16),
                ("Ant-v5", 8, 4), ("Ant-v5", 32, 16)]
ENVPOOL_IDS = {"CartPole-v1": "CartPole-v1", "Pong-v5": "Pong-v5", "Ant-v5": "Ant-v5"}


def _cycles_for(task: str, quick: bool) -> tuple[int, int]:
    """(warm-up, counted) recv/send cycles: a few seconds per run on 2 cores."""
    heavy = task != "CartPole-v1"
    if quick:
        return (20, 60) if heavy else (50, 300)
    return (50, 400) if heavy else (300, 3000)


def _worker_cpu(env) -> list[float]:
    """Each shmpool worker's user+system CPU seconds so far (EnvPool: none, its threads are in-process)."""
    import psutil
    pool = getattr(env, "pool", None)
    pids = pool.worker_pids if pool is not None else []
    return [sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids]


def measure(system: str, task: str, n: int, b: int, warmup: int, cycles: int, policy: str,
            pin: bool = True, max_lead: str | None = "auto") -> dict:
    """One run: per-env step counts, spread, steps/s, per-worker CPU share (shmpool)."""
    if system == "envpool":
        import envpool
        env = envpool.make(ENVPOOL_IDS[task], env_type="gymnasium", num_envs=n, batch_size=b, num_threads=2, seed=0)
        space = env.action_space
    else:
        import shmpool
        env = shmpool.make(task, env_type="gymnasium", num_envs=n, batch_size=b, seed=0, wait_policy=policy,
                           pin=pin, max_lead=max_lead)
        space = env.single_action_space
    rng = np.random.default_rng(0)
    actions = np.stack([space.sample() for _ in range(b)]) if not hasattr(space, "n") else \
        rng.integers(0, space.n, size=b)
    counts = np.zeros(n, dtype=np.int64)
    try:
        env.async_reset()
        for _ in range(warmup):
            info = env.recv()[-1]
            env.send(actions, info["env_id"])
        cpu0, t0 = _worker_cpu(env), time.perf_counter()
        for _ in range(cycles):
            info = env.recv()[-1]
            ids = np.asarray(info["env_id"])
            counts[ids] += 1
            env.send(actions, ids)
        wall = time.perf_counter() - t0
        cpu = [(c1 - c0) / wall for c0, c1 in zip(cpu0, _worker_cpu(env))]
    finally:
        env.close()
    return {"spread": float(counts.max() / max(counts.min(), 1)), "sps": float(cycles * b / wall),
            "worker_cpu": cpu, "num_workers": env.pool.num_workers if system != "envpool" else None,
            "min": int(counts.min()), "max": int(counts.max())}


def _max_lead(text: str):
    return None if text == "none" else text if text in ("auto", "-") else int(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default=None, help="comma list of tasks (default: CartPole-v1, Pong-v5, Ant-v5)")
    ap.add_argument("--policies", default="auto", help="comma list of shmpool wait policies")
    ap.add_argument("--pins", default="pinned", help="comma list of 'pinned' (the default) and 'unpinned' "
                    "(Pool(pin=False): workers free to run on any allowed core)")
    ap.add_argument("--max-leads", default="auto", help="comma list of shmpool max_lead values: 'auto' (the "
                    "default: 8 for these pools), 'none' (pure completion order, as before max_lead) or an int")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-envpool", action="store_true")
    ap.add_argument("--out", default="bench/results/fairness", help="path stem for .json and .md ('' = none)")
    a = ap.parse_args(argv)
    tasks = None if a.tasks is None else a.tasks.split(",")
    rows = [r for r in DEFAULT_ROWS if tasks is None or r[0] in tasks]
    pins = a.pins.split(",")
    if not set(pins) <= {"pinned", "unpinned"}:
        ap.error(f"--pins takes 'pinned' and/or 'unpinned', not {a.pins!r}")
    leads = a.max_leads.split(",")
    systems = [("shmpool", p, pin, lead) for p in a.policies.split(",") for pin in pins for lead in leads] + \
        ([] if a.no_envpool else [("envpool", "-", "-", "-")])
    results = []
    lines = ["| task | N / batch | system | spread (min-max) | steps/s | worker CPU share |",
             "| --- | --- | --- | --- | --- | --- |"]
    for task, n, b in rows:
        warmup, cycles = _cycles_for(task, a.quick)
        runs: dict = {s: [] for s in systems}
        for _ in range(a.reps):  # interleaved repetitions
            for key in systems:
                system, policy, pin, lead = key
                try:
                    runs[key].append(measure(system, task, n, b, warmup, cycles, policy, pin == "pinned",
                                             _max_lead(lead)))
                except Exception as exc:  # a missing package: say so in the table
                    runs[key].append({"error": f"{type(exc).__name__}: {exc}"})
        for (system, policy, pin, lead), rs in runs.items():
            ok = [r for r in rs if "error" not in r]
            name = system if system == "envpool" else (
                f"shmpool {policy}" + (", unpinned" if pin == "unpinned" else "")
                + ("" if lead == "auto" else f", max_lead={lead}"))
            if not ok:
                lines.append(f"| {task} | {n} / {b} | {name} | {rs[0]['error']} | | |")
                continue
            spreads = [r["spread"] for r in ok]
            cpu = [statistics.median(c) for c in zip(*(r["worker_cpu"] for r in ok))]
            lines.append(f"| {task} | {n} / {b} | {name} | {statistics.median(spreads):.2f} "
                         f"({min(spreads):.2f}-{max(spreads):.2f}) | {statistics.median(r['sps'] for r in ok):,.0f} | "
                         f"{' / '.join(f'{c:.2f}' for c in cpu) or '-'} |")
            results.append({"task": task, "num_envs": n, "batch_size": b, "system": system, "policy": policy,
                            "pin": pin, "max_lead": lead, "runs": ok})
        print("\n".join(lines[-len(runs):]) if len(results) > len(runs) else "\n".join(lines), flush=True)
    table = "\n".join(lines)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out + ".json").write_text(json.dumps(results, indent=1))
        Path(a.out + ".md").write_text("# Async evenness (python -m bench.fairness)\n\n" + table + "\n")


if __name__ == "__main__":
    main()
