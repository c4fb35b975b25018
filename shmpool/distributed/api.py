"""``RayPool``'s public API: every entry checks the one pool state (:class:`~shmpool.state.Lifecycle`),
then drives the actors (:mod:`.fleet`), the bookkeeping (:mod:`.ledger`) and the waits (:mod:`.faults`)."""
from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import numpy as np
import ray

from ..arguments import (
    POOL_KEYWORDS,
    check_count,
    check_on_worker_error,
    check_options_list,
    check_seed,
    check_step_timeout,
    check_typos,
    env_constructors,
    env_id_array,
    env_id_list,
    keywords_of,
)
from ..autoreset_modes import NEXT_STEP
from ..errors import PoolClosedError
from ..reset_args import check_reset_mask, seed_list
from ..state import Lifecycle, LifecycleFacts, add_note
from .action_check import ActionCheck
from .actor import Resets, pools_on_nodes
from .batches import Rows, StepOutput, batch_len, concat, merge_infos, take_rows
from .channel import Reply
from .faults import (
    SLICE_S,
    Outcome,
    Watch,
    gather,
    node_gone,
    outcome_of,
    wait_done,
)
from .fleet import Fleet
from .ledger import Ledger
from .placement import Placement, Slot
from .recovery import Recovery

# Ray's own worker object, read before ``ray.is_initialized()``: a connected driver's common case then costs ~8 µs of
# the step's head (with the pool's closed check) where the public call (its client-mode hook) cost ~21 µs, cold beside
# busy workers (issue 34).  Anything else (Ray shut down, Ray Client, a Ray without that object) asks the public call.
_RAY_WORKER = getattr(getattr(getattr(ray, "_private", None), "worker", None), "global_worker", None)


def _entry(method: Callable) -> Callable:
    """A public call: one at a time per pool; a ``close()`` that came during it runs when it ends; Ctrl-C
    (KeyboardInterrupt) during it closes the pool, as it closes a local Pool."""
    op = ENTRY_OPS.get(method.__name__, method.__name__)

    @functools.wraps(method)
    def wrapper(self: RayPool, *args: Any, **kwargs: Any) -> Any:
        life = self._life
        life.enter(op)
        try:
            if not life.closed and not (getattr(_RAY_WORKER, "connected", False) or ray.is_initialized()):
                # The user's ray.shutdown() took the actors; a Ray call now would start a new,
                # empty local Ray instead of failing.
                life.close()
                raise PoolClosedError(RAY_GONE)
            return method(self, *args, **kwargs)
        except KeyboardInterrupt as exc:
            # Mid-call the pools' state is unknown (a step half-sent, answers unread): their actors are killed at
            # once, as a local Pool kills its workers, not asked to close (a pool still stepping would hold the
            # interrupt for the close grace).
            if not life.closed:
                self._abort()
            if not any(INTERRUPTED in n for n in getattr(exc, "__notes__", ())):
                add_note(exc, f"shmpool: {INTERRUPTED} ({op} was interrupted)")
            raise
        finally:
            life.leave(self._shut_down, self._abort)
    return wrapper


INTERRUPTED = "the RayPool was closed and its actors killed"
ENTRY_OPS = {"_sync_step": "step", "_per_env": "a per-env call"}   # how a note names an entry's call


TRANSPORTS = ("direct", "ray")
RAY_GONE = ("Ray was shut down (ray.shutdown()) while this RayPool was open: its actors went with it and the "
            "pool is closed; close a RayPool before ray.shutdown(), or build a new one after ray.init()")


