"""The headline benchmark: shmpool against gymnasium's vector envs stepping the same envs, and the raw round trip.

    python -m bench.core                        # CartPole-v1 N=8,32,128 and Ant-v5 N=8,32
    python -m bench.core --tasks DictObs-v0,DictTextObs-v0 --no-roundtrip   # what a pickled (Text) leaf costs

Env-only: SyncVectorEnv, AsyncVectorEnv, shmpool sync (Pool.step of all N) and async (batch N/2) step N
copies of one env with one fixed batch of actions; env steps/s, median (min–max), ratios of medians.  Then
one empty env's round trip against a C spin ping-pong.  On an idle 2-core machine expect sync 1.6–1.9×
SyncVectorEnv; a busy one moves every ratio.  How to read it: bench/README.md, "core".
"""
from __future__ import annotations

import argparse
import functools
import mmap
import multiprocessing as mp
import os
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from shmpool import _spin

from . import cli, report, subjects
from ._timing import Case, Sample, Summary, latency_loop
from .envs import BENCH_ENVS, EmptyEnv, gym_env_fn

DEFAULT_TASKS = ("CartPole-v1", "Ant-v5")
DEFAULT_NUM_ENVS = {"CartPole-v1": (8, 32, 128), "Ant-v5": (8, 32)}
PINGPONG = "spin ping-pong"
DEFAULT_JSON = str(report.RESULTS / "core.json")   # and the markdown report beside it, core.md
ROUND_TRIP_POLICIES = {"shmpool empty env, default wait": "auto", "shmpool empty env, wait_policy='spin'": "spin"}


def throughput_cases(task: str, n: int) -> list[Case]:
    """The four systems of one (task, N) cell, all stepped with the same actions."""
    make_env = gym_env_fn(task)
    pool_env = make_env if task in BENCH_ENVS else task   # an id the workers can make, else the constructor
    return subjects.headline_cases(make_env, pool_env, n, subjects.fixed_actions(subjects.action_space_of(make_env), n))


# --- round-trip subjects ---------------------------------------------------------------------

def _pingpong_side(buf: mmap.mmap, cpu: int, role: int, warm_rounds: int, rounds: int, conn) -> None:
    """One end of the ping-pong (runs in a forked child)."""
    os.sched_setaffinity(0, {cpu})
    # The warm-up on its own word also lines the two ends up, so the timed
    # part starts within a round trip on both sides.
    _spin.spin_pingpong(buf, 0, role, warm_rounds)
    conn.send(_spin.spin_pingpong(buf, 128, role, rounds))
    conn.close()


class SpinPingPong:
    """C spin ping-pong (``_spin.spin_pingpong``) on one shared word between two processes pinned to two cores."""

    def __init__(self, cpus: tuple[int, int]) -> None:
        self.cpus = cpus
        self.info = {"cpus": list(cpus), "loop": "C"}

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
                                   args=(buf, cpu, role, warm_rounds, rounds, send_end))
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
        self.vec = subjects.open_vec(subjects.POOL, EmptyEnv, 1, num_workers=1, cpus=[worker_cpu],
                                     wait_policy=wait_policy)
        self.info = {**self.vec.info, "parent_cpu": parent_cpu}
        self._saved_affinity = os.sched_getaffinity(0)
        try:
            self.vec.reset()
            os.sched_setaffinity(0, {parent_cpu})
        except BaseException:
            self.close()
            raise
        self._step = self.vec.stepping(np.zeros(1, dtype=np.int64))

    def measure(self, seconds: float, warmup: float) -> Sample:
        return latency_loop(self._step, seconds, warmup)

    def close(self) -> None:
        os.sched_setaffinity(0, self._saved_affinity)
        self.vec.close()


def round_trip_cases(parent_cpu: int, worker_cpu: int) -> list[Case]:
    cpus = (parent_cpu, worker_cpu)
    cases = [Case(PINGPONG, functools.partial(SpinPingPong, cpus))]
    for name, policy in ROUND_TRIP_POLICIES.items():
        cases.append(Case(name, functools.partial(PoolRoundTrip, policy, parent_cpu, worker_cpu)))
    return cases


# --- the run ---------------------------------------------------------------------------------

