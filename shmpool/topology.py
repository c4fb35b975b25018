"""Which cores a pool may use, and how its waiters should behave on them."""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from . import _core


def parse_cpu_list(spec: str) -> list[int]:
    """Parse taskset/cpuset syntax (``"0-3,8,10-14:2"``) into a sorted list of cpu ids."""
    if not isinstance(spec, str):
        raise TypeError(f"cpu list must be a string, got {type(spec).__name__}")
    cpus: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        stride = 1
        if ":" in part:
            part, s = part.split(":", 1)
            stride = _cpu_int(s, spec)
            if stride <= 0:
                raise ValueError(f"invalid cpu list {spec!r}: stride must be positive")
        if "-" in part:
            lo_s, hi_s = part.split("-", 1)
            lo, hi = _cpu_int(lo_s, spec), _cpu_int(hi_s, spec)
            if hi < lo:
                raise ValueError(f"invalid cpu list {spec!r}: range {lo}-{hi} is reversed")
            cpus.update(range(lo, hi + 1, stride))
        else:
            cpus.add(_cpu_int(part, spec))
    if not cpus:
        raise ValueError(f"invalid cpu list {spec!r}: no cpus")
    return sorted(cpus)


def _cpu_int(text: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"invalid cpu list {spec!r}: {text!r} is not a cpu number") from None
    if value < 0:
        raise ValueError(f"invalid cpu list {spec!r}: negative cpu {value}")
    return value


def allowed_cpus() -> list[int]:
    """Cores this process may run on (taskset, numactl and cgroup limits respected)."""
    return sorted(os.sched_getaffinity(0))


def resolve_cpus(cpus: str | Iterable[int] | None) -> list[int]:
    """The cores a pool pins its workers to: ``cpus`` checked against the allowed set."""
    allowed = allowed_cpus()
    if cpus is None:
        return allowed
    chosen = parse_cpu_list(cpus) if isinstance(cpus, str) else [int(c) for c in cpus]
    if not chosen:
        raise ValueError("cpus must name at least one cpu")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"cpus lists a cpu twice: {chosen}")
    outside = sorted(set(chosen) - set(allowed))
    if outside:
        raise ValueError(f"cpus {outside} are outside this process's allowed set {allowed}")
    return chosen


# --- CPU quotas (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us) ---

SYSFS_NODES = "/sys/devices/system/node"


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The inverse of :func:`parse_cpu_list` (without strides): ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def numa_nodes(root: str | os.PathLike = SYSFS_NODES) -> dict[int, list[int]]:
    """Every NUMA node's cpus as sysfs lists them (``nodeN/cpulist``), in node order: node id -> sorted
    cpu ids (empty for a memory-only node); ``{}`` where sysfs has no nodes.  A node whose list cannot
    be read or parsed is left out."""
    nodes = {}
    for d in Path(root).glob("node*"):
        if d.name[4:].isdigit():
            try:
                text = (d / "cpulist").read_text().strip()
                nodes[int(d.name[4:])] = parse_cpu_list(text) if text else []
            except (OSError, ValueError):
                continue
    return dict(sorted(nodes.items()))


def split_by_node(cpus: Iterable[int], nodes: dict[int, list[int]]) -> list[list[int]]:
    """``cpus`` grouped by NUMA node (``nodes`` as :func:`numa_nodes` gives them) in node order, each
    group in the order of ``cpus``; cores of no known node come first, as one group."""
    groups: dict[int, list[int]] = {}
    for c in cpus:
        groups.setdefault(next((k for k, on in nodes.items() if c in on), -1), []).append(c)
    return [groups[k] for k in sorted(groups)]


def parse_cpu_max(text: str) -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"50000 100000"``); None if unlimited."""
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    quota = int(fields[0])
    period = int(fields[1]) if len(fields) > 1 else 100_000
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """CPUs allowed by cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; None if unlimited (-1)."""
    quota, period = int(quota_text.strip()), int(period_text.strip())
    return quota / period if quota > 0 and period > 0 else None


def parse_proc_cgroup(text: str) -> tuple[str | None, str | None]:
    """(v2 path, v1 cpu-controller path) of a process from its ``/proc/<pid>/cgroup``."""
    v2 = v1 = None
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _v1_cpu_mount(root: Path) -> Path | None:
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        if (root / name / "cpu.cfs_quota_us").exists():
            return root / name
    return None


def _ancestors(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory and each parent up to the mount (a limit anywhere above applies)."""
    parts = [p for p in path.split("/") if p]
    return [mount.joinpath(*parts[:k]) for k in range(len(parts), -1, -1)]