class RayPool(LifecycleFacts):
    """Many envs in shmpool pools on several Ray nodes, with the API of :class:`shmpool.Pool`.

    ``env``: a gymnasium id (``**env_kwargs`` go to ``gymnasium.make``), one callable or a
    list of callables, cloudpickled and built on the nodes (each env with its own copy of what its
    constructor captured, as in a Pool).

    ``nodes``: Ray node ids (hex) to use, in order; default every alive node with CPUs.
    ``pools_per_node``: pools per node, an int (each pool gets an even, contiguous share of
    the cores the actor may use) or ``"numa"`` (one pool per NUMA node of each node, on
    that NUMA node's cores, as the node's sysfs reports them).
    ``env_counts``: envs per pool (default: as even as possible, contiguous ranges).
    ``batch_size``: rows per ``recv()`` (default ``num_envs``); ``sub_batch_sizes``:
    each pool's local ``batch_size`` (default its proportional share of ``batch_size``).
    ``on_worker_error``: ``"raise"`` (default) or ``"restart"``.
    ``step_timeout``: seconds any one call may wait (None: no limit, but node deaths are
    still noticed).  ``actor_options``: passed to ``.options()`` of each actor
    (default ``num_cpus=0``: the actor does not reserve Ray CPUs; set ``num_cpus`` to
    keep Ray tasks off the pool's cores).  ``per_pool_kwargs``: one dict of :class:`Pool`
    keywords per pool (e.g. ``cpus``), over the shared ones.  Other keywords that are :class:`Pool`
    parameters (``num_workers``, ``wait_policy``, ``start_method``, ``autoreset_mode``...)
    go to every local pool.  Actions are checked here, before anything is sent, as the pools
    check them (``strict``; strictly when any pool is strict).  The pools' observation spaces are
    judged together as one Pool judges its envs': ``observation_mode="different"`` (when every
    pool has it) lets them differ in bounds, ``observation_spaces`` lists each env's and
    ``single_observation_space`` is env 0's.

    ``transport``: ``"direct"`` (default): each actor's pool calls (reset, step, send/recv, call...)
    go over one TCP connection from this process to the actor, opened at start-up on the address Ray
    uses for the node and guarded by a random token; messages are pickles (protocol 5) whose arrays travel
    beside them as raw bytes (:mod:`.wire`).  The token only keeps other users and processes from driving a
    pool: there is no TLS or encryption (a peer on the network can read or alter the bytes), and it sits inside
    Ray's trust boundary (see :mod:`.channel`).  A connection that cannot be opened (a driver outside the
    cluster's network) leaves that pool on Ray calls, with a RuntimeWarning.  ``"ray"``: every call is an
    ordinary Ray actor call (several ms each).

    Shapes and dtypes are the local pool's: observations ``(n, *obs_shape)`` in the
    space's dtype (dicts/tuples of such arrays for Dict/Tuple spaces), rewards
    ``(n,)`` float64, terminated/truncated ``(n,)`` bool, infos in gymnasium's vector
    layout; ``recv`` adds ``infos["env_id"]`` (``(batch_size,)`` int32, global ids).
    Every array returned is fresh.
    """

    def __init__(
        self,
        env: str | Callable[[], Any] | Sequence[Callable[[], Any]],
        num_envs: int | None = None,
        *,
        nodes: Sequence[str] | None = None,
        pools_per_node: int | str = 1,
        env_counts: Sequence[int] | None = None,
        batch_size: int | None = None,
        sub_batch_sizes: Sequence[int] | None = None,
        seed: int | None = None,
        on_worker_error: str = "raise",
        step_timeout: float | None = None,
        startup_timeout: float | None = 300.0,
        actor_options: dict | None = None,
        per_pool_kwargs: Sequence[dict] | None = None,
        address: str | None = None,
        transport: str = "direct",
        **kwargs: Any,
    ) -> None:
        self._life = Lifecycle()
        self._life.close()              # until start-up succeeds there is nothing to close
        check_typos("RayPool", kwargs, POOL_KEYWORDS | keywords_of(RayPool.__init__))
        pool_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in POOL_KEYWORDS}
        if "copy" in pool_kwargs:
            raise TypeError("'copy' is not a RayPool option: every array it returns is fresh")
        fns = env_constructors(env, num_envs, kwargs)
        self.num_envs = len(fns)
        self.on_worker_error = check_on_worker_error(on_worker_error)
        self.step_timeout = check_step_timeout(step_timeout)
        seed = check_seed(seed)
        if pools_per_node != "numa":
            pools_per_node = check_count("pools_per_node", pools_per_node)
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        # A dead worker inside a node is first the local pool's business: it follows the same policy.
        pool_kwargs["on_worker_error"] = on_worker_error

        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        alive = {x["NodeID"]: x for x in ray.nodes() if x["Alive"]}
        if nodes is None:
            nodes = [nid for nid, x in alive.items() if x["Resources"].get("CPU", 0) > 0] or list(alive)
        nodes = list(nodes)
        missing = [nid for nid in nodes if nid not in alive]
        if missing:
            raise ValueError(f"nodes {missing} are not alive Ray nodes; alive: {sorted(alive)}")
        per = pools_on_nodes(pools_per_node, nodes, timeout=60)
        slots = [Slot(nid, p, pools_per_node) for nid, count in zip(nodes, per) for p in range(count)]
        self._placement = place = Placement(slots, self.num_envs, env_counts, batch_size, sub_batch_sizes)
        if per_pool_kwargs is not None and len(per_pool_kwargs) != place.num_pools:
            raise ValueError(f"per_pool_kwargs needs {place.num_pools} dicts (one per pool), "
                             f"got {len(per_pool_kwargs)}")
        self.batch_size = place.batch_size
        self.sub_batch_sizes = place.sub_batch_sizes
        each = [{**pool_kwargs, **(per_pool_kwargs[k] if per_pool_kwargs else {})} for k in range(place.num_pools)]
        self._fleet = Fleet(place, fns, seed, each, {"num_cpus": 0, "max_restarts": 0, **(actor_options or {})},
                            startup_timeout, direct=transport == "direct")
        self.observation_mode = "different" if all(k.get("observation_mode") == "different" for k in each) else "same"
        infos = self._fleet.start(self.observation_mode)
        self.observation_spaces = self._fleet.observation_spaces
        first = infos[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.metadata = first.metadata
        self.render_mode = first.render_mode
        self.spec = first.spec
        self.autoreset_mode = first.autoreset_mode
        # Checked as the pools check (a local Pool(strict=False) takes what strict refuses), and strictly when any pool
        # is: a batch one pool refuses must be refused before any other pool steps
        self._actions = ActionCheck(self.single_action_space, self.num_envs, any(k.get("strict", True) for k in each))
        self._ledger = Ledger(place, next_step=self.autoreset_mode == NEXT_STEP)
        shut_down = weakref.WeakMethod(self._shut_down)   # no cycle: a forgotten RayPool is freed (and closed) at once
        self._recovery = Recovery(self._fleet, self._ledger, self.on_worker_error, lambda: shut_down()())
        self._pool_rows = [slice(r.start, r.stop) for r in map(place.env_range, range(place.num_pools))]
        self._output = StepOutput(self._pool_rows)
        self._step_refs: list | None = None   # the pending step_async(): one future per pool (None: answered here)
        self._close_timeout = 10.0             # seconds the local pools get to close before their actors are killed
        self._life = Lifecycle()               # NEEDS_RESET

    # --- properties ------------------------------------------------------------------------------

    @property
    def num_pools(self) -> int:
        """How many local pools (actors) the envs are spread over."""
        return self._placement.num_pools

    def env_range(self, k: int) -> range:
        """Global env ids owned by pool ``k``."""
        return self._placement.env_range(k)

    @property
    def nodes(self) -> list[dict]:
        """Per pool: ``node_id``, ``hostname``, actor ``pid``, ``num_workers``, worker ``cpus``, ``cores`` (all the
        pool's processes may use: its share of the node), ``envs`` (range), ``transport`` (``"direct"``: its calls go
        over the direct connection; ``"ray"``: through Ray), ``channel`` (the ``(host, port)`` its actor listens on
        for that connection; None without one)."""
        return [{"node_id": d.node_id, "hostname": d.hostname, "pid": d.pid, "num_workers": d.num_workers,
                 "cpus": d.cpus, "cores": d.cores, "envs": self.env_range(k), "transport": self._fleet.transport(k),
                 "channel": d.channel} for k, d in enumerate(self._fleet.infos)]

    @property
    def restarts(self) -> int:
        """Pools rebuilt so far (``on_worker_error="restart"``)."""
        return self._fleet.restarts

    @property
    def restart_log(self) -> list[dict]:
        """One entry per rebuild: ``pool``, ``old_pid``/``old_node``, ``new_pid``/``new_node``, ``op``, ``cause``."""
        return self._fleet.restart_log

    def __len__(self) -> int:
        return self.num_envs

    def __repr__(self) -> str:
        nodes = len({s.node_id for s in self._placement.slots})
        return (f"RayPool({self.num_envs} envs in {self.num_pools} pools on {nodes} nodes, batch_size="
                f"{self.batch_size}, sub-batches {self.sub_batch_sizes}, {self._life.state.value})")

    # --- sync ------------------------------------------------------------------------------------

    @_entry
    def reset(self, seed: int | Sequence[int | None] | None = None, options: dict | Sequence | None = None):
        """Reset every env; returns ``(obs, infos)`` in env order, obs ``(num_envs, *obs_shape)``.

        ``seed``: an int gives env ``i`` the seed ``seed + i`` (on whichever node it runs),
        a list one per env.  ``options``: a dict for every env, a list with one per env, or a
        dict with ``"reset_mask"`` (bool ``(num_envs,)``) to reset only those envs: the others keep their
        observations, as in gymnasium's vector envs (a pool with no env in the mask is not reset at all)."""
        self._life.check_idle()
        seeds = seed_list(seed, self.num_envs)
        ranges = [self.env_range(k) for k in range(self.num_pools)]
        per_pool: list[Any] = [options for _ in ranges]
        left_out: set[int] = set()   # pools with no env in the mask: not reset, their envs keep their observations
        if isinstance(options, (list, tuple)):
            options = check_options_list(options, self.num_envs)
            per_pool = [options[r.start:r.stop] for r in ranges]
        elif options is not None and "reset_mask" in options:
            mask = check_reset_mask(options["reset_mask"], self.num_envs)
            left_out = {k for k, r in enumerate(ranges) if not mask[r.start:r.stop].any()}
            # a pool left out and rebuilt meanwhile resets all its envs (Recovery.restart_sync drops the mask)
            per_pool = [{**options, "reset_mask": mask[r.start:r.stop]} for r in ranges]
        self._forget_async()
        self._ledger.sync_autoreset.clear()
        refs = [self._fleet.call(k, "observations") if k in left_out else
                self._fleet.call(k, "reset", seeds[r.start:r.stop], per_pool[k]) for k, r in enumerate(ranges)]
        outcomes = self._wait(refs, list(range(self.num_pools)), "reset")
        answers: list[Resets] = self._recovery.settle(outcomes, "reset", restart=True, seeds=seeds, options=per_pool)
        self._life.ready()
        return concat([a.obs for a in answers]), merge_infos([a.infos for a in answers], self._placement.sizes)

    def step(self, actions: Any, env_ids: Any = None):
        """Step every env (or, with ``env_ids``, ``send`` then ``recv``).

        ``actions``: ``(num_envs, *act_shape)``.  Returns ``(obs, rewards, terminated,
        truncated, infos)`` in env order: obs ``(num_envs, *obs_shape)``, rewards float64
        ``(num_envs,)``, flags bool ``(num_envs,)``."""
        if env_ids is not None:
            self.send(actions, env_ids)
            return self.recv()
        return self._sync_step(actions)

    @_entry
    def _sync_step(self, actions: Any):
        # step_async and step_wait under one entry: beside busy workers every Python call of the driver is paid
        # cold, and a sync step is the call RayPool makes most (issue 34)
        self._post_step(actions)
        return self._collect_step(None)

    @_entry
    def step_async(self, actions: Any) -> None:
        """Send every pool its slice of ``actions``; ``step_wait()`` returns the results."""
        self._post_step(actions)

    def _post_step(self, actions: Any) -> None:
        self._life.check_step_async()
        if batch_len(actions) != self.num_envs:
            raise ValueError(f"actions have {batch_len(actions)} rows, the pool has {self.num_envs} envs")
        self._actions.check(actions)
        self._forget_async()
        auto, call = self._ledger.sync_autoreset, self._fleet.call
        refs = [None if k in auto else call(k, "step", take_rows(actions, rows))
                for k, rows in enumerate(self._pool_rows)]
        # aimed once every request is out: the last pool starts its step no later for it
        self._output.aim([ref if isinstance(ref, Reply) else None for ref in refs])
        self._step_refs = refs
        self._life.step_posted()

    @_entry
    def step_wait(self, timeout: float | None = None):
        """Results of the pending ``step_async()``, in env order (see :meth:`step`).

        ``timeout``: seconds to wait; on TimeoutError the step stays pending."""
        return self._collect_step(timeout)

    def _collect_step(self, timeout: float | None):
        self._life.check_step_wait()
        refs = self._step_refs
        start = time.monotonic()
        pools = [k for k, ref in enumerate(refs) if ref is not None]
        outcomes = self._wait([refs[k] for k in pools], pools, "step", timeout=timeout, start=start)
        self._step_refs = None
        self._life.step_done()
        failed = [o.pool for o in outcomes if o.error is not None]
        if failed:   # refused from now on, as a local Pool refuses: no healthy pool steps again before a reset
            self._life.needs_reset(f"pool {failed[0]} raised in step; call reset() before stepping again")
        answers = dict(zip(pools, self._recovery.settle(outcomes, "step", restart=True)))
        parts = [answers[k] if k in answers else   # the autoreset step after a restart: nothing ran
                 Rows.autoreset(np.arange(self._placement.sizes[k]), self._ledger.sync_autoreset.pop(k))
                 for k in range(self.num_pools)]
        return self._output.join(parts).as_step()

    # --- async -----------------------------------------------------------------------------------

    @_entry
    def async_reset(self) -> None:
        """Reset every env without waiting; the results arrive through ``recv()``."""
        self._life.check_idle()
        self._check_sends()
        self._ledger.all_sent()
        for k in range(self.num_pools):
            self._ledger.sends[self._fleet.call(k, "async_reset")] = k
        self._life.ready()
        self._life.in_flight = self.num_envs

    @_entry
    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Start stepping ``env_ids`` (global ids; all envs when None) with ``actions``
        (``(len(env_ids), *act_shape)``); returns at once.  Everything about the call (ids,
        actions, envs already in flight) is checked here, before anything is sent."""
        self._life.check_send()
        ids = np.arange(self.num_envs) if env_ids is None else env_id_array(env_ids)
        ledger = self._ledger
        ledger.claim(ids)
        try:
            if batch_len(actions) != len(ids):
                raise ValueError(f"actions have {batch_len(actions)} rows for {len(ids)} env ids")
            self._actions.check(actions, ids)
        except BaseException:
            ledger.unclaim(ids)
            raise
        for d in ledger.plan_send(ids):
            part = take_rows(actions, d.positions)
            if d.with_recv:
                ledger.requests[self._fleet.call(d.pool, "send_recv", part, d.local_ids)] = d.pool
            else:
                ledger.sends[self._fleet.call(d.pool, "send", part, d.local_ids)] = d.pool
        self._life.in_flight += len(ids)

    @_entry
    def recv(self):
        """The first ``batch_size`` envs to finish, counted in whole sub-batches (see the module doc).

        Returns ``(obs, rewards, terminated, truncated, infos)``, ``batch_size`` rows in
        completion order, with ``infos["env_id"]`` (int32, global ids)."""
        B = self.batch_size
        self._life.check_recv(B)
        ledger = self._ledger
        watch = self._watch("recv")
        while ledger.ready.count < B:
            self._check_sends()
            for k in ledger.to_request():
                ledger.requests[self._fleet.call(k, "recv")] = k
            if not ledger.requests:
                raise RuntimeError(
                    f"recv() cannot finish: {ledger.ready.count} rows are ready and no pool has a whole sub-batch "
                    f"in flight (in flight per pool {ledger.available}, sub-batches {self.sub_batch_sizes}); send "
                    "the envs recv() returned back, or choose sub_batch_sizes that divide what you send")
            refs = list(ledger.requests)
            done = wait_done(refs, 1, SLICE_S)
            if done and len(refs) > 1:
                done = wait_done(refs, len(refs), 0)
            for ref in done:
                self._take(ref)
            if not done:
                for k in watch.after_slice(list(ledger.requests.values())):
                    self._recovery.async_death(node_gone(k), "recv")
        rows = ledger.take(B)
        self._life.in_flight -= B
        return rows.as_recv()

    def _take(self, ref: Any) -> None:
        o = outcome_of(ref, self._ledger.requests.pop(ref))
        if o.death is None and o.error is None:
            self._ledger.received(o.pool, o.value)
        else:
            self._settle_async([o], "recv")

    def _check_sends(self) -> None:
        """Handle the finished fire-and-forget calls (see :meth:`_settle_async`)."""
        sends = self._ledger.sends
        if not sends:
            return
        done = wait_done(list(sends), len(sends), 0)
        self._settle_async([outcome_of(ref, sends.pop(ref)) for ref in done], "send")

    def _settle_async(self, outcomes: list[Outcome], op: str) -> None:
        """Rebuild (or fail on) the dead pools of async calls' ``outcomes``, then raise the first error one of the
        others raised (the pool then needs a reset)."""
        dead = {o.pool: o for o in outcomes if o.death is not None}
        for o in dead.values():
            self._recovery.async_death(o, op)
        failed = [o for o in outcomes if o.error is not None and o.pool not in dead]
        if failed:
            self._life.needs_reset(f"pool {failed[0].pool} raised in {op}; call reset() or async_reset()")
            raise self._recovery.global_error(failed[0].pool, failed[0].error)

    def _forget_async(self) -> None:
        """Before a sync call: surface what earlier sends raised, then drop the async state."""
        if self._ledger.idle and not self._life.in_flight:
            return
        self._check_sends()
        self._ledger.forget()
        self._life.in_flight = 0

    # --- per-env messages ------------------------------------------------------------------------

    def call(self, name: str, *args: Any, env_ids: Any = None, **kwargs: Any) -> tuple:
        """``env.name(*args, **kwargs)`` (or the attribute) in every env or ``env_ids``; results in that order."""
        return self._per_env("call", name, env_ids, args, kwargs)

    def get_attr(self, name: str, env_ids: Any = None) -> tuple:
        """``env.get_wrapper_attr(name)`` of every env or of ``env_ids``."""
        return self._per_env("get_attr", name, env_ids, (), {})

    def set_attr(self, name: str, values: Any, env_ids: Any = None) -> None:
        """Set ``name`` on every env or on ``env_ids``: a list/tuple gives one value per env."""
        ids = env_id_list(env_ids, self.num_envs)
        if isinstance(values, (list, tuple)):
            if len(values) != len(ids):
                raise ValueError(f"set_attr needs {len(ids)} values, got {len(values)}")
            for i, v in zip(ids, values):
                self._per_env("set_attr", name, [i], (v,), {})
            return
        self._per_env("set_attr", name, ids, (values,), {})

    def apply(self, fn: Callable[..., Any], *args: Any, env_ids: Any = None, **kwargs: Any) -> tuple:
        """``fn(env, *args, **kwargs)`` in every env (or ``env_ids``), results in that order."""
        return self._per_env("apply", getattr(fn, "__name__", "fn"), env_ids, (cloudpickle.dumps(fn), args), kwargs)

    @_entry
    def _per_env(self, op: str, name: str, env_ids: Any, args: tuple, kwargs: dict) -> tuple:
        self._life.check_idle()
        ids = env_id_list(env_ids, self.num_envs)
        by_pool: dict[int, list[int]] = {}
        for pos, i in enumerate(ids):
            by_pool.setdefault(int(self._placement.owner[i]), []).append(pos)
        pools = list(by_pool)
        starts = self._placement.starts
        refs = [self._fleet.call(k, "per_env", op, name, [ids[p] - int(starts[k]) for p in by_pool[k]], args, kwargs)
                for k in pools]
        answers = self._recovery.settle(self._wait(refs, pools, op), op, restart=False)
        out: list = [None] * len(ids)
        for k, answer in zip(pools, answers):
            for pos, value in zip(by_pool[k], answer or ()):
                out[pos] = value
        return tuple(out)

    # --- waiting and faults ----------------------------------------------------------------------

    def _watch(self, op: str, timeout: float | None = None, start: float | None = None) -> Watch:
        life = self._life
        # a passed step_timeout kills the actors before the error leaves the wait
        return Watch(op, timeout, self.step_timeout, self._fleet.node_of, self._fleet.describe_pools,
                     cancelled=lambda: life.close_requested, start=start, on_step_timeout=self._abort)

    def _wait(self, refs: list, pools: list[int], op: str, timeout: float | None = None,
              start: float | None = None) -> list[Outcome]:
        """Every answer of one call (``pools[i]`` for ``refs[i]``), waited for in watched slices (its limits counted
        from ``start``, monotonic seconds, when the wait began before)."""
        return gather(refs, pools, self._watch(op, timeout, start))

    # --- closing ---------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0, terminate: bool = False) -> None:
        """Close every local pool and stop the actors. Idempotent; from a signal handler or another
        thread during a call, the call closes the pool when it ends.  ``terminate``: kill the actors
        (and with them their workers) at once, without asking their pools to close."""
        self._close_timeout = timeout   # also for a call that performs a close requested during it
        if not self._life.begin_close(kill=terminate):
            return
        try:
            self._shut_down(kill=terminate)
        finally:
            self._life.end_close()

    def _abort(self) -> None:
        """The fatal path (``step_timeout`` passed, Ctrl-C): a pool that overran is not asked to close, its
        actors are killed at once (their workers die with them), so the error comes at the bound,
        not after the close grace."""
        self._shut_down(kill=True)

    def _shut_down(self, kill: bool = False) -> None:
        """Stop the actors (``kill``: at once, else after asking their pools to close) and mark the pool closed (the
        caller holds the pool's entry)."""
        self._life.close()
        self._step_refs = None
        self._ledger.forget()
        if not ray.is_initialized():
            self._fleet.forget()
        elif kill:
            self._fleet.kill_all()
            self._fleet.forget()
        else:
            self._fleet.close(self._close_timeout)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Its actors and futures belong to this driver: a copy (copy, deepcopy, pickle, a Ray task's
        # argument) could only close them under the original or fail later, so copying is refused.
        raise TypeError("a RayPool cannot be copied or pickled: its actors belong to the process that created it; "
                        "pass its arguments and build a new one")

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        life = getattr(self, "_life", None)
        if life is not None and not life.closed and ray.is_initialized():
            self.close(timeout=2.0)
