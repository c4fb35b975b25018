"""BatchPong-v0: a natively batched env in shmpool's workers vs the same game one env at a time.

``python -m bench batch-pong [--num-envs 1024,16384] [--workers 2] [--seconds 3] [--repeats 3]``

Cases, interleaved (repetition 1 of every case, then repetition 2, ...; median reported):

- ``shmpool BatchPong``: ``Pool(Batched(BatchPong), N, num_workers=W)``, sync ``step``; each
  worker steps its shard with one numpy call.
- ``BatchPong in-process``: one ``BatchPong(N)`` stepped in this process (one core, no pool).
- ``SyncVectorEnv(PongEnv)``: gymnasium's ``SyncVectorEnv`` over the one-env version (the same
  rules, one env at a time).  Stepping one env at a time costs the same per env whatever N,
  so this side uses ``min(N, --baseline-envs)`` envs (default 1,024) and its steps/s stands
  for every N.
- ``loop PongEnv``: a plain Python loop calling ``PongEnv.step`` (no vector env around it).

Steps/s count env steps (one per env per ``step``).  Ratios are shmpool over each
one-at-a-time side, measured in the same run.  Random actions, drawn before timing.
"""
from __future__ import annotations

import argparse
import functools
import sys

import gymnasium as gym
import numpy as np
from shmpool.workers.recipes.batch_pong import BatchPong, PongEnv

import shmpool
from shmpool.batched import Batched

from . import cli
from ._timing import Case, Sample, run_interleaved, summarize, timed_loop
from .report import write_json

_ACTION_SETS = 8


def _actions(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 3, n, dtype=np.int64) for _ in range(_ACTION_SETS)]


class PoolSubject:
    def __init__(self, n: int, workers: int) -> None:
        self.n = n
        self.pool = shmpool.Pool(Batched(BatchPong), n, num_workers=workers, seed=0)
        self.pool.reset()
        self.acts = _actions(n)
        self.info = {"workers": workers, "wait_policy": self.pool.wait_policy.name}

    def measure(self, seconds: float, warmup: float) -> Sample:
        acts, step, k = self.acts, self.pool.step, [0]

        def one():
            k[0] = (k[0] + 1) % _ACTION_SETS
            step(acts[k[0]])
        return timed_loop(one, self.n, seconds, warmup)

    def close(self) -> None:
        self.pool.close()


class InProcessSubject:
    def __init__(self, n: int) -> None:
        self.n = n
        self.env = BatchPong(n).bind_own()
        self.ids = np.arange(n, dtype=np.int64)
        self.env.reset(self.ids, list(range(n)))
        self.acts = _actions(n)

    def measure(self, seconds: float, warmup: float) -> Sample:
        acts, step, ids, k = self.acts, self.env.step, self.ids, [0]

        def one():
            k[0] = (k[0] + 1) % _ACTION_SETS
            step(ids, acts[k[0]])
        return timed_loop(one, self.n, seconds, warmup)

    def close(self) -> None:
        pass


class SyncVectorSubject:
    def __init__(self, n: int) -> None:
        self.n = n
        self.env = gym.vector.SyncVectorEnv([PongEnv] * n)
        self.env.reset(seed=0)
        self.acts = _actions(n)
        self.info = {"envs": n}

    def measure(self, seconds: float, warmup: float) -> Sample:
        acts, step, k = self.acts, self.env.step, [0]

        def one():
            k[0] = (k[0] + 1) % _ACTION_SETS
            step(acts[k[0]])
        return timed_loop(one, self.n, seconds, warmup)

    def close(self) -> None:
        self.env.close()


