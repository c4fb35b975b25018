"""The core benchmark (issue 2): shmpool against gymnasium's vector envs, and the raw round trip.

    python -m bench.core                        # CartPole-v1 N=8,32,128 and Ant-v5 N=8,32
    python -m bench.core --json /tmp/core.json  # also write every raw measurement
    python -m bench.core --quick                # a few seconds, for tests

Everything is measured in one run and every ratio compares systems of that
run.  Repetitions are interleaved across the systems of a (task, N) group and
each repetition opens a fresh env/pool (opening is not timed), so no idle pool
is waiting — possibly spinning — while another system is timed.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import mmap
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Discrete
from gymnasium.vector.utils import batch_space
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

import shmpool
from shmpool import _core

from ._timing import Case, Record, Sample, Summary, fill_defaults, latency_loop, run_interleaved, summarize, timed_loop

SYNC_VEC, ASYNC_VEC, POOL_SYNC, POOL_ASYNC = "SyncVectorEnv", "AsyncVectorEnv", "shmpool sync", "shmpool async"
SYSTEMS = (SYNC_VEC, ASYNC_VEC, POOL_SYNC, POOL_ASYNC)
DEFAULT_TASKS = ("CartPole-v1", "Ant-v5")
DEFAULT_NUM_ENVS = {"CartPole-v1": (8, 32, 128), "Ant-v5": (8, 32)}
OTHER_NUM_ENVS = (8, 32)
PINGPONG = "spin ping-pong"
PY_PINGPONG = "spin ping-pong, Python loop"
ROUND_TRIP_POLICIES = {"shmpool empty env, default wait": "auto", "shmpool empty env, wait_policy='spin'": "spin"}


# --- the empty env: what a round trip costs when the env costs nothing ------------------------

class EmptyEnv(gym.Env):
    """An env whose step does nothing and returns a preallocated observation."""

    observation_space = Box(0.0, 1.0, (1,), np.float32)
    action_space = Discrete(2)

    def __init__(self) -> None:
        self._obs = np.zeros(1, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self._obs, {}

    def step(self, action):
        return self._obs, 0.0, False, False, {}


def fixed_actions(space: gym.Space, n: int) -> np.ndarray:
    """One batch of actions every system gets on every step: zeros for Box, a seeded draw otherwise."""
    if isinstance(space, Box):
        return np.zeros((n, *space.shape), dtype=space.dtype)
    batched = batch_space(space, n)
    batched.seed(0)
    return batched.sample()


def pool_info(pool: shmpool.Pool) -> dict[str, Any]:
    """What a pool resolved its defaults to, for the JSON record."""
    return {
        "num_workers": pool.num_workers,
        "worker_cpus": pool.worker_cpus,
        "batch_size": pool.batch_size,
        "wait_policy": pool.wait_policy.name,
        "worker_wait_policy": pool.worker_wait_policy.name,
    }


# --- throughput subjects ---------------------------------------------------------------------

class GymVector:
    """gymnasium's SyncVectorEnv or AsyncVectorEnv (shared memory), stepped with fixed actions."""

    def __init__(self, system: str, task: str | Callable[[], gym.Env], n: int, actions: np.ndarray) -> None:
        fns = [task if callable(task) else functools.partial(gym.make, task)] * n
        if system == SYNC_VEC:
            self.env = gym.vector.SyncVectorEnv(fns)
        else:
            self.env = gym.vector.AsyncVectorEnv(fns, shared_memory=True)
        self.n = n
        self.info: dict[str, Any] = {}
        try:
            self.env.reset(seed=0)
        except BaseException:
            self.env.close()
            raise
        self._step = functools.partial(self.env.step, actions)

    def measure(self, seconds: float, warmup: float) -> Sample:
        return timed_loop(self._step, self.n, seconds, warmup)

    def close(self) -> None:
        self.env.close()


class PoolSync:
    """shmpool, ``pool.step(actions)`` over all envs."""

    def __init__(self, task: str, n: int, actions: np.ndarray) -> None:
        self.pool = shmpool.Pool(task, n, seed=0)
        self.n = n
        self.info = pool_info(self.pool)
        try:
            self.pool.reset()
        except BaseException:
            self.pool.close()
            raise
        self._step = functools.partial(self.pool.step, actions)

    def measure(self, seconds: float, warmup: float) -> Sample:
        return timed_loop(self._step, self.n, seconds, warmup)

    def close(self) -> None:
        self.pool.close()


