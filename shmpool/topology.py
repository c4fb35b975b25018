"""Which cores a pool may use, and how its waiters should behave on them."""
from __future__ import annotations

import os
from collections.abc import Iterable

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
}


def oversubscribed(worker_cpus: list[int], allowed: list[int]) -> bool:
    """True when workers share cores, or no allowed core is left for the parent."""
    return len(worker_cpus) > len(set(worker_cpus)) or not set(allowed) - set(worker_cpus)


def resolve_wait_policy(policy, crowded: bool) -> tuple[_core.WaitPolicy, _core.WaitPolicy]:
    """(parent, worker) wait policies from a name, one WaitPolicy, or a pair.

    ``crowded``: processes outnumber cores (see ``oversubscribed``); "auto"
    then avoids long busy spins, which would steal the core a worker needs."""
    if isinstance(policy, tuple):
        parent, worker = policy
        return resolve_wait_policy(parent, crowded)[0], resolve_wait_policy(worker, crowded)[1]
    if isinstance(policy, _core.WaitPolicy):
        return policy, policy
    if policy == "auto":
        # Measured on 2 vCPUs with 2 workers: a sleeping parent woken by the
        # last worker beats every spinning parent, which steals a worker's
        # core; workers yield-spin so their vCPUs never idle (waking an idle
        # vCPU costs 70-140 us) and the parent can still run on them.
        if crowded:
            return WAIT_POLICIES["block"], WAIT_POLICIES["yield"]
        policy = "hybrid"
    try:
        return WAIT_POLICIES[policy], WAIT_POLICIES[policy]
    except KeyError:
        raise ValueError(
            f"unknown wait_policy {policy!r}; choose one of {['auto', *WAIT_POLICIES]}"
        ) from None
