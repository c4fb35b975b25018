"""A pool's settings, resolved once from its arguments and the machine.

``plan_pool`` turns what the caller asked (``num_workers=None``, ``wait_policy="auto"``,
``parent_shard="auto"``, ...) and what the machine has (allowed cores, a cgroup quota,
torch's threads beside the pool) into one frozen :class:`PoolPlan`.  ``Pool`` builds from
it, ``repr(pool)`` and ``pool.wait_choice`` describe it, and bench and tests read it
(``pool.plan``) instead of re-deriving any of it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from . import _core
from .arguments import (
    check_batch_size,
    check_max_concurrency,
    check_max_lead,
    check_num_workers,
    check_on_worker_error,
    check_parent_shard,
    check_step_timeout,
    check_wake,
    shard_sizes,
    workers_within,
)
from .batched import BatchedEnvs
from .costs import KnownCost, cheap_enough, known_cost
from .neighbours import Neighbour, pinned_neighbours
from .neighbours import describe as describe_neighbours
from .neighbours import warning as neighbour_warning
from .openmp import LEAVE_OPENMP, OpenMPChoice
from .openmp import choose as choose_openmp
from .topology import (
    TrainerThreads,
    WaitChoice,
    allowed_cpus,
    choose_wait_policy,
    cpu_quota,
    default_num_workers,
    oversubscribed,
    resolve_cpus,
    trainer_threads,
    usable_cores,
)


@dataclass(frozen=True)
class PoolPlan:
    """Every setting of one pool, resolved.

    ``worker_cpus[k]`` is worker ``k``'s core, None for the shard this process steps
    (``parent_shard``); ``bounds[k]`` its envs ``[start, end)``."""

    num_envs: int
    num_workers: int
    batch_size: int
    max_lead: int | None
    max_concurrency: int | None
    cpus: tuple[int, ...]
    cpu_quota: float | None
    worker_cpus: tuple[int | None, ...]
    parent_shard: int | None
    pinned: bool
    wait_choice: WaitChoice
    step_timeout: float | None
    on_worker_error: str
    use_semaphores: bool
    shard_sizes: tuple[int, ...]
    trainer: TrainerThreads
    layout_note: str = ""   # why the layout differs from the default one, when it does
    openmp: OpenMPChoice = LEAVE_OPENMP   # what the pool does about the trainer's OpenMP spin
    step_cost: KnownCost | None = None   # one env step's known cost (shmpool.costs), when the layout asked
    neighbours: tuple[Neighbour, ...] = ()   # other processes' pool workers pinned to our cores (shmpool.neighbours)

    @property
    def bounds(self) -> list[tuple[int, int]]:
        ends = list(itertools.accumulate(self.shard_sizes))
        return [(e - s, e) for s, e in zip(self.shard_sizes, ends)]

    @property
    def owner(self) -> np.ndarray:
        """The worker of each env (int32, one per env)."""
        return np.repeat(np.arange(self.num_workers, dtype=np.int32), self.shard_sizes)

    @property
    def process_cpus(self) -> list[int]:
        """The cores of the worker processes (a parent shard has none)."""
        return [c for c in self.worker_cpus if c is not None]

    @property
    def crowded(self) -> bool:
        """The worker processes and this process outnumber the cores they may use."""
        return oversubscribed(self.process_cpus, allowed_cpus(), self.cpu_quota)

    @property
    def spin_warning(self) -> str | None:
        """What to warn of when a spinning wait was asked for where the processes share cores."""
        if not self.crowded or "spin" not in (self.wait_choice.parent.name, self.wait_choice.worker.name):
            return None
        return (f"wait_policy 'spin' with {self.num_workers} workers on cpus {sorted(set(self.process_cpus))} and "
                "the parent sharing them: a spinning process keeps a core another one needs; expect a large slowdown")

    @property
    def warnings(self) -> list[str]:
        """What the pool warns of once, when it is built."""
        notes = [self.spin_warning] if self.spin_warning else []
        if self.neighbours:
            taken = {n.cpu for n in self.neighbours}
            notes.append(neighbour_warning(self.neighbours, [c for c in allowed_cpus() if c not in taken]))
        return notes

    def describe_layout(self) -> str:
        """Where the workers run, as ``repr(pool)`` says it."""
        quota = "" if self.cpu_quota is None else f", cpu quota {self.cpu_quota:g}"
        cpus = self.process_cpus
        where = f"on cpus {cpus}" if self.pinned else f"unpinned on cpus {list(self.cpus)}"
        if self.parent_shard is not None:
            processes = f"{len(cpus)} in processes {where}" if cpus else "no worker process"
            where = f"({processes}, worker {self.parent_shard}'s shard stepped in this process)"
        if self.layout_note:
            where = f"({self.layout_note})"
        workers = "1 worker" if self.num_workers == 1 else f"{self.num_workers} workers"
        shared = f", {describe_neighbours(self.neighbours)}" if self.neighbours else ""
        return f"{workers} {where}{quota}{shared}"


def plan_pool(fns, *, num_workers: int | None, batch_size: int | None, cpus, wait_policy,
              step_timeout: float | None, wake: str, on_worker_error: str, pin: bool,
              max_concurrency: int | None, max_lead, parent_shard) -> PoolPlan:
    """Resolve a pool's settings for the env constructors ``fns`` (see ``Pool`` for each
    argument); raises the argument checks' errors."""
    n = len(fns)
    batched = isinstance(fns, BatchedEnvs)
    # A Batched env is one constructor sliced into shards: its envs are alike.
    alike = batched or all(f is fns[0] for f in fns)
    lead = check_max_lead(max_lead, alike)
    cores = resolve_cpus(cpus)
    quota = cpu_quota()   # cgroup CPU limit in cpus (docker --cpus), None if none
    chosen = num_workers is not None
    if not chosen:
        num_workers = default_num_workers(cores, quota, n)
    concurrency = check_max_concurrency(max_concurrency)
    w = check_num_workers(workers_within(num_workers, concurrency, chosen), n)
    batch = check_batch_size(batch_size, n)
    timeout = check_step_timeout(step_timeout)
    on_error = check_on_worker_error(on_worker_error)
    use_sems = check_wake(wake, _core.have_futex(), on_error, batched)
    worker_cpus = [cores[k % len(cores)] for k in range(w)]
    allowed = allowed_cpus()
    trainer = trainer_threads()   # read once: the layout and the wait choice see the same trainer
    hosting = check_parent_shard(parent_shard, oversubscribed(worker_cpus, allowed, quota), chosen, timeout,
                                 on_error, batch < n, trainer.leaves_a_core(usable_cores(allowed, quota)))
    note = ""
    cost = None
    if hosting and parent_shard == "auto" and w > 1 and not batched and trainer.torch_threads is not None:
        # A trainer beside us and envs this cheap: every env here beats any hand-off (shmpool.costs).
        # Known from which env the constructors name, before any env exists: none is run for it.
        cost = known_cost(fns)
        if cheap_enough(cost, n):
            w = 1
            worker_cpus = worker_cpus[:1]
            note = (f"every env stepped in this process: {cost.describe()}, {n} of them less than handing a "
                    "shard to a worker beside the trainer")
    if hosting:   # the last (never the largest) shard: the parent also gathers the results
        worker_cpus = worker_cpus[:-1]
    choice = choose_wait_policy(wait_policy, worker_cpus, allowed, quota, trainer, hosted=hosting)
    neighbours = tuple(pinned_neighbours(worker_cpus)) if pin and worker_cpus else ()
    return PoolPlan(
        num_envs=n, num_workers=w, batch_size=batch, max_lead=lead, max_concurrency=concurrency,
        cpus=tuple(cores), cpu_quota=quota, worker_cpus=tuple(worker_cpus) + (None,) * hosting,
        parent_shard=w - 1 if hosting else None, pinned=bool(pin), wait_choice=choice, step_timeout=timeout,
        on_worker_error=on_error, use_semaphores=use_sems, shard_sizes=tuple(shard_sizes(n, w)),
        trainer=trainer, layout_note=note, openmp=choose_openmp(bool(worker_cpus)), step_cost=cost,
        neighbours=neighbours)