class PoolAsync:
    """shmpool with ``batch_size=N//2``: receive the first half to finish, send it straight back."""

    def __init__(self, task: str, n: int, actions: np.ndarray) -> None:
        self.batch = max(1, n // 2)
        self.pool = shmpool.Pool(task, n, batch_size=self.batch, seed=0)
        self.info = pool_info(self.pool)
        self.actions = actions[: self.batch]
        self.pool.async_reset()

    def _step(self) -> None:
        *_, infos = self.pool.recv()
        self.pool.send(self.actions, infos["env_id"])

    def measure(self, seconds: float, warmup: float) -> Sample:
        return timed_loop(self._step, self.batch, seconds, warmup)

    def close(self) -> None:
        self.pool.close()


def throughput_cases(task: str, n: int) -> list[Case]:
    """The four systems of one (task, N) cell, all stepped with the same actions."""
    probe = gym.make(task)
    actions = fixed_actions(probe.action_space, n)
    probe.close()
    return [
        Case(SYNC_VEC, functools.partial(GymVector, SYNC_VEC, task, n, actions)),
        Case(ASYNC_VEC, functools.partial(GymVector, ASYNC_VEC, task, n, actions)),
        Case(POOL_SYNC, functools.partial(PoolSync, task, n, actions)),
        Case(POOL_ASYNC, functools.partial(PoolAsync, task, n, actions)),
    ]


# --- round-trip subjects ---------------------------------------------------------------------

def python_pingpong(buf: mmap.mmap, offset: int, role: int, rounds: int) -> int:
    """``_core.spin_pingpong`` written in Python: the floor of a round trip driven by Python code."""
    load, store = _core.load_word, _core.store_word
    t0 = time.perf_counter_ns()
    for i in range(rounds):
        v = 2 * i + role
        while load(buf, offset) != v:
            pass
        store(buf, offset, v + 1)
    return time.perf_counter_ns() - t0


def _pingpong_side(buf: mmap.mmap, cpu: int, role: int, warm_rounds: int, rounds: int, python: bool,
                   conn) -> None:
    """One end of the ping-pong (runs in a forked child)."""
    os.sched_setaffinity(0, {cpu})
    pingpong = python_pingpong if python else _core.spin_pingpong
    # The warm-up on its own word also lines the two ends up, so the timed
    # part starts within a round trip on both sides.
    pingpong(buf, 0, role, warm_rounds)
    conn.send(pingpong(buf, 128, role, rounds))
    conn.close()


class SpinPingPong:
    """Spin ping-pong on one shared word between two processes pinned to two cores.

    C-speed (``_core.spin_pingpong``) by default; ``python=True`` runs the
    same loop in Python, to show what the interpreter alone costs."""

    def __init__(self, cpus: tuple[int, int], python: bool = False) -> None:
        self.cpus = cpus
        self.python = python
        self.info = {"cpus": list(cpus), "loop": "python" if python else "C"}

    def measure(self, seconds: float, warmup: float) -> Sample:
        calibration = 20_000
        per_round_ns = self._pair(2_000, calibration) / calibration
        rounds = max(1_000, int(seconds * 1e9 / per_round_ns))
        elapsed_ns = self._pair(int(warmup * 1e9 / per_round_ns), rounds)
        return Sample(rounds, elapsed_ns / 1e9)

    def _pair(self, warm_rounds: int, rounds: int) -> float:
        """Elapsed ns of ``rounds`` timed round trips (mean of the two ends' clocks)."""
        ctx = mp.get_context("fork")
        buf = mmap.mmap(-1, 4096)  # zeroed; created before the fork so both ends share it
        procs, conns = [], []
        try:
            for role, cpu in enumerate(self.cpus):
                recv_end, send_end = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_pingpong_side, name=f"pingpong-{role}", daemon=True,
                                   args=(buf, cpu, role, warm_rounds, rounds, self.python, send_end))
                proc.start()
                send_end.close()
                procs.append(proc)
                conns.append(recv_end)
            # An end that died would leave the other spinning: never wait unbounded.
            timeout = 60.0 + 1e-4 * (warm_rounds + rounds)
            elapsed = []
            for conn in conns:
                if not conn.poll(timeout):
                    raise TimeoutError(f"spin ping-pong did not finish within {timeout:.0f} s")
                elapsed.append(conn.recv())
            return sum(elapsed) / len(elapsed)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                proc.join()
            for conn in conns:
                conn.close()
            buf.close()

    def close(self) -> None:
        pass


