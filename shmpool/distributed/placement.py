"""Where a :class:`~shmpool.distributed.RayPool`'s envs run: which node holds each pool, which
contiguous env range each pool owns, each pool's sub-batch, and the cores of a pool inside its
node.  Pure Python and numpy; the node list comes from Ray, but nothing here calls it."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..arguments import check_batch_size, check_count, shard_sizes
from ..topology import SYSFS_NODES, numa_nodes


@dataclass(frozen=True)
class Slot:
    """Pool ``index`` of the ``per_node`` pools (an int, or ``"numa"``) on Ray node ``node_id``."""

    node_id: str
    index: int
    per_node: int | str


def apportion(total: int, sizes: list[int]) -> list[int]:
    """``total`` split in proportion to ``sizes`` (largest remainders), each at least 1 and at most its size."""
    n = sum(sizes)
    exact = [total * s / n for s in sizes]
    out = [max(1, min(s, int(x))) for s, x in zip(sizes, exact)]
    order = sorted(range(len(sizes)), key=lambda k: exact[k] - int(exact[k]), reverse=True)
    i = 0
    while sum(out) < total and i < 4 * len(sizes):
        k = order[i % len(sizes)]
        if out[k] < sizes[k]:
            out[k] += 1
        i += 1
    return out


class Placement:
    """The envs split into contiguous ranges, one per pool, and the pools over the nodes.

    ``slots[k]``: the node of pool ``k``; ``sizes[k]``: its env count; ``starts`` ``(P,)`` int64:
    its first global env id; ``owner`` ``(num_envs,)`` int64: the pool of each env;
    ``sub_batch_sizes[k]``: the local pool's ``batch_size``."""

    def __init__(self, slots: list[Slot], num_envs: int, env_counts: Sequence[int] | None,
                 batch_size: int | None, sub_batch_sizes: Sequence[int] | None) -> None:
        P = len(slots)
        if P == 0:
            raise ValueError("no Ray node to run on")
        if env_counts is None:
            if num_envs < P:
                raise ValueError(f"num_envs={num_envs} is fewer than the {P} pools: every pool needs an env")
            sizes = shard_sizes(num_envs, P)
        else:
            sizes = [check_count("env_counts[]", c) for c in env_counts]
            if len(sizes) != P or sum(sizes) != num_envs:
                raise ValueError(f"env_counts {list(env_counts)} must give {P} pools summing to num_envs={num_envs}")
        B = check_batch_size(batch_size, num_envs)
        if sub_batch_sizes is None:
            subs = apportion(B, sizes)
        else:
            subs = [check_count("sub_batch_sizes[]", b) for b in sub_batch_sizes]
            if len(subs) != P:
                raise ValueError(f"sub_batch_sizes needs {P} entries (one per pool), got {len(subs)}")
        for k, (b, s) in enumerate(zip(subs, sizes)):
            if b > s:
                raise ValueError(f"sub_batch_sizes[{k}]={b} is more than pool {k}'s {s} envs")
        self.slots = list(slots)
        self.num_envs = num_envs
        self.sizes = sizes
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.owner = np.repeat(np.arange(P, dtype=np.int64), sizes)
        self.batch_size = B
        self.sub_batch_sizes = subs

    @property
    def num_pools(self) -> int:
        return len(self.slots)

    def env_range(self, k: int) -> range:
        """Global env ids owned by pool ``k``."""
        a = int(self.starts[k])
        return range(a, a + self.sizes[k])

    def by_pool(self, ids: np.ndarray) -> dict[int, np.ndarray]:
        """Positions in ``ids`` (global env ids) of each pool's envs, pools in ascending order."""
        owners = self.owner[ids]
        if len(owners) and (owners == owners[0]).all():   # one pool's, as a recv's sub-batch sent back: no np.unique
            return {int(owners[0]): np.arange(len(owners))}
        return {k: np.flatnonzero(owners == k) for k in np.unique(owners).tolist()}


def describe_range(r: range) -> str:
    """``"4..7"`` for ``range(4, 8)``, as messages name a pool's envs."""
    return f"{r.start}..{r.stop - 1}"


def numa_cpu_groups(root: str | os.PathLike = SYSFS_NODES) -> list[list[int]]:
    """The cores this process may use, grouped by NUMA node (one group if sysfs has none)."""
    allowed = sorted(os.sched_getaffinity(0))
    groups = [[c for c in allowed if c in on] for on in numa_nodes(root).values()]
    return [g for g in groups if g] or [allowed]


def slot_cpus(slot: int, per_node: int | str) -> list[int] | None:
    """The cores of pool ``slot`` among the ``per_node`` pools of this node (None: all of them).

    ``"numa"``: the cores of NUMA node ``slot``; an int: an even, contiguous share of the cores this
    process may use (shared round-robin when there are fewer cores than pools)."""
    if per_node == "numa":
        groups = numa_cpu_groups()
        return groups[slot % len(groups)]
    if per_node == 1:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    sizes = shard_sizes(len(allowed), per_node) if len(allowed) >= per_node else [1] * per_node
    start = sum(sizes[:slot]) % len(allowed)
    return [allowed[(start + i) % len(allowed)] for i in range(sizes[slot])]
