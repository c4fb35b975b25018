"""Where users deploy: a CPU quota, and the CPU the workers burn while a trainer is busy elsewhere.

    python -m bench deploy                    # the machine as it is
    python -m bench deploy --cpu-quota 1      # inside a child cgroup limited to 1 CPU (root; v1 or v2)
    python -m bench deploy --wait-policy block/block   # the pool with other waiting (parent/workers)

SyncVectorEnv against shmpool.Pool (default settings), CartPole-v1: env-only steps/s, and a
trainer-shaped loop (3 ms sleep for a GPU + 0.5 ms host CPU per step) in ms per iteration with the
workers' CPU over wall time.  How to read it: bench/README.md, "deploy".
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil

from . import subjects
from .cli import parser

CGROUP = Path("/sys/fs/cgroup")
GPU_WAIT_S = 0.003
HOST_CPU_S = 0.0005


@contextlib.contextmanager
def cpu_quota_group(cpus: float) -> Iterator[Path]:
    """Run the rest of this process (and its children) in a new cgroup with ``cpus`` of CPU quota."""
    v1 = next((CGROUP / n for n in ("cpu", "cpu,cpuacct") if (CGROUP / n / "cpu.cfs_quota_us").exists()), None)
    base = v1 if v1 is not None else CGROUP
    if v1 is None and not (CGROUP / "cgroup.controllers").exists():
        raise SystemExit("no cgroup cpu controller is mounted here: --cpu-quota cannot be applied")
    group = base / f"shmpool-bench-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        raise SystemExit(f"cannot make a cgroup in {base} ({exc}): --cpu-quota needs root and a writable "
                         "cgroup cpu controller") from None
    period = 100_000
    if v1 is not None:
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))
    else:
        (group / "cpu.max").write_text(f"{int(cpus * period)} {period}")
    (group / "cgroup.procs").write_text(str(os.getpid()))
    try:
        yield group
    finally:
        (base / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(50):   # exited workers leave the group a moment after close()
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def parse_wait_policy(text: str) -> str | tuple[str, str]:
    """``"auto"`` or ``"block"`` (both sides), or ``"parent/workers"`` such as ``"block/block"``."""
    parent, _, workers = text.partition("/")
    return (parent, workers) if workers else parent


def _open(system: str, n: int, wait_policy: str | tuple[str, str] = "auto") -> tuple[subjects.Vec, list[int], str]:
    if system == "SyncVectorEnv":
        vec = subjects.open_vec(subjects.SYNC_VEC, "CartPole-v1", n)
        vec.reset()
        return vec, [], system
    vec = subjects.open_vec(subjects.POOL, "CartPole-v1", n, wait_policy=wait_policy)
    vec.reset()
    # Worker processes only: a shard this process steps (parent_shard) is the loop's own CPU.
    return vec, [pid for pid in vec.env.worker_pids if pid != os.getpid()], repr(vec.env)


def _worker_cpu(pids: list[int]) -> float:
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(system: str, n: int, seconds: float, trainer: bool,
            wait_policy: str | tuple[str, str] = "auto") -> dict:
    """One repetition: env steps/s (env-only) or ms per iteration and workers' CPU share (trainer)."""
    vec, pids, described = _open(system, n, wait_policy)
    step = vec.stepping(np.zeros(n, dtype=np.int64))
    try:
        def once() -> None:
            step()
            if trainer:
                time.sleep(GPU_WAIT_S)
                _burn(HOST_CPU_S)
        for _ in range(20):
            once()
        c0, t0, calls = _worker_cpu(pids), time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            once()
            calls += 1
        wall = time.perf_counter() - t0
        cpu = (_worker_cpu(pids) - c0) / wall if pids else None
    finally:
        vec.close()
    return {"system": system, "steps_per_s": calls * n / wall, "ms_per_iter": 1e3 * wall / calls,
            "worker_cpu_share": cpu, "described": described}


def run(n: int, seconds: float, repeats: int, wait_policy: str | tuple[str, str] = "auto") -> list[str]:
    systems = ("SyncVectorEnv", "shmpool sync")
    rows = []
    for trainer in (False, True):
        runs: dict[str, list[dict]] = {s: [] for s in systems}
        for _ in range(repeats):
            for s in systems:
                runs[s].append(measure(s, n, seconds, trainer, wait_policy))
        base = statistics.median(r["ms_per_iter" if trainer else "steps_per_s"] for r in runs[systems[0]])
        for s in systems:
            rs = runs[s]
            if trainer:
                v = [r["ms_per_iter"] for r in rs]
                value, ratio = f"{statistics.median(v):.2f} ms/iter ({min(v):.2f}–{max(v):.2f})", \
                    base / statistics.median(v)
            else:
                v = [r["steps_per_s"] for r in rs]
                value, ratio = f"{statistics.median(v) / 1e3:.1f}k steps/s ({min(v) / 1e3:.1f}k–{max(v) / 1e3:.1f}k)", \
                    statistics.median(v) / base
            share = [r["worker_cpu_share"] for r in rs if r["worker_cpu_share"] is not None]
            rows.append(f"| {'trainer-shaped' if trainer else 'env-only'} | {s} | {value} | {ratio:.2f}× | "
                        f"{f'{statistics.median(share):.0%}' if share else '—'} |")
        print(f"pool: {runs['shmpool sync'][-1]['described']}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench deploy", __doc__)
    ap.add_argument("--cpu-quota", type=float, help="run inside a cgroup with this many CPUs of quota (root)")
    ap.add_argument("--num-envs", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--wait-policy", default="auto", help="the pool's wait_policy: a name, or parent/workers "
                    "such as block/block (default auto)")
    a = ap.parse_args(argv)
    where = contextlib.nullcontext() if a.cpu_quota is None else cpu_quota_group(a.cpu_quota)
    with where:
        rows = run(a.num_envs, a.seconds, a.repeats, parse_wait_policy(a.wait_policy))
    quota = "no quota" if a.cpu_quota is None else f"CPU quota {a.cpu_quota:g}"
    print(f"\nCartPole-v1 N={a.num_envs}, {quota}, wait_policy {a.wait_policy}, "
          f"cpus {sorted(os.sched_getaffinity(0))}, {a.repeats} interleaved repetitions × {a.seconds:g} s; "
          "trainer-shaped = step, 3 ms sleep, 0.5 ms CPU\n")
    print("| loop | system | median (min–max) | ÷ SyncVectorEnv (higher is better) | workers' CPU ÷ wall |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
