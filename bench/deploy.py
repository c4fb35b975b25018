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
import functools
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from . import cli, report, subjects
from ._timing import Case, DeviceShape, Sample, timed_loop

CGROUP = Path("/sys/fs/cgroup")
SYSTEMS = ("SyncVectorEnv", "shmpool sync")
LOOPS = ("env-only", "trainer-shaped")


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


class DeployLoop:
    """``system`` (``SYSTEMS``) on CartPole-v1 stepped env-only or in the trainer-shaped loop; ``info``: the
    pool's ``repr`` and its worker processes' CPU over the wall time of the last sample."""

    def __init__(self, system: str, n: int, trainer: bool, wait_policy: str | tuple[str, str] = "auto") -> None:
        pool = system != SYSTEMS[0]
        self.vec = subjects.open_vec(subjects.POOL if pool else subjects.SYNC_VEC, "CartPole-v1", n,
                                     **({"wait_policy": wait_policy} if pool else {}))
        try:
            self.vec.reset()
            step = self.vec.stepping(np.zeros(n, dtype=np.int64))
        except BaseException:
            self.vec.close()
            raise
        # Worker processes only: a shard this process steps (parent_shard) is the loop's own CPU.
        self.pids = [pid for pid in self.vec.env.worker_pids if pid != os.getpid()] if pool else []
        self.info: dict[str, Any] = {"described": repr(self.vec.env) if pool else system}
        self.n = n

        device = DeviceShape()

        def once() -> None:
            step()
            if trainer:
                device.call()
        self._once = once

    def _worker_cpu(self) -> float:
        return sum(subjects.cpu_seconds(pid) for pid in self.pids)

    def measure(self, seconds: float, warmup: float) -> Sample:
        timed_loop(self._once, self.n, warmup)
        cpu = self._worker_cpu()
        sample = timed_loop(self._once, self.n, seconds)
        self.info["worker_cpu_share"] = (self._worker_cpu() - cpu) / sample.seconds if self.pids else None
        return sample

    def close(self) -> None:
        self.vec.close()


def rows(groups: list[report.Group]) -> list[list[str]]:
    out = []
    for g in groups:
        for system in SYSTEMS:
            if g.task == LOOPS[1]:   # ms per iteration: the ratio of rates is SyncVectorEnv's ms ÷ this one's
                shown = report.fmt_summary(g.us(system), lambda us, n=g.num_envs: f"{us * n / 1e3:.2f} ms/iter")
            else:
                shown = report.fmt_summary(g.rate(system), lambda r: f"{report.fmt_rate(r)} steps/s")
            shares = [r.info["worker_cpu_share"] for r in g.records
                      if r.case == system and r.info.get("worker_cpu_share") is not None]
            out.append([g.task, system, shown, report.fmt_ratio(g.ratio(system, SYSTEMS[0])),
                        f"{statistics.median(shares):.0%}" if shares else "—"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("python -m bench deploy", __doc__)
    p.add_argument("--cpu-quota", type=float, help="run inside a cgroup with this many CPUs of quota (root)")
    p.add_argument("--num-envs", type=int, help="N (default 32, --quick 8)")
    p.add_argument("--wait-policy", default="auto", help="the pool's wait_policy: a name, or parent/workers "
                   "such as block/block (default auto)")
    cli.add_run_options(p, cli.RunDefaults(), quick="N=8, 0.2 s, 1 repeat")
    args = cli.parse(p, argv, num_envs=(32, 8))
    policy, err, env = parse_wait_policy(args.wait_policy), report.stderr_console(), report.environment()
    where = contextlib.nullcontext() if args.cpu_quota is None else cpu_quota_group(args.cpu_quota)
    with where:
        groups = report.run_cells([(loop, args.num_envs) for loop in LOOPS], lambda loop, n: [
            Case(s, functools.partial(DeployLoop, s, n, loop == LOOPS[1], policy)) for s in SYSTEMS], args, err,
            len(SYSTEMS))
    pools = {r.info["described"] for g in groups for r in g.records if r.case == SYSTEMS[1] and r.info}
    quota = "no quota" if args.cpu_quota is None else f"CPU quota {args.cpu_quota:g}"
    text = "\n".join([report.header("Where users deploy", args, env, f"CartPole-v1 N={args.num_envs}, {quota}, "
                                    f"wait_policy {args.wait_policy}; trainer-shaped = step, 3 ms sleep, 0.5 ms CPU"),
                      "", *(f"pool: {d}" for d in sorted(pools)), "", report.markdown_table(
                          ["loop", "system", "median (min–max)", "÷ SyncVectorEnv (higher is better)",
                           "workers' CPU ÷ wall"], rows(groups))])
    return report.finish(args, "bench.deploy", env, text, err, groups, loops=[g.to_json() for g in groups])


if __name__ == "__main__":
    raise SystemExit(main())
