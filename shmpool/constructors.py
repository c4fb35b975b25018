"""A shard's env constructors on their way to the worker that builds them.

gymnasium's AsyncVectorEnv sends each constructor to its own process, so with
``[lambda: Env(space)] * 3`` every env holds a private copy of ``space`` (and of its
random generator).  A shmpool worker builds several envs, and a hosted shard is
built in the trainer's process: unpickling a shard's constructors as one list would
give its envs one shared ``space``, and a hosted shard the trainer's own object.
So each constructor is cloudpickled on its own and unpickled once per env: every
env gets its own copy of what its constructor captured, as with one process per env.

What is copied and what is shared:

- A constructor is pickled once for the whole pool (``pack``'s ``blobs``, shared by every
  shard), not once per shard: the trainer keeps one blob per distinct constructor (for
  restarts), whatever the number of workers.
- Each env unpickles its own object from it (a captured array, space, tensor or env is
  per-env), except a constructor found by reference (a module-level function or class),
  which has no state to copy.
- A constructor that cannot be pickled (it captured a lock, an open file, a socket, a
  generator) is *inherited* under the ``fork`` start method, as ``AsyncVectorEnv``'s
  workers inherit theirs: the worker process gets the trainer's object as fork leaves it
  (its own copy-on-write copy), and that worker's envs of that constructor share it; a
  shard stepped in the trainer (``parent_shard``) uses the trainer's object itself, as
  ``SyncVectorEnv`` does.  Under ``spawn``/``forkserver`` nothing can be inherited, and
  such a constructor is refused with a ``TypeError`` that says so.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from .batched import BatchedEnvs

__all__ = ["ShardConstructors"]


@dataclass(frozen=True)
class Inherited:
    """A constructor that cannot be pickled, handed to a forked worker as fork leaves it."""

    fn: Any

    def __reduce__(self):
        raise TypeError(f"env constructor {self.fn!r} cannot be pickled; only a worker started by fork can "
                        "inherit it")


@dataclass(frozen=True)
class ShardConstructors:
    """The constructors of one shard, cloudpickled.

    ``per_env``: one blob per env; envs given the same constructor object share the bytes
    (pickled once), not the unpickled object.  ``batched``: one blob of a
    :class:`~shmpool.batched.BatchedEnvs` that builds the whole shard as one env."""

    per_env: tuple[bytes | Inherited, ...] = ()
    batched: bytes | None = None

    @classmethod
    def pack(cls, fns: Sequence[Any] | BatchedEnvs, inherit: bool = False,
             blobs: dict[int, bytes | Inherited] | None = None) -> ShardConstructors:
        """Pickle a shard's constructors (``fns[a:b]`` of the pool's list, or a BatchedEnvs slice).

        ``blobs`` (id of a constructor -> its blob) is shared by the pool's shards, so each
        constructor is pickled once; the objects must stay alive meanwhile (the pool's list holds
        them).  ``inherit``: the workers are forked, so a constructor that cannot be pickled is
        passed as it is (``Inherited``) instead of refused."""
        if isinstance(fns, BatchedEnvs):
            return cls(batched=cloudpickle.dumps(fns))
        blobs = {} if blobs is None else blobs
        for fn in fns:
            if id(fn) not in blobs:
                blobs[id(fn)] = _pickled(fn, inherit)
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
            if isinstance(blob, Inherited):
                out.append(blob.fn)   # as fork left it: this process's, shared by its envs
                continue
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



def _pickled(fn: Any, inherit: bool) -> bytes | Inherited:
    """``fn`` cloudpickled; under ``inherit`` one that cannot be is passed on as it is."""
    try:
        return cloudpickle.dumps(fn)
    except Exception as exc:
        if inherit:
            return Inherited(fn)
        raise TypeError(f"env constructor {fn!r} cannot be pickled ({type(exc).__name__}: {exc}); the workers "
                        "are not forked (start_method is not 'fork'), so they cannot inherit it either. Build "
                        "what it captured inside the constructor, or use start_method='fork'") from exc