class LoopSubject:
    """A plain loop over ``n`` PongEnvs, resetting each one whose episode ended."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.envs = [PongEnv() for _ in range(n)]
        for i, env in enumerate(self.envs):
            env.reset(seed=i)
        self.acts = [a.tolist() for a in _actions(n)]
        self.info = {"envs": n}

    def measure(self, seconds: float, warmup: float) -> Sample:
        envs, acts, k = self.envs, self.acts, [0]

        def one():
            k[0] = (k[0] + 1) % _ACTION_SETS
            for env, a in zip(envs, acts[k[0]]):
                _, _, terminated, truncated, _ = env.step(a)
                if terminated or truncated:
                    env.reset()
        return timed_loop(one, self.n, seconds, warmup)

    def close(self) -> None:
        pass


SHMPOOL, INPROC, SYNC, LOOP = "shmpool BatchPong", "BatchPong in-process", "SyncVectorEnv(PongEnv)", "loop PongEnv"


def run(args: argparse.Namespace) -> dict:
    """Measure every N; returns ``{"config", "results": [{"num_envs", "rates", "ratios"}]}`` (steps/s)."""
    base_n = min(max(args.num_envs), args.baseline_envs)
    results = []
    # The one-at-a-time sides do not depend on N: measured once, beside every N's pool.
    for n in args.num_envs:
        cases = [Case(SHMPOOL, functools.partial(PoolSubject, n, args.workers)),
                 Case(INPROC, functools.partial(InProcessSubject, n)),
                 Case(SYNC, functools.partial(SyncVectorSubject, min(n, base_n))),
                 Case(LOOP, functools.partial(LoopSubject, min(n, base_n)))]
        records = run_interleaved(cases, repeats=args.repeats, seconds=args.seconds, warmup=args.warmup,
                                  reuse=False)
        errors = [r for r in records if r.error]
        for r in errors:
            print(f"{r.case} N={n} rep {r.rep} failed:\n{r.error}", file=sys.stderr)
        rates = {}
        for case in cases:
            s = summarize(records, case.name, lambda sample: sample.rate)
            rates[case.name] = None if s is None else {"median": s.median, "lo": s.lo, "hi": s.hi, "n": s.n}
        top = rates[SHMPOOL]["median"] if rates[SHMPOOL] else None
        ratios = {name: (top / r["median"] if top and r else None) for name, r in rates.items() if name != SHMPOOL}
        results.append({"num_envs": n, "rates": rates, "ratios": ratios,
                        "baseline_envs": min(n, base_n), "errors": len(errors)})
    return {"config": {"num_envs": args.num_envs, "workers": args.workers, "seconds": args.seconds,
                       "repeats": args.repeats, "baseline_envs": base_n}, "results": results}


def _fmt(rate: dict | None) -> str:
    if rate is None:
        return "failed"
    return f"{rate['median'] / 1e3:,.1f}k ({rate['lo'] / 1e3:,.1f}-{rate['hi'] / 1e3:,.1f})"


def report(data: dict) -> str:
    lines = ["### BatchPong-v0: steps/s (median of repetitions, min-max)", "",
             f"| N | {SHMPOOL} ({data['config']['workers']} workers) | {INPROC} | {SYNC} | {LOOP} "
             f"| × SyncVectorEnv | × loop |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in data["results"]:
        rt, ra = r["rates"], r["ratios"]

        def x(name, ra=ra):
            return "—" if ra.get(name) is None else f"{ra[name]:,.0f}×"
        lines.append(f"| {r['num_envs']:,} | {_fmt(rt[SHMPOOL])} | {_fmt(rt[INPROC])} | {_fmt(rt[SYNC])} "
                     f"| {_fmt(rt[LOOP])} | {x(SYNC)} | {x(LOOP)} |")
    lines.append("")
    lines.append(f"One-at-a-time sides step min(N, {data['config']['baseline_envs']}) envs; their per-env "
                 "cost does not depend on N.")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser("python -m bench batch-pong", __doc__)
    parser.add_argument("--num-envs", help="comma list of N (default 1024,16384; --quick: 64,256)")
    parser.add_argument("--workers", type=int, default=2, help="shmpool workers (default 2)")
    parser.add_argument("--baseline-envs", type=int, default=1024,
                        help="most envs the one-at-a-time sides step (their per-env cost is flat in N)")
    cli.add_run_options(parser, cli.RunDefaults(seconds=(3.0, 0.2), warmup=(0.5, 0.05)), quick="N=64,256, 0.2 s")
    args = cli.parse(parser, argv)
    if args.num_envs:
        args.num_envs = cli.positive_ints(parser, "--num-envs", args.num_envs)
    else:
        args.num_envs = [64, 256] if args.quick else [1024, 16384]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    data = run(args)
    print(report(data), flush=True)
    if args.json:
        write_json(args.json, data)
    failed = any(r["rates"][SHMPOOL] is None for r in data["results"])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