def cpu_quota(proc_cgroup: str | Path = "/proc/self/cgroup", root: str | Path = "/sys/fs/cgroup") -> float | None:
    """CPUs this process may use per period under its cgroups' CPU quota (the tightest
    of its cgroup and their parents, v2 and v1); None when no quota applies.

    ``docker --cpus=1`` and Kubernetes CPU limits set it; the affinity mask
    (``allowed_cpus``) does not show it."""
    root = Path(root)
    try:
        v2, v1 = parse_proc_cgroup(Path(proc_cgroup).read_text())
    except OSError:
        return None
    found: list[float] = []
    if v2 is not None:
        mount = root if (root / "cgroup.controllers").exists() else root / "unified"
        for d in _ancestors(mount, v2):
            try:
                q = parse_cpu_max((d / "cpu.max").read_text())
            except (OSError, ValueError):
                continue
            if q is not None:
                found.append(q)
    mount = _v1_cpu_mount(root)
    if v1 is not None and mount is not None:
        for d in _ancestors(mount, v1):
            try:
                q = parse_cfs_quota((d / "cpu.cfs_quota_us").read_text(), (d / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                continue
            if q is not None:
                found.append(q)
    return min(found) if found else None


def usable_cores(cpus: list[int], quota: float | None) -> int:
    """Cores' worth of CPU time: the cpu count, capped by the quota (at least 1)."""
    if quota is None:
        return len(cpus)
    return max(1, min(len(cpus), math.floor(quota + 1e-9)))


def default_num_workers(cpus: list[int], quota: float | None, num_envs: int) -> int:
    """One worker per usable core (a 1-CPU quota gets one worker, the parent waits beside it)."""
    return max(1, min(usable_cores(cpus, quota), num_envs))


# --- the trainer's threads --------------------------------------------------

SPIN_SETTINGS = ("GOMP_SPINCOUNT", "KMP_BLOCKTIME")


@dataclass(frozen=True)
class TrainerThreads:
    """What the trainer in this process runs beside the pool."""

    torch_threads: int | None      # torch.get_num_threads(), if torch is imported
    omp_num_threads: str | None    # OMP_NUM_THREADS as set
    omp_wait_policy: str | None    # OMP_WAIT_POLICY as set
    # How long OpenMP threads spin after each parallel region before they sleep (libgomp's
    # GOMP_SPINCOUNT, Intel OpenMP's KMP_BLOCKTIME), as set: docs/performance.md says why it matters.
    spin_settings: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        parts = []
        if self.torch_threads is not None:
            parts.append(f"torch {self.torch_threads} thread{'' if self.torch_threads == 1 else 's'}")
        if self.omp_num_threads is not None:
            parts.append(f"OMP_NUM_THREADS={self.omp_num_threads}")
        if self.omp_wait_policy is not None:
            parts.append(f"OMP_WAIT_POLICY={self.omp_wait_policy}")
        parts += [f"{name}={value}" for name, value in self.spin_settings]
        return ", ".join(parts) or "no torch/OpenMP settings seen"

    def leaves_a_core(self, cores: int) -> bool:
        """True when torch (or OMP_NUM_THREADS) runs fewer threads than ``cores``: a core is
        free while the trainer computes."""
        if self.torch_threads is not None:
            return self.torch_threads < cores
        try:
            return self.omp_num_threads is not None and int(self.omp_num_threads) < cores
        except ValueError:   # "4,2" (nested levels) or junk: OpenMP's own parsing is not ours
            return False


def trainer_threads() -> TrainerThreads:
    """Read torch's thread count (only if torch is already imported: never import it) and OpenMP's settings."""
    torch = sys.modules.get("torch")
    n = None
    if torch is not None:
        try:
            n = int(torch.get_num_threads())
        except Exception:  # a half-imported or stub torch
            n = None
    spin = tuple((name, os.environ[name]) for name in SPIN_SETTINGS if name in os.environ)
    return TrainerThreads(n, os.environ.get("OMP_NUM_THREADS"), os.environ.get("OMP_WAIT_POLICY"), spin)


# Spin/yield budgets in ns.  Measured on the 2-vCPU KVM guest: waking a
# sleeping vCPU costs 70-140 us, a busy spin answers in ~1 us but burns a core.
WAIT_POLICIES = {
    "spin": _core.WaitPolicy("spin", 10_000_000_000, 0),
    "hybrid": _core.WaitPolicy("hybrid", 50_000, 200_000),
    # Workers keep yielding for 10 ms: on these VMs a vCPU that goes idle
    # takes ~1 ms to wake (Ant-v5, 2 workers: block 0.92x vs yield 1.88x
    # SyncVectorEnv), so idling between two steps must not happen.
    "yield": _core.WaitPolicy("yield", 2_000, 10_000_000),
    "block": _core.WaitPolicy("block", 2_000, 0),
    # Workers under "auto": yield for up to 200 us while commands come that
    # soon (an env-only loop: the parent turns around in tens of us), sleep at
    # once while they come later (a trainer computing between steps).
    "adaptive": _core.WaitPolicy("adaptive", 2_000, 200_000, True),
}


def oversubscribed(worker_cpus: list[int], allowed: list[int], quota: float | None = None) -> bool:
    """True when workers share cores, or no allowed core (or quota) is left for the parent."""
    if len(worker_cpus) > len(set(worker_cpus)) or not set(allowed) - set(worker_cpus):
        return True
    return quota is not None and len(worker_cpus) + 1 > quota


@dataclass(frozen=True)
class WaitChoice:
    """The wait policies a pool runs with, and why (``repr(pool)`` shows ``reason``)."""

    parent: _core.WaitPolicy
    worker: _core.WaitPolicy
    reason: str

    def __str__(self) -> str:
        return f"parent {self.parent.name}, workers {self.worker.name}: {self.reason}"


def choose_wait_policy(policy, worker_cpus: list[int], allowed: list[int], quota: float | None,
                       trainer: TrainerThreads | None = None, hosted: bool = False) -> WaitChoice:
    """Resolve ``wait_policy`` for a pool's layout (``worker_cpus``: the worker processes'
    cores; ``hosted``: the parent steps a shard too), and say why."""
    crowded = oversubscribed(worker_cpus, allowed, quota)
    parent, worker = resolve_wait_policy(policy, crowded)
    n = len(worker_cpus)
    room = f"{n} worker{'' if n == 1 else 's'} + parent on {len(set(allowed))} cpus"
    if quota is not None:
        room += f" (quota {quota:g})"
    if hosted:
        room += ", the parent stepping a shard itself"
    if policy != "auto":
        return WaitChoice(parent, worker, f"as asked; {room}")
    trainer = trainer_threads() if trainer is None else trainer
    why = ("crowded: the parent sleeps while workers step, so it never takes a worker's core"
           if crowded else "a core to spare: the parent spins briefly, then sleeps")
    return WaitChoice(parent, worker, f"{room}; {why}; workers yield only while commands come within "
                      f"{(worker.spin_ns + worker.yield_ns) / 1000:g} µs, else sleep; trainer: {trainer.describe()}")


def resolve_wait_policy(policy, crowded: bool) -> tuple[_core.WaitPolicy, _core.WaitPolicy]:
    """(parent, worker) wait policies from a name, one WaitPolicy, or a pair.

    ``crowded``: processes outnumber cores (see ``oversubscribed``); "auto"
    then avoids long busy spins, which would steal the core a worker needs.
    "auto" workers are adaptive: they spin only while commands come soon."""
    if isinstance(policy, tuple):
        parent, worker = policy
        return resolve_wait_policy(parent, crowded)[0], resolve_wait_policy(worker, crowded)[1]
    if isinstance(policy, _core.WaitPolicy):
        return policy, policy
    if policy == "auto":
        # Measured on 2 vCPUs with 2 workers: a sleeping parent woken by the
        # last worker beats every spinning parent, which steals a worker's
        # core.  Workers yield-spin while the parent turns steps around fast
        # (waking an idle vCPU costs 70-140 us) and sleep while a trainer
        # computes between steps (their spinning took its cores: 0.2x
        # SyncVectorEnv in a PPO loop).  A fresh copy per pool: it learns.
        worker = _fresh(WAIT_POLICIES["adaptive"])
        return (WAIT_POLICIES["block"] if crowded else WAIT_POLICIES["hybrid"]), worker
    try:
        return WAIT_POLICIES[policy], _fresh(WAIT_POLICIES[policy])
    except KeyError:
        raise ValueError(
            f"unknown wait_policy {policy!r}; choose one of {['auto', *WAIT_POLICIES]}"
        ) from None


def _fresh(policy: _core.WaitPolicy) -> _core.WaitPolicy:
    return _core.WaitPolicy(policy.name, policy.spin_ns, policy.yield_ns, policy.adaptive)
