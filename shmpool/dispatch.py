"""What the parent has out at the workers: the dispatch room.

Pure bookkeeping over the wire (``shmpool._core.Wire``, a view of a buffer): which envs
are in flight, the sync step's target count, the lead limit of async ``recv``, and the
order results are handed out.  It never waits and never talks to a process: taking
results from the wire is a ``take`` function passed in (the supervisor's, which waits
and watches the workers), so the room is testable over a plain ``bytearray``.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._lead import LeadLimit
from .arguments import check_env_ids, env_id_array
from .state import Lifecycle

# take(out, n, op): fill out[:n] with env ids the workers finished, in completion order.
Take = Callable[[np.ndarray, int, str], int]


class Dispatch:
    """In-flight marks, the sync target and the lead limit of one pool.

    ``owner[e]`` (int32) is the worker of env ``e``; ``life.in_flight`` counts the envs out
    from ``send``/``async_reset`` (the lifecycle checks it at every entry)."""

    def __init__(self, wire, owner: np.ndarray, life: Lifecycle, batch_size: int, max_lead: int | None) -> None:
        self.wire = wire
        self.owner = owner
        self.life = life
        self.num_envs = n = len(owner)
        self.num_workers = int(owner[-1]) + 1
        self.max_lead = max_lead
        self.all_ids = np.arange(n, dtype=np.int64)
        self.in_flight = np.zeros(n, dtype=np.uint8)   # 1: sent (or async-reset), not received
        self.lead = LeadLimit(n, max_lead)
        self.sync_seq = wire.sync_count()    # where the region's header started it
        self.step_target: int | None = None  # sync-counter value a pending step_async waits for
        self.batch_ids = np.zeros(batch_size, dtype=np.uint32)
        self.taken = np.zeros(batch_size, dtype=np.uint32)

    # --- async: send / recv --------------------------------------------------------------

    def claim(self, env_ids) -> np.ndarray:
        """Validate env ids (None: every env) and mark them in flight (one C pass; numpy only
        to word an error)."""
        ids = self.all_ids if env_ids is None else env_id_array(env_ids)
        if self.wire.claim(ids, self.in_flight):
            return ids
        check_env_ids(ids, self.num_envs)
        busy = ids[self.in_flight[ids].astype(bool)]
        raise RuntimeError(f"env ids {busy.tolist()} are already in flight; recv() them first")

    def unclaim(self, ids: np.ndarray) -> None:
        """Claimed envs that were never dispatched (their actions were refused)."""
        self.in_flight[ids] = 0

    def dispatch(self, ids: np.ndarray, reset: bool) -> None:
        """Hand claimed envs to their workers (``reset``: reset them instead of stepping)."""
        if self.max_lead is not None:
            self.lead.sent(ids)
        self.wire.dispatch(ids, self.owner, reset)
        self.life.in_flight += len(ids)

    def received(self, ids: np.ndarray) -> None:
        """Envs handed back to the caller."""
        # take/put rather than fancy indexing: half the cost for a batch of a few rows.
        self.in_flight.put(ids, 0)
        self.life.in_flight -= len(ids)

    def take_in_turn(self, out: np.ndarray, b: int, take: Take) -> int:
        """``recv``'s take: finished envs in completion order, except that none gets more than
        ``max_lead`` steps ahead of the least-advanced env out (``shmpool._lead``)."""
        order, life = self.lead, self.life
        if self.max_lead is None:
            return take(out, b, "recv")
        if b >= life.in_flight and not order.n_held:   # everything out comes back anyway
            got = take(out, b, "recv")
            order.received(out[:got])
            return got
        taken, in_flight = self.taken, self.in_flight
        got = order.release(in_flight, out, 0, b)
        while got < b:
            at_workers = life.in_flight - order.n_held - got
            want = min(b - got, at_workers)
            if want <= 0:
                raise RuntimeError(f"recv: {b - got} envs short with none at the workers (held "
                                   f"{order.held_envs()}); this is a bug in shmpool")
            n = take(taken, want, "recv")
            got += order.admit(taken[:n], in_flight, out, got)
            got += order.release(in_flight, out, got, b - got)
        return got

    def drain(self, take: Take) -> np.ndarray:
        """Take back every env in flight (reset and messages need idle workers); their ids (int32),
        which the caller reads and drops."""
        n = self.life.in_flight
        if not n:
            return np.zeros(0, dtype=np.int32)
        held = self.lead.drop_held()
        out = np.zeros(n, dtype=np.uint32)
        out[:len(held)] = held
        got = len(held) + take(out[len(held):], n - len(held), "drain")
        ids = out[:got].astype(np.int32)
        self.received(ids)
        return ids

    # --- sync: step_async / step_wait ------------------------------------------------------

    def post_step(self, cmd: int) -> None:
        """Post ``cmd`` to every worker; the step is done when the sync counter reaches the target."""
        self.step_target = (self.sync_seq + self.num_workers) & 0xFFFFFFFF
        self.wire.post_all(cmd)

    def step_done(self) -> None:
        self.sync_seq = self.step_target
        self.step_target = None

    def retarget(self) -> None:
        """After replacements stepped their shards again (``Supervisor.wait``): the sync counter
        may or may not hold the dead worker's count, so the target is the counter itself."""
        self.step_target = self.wire.sync_count()