def unavailable(task: str) -> str | None:
    """Why ``task`` cannot be made here (e.g. mujoco missing), or None."""
    try:
        gym_env_fn(task)().close()
    except (gym.error.DependencyNotInstalled, ImportError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def round_trip_cpus(args: argparse.Namespace) -> tuple[tuple[int, int] | None, str]:
    """The two cores of the round trip, or None and why it is not run."""
    allowed = sorted(os.sched_getaffinity(0))
    if args.no_roundtrip:
        return None, "not run (--no-roundtrip)"
    if len(allowed) < 2:
        return None, f"not run: needs two cores, this process may use only {allowed}"
    return (allowed[0], allowed[1]), ""


# --- the report ------------------------------------------------------------------------------

THROUGHPUT_HEADER = ("task", "N", *subjects.SYSTEMS, "sync ÷ SyncVectorEnv", "sync ÷ AsyncVectorEnv",
                     "async ÷ SyncVectorEnv")
ROUND_TRIP_HEADER = ("round trip", "µs per step: median (min–max)", "× ping-pong", "p50 µs", "p99 µs",
                     "p50 × ping-pong", "wait policy (parent / worker)")
READING = """Reading it: two shards on two cores (sync: one worker process, and this process stepping the other
shard where it would wait) can reach about 2.4× SyncVectorEnv on CartPole at best; other processes on
the box take from shmpool's two cores first (SyncVectorEnv needs one), so on a busy machine sync ÷
SyncVectorEnv can fall below 1×. "× ping-pong" is how many C spin ping-pongs one pool step of an empty
env costs: both ends of a pool step run Python (~2 µs in the parent, ~3.5 µs in the worker), so 30–50×
is expected; the spin policy shows the floor of the wait itself."""


def throughput_rows(groups: Sequence[report.Group]) -> list[list[str]]:
    return [[g.task, str(g.num_envs), *(report.fmt_summary(g.rate(s)) for s in subjects.SYSTEMS),
             report.fmt_ratio(g.ratio(subjects.POOL_SYNC, subjects.SYNC_VEC)),
             report.fmt_ratio(g.ratio(subjects.POOL_SYNC, subjects.ASYNC_VEC)),
             report.fmt_ratio(g.ratio(subjects.POOL_ASYNC, subjects.SYNC_VEC))] for g in groups]


def round_trip_rows(group: report.Group) -> list[list[str]]:
    """Mean µs per round trip (elapsed / count) and, for pool steps, per-call percentiles."""
    floor = group.us(PINGPONG)
    rows = []
    for case in group.cases:
        us, p50, p99 = group.us(case.name), group.latency(case.name, "p50"), group.latency(case.name, "p99")
        info = next((r.info for r in group.records if r.case == case.name and r.info), {})
        if case.name == PINGPONG:
            policy = f"spin ({info.get('loop', '?')} loop)"
        else:
            policy = f"{info['wait_policy']} / {info['worker_wait_policy']}" if info else "—"
        rows.append([case.name, report.fmt_summary(us, report.fmt_us), report.fmt_ratio(_over(us, floor)),
                     "—" if p50 is None else report.fmt_us(p50.median),
                     "—" if p99 is None else report.fmt_us(p99.median),
                     report.fmt_ratio(_over(p50, floor)), policy])
    return rows


def _over(a: Summary | None, b: Summary | None) -> float | None:
    return None if a is None or b is None else a.median / b.median


def targets(groups: Sequence[report.Group], round_trip: report.Group | None, load: float) -> list[report.Target]:
    """The env-only targets, each with what moves it (``load``: the load average when the run started)."""
    def ratio(task: str, n: int, num: str, den: str) -> float | None:
        g = next((g for g in groups if g.task == task and g.num_envs == n), None)
        return None if g is None else g.ratio(num, den)

    busy = (f"other processes on the box (load average {load:.1f} at the start on "
            f"{len(os.sched_getaffinity(0))} cores) take cores from shmpool's workers first")

    def round_trip_target(label: str, name: str) -> report.Target:
        # Informational: a C handoff is ~0.2 µs, a pool step runs Python at both ends.
        moves = ("both ends of a pool step run Python (~6 µs together) against a C handoff of ~0.2 µs: "
                 "not reachable from Python; the wait policy and the CPU move it")
        floor = round_trip.us(PINGPONG) if round_trip else None
        p50 = _over(round_trip.latency(name, "p50"), floor) if round_trip else None
        return report.Target(f"empty-env round trip ({label}) against 5× the spin ping-pong (informational)", 5.0,
                             _over(round_trip.us(name), floor) if round_trip else None, at_most=True,
                             note="" if p50 is None else f"per-call p50: {report.fmt_ratio(p50)}", moves=moves,
                             informational=True)

    default, spin = ROUND_TRIP_POLICIES
    return [
        report.Target("CartPole-v1 N=32 env-only: shmpool sync ≥ 1.6× SyncVectorEnv", 1.6,
                      ratio("CartPole-v1", 32, subjects.POOL_SYNC, subjects.SYNC_VEC),
                      moves=f"needs both cores free (ceiling ~2.4× here); {busy}"),
        report.Target("CartPole-v1 N=32 env-only: shmpool sync ≥ 10× AsyncVectorEnv", 10.0,
                      ratio("CartPole-v1", 32, subjects.POOL_SYNC, subjects.ASYNC_VEC),
                      moves="AsyncVectorEnv's own speed, which varies up to 4× between runs on 2 cores (N processes "
                      "and pipes on 2 cores); it holds when AsyncVectorEnv runs ~8× slower than SyncVectorEnv"),
        report.Target("Ant-v5 N=8 env-only: shmpool sync ≥ 1.8× SyncVectorEnv", 1.8,
                      ratio("Ant-v5", 8, subjects.POOL_SYNC, subjects.SYNC_VEC),
                      moves=f"physics-bound: the ceiling is the number of cores (2×); {busy}"),
        round_trip_target("default wait", default),
        round_trip_target("wait_policy='spin'", spin),
    ]


def write_report(args: argparse.Namespace, env: dict[str, Any], skipped: dict[str, str], groups: list[report.Group],
                 round_trip: report.Group | None, round_trip_note: str, goals: list[report.Target]) -> str:
    """The whole report as markdown: printed once, and the results file."""
    lines = [report.header("shmpool core benchmark", args, env, f"python {env['python']}, numpy {env['numpy']}, "
                           f"gymnasium {env['gymnasium']}, mujoco {env['mujoco']}"), "",
             *([f"**Before the run:** {env['busy']}.", ""] if env.get("busy") else []),
             "Env-only throughput, env steps/s: median (min–max); ratios of medians:", "",
             report.markdown_table(THROUGHPUT_HEADER, throughput_rows(groups))]
    lines += [f"\n{task} skipped — {reason}" for task, reason in skipped.items()]
    if round_trip is not None:
        lines += ["", "Round trip, one empty env on one worker, parent and worker pinned to different cores (µs per "
                  "step = elapsed / steps; p50/p99 per call; × ping-pong = ÷ the C spin ping-pong's µs):", "",
                  report.markdown_table(ROUND_TRIP_HEADER, round_trip_rows(round_trip))]
    else:
        lines += ["", f"Round trip {round_trip_note}."]
    lines += ["", READING, "", "### Targets (medians of this run)", "", *(t.line() for t in goals)]
    return "\n".join(lines)


# --- command line ----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench.core", __doc__)
    p.add_argument("--tasks", help=f"comma list of gymnasium ids (default {','.join(DEFAULT_TASKS)})")
    p.add_argument("--num-envs", help="comma list of N for every task (default: 8,32,128 for CartPole, 8,32 else)")
    p.add_argument("--no-roundtrip", action="store_true", help="skip the round-trip measurements")
    cli.add_run_options(p, cli.RunDefaults(json=DEFAULT_JSON), quick="CartPole-v1 N=8, 0.2 s, 1 repeat")
    args = cli.parse(p, argv)
    quick = args.quick
    args.tasks = cli.comma_list(args.tasks) if args.tasks else (["CartPole-v1"] if quick else list(DEFAULT_TASKS))
    args.num_envs = cli.positive_ints(p, "--num-envs", args.num_envs) if args.num_envs else ([8] if quick else None)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    err = report.stderr_console()
    skipped = {t: why for t in args.tasks if (why := unavailable(t))}
    report.say_skipped(skipped, err)
    env = report.environment()
    env["busy"] = report.busy_machine()
    if env["busy"]:
        err.print(f"[yellow]{env['busy']}[/yellow]", highlight=False)
    cells = [(t, n) for t in args.tasks if t not in skipped for n in args.num_envs or DEFAULT_NUM_ENVS.get(t, (8, 32))]
    groups = report.run_cells(cells, throughput_cases, args, err, len(subjects.SYSTEMS))
    cpus, note = round_trip_cpus(args)
    round_trip = None if cpus is None else report.run_cells([("round trip", 1)], lambda *_: round_trip_cases(*cpus),
                                                            args, err, 1 + len(ROUND_TRIP_POLICIES))[0]
    goals = targets(groups, round_trip, env["loadavg_at_start"][0])
    text = write_report(args, env, skipped, groups, round_trip, note, goals)
    return report.finish(args, "bench.core", env, text, err, groups + ([round_trip] if round_trip else []),
                         skipped=skipped, throughput=[g.to_json() for g in groups],
                         round_trip=round_trip.to_json() if round_trip is not None else {"note": note},
                         targets=[t.to_json() for t in goals])


if __name__ == "__main__":
    raise SystemExit(main())