class PoolRoundTrip:
    """``pool.step`` of one EmptyEnv on one worker: the parent pinned to one core, the worker to the other."""

    def __init__(self, wait_policy: str, parent_cpu: int, worker_cpu: int) -> None:
        # The pool is created before the parent pins itself: ``cpus=`` must lie
        # inside the parent's own affinity mask.
        self.pool = shmpool.Pool(EmptyEnv, 1, num_workers=1, cpus=[worker_cpu], wait_policy=wait_policy, seed=0)
        self.info = {**pool_info(self.pool), "parent_cpu": parent_cpu}
        self._saved_affinity = os.sched_getaffinity(0)
        try:
            self.pool.reset()
            os.sched_setaffinity(0, {parent_cpu})
        except BaseException:
            self.close()
            raise
        self._step = functools.partial(self.pool.step, np.zeros(1, dtype=np.int64))

    def measure(self, seconds: float, warmup: float) -> Sample:
        return latency_loop(self._step, seconds, warmup)

    def close(self) -> None:
        os.sched_setaffinity(0, self._saved_affinity)
        self.pool.close()


def round_trip_cases(parent_cpu: int, worker_cpu: int) -> list[Case]:
    cpus = (parent_cpu, worker_cpu)
    cases = [Case(PINGPONG, functools.partial(SpinPingPong, cpus)),
             Case(PY_PINGPONG, functools.partial(SpinPingPong, cpus, python=True))]
    for name, policy in ROUND_TRIP_POLICIES.items():
        cases.append(Case(name, functools.partial(PoolRoundTrip, policy, parent_cpu, worker_cpu)))
    return cases


# --- the run ---------------------------------------------------------------------------------

@dataclass
class Group:
    """The repetitions of one (task, N) cell (round trips: task "round trip", N 1)."""

    task: str
    num_envs: int
    cases: list[Case]
    records: list[Record]

    def rate(self, system: str) -> Summary | None:
        return summarize(self.records, system, lambda s: s.rate)

    def us(self, system: str) -> Summary | None:
        return summarize(self.records, system, lambda s: s.us_per_unit)

    def latency(self, system: str, key: str) -> Summary | None:
        return summarize((r for r in self.records if r.sample is not None and r.sample.latency_us),
                         system, lambda s: s.latency_us[key])

    def ratio(self, num: str, den: str) -> float | None:
        a, b = self.rate(num), self.rate(den)
        return None if a is None or b is None else a.median / b.median

    def errors(self) -> list[Record]:
        return [r for r in self.records if r.error is not None]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task": self.task, "num_envs": self.num_envs, "systems": {}}
        for case in self.cases:
            rate, us = self.rate(case.name), self.us(case.name)
            out["systems"][case.name] = {
                "samples": [r.to_json() for r in self.records if r.case == case.name],
                "median_rate": rate and rate.median, "min_rate": rate and rate.lo, "max_rate": rate and rate.hi,
                "median_us": us and us.median,
            }
        return out


@dataclass(frozen=True)
class Plan:
    """What to run: throughput cells per task, skipped tasks with the reason, the round-trip cpus."""

    cells: list[tuple[str, int]]
    skipped: dict[str, str]
    round_trip_cpus: tuple[int, int] | None
    round_trip_note: str | None


