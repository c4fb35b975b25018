"""Async evenness: how evenly ``recv``/``send`` advances every env, beside EnvPool.

    python -m bench.fairness                       # CartPole 12/4, 32/16; Pong-v5, Ant-v5 8/4, 32/16
    python -m bench.fairness --tasks CartPole-v1 --policies auto,block,yield,hybrid
    python -m bench.fairness --layouts auto,processes --max-leads auto,none   # beside the issue-day default

spread = max/min of the per-env step counts (1.00: every env advanced equally; EnvPool 1.00–1.02),
steps/s, per worker its CPU and run-queue share of the wall time, the parent's share and core.
--layouts: auto, parent (parent_shard=True), processes (parent_shard=False); --modes async,sync adds
sync rows.  How to read it: bench/README.md, "fairness".
"""
from __future__ import annotations

import collections
import functools
import os
import statistics
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import psutil

from . import cli, report, subjects
from ._timing import Case, Sample, Summary, timed_loop

DEFAULT_ROWS = [("CartPole-v1", 12, 4), ("CartPole-v1", 32, 16), ("Pong-v5", 8, 4), ("Pong-v5", 32, 16),
                ("Ant-v5", 8, 4), ("Ant-v5", 32, 16)]


class _Layout(NamedTuple):
    """One ``--layouts`` value: what it passes as ``Pool(parent_shard=)`` and what its rows add to the name."""

    parent_shard: bool | str
    label: str


_LAYOUTS = {"auto": _Layout("auto", ""), "parent": _Layout(True, ", parent shard"),
            "processes": _Layout(False, ", processes")}
DEFAULT_JSON = str(report.RESULTS / "fairness.json")


def _worker_pids(env) -> list[int]:
    """The shmpool workers' pids (EnvPool: none, its threads are in-process)."""
    pool = getattr(env, "pool", None)
    return pool.worker_pids if pool is not None else []


def _worker_cpu(env) -> list[float]:
    """Each shmpool worker's user+system CPU seconds so far; NaN for a shard this process
    steps (``parent_shard``): its CPU is in the parent's share."""
    return [subjects.cpu_seconds(pid) for pid in _worker_pids(env)]


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


class Evenness:
    """``system`` ("shmpool" or "envpool") on ``task``, stepped by ``recv``/``send`` of ``b`` envs
    (``mode="sync"``: ``step`` of all ``n``).  ``info`` after a sample: per-env step counts (min, max,
    spread = max/min), each worker's CPU and run-queue share of the wall time, the parent's share and core."""

    def __init__(self, system: str, task: str, n: int, b: int, policy: str = "auto", pin: bool = True,
                 max_lead: str | int | None = "auto", mode: str = "async", parent_shard: bool | str = "auto") -> None:
        self.b = n if mode == "sync" else b
        if system == "envpool":
            self.vec = subjects.open_vec(subjects.ENVPOOL, task, n, batch=self.b, num_threads=2)
        else:
            self.vec = subjects.open_vec(subjects.MAKE, task, n, batch=self.b, env_type="gymnasium",
                                         wait_policy=policy, pin=pin, max_lead=max_lead, parent_shard=parent_shard)
        try:
            self._start(system, n, pin, mode)
        except BaseException:
            self.vec.close()
            raise

    def _start(self, system: str, n: int, pin: bool, mode: str) -> None:
        space, rng = self.vec.action_space, np.random.default_rng(0)
        actions = np.stack([space.sample() for _ in range(self.b)]) if not hasattr(space, "n") else \
            rng.integers(0, space.n, size=self.b)
        self.counts, every, self.calls = np.zeros(n, dtype=np.int64), np.arange(n), 0
        self.cores: collections.Counter[int] = collections.Counter()   # the parent's core, sampled
        self.parent, env = psutil.Process(), self.vec.env
        self.info: dict[str, Any] = {"num_workers": None if system == "envpool" else env.pool.num_workers,
                                     "worker_cores": None if system == "envpool" or not pin
                                     else list(env.pool.worker_cpus)}

        def cycle() -> None:
            out = self.vec.raw_step(actions)
            self.counts[every if mode == "sync" else np.asarray(out[-1]["env_id"])] += 1
            self.calls += 1
            if self.calls % 64 == 0:
                self.cores[self.parent.cpu_num()] += 1
        self._cycle = cycle
        self.vec.reset()

    def measure(self, seconds: float, warmup: float) -> Sample:
        timed_loop(self._cycle, self.b, warmup)
        env, pids = self.vec.env, _worker_pids(self.vec.env)
        self.counts[:] = 0
        self.cores.clear()
        cpu0, wait0, own0 = _worker_cpu(env), [_run_queue_wait(p) for p in pids], sum(self.parent.cpu_times()[:2])
        sample = timed_loop(self._cycle, self.b, seconds)
        wall = sample.seconds
        self.info.update(
            spread=float(self.counts.max() / max(self.counts.min(), 1)), min=int(self.counts.min()),
            max=int(self.counts.max()), worker_cpu=[(c1 - c0) / wall for c0, c1 in zip(cpu0, _worker_cpu(env))],
            worker_runqueue=[(_run_queue_wait(p) - w0) / wall for p, w0 in zip(pids, wait0)],
            parent_cpu=(sum(self.parent.cpu_times()[:2]) - own0) / wall,
            parent_core=self.cores.most_common(1)[0][0] if self.cores else None)
        return sample

    def close(self) -> None:
        self.vec.close()


