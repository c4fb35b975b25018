"""A :class:`~shmpool.distributed.RayPool`'s bookkeeping: which envs are in flight, what each pool
has been asked for, which rows are ready, and the rows a rebuilt pool still owes.  Pure state:
Ray's futures are opaque keys here, so every rule is testable without Ray."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core import claim_ids
from ..arguments import check_env_ids
from .batches import ReadyRows, Rows, take_rows
from .placement import Placement


@dataclass
class Dispatch:
    """One pool's part of a ``send``: ``positions`` of its envs in the caller's ids (and actions),
    their ``local_ids`` on the pool, and whether the call also asks the pool for its next sub-batch
    (one round trip instead of two)."""

    pool: int
    positions: np.ndarray
    local_ids: np.ndarray
    with_recv: bool


class Ledger:
    """Async state (EnvPool semantics at sub-batch granularity) plus the restart rows of rebuilt pools.

    A pool is asked for a sub-batch only when at least that many of its envs are in flight and not
    already claimed by an earlier request (``available``); at most one request per pool is
    outstanding.  ``next_step``: the autoreset mode is NEXT_STEP, so the step after a restart row
    is an autoreset row (the reset observation again, reward 0, no flags), answered here without
    stepping the env, which a rebuild already left in its reset state."""

    def __init__(self, placement: Placement, next_step: bool) -> None:
        self.placement = placement
        self.next_step = next_step
        P = placement.num_pools
        self.in_flight = np.zeros(placement.num_envs, dtype=bool)  # sent, not returned by recv yet
        self._flight_bytes = self.in_flight.view(np.uint8)   # the same memory, for claim's C pass
        self.n_flight = 0
        self.available = [0] * P          # in flight at pool k and not claimed by a request
        self.requests: dict[Any, int] = {}  # outstanding recv future -> pool
        self.sends: dict[Any, int] = {}     # fire-and-forget send future -> pool, checked for errors later
        self.ready = ReadyRows()
        self.held: list[dict[int, Rows]] = [{} for _ in range(P)]  # env held by the caller -> its restart row
        self.autoreset: dict[int, Any] = {}         # async: env -> its reset observation (one row)
        self.sync_autoreset: dict[int, Any] = {}    # sync: pool -> its envs' reset observations

    def busy(self, k: int) -> bool:
        """Pool ``k`` has an outstanding request."""
        return k in self.requests.values()

    @property
    def idle(self) -> bool:
        """Nothing async to forget: no env in flight, no request or send outstanding, no row ready or held."""
        return not (self.n_flight or self.requests or self.sends or self.ready.count or self.autoreset
                    or any(self.available) or any(self.held))

    def forget(self) -> None:
        """Drop the async state (before a sync call; the actors finish queued calls first, in order)."""
        P = self.placement.num_pools
        self.in_flight[:] = False
        self.n_flight = 0
        self.available = [0] * P
        self.requests.clear()
        self.sends.clear()
        self.ready.clear()
        self.held = [{} for _ in range(P)]
        self.autoreset = {}

    def all_sent(self) -> None:
        """``async_reset``: every env in flight."""
        self.forget()
        self.sync_autoreset.clear()
        self.in_flight[:] = True
        self.n_flight = self.placement.num_envs
        self.available = list(self.placement.sizes)

    def check_idle(self, ids: np.ndarray) -> None:
        """RuntimeError if an env of ``ids`` (global, int64) is still in flight."""
        busy = self.in_flight[ids]
        if busy.any():
            raise RuntimeError(f"env ids {ids[busy].tolist()} are already in flight; recv() them first")

    def claim(self, ids: np.ndarray) -> None:
        """Mark ``ids`` (C-contiguous int64, global) in flight, in one C pass.  Nothing is marked when one is
        out of range or repeated (ValueError, as :func:`~shmpool.arguments.check_env_ids` words it) or already in
        flight (RuntimeError, as :meth:`check_idle` words it).  :meth:`unclaim` undoes it; :meth:`plan_send`
        follows it."""
        if claim_ids(ids, self._flight_bytes):
            return
        check_env_ids(ids, self.placement.num_envs)
        self.check_idle(ids)

    def unclaim(self, ids: np.ndarray) -> None:
        """Claimed ``ids`` that will not be sent (their actions were refused)."""
        self.in_flight[ids] = False

    def plan_send(self, ids: np.ndarray) -> list[Dispatch]:
        """Mark ``ids`` (checked, idle, global) in flight and decide what to ask each pool: envs owed a
        restart or autoreset row are answered here at once (queued as ready), the rest dispatched."""
        self.in_flight[ids] = True
        self.n_flight += len(ids)
        plan = []
        for k, pos in self.placement.by_pool(ids).items():
            mine = ids[pos]
            if self.held[k] or self.autoreset:
                keep = np.array([not self._answer_here(k, i) for i in mine.tolist()], dtype=bool)
                pos, mine = pos[keep], mine[keep]
                if not len(mine):
                    continue
            b = self.placement.sub_batch_sizes[k]
            with_recv = not self.busy(k) and self.available[k] + len(mine) >= b
            self.available[k] += len(mine) - (b if with_recv else 0)
            plan.append(Dispatch(k, pos, mine - self.placement.starts[k], with_recv))
        return plan

    def _answer_here(self, k: int, env: int) -> bool:
        """Queue env's owed row, if it is owed one."""
        if env in self.held[k]:     # reset by a rebuild while the caller held it: its restart row answers
            rows = self.held[k].pop(env)
            if self.next_step:
                self.autoreset[env] = rows.obs
        elif env in self.autoreset:  # the autoreset step after its restart row
            rows = Rows.autoreset(np.array([env]), self.autoreset.pop(env))
        else:
            return False
        self.ready.add(rows)
        return True

    def to_request(self) -> list[int]:
        """Pools to ask for a sub-batch now: idle ones with a whole sub-batch in flight (claimed here)."""
        out = []
        for k, b in enumerate(self.placement.sub_batch_sizes):
            if self.available[k] >= b and not self.busy(k):
                self.available[k] -= b
                out.append(k)
        return out

    def received(self, k: int, rows: Rows) -> None:
        """Pool ``k``'s sub-batch (local ids) arrived."""
        self.ready.add(rows.shifted(int(self.placement.starts[k])))

    def take(self, n: int) -> Rows:
        """The oldest ``n`` ready rows (global ids); they are no longer in flight."""
        rows = self.ready.take(n)
        self.in_flight[rows.ids] = False
        self.n_flight -= n
        return rows

    def pool_rebuilt(self, k: int, obs: Any, infos: dict) -> None:
        """Pool ``k`` was rebuilt during async use and all its envs reset (``obs``, ``infos``: its reset).

        Its requests and sends are void; each of its envs comes back once with its restart row: at once
        for those in flight, in place of the next result for those the caller holds."""
        r = self.placement.env_range(k)
        self.available[k] = 0
        self.sends = {ref: j for ref, j in self.sends.items() if j != k}
        self.requests = {ref: j for ref, j in self.requests.items() if j != k}
        self.ready.drop_envs(r)   # rows of its envs not returned yet: the restart rows replace them
        rows = Rows.restarted(np.arange(r.start, r.stop), obs, infos)
        flying = self.in_flight[r.start:r.stop]
        self.ready.add(rows.select(flying))
        if self.next_step:
            for local in np.flatnonzero(flying).tolist():
                self.autoreset[r.start + local] = take_rows(obs, slice(local, local + 1))
        self.held[k] = {r.start + local: rows.select(slice(local, local + 1))
                        for local in np.flatnonzero(~flying).tolist()}