def unavailable(task: str) -> str | None:
    """Why ``task`` cannot be made here (e.g. mujoco missing), or None."""
    try:
        gym.make(task).close()
    except (gym.error.DependencyNotInstalled, ImportError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def make_plan(args: argparse.Namespace) -> Plan:
    cells, skipped = [], {}
    for task in args.tasks:
        reason = unavailable(task)
        if reason is not None:
            skipped[task] = reason
            continue
        sizes = args.num_envs or DEFAULT_NUM_ENVS.get(task, OTHER_NUM_ENVS)
        cells += [(task, n) for n in sizes]
    cpus, note = None, None
    allowed = sorted(os.sched_getaffinity(0))
    if args.no_roundtrip:
        note = "not run (--no-roundtrip)"
    elif len(allowed) < 2:
        note = f"not run: needs two cores, this process may use only {allowed}"
    else:
        cpus = (allowed[0], allowed[1])
    return Plan(cells, skipped, cpus, note)


def run(plan: Plan, args: argparse.Namespace, err: Console) -> tuple[list[Group], Group | None]:
    """Measure every throughput cell, then the round trips, with a progress bar on stderr."""
    rt_cases = round_trip_cases(*plan.round_trip_cpus) if plan.round_trip_cpus is not None else []
    total = (len(plan.cells) * len(SYSTEMS) + len(rt_cases)) * args.repeats
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    # No auto-refresh: a refresh thread would compete for the GIL and the cores being measured.
    with Progress(*columns, console=err, auto_refresh=False) as progress:
        bar = progress.add_task("starting", total=total)

        def advance(_: Record) -> None:
            progress.advance(bar)
            progress.refresh()

        def measure(task: str, n: int, cases: list[Case]) -> Group:
            def on_start(case: Case, rep: int) -> None:
                where = task if task == "round trip" else f"{task} N={n}"
                progress.update(bar, description=f"{where} · {case.name} · rep {rep + 1}/{args.repeats}",
                                refresh=True)

            records = run_interleaved(cases, repeats=args.repeats, seconds=args.seconds, warmup=args.warmup,
                                      on_start=on_start, on_done=advance)
            return Group(task, n, cases, records)

        groups = [measure(task, n, throughput_cases(task, n)) for task, n in plan.cells]
        round_trip = measure("round trip", 1, rt_cases) if rt_cases else None
    return groups, round_trip


# --- the report ------------------------------------------------------------------------------

def fmt_rate(v: float) -> str:
    """Three significant digits with a k/M suffix: 176k, 17.7k, 4.44k."""
    for div, suffix in ((1e6, "M"), (1e3, "k"), (1.0, "")):
        if v >= div or div == 1.0:
            x = v / div
            digits = max(0, 3 - len(str(int(x))))
            return f"{x:.{digits}f}{suffix}"
    raise AssertionError("unreachable")


def fmt_summary(s: Summary | None, fmt=fmt_rate) -> str:
    if s is None:
        return "error"
    if s.n == 1:
        return fmt(s.median)
    return f"{fmt(s.median)} ({fmt(s.lo)}–{fmt(s.hi)})"


def fmt_ratio(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}×"


def fmt_us(v: float) -> str:
    return f"{v:.2f}" if v < 100 else f"{v:.0f}"


THROUGHPUT_HEADER = ("task", "N", *SYSTEMS, "sync ÷ SyncVectorEnv", "sync ÷ AsyncVectorEnv", "async ÷ SyncVectorEnv")
ROUND_TRIP_HEADER = ("round trip", "µs per step: median (min–max)", "× ping-pong", "p50 µs", "p99 µs",
                     "p50 × ping-pong", "wait policy (parent / worker)")


def throughput_rows(groups: Sequence[Group]) -> list[list[str]]:
    return [
        [g.task, str(g.num_envs), *(fmt_summary(g.rate(s)) for s in SYSTEMS),
         fmt_ratio(g.ratio(POOL_SYNC, SYNC_VEC)), fmt_ratio(g.ratio(POOL_SYNC, ASYNC_VEC)),
         fmt_ratio(g.ratio(POOL_ASYNC, SYNC_VEC))]
        for g in groups
    ]


def round_trip_rows(group: Group) -> list[list[str]]:
    """Mean µs per round trip (elapsed / count) and, for pool steps, per-call percentiles."""
    floor = group.us(PINGPONG)
    rows = []
    for case in group.cases:
        us, p50, p99 = group.us(case.name), group.latency(case.name, "p50"), group.latency(case.name, "p99")
        info = next((r.info for r in group.records if r.case == case.name and r.info), {})
        if case.name in (PINGPONG, PY_PINGPONG):
            policy = f"spin ({info.get('loop', '?')} loop)"
        else:
            policy = f"{info['wait_policy']} / {info['worker_wait_policy']}" if info else "—"
        rows.append([case.name, fmt_summary(us, fmt_us), fmt_ratio(_over(us, floor)),
                     "—" if p50 is None else fmt_us(p50.median), "—" if p99 is None else fmt_us(p99.median),
                     fmt_ratio(_over(p50, floor)), policy])
    return rows


def _over(a: Summary | None, b: Summary | None) -> float | None:
    return None if a is None or b is None else a.median / b.median


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def rich_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


@dataclass(frozen=True)
class Target:
    """A ratio the issue asks for; ``at_most`` for "within N×" targets."""

    label: str
    goal: float
    value: float | None
    at_most: bool = False
    note: str = ""

    @property
    def status(self) -> str:
        if self.value is None:
            return "not measured"
        ok = self.value <= self.goal if self.at_most else self.value >= self.goal
        return "PASS" if ok else "MISS"

    def line(self) -> str:
        if self.value is None:
            return f"- {self.label}: not measured"
        return f"- {self.label}: {fmt_ratio(self.value)} — {self.status}" + (f" ({self.note})" if self.note else "")

    def to_json(self) -> dict[str, Any]:
        return {"target": self.label, "goal": self.goal, "at_most": self.at_most, "value": self.value,
                "status": self.status}


def targets(groups: Sequence[Group], round_trip: Group | None) -> list[Target]:
    def cell(task: str, n: int) -> Group | None:
        return next((g for g in groups if g.task == task and g.num_envs == n), None)

    def ratio(task: str, n: int, num: str, den: str) -> float | None:
        g = cell(task, n)
        return None if g is None else g.ratio(num, den)

    def round_trip_target(label: str, name: str) -> Target:
        if round_trip is None:
            return Target(label, 5.0, None, at_most=True)
        floor = round_trip.us(PINGPONG)
        p50 = _over(round_trip.latency(name, "p50"), floor)
        note = "" if p50 is None else f"per-call p50: {fmt_ratio(p50)}"
        return Target(label, 5.0, _over(round_trip.us(name), floor), at_most=True, note=note)

    default, spin = ROUND_TRIP_POLICIES
    return [
        Target("CartPole-v1 N=32 shmpool sync ≥ 1.6× SyncVectorEnv", 1.6,
               ratio("CartPole-v1", 32, POOL_SYNC, SYNC_VEC)),
        Target("CartPole-v1 N=32 shmpool sync ≥ 10× AsyncVectorEnv", 10.0,
               ratio("CartPole-v1", 32, POOL_SYNC, ASYNC_VEC)),
        Target("Ant-v5 N=8 shmpool sync ≥ 1.8× SyncVectorEnv", 1.8, ratio("Ant-v5", 8, POOL_SYNC, SYNC_VEC)),
        round_trip_target("empty-env round trip (default wait) within 5× of spin ping-pong", default),
        round_trip_target("empty-env round trip (wait_policy='spin') within 5× of spin ping-pong", spin),
    ]


def environment() -> dict[str, Any]:
    """Versions, cpu and date: what a reader needs to compare two runs."""
    def cpu_model() -> str:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or "unknown"

    def git_commit() -> str | None:
        root = Path(__file__).resolve().parent.parent
        def git(*cmd: str) -> str:
            return subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

        try:
            head, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
        except (OSError, subprocess.CalledProcessError):
            return None
        return head + ("+dirty" if dirty else "")  # dirty: tracked files differ from the commit

    try:
        import mujoco
        mujoco_version = mujoco.__version__
    except ImportError:
        mujoco_version = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "gymnasium": gym.__version__,
        "mujoco": mujoco_version,
        "shmpool": shmpool.__version__,
        "git_commit": git_commit(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "sched_getaffinity": sorted(os.sched_getaffinity(0)),
        # What numactl --membind/--cpunodebind left in force (inherited by the workers).
        "mems_allowed": proc_status("Mems_allowed_list"),
        "numa_policy": numa_policy(),
        "start_method": mp.get_start_method(),
    }


def proc_status(field: str) -> str | None:
    """A field of /proc/self/status (e.g. ``Mems_allowed_list``: the NUMA nodes memory may come from)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def numa_policy() -> str | None:
    """This process's memory policy as ``numactl --show`` prints it (``policy: bind; membind: 0``
    after ``numactl --membind=0``), or None when numactl is not installed."""
    try:
        out = subprocess.run(["numactl", "--show"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return "; ".join(f"{k}: {fields[k].strip()}" for k in ("policy", "membind") if k in fields) or None


def report(args: argparse.Namespace, env: dict[str, Any], plan: Plan, groups: list[Group],
           round_trip: Group | None, out: Console) -> list[Target]:
    """Rich tables, then the same as plain markdown (pasteable), then the targets."""
    goals = targets(groups, round_trip)
    tp_rows = throughput_rows(groups)
    rt_rows = round_trip_rows(round_trip) if round_trip is not None else []
    out.print(rich_table("Throughput, env steps/s: median (min–max)", THROUGHPUT_HEADER, tp_rows))
    if rt_rows:
        out.print(rich_table("Round trip, one empty env on one worker", ROUND_TRIP_HEADER, rt_rows))

    lines = [
        f"## shmpool core benchmark — {env['date']}",
        "",
        f"`{args.command}` · {env['cpu_model']} · cpus {env['sched_getaffinity']} · "
        f"python {env['python']}, numpy {env['numpy']}, gymnasium {env['gymnasium']}, mujoco {env['mujoco']} · "
        f"{args.repeats} interleaved repetitions × {args.seconds:g} s (warm-up {args.warmup:g} s)",
        "",
        "Throughput, env steps/s, median (min–max); ratios of medians:",
        "",
        markdown_table(THROUGHPUT_HEADER, tp_rows),
    ]
    lines += [f"\n{task} skipped — {reason}" for task, reason in plan.skipped.items()]
    if rt_rows:
        lines += ["", "Round trip, one empty env on one worker, parent and worker pinned to different cores "
                  "(µs per step = elapsed / steps; p50/p99 per call):", "",
                  markdown_table(ROUND_TRIP_HEADER, rt_rows)]
    else:
        lines += ["", f"Round trip {plan.round_trip_note}."]
    lines += ["", "### Targets (medians of this run)", "", *(t.line() for t in goals)]
    print("\n".join(lines), flush=True)
    return goals


def print_errors(groups: Sequence[Group], err: Console) -> int:
    """Every recorded failure with its traceback; returns how many there were."""
    failed = [(g, r) for g in groups for r in g.errors()]
    for g, r in failed:
        where = g.task if g.task == "round trip" else f"{g.task} N={g.num_envs}"
        err.print(f"{where} · {r.case} · rep {r.rep + 1} failed:", style="red", markup=False, highlight=False)
        sys.stderr.write(r.error.rstrip() + "\n")  # not through rich: no markup, no re-wrapping
    return len(failed)


def write_json(path: str, args: argparse.Namespace, env: dict[str, Any], plan: Plan, groups: list[Group],
               round_trip: Group | None, goals: list[Target]) -> None:
    config = {k: v for k, v in vars(args).items() if k != "json"}
    data = {
        "benchmark": "bench.core",
        "environment": env,
        "config": config,
        "skipped": plan.skipped,
        "throughput": [g.to_json() for g in groups],
        "round_trip": round_trip.to_json() if round_trip is not None else {"note": plan.round_trip_note},
        "targets": [t.to_json() for t in goals],
    }
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


# --- command line ----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.core", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", help=f"comma list of gymnasium ids (default {','.join(DEFAULT_TASKS)})")
    p.add_argument("--num-envs", help="comma list of N for every task (default: 8,32,128 for CartPole, 8,32 else)")
    p.add_argument("--seconds", type=float, help="timed seconds per repetition (default 2)")
    p.add_argument("--repeats", type=int, help="interleaved repetitions per cell (default 3)")
    p.add_argument("--warmup", type=float, help="untimed seconds before each repetition (default 0.3)")
    p.add_argument("--json", metavar="PATH", help="write every raw measurement and the configuration here")
    p.add_argument("--quick", action="store_true",
                   help="tiny run for tests: 0.2 s, 1 repeat, CartPole-v1 N=8 (explicit options still win)")
    p.add_argument("--no-roundtrip", action="store_true", help="skip the round-trip measurements")
    args = p.parse_args(argv)

    quick = args.quick
    args.command = " ".join(["python -m bench.core", *(sys.argv[1:] if argv is None else argv)])
    args.tasks = comma_list(args.tasks) if args.tasks else (["CartPole-v1"] if quick else list(DEFAULT_TASKS))
    args.num_envs = comma_counts(p, args.num_envs) if args.num_envs else ([8] if quick else None)
    fill_defaults(args, seconds=(2.0, 0.2), repeats=(3, 1), warmup=(0.3, 0.1))
    if args.seconds <= 0 or args.warmup < 0 or args.repeats < 1:
        p.error("--seconds must be > 0, --warmup >= 0 and --repeats >= 1")
    return args


def comma_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def comma_counts(p: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        values = [int(t) for t in comma_list(text)]
    except ValueError:
        p.error(f"--num-envs must be a comma list of integers, got {text!r}")
    if not values or min(values) < 1:
        p.error(f"--num-envs must be positive integers, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out, err = Console(), Console(stderr=True)
    if not out.is_terminal:
        out = Console(width=180)  # piped or redirected: keep the tables readable, not folded to 80 columns
    plan = make_plan(args)
    for task, reason in plan.skipped.items():
        err.print(f"[yellow]{task} skipped[/yellow] — {reason}", highlight=False)
    env = environment()
    groups, round_trip = run(plan, args, err)
    goals = report(args, env, plan, groups, round_trip, out)
    if args.json:
        write_json(args.json, args, env, plan, groups, round_trip, goals)
        err.print(f"raw measurements written to {args.json}")
    failures = print_errors(groups + ([round_trip] if round_trip else []), err)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
