"""A shard's env constructors on their way to the worker that builds them.

gymnasium's AsyncVectorEnv sends each constructor to its own process, so with
``[lambda: Env(space)] * 3`` every env holds a private copy of ``space`` (and of its
random generator).  A shmpool worker builds several envs, and a hosted shard is
built in the trainer's process: unpickling a shard's constructors as one list would
give its envs one shared ``space``, and a hosted shard the trainer's own object.
So each constructor is cloudpickled on its own and unpickled once per env: every
env gets its own copy of what its constructor captured, as with one process per env.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from .batched import BatchedEnvs

__all__ = ["ShardConstructors"]


@dataclass(frozen=True)
class ShardConstructors:
    """The constructors of one shard, cloudpickled.

    ``per_env``: one blob per env; envs given the same constructor object share the bytes
    (pickled once), not the unpickled object.  ``batched``: one blob of a
    :class:`~shmpool.batched.BatchedEnvs` that builds the whole shard as one env."""

    per_env: tuple[bytes, ...] = ()
    batched: bytes | None = None

    @classmethod
    def pack(cls, fns: Sequence[Any] | BatchedEnvs) -> ShardConstructors:
        """Pickle a shard's constructors (``fns[a:b]`` of the pool's list, or a BatchedEnvs slice)."""
        if isinstance(fns, BatchedEnvs):
            return cls(batched=cloudpickle.dumps(fns))
        blobs: dict[int, bytes] = {}   # id -> blob; the objects stay alive in ``fns`` meanwhile
        for fn in fns:
            if id(fn) not in blobs:
                blobs[id(fn)] = cloudpickle.dumps(fn)
        return cls(per_env=tuple(blobs[id(fn)] for fn in fns))

    def unpack(self) -> list[Any] | BatchedEnvs:
        """The constructors again: a fresh object per env (a BatchedEnvs for a batched shard).

        A constructor that unpickles to the very same object twice (a module-level function or
        class, found by reference; a class cloudpickle tracks) has no per-env state to copy: it is
        unpickled twice, not once per env (a class carrying large data would be parsed N times)."""
        if self.batched is not None:
            return cloudpickle.loads(self.batched)
        first: dict[int, Any] = {}    # id of a blob -> its first unpickled object
        shared: dict[int, Any] = {}   # id of a blob -> the object every env of it gets
        out = []
        for blob in self.per_env:     # envs of one constructor hold the same bytes object
            key = id(blob)
            if key in shared:
                out.append(shared[key])
                continue
            fn = cloudpickle.loads(blob)
            if key in first and first[key] is fn:
                shared[key] = fn
            first.setdefault(key, fn)
            out.append(fn)
        return out

