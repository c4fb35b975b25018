"""The Ray backend of a pool's surface: one local pool per Ray node (or per NUMA node of each), driven
through actors.

:class:`RayBackend` answers the verbs of :mod:`shmpool.backend` (the surface, :class:`shmpool.surface.PoolSurface`,
has checked the state and makes the transitions) with the actors (:mod:`.fleet`), the bookkeeping
(:mod:`.ledger`), the waits (:mod:`.faults`), what the answers mean (:mod:`.recovery`) and batch assembly
(:mod:`.batches`).  Every array it returns is fresh.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
import ray

from .. import protocol as P
from ..arguments import check_options_list, env_id_array
from ..autoreset_modes import NEXT_STEP
from ..errors import PoolClosedError
from ..reset_args import check_reset_mask, seed_list
from ..state import Lifecycle
from .action_check import ActionCheck
from .actor import Resets
from .batches import Rows, StepOutput, batch_len, concat, merge_infos, take_rows
from .channel import Reply
from .faults import SLICE_S, Outcome, Watch, gather, node_gone, outcome_of, wait_done
from .fleet import Fleet
from .ledger import Ledger
from .placement import Placement
from .recovery import Recovery

# Ray's own worker object, read before ``ray.is_initialized()``: a connected driver's common case then costs ~8 µs of
# the step's head (with the pool's closed check) where the public call (its client-mode hook) cost ~21 µs, cold beside
# busy workers (issue 34).  Anything else (Ray shut down, Ray Client, a Ray without that object) asks the public call.
_RAY_WORKER = getattr(getattr(getattr(ray, "_private", None), "worker", None), "global_worker", None)

INTERRUPTED = "the RayPool was closed and its actors killed"
RAY_GONE = ("Ray was shut down (ray.shutdown()) while this RayPool was open: its actors went with it and the "
            "pool is closed; close a RayPool before ray.shutdown(), or build a new one after ray.init()")


class RayBackend:
    """The actors of one RayPool, started, and what is out at them.

    ``fleet`` is started here (``observation_mode``: how the pools' spaces are judged together);
    ``strict``: actions are checked strictly (any pool is strict).  ``shut_down`` and ``abort`` are the
    surface's close and fatal paths (called through weak references): a fatal death closes the pool,
    a passed ``step_timeout`` kills it."""

    interrupted = INTERRUPTED

    def __init__(self, num_envs: int, placement: Placement, fleet: Fleet, *, observation_mode: str, strict: bool,
                 on_worker_error: str, step_timeout: float | None,
                 shut_down: Callable[[], None], abort: Callable[[], None]) -> None:
        self.placement = place = placement
        self.num_envs = num_envs
        self.batch_size = place.batch_size
        self.fleet = fleet
        self.step_timeout = step_timeout
        self.abort = abort
        infos = fleet.start(observation_mode)
        self.observation_spaces = fleet.observation_spaces
        first = infos[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.metadata = first.metadata
        self.render_mode = first.render_mode
        self.spec = first.spec
        self.autoreset_mode = first.autoreset_mode
        # Checked as the pools check (a local Pool(strict=False) takes what strict refuses), and strictly when any pool
        # is: a batch one pool refuses must be refused before any other pool steps
        self.actions = ActionCheck(first.action_space, self.num_envs, strict)
        self.ledger = Ledger(place, next_step=self.autoreset_mode == NEXT_STEP)
        self.recovery = Recovery(fleet, self.ledger, on_worker_error, shut_down)
        self.pool_rows = [slice(r.start, r.stop) for r in map(place.env_range, range(place.num_pools))]
        self.output = StepOutput(self.pool_rows)
        self.step_refs: list | None = None     # the pending step's futures, one per pool (None: answered here)
        self.step_outcomes: tuple[list[int], list[Outcome]] | None = None   # waited, not yet read
        self.reset_answers: list[Resets] = []
        self.close_timeout = 10.0               # seconds the local pools get to close before their actors are killed
        self.life = Lifecycle()                 # NEEDS_RESET

    # --- entry ------------------------------------------------------------------------------------

    def entry_check(self) -> None:
        life = self.life
        if not life.closed and not (getattr(_RAY_WORKER, "connected", False) or ray.is_initialized()):
            # The user's ray.shutdown() took the actors; a Ray call now would start a new,
            # empty local Ray instead of failing.
            life.close()
            raise PoolClosedError(RAY_GONE)

    # --- reset ------------------------------------------------------------------------------------

    def reset_request(self, seed: Any, options: Any) -> tuple[list, list, set[int]]:
        """The seeds, each pool's options, and the pools a reset mask leaves out (not reset: their envs
        keep their observations, and the actor answers them, ``PoolActor.observations``)."""
        seeds = seed_list(seed, self.num_envs)
        place = self.placement
        ranges = [place.env_range(k) for k in range(place.num_pools)]
        per_pool: list[Any] = [options for _ in ranges]
        left_out: set[int] = set()
        if isinstance(options, (list, tuple)):
            options = check_options_list(options, self.num_envs)
            per_pool = [options[r.start:r.stop] for r in ranges]
        elif options is not None and "reset_mask" in options:
            mask = check_reset_mask(options["reset_mask"], self.num_envs)
            left_out = {k for k, r in enumerate(ranges) if not mask[r.start:r.stop].any()}
            # a pool left out and rebuilt meanwhile resets all its envs (Recovery.restart_sync drops the mask)
            per_pool = [{**options, "reset_mask": mask[r.start:r.stop]} for r in ranges]
        return seeds, per_pool, left_out

    def reset(self, request: tuple[list, list, set[int]]) -> None:
        seeds, per_pool, left_out = request
        place = self.placement
        self._forget_async()
        self.ledger.sync_autoreset.clear()
        refs = [self.fleet.call(k, "observations") if k in left_out else
                self.fleet.call(k, "reset", seeds[r.start:r.stop], per_pool[k])
                for k, r in enumerate(map(place.env_range, range(place.num_pools)))]
        outcomes = self._wait(refs, list(range(place.num_pools)), "reset")
        self.reset_answers = self.recovery.settle(outcomes, "reset", restart=True, seeds=seeds, options=per_pool)

    def reset_result(self) -> tuple[Any, dict]:
        answers, self.reset_answers = self.reset_answers, []
        return concat([a.obs for a in answers]), merge_infos([a.infos for a in answers], self.placement.sizes)

    # --- sync step ----------------------------------------------------------------------------------

    def post_step(self, actions: Any) -> None:
        if batch_len(actions) != self.num_envs:
            raise ValueError(f"actions have {batch_len(actions)} rows, the pool has {self.num_envs} envs")
        self.actions.check(actions)
        self._forget_async()
        auto, call = self.ledger.sync_autoreset, self.fleet.call
        refs = [None if k in auto else call(k, "step", take_rows(actions, rows))
                for k, rows in enumerate(self.pool_rows)]
        # aimed once every request is out: the last pool starts its step no later for it
        self.output.aim([ref if isinstance(ref, Reply) else None for ref in refs])
        self.step_refs = refs

    def wait_step(self, timeout: float | None) -> None:
        refs = self.step_refs
        start = time.monotonic()
        pools = [k for k, ref in enumerate(refs) if ref is not None]
        self.step_outcomes = pools, self._wait([refs[k] for k in pools], pools, "step", timeout=timeout, start=start)
        self.step_refs = None

    def step_result(self) -> tuple:
        pools, outcomes = self.step_outcomes
        self.step_outcomes = None
        failed = [o.pool for o in outcomes if o.error is not None]
        if failed:   # refused from now on, as a local Pool refuses: no healthy pool steps again before a reset
            self.life.needs_reset(f"pool {failed[0]} raised in step; call reset() before stepping again")
        answers = dict(zip(pools, self.recovery.settle(outcomes, "step", restart=True)))
        sizes, auto = self.placement.sizes, self.ledger.sync_autoreset
        parts = [answers[k] if k in answers else   # the autoreset step after a restart: nothing ran
                 Rows.autoreset(np.arange(sizes[k]), auto.pop(k)) for k in range(self.placement.num_pools)]
        return self.output.join(parts).as_step()

    # --- async --------------------------------------------------------------------------------------

    def async_reset(self) -> None:
        self._check_sends()
        self.ledger.all_sent()
        for k in range(self.placement.num_pools):
            self.ledger.sends[self.fleet.call(k, "async_reset")] = k
        self.life.in_flight = self.num_envs

    def send(self, actions: Any, env_ids: Any) -> None:
        """Everything about the call (ids, actions, envs already in flight) is checked here, before
        anything is sent."""
        ids = np.arange(self.num_envs) if env_ids is None else env_id_array(env_ids)
        ledger = self.ledger
        ledger.claim(ids)
        try:
            if batch_len(actions) != len(ids):
                raise ValueError(f"actions have {batch_len(actions)} rows for {len(ids)} env ids")
            self.actions.check(actions, ids)
        except BaseException:
            ledger.unclaim(ids)
            raise
        for d in ledger.plan_send(ids):
            part = take_rows(actions, d.positions)
            if d.with_recv:
                ledger.requests[self.fleet.call(d.pool, "send_recv", part, d.local_ids)] = d.pool
            else:
                ledger.sends[self.fleet.call(d.pool, "send", part, d.local_ids)] = d.pool
        self.life.in_flight += len(ids)

    def recv(self) -> tuple:
        """Counted in whole sub-batches: a pool answers ``recv`` with its own ``batch_size`` rows."""
        B = self.batch_size
        ledger = self.ledger
        watch = self._watch("recv")
        while ledger.ready.count < B:
            self._check_sends()
            for k in ledger.to_request():
                ledger.requests[self.fleet.call(k, "recv")] = k
            if not ledger.requests:
                raise RuntimeError(
                    f"recv() cannot finish: {ledger.ready.count} rows are ready and no pool has a whole sub-batch "
                    f"in flight (in flight per pool {ledger.available}, sub-batches "
                    f"{self.placement.sub_batch_sizes}); send the envs recv() returned back, or choose "
                    "sub_batch_sizes that divide what you send")
            refs = list(ledger.requests)
            done = wait_done(refs, 1, SLICE_S)
            if done and len(refs) > 1:
                done = wait_done(refs, len(refs), 0)
            for ref in done:
                self._take(ref)
            if not done:
                for k in watch.after_slice(list(ledger.requests.values())):
                    self.recovery.async_death(node_gone(k), "recv")
        rows = ledger.take(B)
        self.life.in_flight -= B
        return rows.as_recv()

    def _take(self, ref: Any) -> None:
        o = outcome_of(ref, self.ledger.requests.pop(ref))
        if o.death is None and o.error is None:
            self.ledger.received(o.pool, o.value)
        else:
            self._settle_async([o], "recv")

    def _check_sends(self) -> None:
        """Handle the finished fire-and-forget calls (see :meth:`_settle_async`)."""
        sends = self.ledger.sends
        if not sends:
            return
        done = wait_done(list(sends), len(sends), 0)
        self._settle_async([outcome_of(ref, sends.pop(ref)) for ref in done], "send")

    def _settle_async(self, outcomes: list[Outcome], op: str) -> None:
        """Rebuild (or fail on) the dead pools of async calls' ``outcomes``, then raise the first error one of the
        others raised (the pool then needs a reset)."""
        dead = {o.pool: o for o in outcomes if o.death is not None}
        for o in dead.values():
            self.recovery.async_death(o, op)
        failed = [o for o in outcomes if o.error is not None and o.pool not in dead]
        if failed:
            self.life.needs_reset(f"pool {failed[0].pool} raised in {op}; call reset() or async_reset()")
            raise self.recovery.global_error(failed[0].pool, failed[0].error)

    def _forget_async(self) -> None:
        """Before a sync call: surface what earlier sends raised, then drop the async state."""
        if self.ledger.idle and not self.life.in_flight:
            return
        self._check_sends()
        self.ledger.forget()
        self.life.in_flight = 0

    # --- per-env messages ------------------------------------------------------------------------------

    def per_env(self, op: str, name: str, ids: list[int], payloads: list) -> tuple:
        """Each pool holding some of ``ids`` is asked once, for its envs."""
        by_pool: dict[int, list[int]] = {}
        owner = self.placement.owner
        for pos, i in enumerate(ids):
            by_pool.setdefault(int(owner[i]), []).append(pos)
        pools = list(by_pool)
        starts = self.placement.starts
        refs = [self.fleet.call(k, "per_env", op, name, [ids[p] - int(starts[k]) for p in by_pool[k]],
                                *_actor_arguments(op, [payloads[p] for p in by_pool[k]]))
                for k in pools]
        answers = self.recovery.settle(self._wait(refs, pools, op), op, restart=False)
        out: list = [None] * len(ids)
        for k, answer in zip(pools, answers):
            for pos, value in zip(by_pool[k], answer or ()):
                out[pos] = value
        return tuple(out)

    # --- waiting and faults ----------------------------------------------------------------------------

    def _watch(self, op: str, timeout: float | None = None, start: float | None = None) -> Watch:
        life = self.life
        # a passed step_timeout kills the actors before the error leaves the wait
        return Watch(op, timeout, self.step_timeout, self.fleet.node_of, self.fleet.describe_pools,
                     cancelled=lambda: life.close_requested, start=start, on_step_timeout=self.abort)

    def _wait(self, refs: list, pools: list[int], op: str, timeout: float | None = None,
              start: float | None = None) -> list[Outcome]:
        """Every answer of one call (``pools[i]`` for ``refs[i]``), waited for in watched slices (its limits counted
        from ``start``, monotonic seconds, when the wait began before)."""
        return gather(refs, pools, self._watch(op, timeout, start))

    # --- counters and closing ---------------------------------------------------------------------------

    @property
    def restarts(self) -> int:
        return self.fleet.restarts

    @property
    def restart_log(self) -> list[dict]:
        return self.fleet.restart_log

    def close(self) -> None:
        self._stop(kill=False)

    def kill(self) -> None:
        """A pool that overran is not asked to close: its actors are killed at once (their workers die with
        them), so the error comes at the bound, not after the close grace."""
        self._stop(kill=True)

    def forgotten(self) -> bool:
        if not ray.is_initialized():
            return False
        self.close_timeout = 2.0
        return True

    def _stop(self, kill: bool) -> None:
        """Stop the actors (``kill``: at once, else after asking their pools to close)."""
        self.step_refs = None
        self.ledger.forget()
        if not ray.is_initialized():
            self.fleet.forget()
        elif kill:
            self.fleet.kill_all()
            self.fleet.forget()
        else:
            self.fleet.close(self.close_timeout)


def _actor_arguments(op: str, payloads: list) -> tuple[tuple, dict]:
    """A per-env op's ``(args, kwargs)`` for ``PoolActor.per_env`` from its per-env payloads (see
    :meth:`shmpool.backend.PoolBackend.per_env`): one shared value for every op but ``set_attr``, whose
    values go as one tuple with one per env (the local pool's ``set_attr`` takes a tuple as one per env)."""
    if op == P.SET_ATTR:
        return (tuple(payloads),), {}
    if op == P.GET_ATTR:
        return (), {}
    if op == P.APPLY:
        fn, args, kwargs = payloads[0]
        return (cloudpickle.dumps(fn), args), kwargs
    return payloads[0]


__all__ = ["INTERRUPTED", "RAY_GONE", "RayBackend"]
