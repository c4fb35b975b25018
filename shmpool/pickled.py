"""Pickled leaves: the leaves that cannot live in shared memory travel pickled.

Text, Sequence, Graph, OneOf and custom ``Space`` subclasses have no fixed shape
and dtype, so ``layout`` gives them no array.  Their values go through each
worker's pipe instead, one env at a time, while the other leaves of a Dict/Tuple
stay in shared memory:

- observations: the worker pickles the pickled leaves of each result into the
  result's ``Extra`` side message (status ``STATUS_EXTRA``); the parent keeps each
  env's latest values (:class:`LatestValues`), so envs a partial reset leaves alone
  keep theirs, as their shared rows do;
- actions: the parent bumps the env's version word in shared memory, dispatches,
  then sends ``PickledActions`` on the pipe; a worker reads its pipe until it holds
  that version (``workers.inbox``).  Versions, not arrival order, pair values with
  steps, so an autoreset step or a restarted env that needs no action leaves
  nothing misaligned.

Batched, a pickled leaf is a tuple with one value per env: what gymnasium's
``concatenate`` gives for these spaces (``AsyncVectorEnv(shared_memory=False)``).
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from . import layout as L
from . import protocol as P
from .spacetree import tree_of


def path_name(root: str, path: tuple) -> str:
    """``obs['text']``, ``action[0]``: how a user would index the leaf."""
    return root + "".join(f"[{p!r}]" for p in path)


class PickledLeaves:
    """Which leaves of one space travel pickled, and how to split and rebuild its values.

    ``PickledLeaves.of(space)`` is None when every leaf is shared: callers keep their plain path."""

    def __init__(self, space: spaces.Space) -> None:
        self.space = space
        self.tree = tree_of(space)
        every = self.tree.leaves
        self.slow_at = [k for k, leaf in enumerate(every) if not isinstance(leaf.space, L.SHARED_SPACES)]
        self.shared_at = [k for k, leaf in enumerate(every) if isinstance(leaf.space, L.SHARED_SPACES)]
        self.paths = [every[k].path for k in self.slow_at]
        self.kinds = [type(every[k].space).__name__ for k in self.slow_at]
        self.count = len(every)

    @classmethod
    def of(cls, space: spaces.Space) -> PickledLeaves | None:
        return None if L.all_shared(space) else cls(space)

    def split(self, value) -> tuple[list, tuple]:
        """One structured value: (shared leaf values, pickled leaf values)."""
        parts = self.tree.split(value)
        return [parts[k] for k in self.shared_at], tuple(parts[k] for k in self.slow_at)

    def assemble(self, shared: Sequence, pickled: Sequence) -> Any:
        """The structured value (or batch) from shared leaves and pickled leaves, each in leaf order."""
        parts: list = [None] * self.count
        for k, value in zip(self.shared_at, shared):
            parts[k] = value
        for k, value in zip(self.slow_at, pickled):
            parts[k] = value
        return self.tree.assemble(parts)

    def names(self, root: str) -> list[str]:
        return [path_name(root, p) for p in self.paths]


def warn_pickled(obs_pickled: PickledLeaves | None, act_pickled: PickledLeaves | None, stacklevel: int = 3) -> None:
    """One UserWarning naming the leaves that travel pickled."""
    named = []
    for leaves, root in ((obs_pickled, "obs"), (act_pickled, "action")):
        if leaves is not None:
            named += [f"{name} ({kind})" for name, kind in zip(leaves.names(root), leaves.kinds)]
    if named:
        warnings.warn(
            f"shmpool: {', '.join(named)} cannot be laid out in shared memory; these leaves travel pickled "
            "through each worker's pipe, one env at a time, which is slower (the rest stays in shared memory)",
            UserWarning, stacklevel=stacklevel)


class LatestValues:
    """Parent side: each env's latest values of the pickled observation leaves."""

    def __init__(self, leaves: PickledLeaves, num_envs: int) -> None:
        self.columns: list[list] = [[None] * num_envs for _ in leaves.slow_at]

    def store(self, env_id: int, values: tuple) -> None:
        for column, value in zip(self.columns, values):
            column[env_id] = value

    def batch(self, ids: Sequence[int] | None) -> list[tuple]:
        """Per pickled leaf, a tuple of the values of ``ids`` (every env when None)."""
        if ids is None:
            return [tuple(column) for column in self.columns]
        return [tuple(column[i] for i in ids) for column in self.columns]


def per_env_values(leaves: PickledLeaves, batches: Sequence, rows: int) -> list[tuple]:
    """The pickled leaves of a batch of actions (``PickledLeaves.split``'s second part), as one
    tuple per env with a value per pickled leaf.

    A pickled leaf's batch is any sequence with one value per env (gymnasium batches
    these spaces as a ``Tuple``); each value reaches its env unchanged."""
    columns = []
    for batch, path in zip(batches, leaves.paths):
        try:
            values = list(batch)
        except TypeError:
            raise TypeError(f"{path_name('actions', path)} must be a sequence with one value per env, "
                            f"got {type(batch).__name__}") from None
        if len(values) != rows:
            raise ValueError(f"{path_name('actions', path)} has {len(values)} values; expected {rows} (one per env)")
        columns.append(values)
    return list(zip(*columns))


class PickledActionSender:
    """Parent side of pickled actions: number each env's step in its version word
    (before the dispatch), then send the values to the workers that own the envs."""

    def __init__(self, versions: np.ndarray, owner: np.ndarray, all_ids: np.ndarray) -> None:
        self.versions = versions
        self.owner = owner
        self.all_ids = all_ids

    def stamp(self, ids: np.ndarray | None) -> np.ndarray:
        """Bump the version of ``ids`` (every env when None); returns their new versions."""
        if ids is None:
            self.versions += 1
            return self.versions.copy()
        self.versions[ids] += 1
        return self.versions[ids]

    def messages(self, ids: np.ndarray | None, versions: np.ndarray, values: list[tuple]):
        """``(worker, PickledActions)`` for each worker owning some of ``ids``."""
        ids = self.all_ids if ids is None else np.asarray(ids)
        owners = self.owner[ids]
        for k in np.unique(owners).tolist():
            rows = np.flatnonzero(owners == k).tolist()
            yield k, P.PickledActions([int(ids[r]) for r in rows], [int(versions[r]) for r in rows],
                                   [values[r] for r in rows])
