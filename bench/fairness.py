"""Async evenness: how evenly ``recv``/``send`` advances every env, beside EnvPool.

    python -m bench.fairness                       # CartPole 12/4, 32/16; Pong-v5, Ant-v5 8/4, 32/16
    python -m bench.fairness --tasks CartPole-v1 --policies auto,block,yield,hybrid
    python -m bench.fairness --pins pinned,unpinned # also workers free to run on any allowed core
    python -m bench.fairness --layouts auto,processes --max-leads auto,none   # beside the issue-day default
    python -m bench.fairness --quick               # a few seconds

spread = max/min of the per-env step counts (1.00: every env advanced equally; EnvPool 1.00–1.02),
steps/s, per worker its CPU and run-queue share of the wall time, the parent's share and core.
--layouts: auto, parent (parent_shard=True), processes (parent_shard=False); --modes async,sync adds
sync rows.  How to read it: bench/README.md, "fairness".
"""
from __future__ import annotations

import collections
import json
import os
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import subjects
from .cli import choice_list, comma_list, parser

DEFAULT_ROWS = [("CartPole-v1", 12, 4), ("CartPole-v1", 32, 16), ("Pong-v5", 8, 4), ("Pong-v5", 32, 16),
                ("Ant-v5", 8, 4), ("Ant-v5", 32, 16)]


class _Layout(NamedTuple):
    """One ``--layouts`` value: what it passes as ``Pool(parent_shard=)`` and what its rows add to the name."""

    parent_shard: bool | str
    label: str


_LAYOUTS = {"auto": _Layout("auto", ""), "parent": _Layout(True, ", parent shard"),
            "processes": _Layout(False, ", processes")}


def _cycles_for(task: str, quick: bool) -> tuple[int, int]:
    """(warm-up, counted) recv/send cycles: a few seconds per run on 2 cores."""
    heavy = task != "CartPole-v1"
    if quick:
        return (20, 60) if heavy else (50, 300)
    return (50, 400) if heavy else (300, 3000)


def _worker_pids(env) -> list[int]:
    """The shmpool workers' pids (EnvPool: none, its threads are in-process)."""
    pool = getattr(env, "pool", None)
    return pool.worker_pids if pool is not None else []


def _worker_cpu(env) -> list[float]:
    """Each shmpool worker's user+system CPU seconds so far; NaN for a shard this process
    steps (``parent_shard``): its CPU is in the parent's share."""
    import psutil
    return [float("nan") if pid == os.getpid() else sum(psutil.Process(pid).cpu_times()[:2])
            for pid in _worker_pids(env)]


def _run_queue_wait(pid: int | str) -> float:
    """Seconds ``pid`` spent runnable but not running (another task had its core): the
    second field of /proc/<pid>/schedstat; NaN where the kernel keeps no schedstats, and for
    a shard this process steps (``parent_shard``)."""
    if pid == os.getpid():
        return float("nan")
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def measure(system: str, task: str, n: int, b: int, warmup: int, cycles: int, policy: str,
            pin: bool = True, max_lead: str | None = "auto", mode: str = "async",
            parent_shard: bool | str = "auto") -> dict:
    """One run: per-env step counts, spread, steps/s, per-worker CPU and run-queue shares (shmpool).
    ``mode="sync"`` steps all ``n`` envs per cycle (``step``) instead of ``recv``/``send`` of ``b``."""
    import psutil
    if mode == "sync":
        b = n
    if system == "envpool":
        vec = subjects.open_vec(subjects.ENVPOOL, task, n, batch=b, num_threads=2)
    else:
        vec = subjects.open_vec(subjects.MAKE, task, n, batch=b, env_type="gymnasium", wait_policy=policy, pin=pin,
                                max_lead=max_lead,
                                parent_shard=parent_shard)
    env, space = vec.env, vec.action_space
    rng = np.random.default_rng(0)
    actions = np.stack([space.sample() for _ in range(b)]) if not hasattr(space, "n") else \
        rng.integers(0, space.n, size=b)
    counts = np.zeros(n, dtype=np.int64)
    parent = psutil.Process()
    cores: collections.Counter[int] = collections.Counter()   # the parent's core, sampled
    every = np.arange(n)
    try:
        vec.reset()

        def cycle() -> np.ndarray:
            out = vec.raw_step(actions)
            return every if mode == "sync" else np.asarray(out[-1]["env_id"])
        for _ in range(warmup):
            cycle()
        pids = _worker_pids(env)
        cpu0, wait0, own0 = _worker_cpu(env), [_run_queue_wait(p) for p in pids], sum(parent.cpu_times()[:2])
        t0 = time.perf_counter()
        for i in range(cycles):
            counts[cycle()] += 1
            if i % 64 == 0:
                cores[parent.cpu_num()] += 1
        wall = time.perf_counter() - t0
        cpu = [(c1 - c0) / wall for c0, c1 in zip(cpu0, _worker_cpu(env))]
        runqueue = [(_run_queue_wait(p) - w0) / wall for p, w0 in zip(pids, wait0)]
        own = (sum(parent.cpu_times()[:2]) - own0) / wall
    finally:
        vec.close()
    return {"spread": float(counts.max() / max(counts.min(), 1)), "sps": float(cycles * b / wall),
            "worker_cpu": cpu, "worker_runqueue": runqueue, "parent_cpu": own,
            "parent_core": cores.most_common(1)[0][0] if cores else None,
            "worker_cores": None if system == "envpool" or not pin else list(env.pool.worker_cpus),
            "num_workers": env.pool.num_workers if system != "envpool" else None,
            "min": int(counts.min()), "max": int(counts.max())}


