"""Waiting on a :class:`~shmpool.distributed.RayPool`'s actors without ever waiting blind.

Every wait runs in slices of :data:`SLICE_S`; between slices a :class:`Watch` enforces the call's
timeout and ``step_timeout`` and asks the GCS which nodes are alive, so a pool whose node left is
noticed even when Ray would wait for it.  Each answer is classified into an :class:`Outcome`
(a value, an error raised in the pool, or the pool's death); nothing is swallowed."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
import ray.exceptions

from ..errors import PoolClosedError, WorkerDiedError
from ..state import CLOSED_DURING_CALL
from .actor import RemoteError
from .channel import Reply
from .channel import wait as wait_replies

SLICE_S = 0.25            # longest uninterrupted wait; the watch runs between slices
MIXED_TURN_S = 0.002      # when Ray futures and direct replies are awaited together: each side's turn
LIVENESS_EVERY_S = 1.0    # how often a waiting call asks the GCS which nodes are alive
DEATH = (ray.exceptions.RayActorError,)  # ActorDiedError, ActorUnavailableError are subclasses


class RemotePoolDiedError(WorkerDiedError):
    """The actor holding one of a :class:`RayPool`'s pools died (or its node did).

    ``worker`` is the pool's index, ``pid`` the actor's process id, ``node_id``
    the Ray node (hex) and ``env_range`` the global env ids it owned."""

    def __init__(self, message: str, *, worker: int, pid: int, node_id: str, env_range: range) -> None:
        super().__init__(message, worker=worker, pid=pid, exitcode=None)
        self.node_id = node_id
        self.env_range = env_range


class StepTimeoutError(TimeoutError):
    """A call waited longer than ``step_timeout``: fatal, the RayPool closes before this reaches the caller."""


@dataclass
class Outcome:
    """How pool ``pool`` answered one call: ``value``, or ``error`` (raised in the pool; the pool
    lives), or ``death`` (the actor, its node or a worker of its local pool died; ``node_gone``
    when the GCS reported the node dead)."""

    pool: int
    value: Any = None
    error: BaseException | None = None
    death: BaseException | None = None
    node_gone: bool = False


def outcome_of(ref: Any, pool: int) -> Outcome:
    """The :class:`Outcome` of a finished future ``ref`` (a Ray future or a direct :class:`Reply`) of pool ``pool``."""
    if isinstance(ref, Reply):
        if ref.lost is not None:
            return Outcome(pool, death=ref.lost)
        if not ref.answer.failed:
            return Outcome(pool, value=ref.answer.value)
        cause = ref.answer.error
    else:
        try:
            return Outcome(pool, value=ray.get(ref, timeout=0))
        except DEATH as exc:
            return Outcome(pool, death=exc)
        except ray.exceptions.RayTaskError as exc:   # the exception raised in the actor, when Ray kept it
            cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
    if isinstance(cause, RemoteError):
        cause = cause.rebuild()
    if isinstance(cause, WorkerDiedError):  # a worker of the local pool died; that pool closed itself
        return Outcome(pool, death=cause)
    return Outcome(pool, error=cause)


def wait_done(futures: list, num_returns: int, timeout: float) -> list:
    """The futures of ``futures`` (Ray futures and direct replies, in any mix) that are done, once
    ``num_returns`` of them are or ``timeout`` s passed; like ``ray.wait``'s first list."""
    refs = [f for f in futures if not isinstance(f, Reply)]
    if not refs:   # every pool reached directly: the common case, one pass over the futures
        return wait_replies(futures, num_returns, timeout) if futures else []
    replies = [f for f in futures if isinstance(f, Reply)]
    if not replies:
        return ray.wait(refs, num_returns=num_returns, timeout=timeout)[0]
    # Some pools could not be reached directly (a warning said so): take turns, briefly each.
    deadline = time.monotonic() + timeout
    while True:
        done = ray.wait(refs, num_returns=len(refs), timeout=0)[0]
        turn = max(0.0, min(MIXED_TURN_S, deadline - time.monotonic()))
        done += wait_replies(replies, max(1, num_returns - len(done)), turn)
        if len(done) >= num_returns or time.monotonic() >= deadline:
            return done


def node_gone(pool: int) -> Outcome:
    """The outcome of a call to a pool whose node the GCS reports dead."""
    return Outcome(pool, death=ray.exceptions.ActorDiedError(), node_gone=True)


class Watch:
    """The checks between wait slices of one call ``op``.

    ``timeout``: the caller's own limit (TimeoutError; the call stays pending).  ``step_timeout``:
    the pool's limit (:class:`StepTimeoutError`, fatal: ``on_step_timeout()`` runs first, to close the pool).
    ``node_of(k)``: pool ``k``'s node; ``describe(pools)``: their envs, for messages; ``cancelled()``: True once the
    wait must stop; ``start``: when the call's wait began (``time.monotonic()``; now when None), which both limits
    count from."""

    def __init__(self, op: str, timeout: float | None, step_timeout: float | None,
                 node_of: Callable[[int], str], describe: Callable[[list[int]], str],
                 cancelled: Callable[[], bool] = lambda: False, start: float | None = None,
                 on_step_timeout: Callable[[], None] = lambda: None) -> None:
        self.op = op
        self.cancelled = cancelled
        self.on_step_timeout = on_step_timeout
        self.timeout = timeout
        self.step_timeout = step_timeout
        self.node_of = node_of
        self.describe = describe
        self.start = time.monotonic() if start is None else start
        self.last_liveness = 0.0   # the first slice without an answer checks at once

    def after_slice(self, waiting_on: list[int]) -> list[int]:
        """Raise if a limit passed or the wait was cancelled (``close()`` from a signal handler or
        another thread: PoolClosedError); else the pools of ``waiting_on`` whose node is gone."""
        if self.cancelled():
            raise PoolClosedError(CLOSED_DURING_CALL)
        now = time.monotonic()
        waited = now - self.start
        if self.timeout is not None and waited > self.timeout:
            raise TimeoutError(f"{self.op} did not finish within {self.timeout} s; it is still pending")
        if self.step_timeout is not None and waited > self.step_timeout:
            late = sorted(set(waiting_on))
            self.on_step_timeout()
            raise StepTimeoutError(f"{self.op} did not finish within step_timeout={self.step_timeout} s: pools "
                                   f"{late} ({self.describe(late)}) did not answer; the pool is closed")
        if now - self.last_liveness < LIVENESS_EVERY_S:
            return []
        self.last_liveness = now
        alive = {x["NodeID"] for x in ray.nodes() if x["Alive"]}
        return [k for k in sorted(set(waiting_on)) if self.node_of(k) not in alive]


def gather(refs: list, pools: list[int], watch: Watch) -> list[Outcome]:
    """One :class:`Outcome` per future (``refs[i]`` of pool ``pools[i]``), waiting for every one of
    them in slices: an error in one pool does not stop the wait for the others, so their deaths are
    seen too.  Raises only what ``watch`` raises."""
    out: list[Outcome | None] = [None] * len(refs)
    left = dict(zip(refs, range(len(refs))))
    while left:
        for ref in wait_done(list(left), len(left), SLICE_S):
            i = left.pop(ref)
            out[i] = outcome_of(ref, pools[i])
        if left:
            for k in watch.after_slice([pools[i] for i in left.values()]):
                for ref, i in list(left.items()):
                    if pools[i] == k:
                        del left[ref]
                        out[i] = node_gone(k)
    return out  # type: ignore[return-value]