def _max_lead(text: str) -> str | int | None:
    return None if text == "none" else text if text in ("auto", "-") else int(text)


def rows(groups: Sequence[report.Group], shown: dict[str, tuple[str, str]]) -> list[list[str]]:
    """One row per case: its per-env spread, steps/s, the workers' and the parent's shares (medians)."""
    out = []
    for g in groups:
        for case in g.cases:
            infos = [r.info for r in g.records if r.case == case.name and r.sample is not None]
            size, name = shown[case.name]
            if not infos:
                out.append([g.task, size, name, "error", "", "", "", ""])
                continue
            spreads = Summary.of(i["spread"] for i in infos)
            cpu = [statistics.median(c) for c in zip(*(i["worker_cpu"] for i in infos))]
            runqueue = [statistics.median(c) for c in zip(*(i["worker_runqueue"] for i in infos))]
            core = statistics.mode(i["parent_core"] for i in infos)
            out.append([g.task, size, name, report.fmt_summary(spreads, lambda v: f"{v:.2f}"),
                        f"{g.rate(case.name).median:,.0f}", " / ".join(f"{c:.2f}" for c in cpu) or "-",
                        " / ".join(f"{c:.2f}" for c in runqueue) or "-",
                        f"{statistics.median(i['parent_cpu'] for i in infos):.2f}, cpu {core}"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("python -m bench.fairness", __doc__)
    p.add_argument("--tasks", default=None, help="comma list of tasks (default: CartPole-v1, Pong-v5, Ant-v5)")
    p.add_argument("--policies", default="auto", help="comma list of shmpool wait policies")
    p.add_argument("--pins", default="pinned", help="comma list of 'pinned' (the default) and 'unpinned' "
                   "(Pool(pin=False): workers free to run on any allowed core)")
    p.add_argument("--max-leads", default="auto", help="comma list of shmpool max_lead values: 'auto' (the "
                   "default: 8 for these pools), 'none' (pure completion order, as before max_lead) or an int")
    p.add_argument("--layouts", default="auto", help="comma list of 'auto' (parent_shard='auto', the "
                   "default), 'parent' (parent_shard=True: the pool's process steps one shard) and "
                   "'processes' (parent_shard=False: every shard a worker process)")
    p.add_argument("--modes", default="async", help="comma list of 'async' (recv/send of the batch, the "
                   "default) and 'sync' (step on every env: per-worker busy time while a step waits)")
    p.add_argument("--no-envpool", action="store_true")
    cli.add_run_options(p, cli.RunDefaults(json=DEFAULT_JSON), quick="0.2 s, 1 repeat")
    args = cli.parse(p, argv)
    tasks = None if args.tasks is None else cli.comma_list(args.tasks)
    sizes = {(t, n): b for t, n, b in DEFAULT_ROWS if tasks is None or t in tasks}
    pins = cli.choice_list(p, "--pins", args.pins, ("pinned", "unpinned"))
    leads = cli.comma_list(args.max_leads)
    layouts = cli.choice_list(p, "--layouts", args.layouts, list(_LAYOUTS))
    modes = cli.choice_list(p, "--modes", args.modes, ("async", "sync"))
    err, env = report.stderr_console(), report.environment()
    envpool = not args.no_envpool and report.version_of("envpool") is not None
    if not args.no_envpool and not envpool:
        err.print("[yellow]EnvPool rows left out[/yellow] — envpool does not import", highlight=False)
    shown: dict[str, tuple[str, str]] = {}   # case name -> (the "N / batch" column, the system column)

    def cases(task: str, n: int) -> list[Case]:
        out = []
        for mode in modes:
            size = f"{n} / {sizes[task, n]}" if mode == "async" else f"{n} / sync"
            # max_lead plays no part in a sync step: one row per (policy, pin, layout) there
            for policy, pin, lead, lay in [(po, pi, le, la) for po in cli.comma_list(args.policies) for pi in pins
                                           for le in (leads if mode == "async" else leads[:1]) for la in layouts]:
                name = (f"shmpool {policy}" + (", unpinned" if pin == "unpinned" else "")
                        + ("" if lead == "auto" or mode == "sync" else f", max_lead={lead}") + _LAYOUTS[lay].label)
                shown[f"{size} {name}"] = (size, name)
                out.append(Case(f"{size} {name}", functools.partial(
                    Evenness, "shmpool", task, n, sizes[task, n], policy, pin == "pinned", _max_lead(lead), mode,
                    _LAYOUTS[lay].parent_shard)))
            if envpool:
                shown[f"{size} envpool"] = (size, "envpool")
                out.append(Case(f"{size} envpool", functools.partial(Evenness, "envpool", task, n, sizes[task, n],
                                                                     mode=mode)))
        return out

    per_cell = sum(len(cases(*key)) for key in list(sizes)[:1])
    groups = report.run_cells(list(sizes), cases, args, err, per_cell)
    header = ["task", "N / batch", "system", "spread (min–max)", "steps/s", "worker CPU share",
              "worker run-queue share", "parent CPU share, core"]
    text = "\n".join([report.header("Async evenness", args, env), "",
                      report.markdown_table(header, rows(groups, shown))])
    return report.finish(args, "bench.fairness", env, text, err, groups, cells=[g.to_json() for g in groups])


if __name__ == "__main__":
    raise SystemExit(main())