def _max_lead(text: str):
    return None if text == "none" else text if text in ("auto", "-") else int(text)


def main(argv: list[str] | None = None) -> None:
    ap = parser("python -m bench.fairness", __doc__)
    ap.add_argument("--tasks", default=None, help="comma list of tasks (default: CartPole-v1, Pong-v5, Ant-v5)")
    ap.add_argument("--policies", default="auto", help="comma list of shmpool wait policies")
    ap.add_argument("--pins", default="pinned", help="comma list of 'pinned' (the default) and 'unpinned' "
                    "(Pool(pin=False): workers free to run on any allowed core)")
    ap.add_argument("--max-leads", default="auto", help="comma list of shmpool max_lead values: 'auto' (the "
                    "default: 8 for these pools), 'none' (pure completion order, as before max_lead) or an int")
    ap.add_argument("--layouts", default="auto", help="comma list of 'auto' (parent_shard='auto', the "
                    "default), 'parent' (parent_shard=True: the pool's process steps one shard) and "
                    "'processes' (parent_shard=False: every shard a worker process)")
    ap.add_argument("--modes", default="async", help="comma list of 'async' (recv/send of the batch, the "
                    "default) and 'sync' (step on every env: per-worker busy time while a step waits)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-envpool", action="store_true")
    ap.add_argument("--out", default="", help="path stem for .json and .md (default: none; "
                                              "bench/results/fairness is the tracked one the docs quote)")
    a = ap.parse_args(argv)
    tasks = None if a.tasks is None else comma_list(a.tasks)
    rows = [r for r in DEFAULT_ROWS if tasks is None or r[0] in tasks]
    pins = choice_list(ap, "--pins", a.pins, ("pinned", "unpinned"))
    leads = comma_list(a.max_leads)
    layouts = choice_list(ap, "--layouts", a.layouts, list(_LAYOUTS))
    modes = choice_list(ap, "--modes", a.modes, ("async", "sync"))
    systems = [("shmpool", p, pin, lead, lay) for p in comma_list(a.policies) for pin in pins for lead in leads
               for lay in layouts] + ([] if a.no_envpool else [("envpool", "-", "-", "-", "-")])
    results = []
    lines = [("| task | N / batch | system | spread (min-max) | steps/s | worker CPU share | worker run-queue share "
              "| parent CPU share, core |"), "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for task, n, b in rows:
        warmup, cycles = _cycles_for(task, a.quick)
        for mode in modes:
            if mode == "sync" and any(r[0] == task and r[1] == n and r[2] < b for r in rows):
                continue   # one sync row per (task, N)
            shown = f"{n} / {b}" if mode == "async" else f"{n} / sync"
            # max_lead plays no part in a sync step: one row per (policy, pin) there
            runs: dict = {s: [] for s in systems if mode == "async" or s[3] in (leads[0], "-")}
            for _ in range(a.reps):  # interleaved repetitions
                for key in runs:
                    system, policy, pin, lead, lay = key
                    layout = _LAYOUTS.get(lay, _LAYOUTS["auto"])   # EnvPool's rows ("-") have none
                    try:
                        runs[key].append(measure(system, task, n, b, warmup, cycles, policy, pin == "pinned",
                                                 _max_lead(lead), mode, layout.parent_shard))
                    except Exception as exc:  # a missing package: say so in the table
                        runs[key].append({"error": f"{type(exc).__name__}: {exc}"})
            for (system, policy, pin, lead, lay), rs in runs.items():
                ok = [r for r in rs if "error" not in r]
                name = system if system == "envpool" else (
                    f"shmpool {policy}" + (", unpinned" if pin == "unpinned" else "")
                    + ("" if lead == "auto" or mode == "sync" else f", max_lead={lead}")
                    + _LAYOUTS[lay].label)
                if not ok:
                    lines.append(f"| {task} | {shown} | {name} | {rs[0]['error']} | | | | |")
                    continue
                spreads = [r["spread"] for r in ok]
                cpu = [statistics.median(c) for c in zip(*(r["worker_cpu"] for r in ok))]
                runqueue = [statistics.median(c) for c in zip(*(r["worker_runqueue"] for r in ok))]
                parent = statistics.median(r["parent_cpu"] for r in ok)
                core = statistics.mode(r["parent_core"] for r in ok)
                lines.append(f"| {task} | {shown} | {name} | {statistics.median(spreads):.2f} "
                             f"({min(spreads):.2f}-{max(spreads):.2f}) | "
                             f"{statistics.median(r['sps'] for r in ok):,.0f} | "
                             f"{' / '.join(f'{c:.2f}' for c in cpu) or '-'} | "
                             f"{' / '.join(f'{c:.2f}' for c in runqueue) or '-'} | {parent:.2f}, cpu {core} |")
                results.append({"task": task, "num_envs": n, "batch_size": b, "mode": mode, "system": system,
                                "policy": policy, "pin": pin, "max_lead": lead, "layout": lay, "runs": ok})
            print("\n".join(lines[-len(runs):]) if len(results) > len(runs) else "\n".join(lines), flush=True)
    table = "\n".join(lines)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out + ".json").write_text(json.dumps(results, indent=1))
        Path(a.out + ".md").write_text("# Async evenness (python -m bench.fairness)\n\n" + table + "\n")


if __name__ == "__main__":
    main()
