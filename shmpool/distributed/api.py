"""``RayPool``: the pool surface (:class:`shmpool.surface.PoolSurface`, every entry checking the one
:class:`~shmpool.state.Lifecycle`) over the Ray backend (:mod:`.ray_backend`: the actors, :mod:`.fleet`; the
bookkeeping, :mod:`.ledger`; the waits, :mod:`.faults`).  This module resolves the arguments and the nodes, builds
the backend and adds what only a RayPool has (its nodes, pools and their env ranges)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ray

from ..arguments import (
    POOL_KEYWORDS,
    check_count,
    check_on_worker_error,
    check_seed,
    check_step_timeout,
    check_typos,
    env_constructors,
    keywords_of,
)
from ..surface import PoolSurface
from .actor import pools_on_nodes
from .fleet import Fleet
from .placement import Placement, Slot
from .ray_backend import RayBackend

TRANSPORTS = ("direct", "ray")
COPY_REFUSED = ("a RayPool cannot be copied or pickled: its actors belong to the process that created it; "
                "pass its arguments and build a new one")


class RayPool(PoolSurface):
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

    The calls are the surface's (:class:`shmpool.surface.PoolSurface`, as for a local Pool); what they do here
    beyond it: ``reset(options={"reset_mask": m})`` resets no pool with none of the envs in ``m`` (its actor answers
    its current observations); ``send`` checks everything about the call (ids, actions, envs already in flight)
    before anything is sent; ``recv`` counts in whole sub-batches (a pool answers with its own ``batch_size``
    rows).  ``restarts`` counts the pools rebuilt (``on_worker_error="restart"``), ``restart_log`` has one entry
    per rebuild: ``pool``, ``old_pid``/``old_node``, ``new_pid``/``new_node``, ``op``, ``cause``.
    """

    _copy_refused = COPY_REFUSED

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
        super().__init__()
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
        fleet = Fleet(place, fns, seed, each, {"num_cpus": 0, "max_restarts": 0, **(actor_options or {})},
                      startup_timeout, direct=transport == "direct")
        self.observation_mode = "different" if all(k.get("observation_mode") == "different" for k in each) else "same"
        # Actions are checked as the pools check (a local Pool(strict=False) takes what strict refuses), and strictly
        # when any pool is: a batch one pool refuses must be refused before any other pool steps
        backend = RayBackend(self.num_envs, place, fleet, observation_mode=self.observation_mode,
                             strict=any(k.get("strict", True) for k in each), on_worker_error=self.on_worker_error,
                             step_timeout=self.step_timeout, shut_down=self._weakly(self._close_now),
                             abort=self._weakly(self._kill_workers_now))
        self._fleet = fleet
        self.autoreset_mode = backend.autoreset_mode
        self._open(backend)

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

    def __repr__(self) -> str:
        nodes = len({s.node_id for s in self._placement.slots})
        return (f"RayPool({self.num_envs} envs in {self.num_pools} pools on {nodes} nodes, batch_size="
                f"{self.batch_size}, sub-batches {self.sub_batch_sizes}, {self._life.state.value})")

    # --- closing ---------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0, terminate: bool = False) -> None:
        """Close every local pool and stop the actors. Idempotent; from a signal handler or another
        thread during a call, the call closes the pool when it ends.  ``timeout``: seconds the local pools
        get to close before their actors are killed.  ``terminate``: kill the actors (and with them their
        workers) at once, without asking their pools to close."""
        if self._backend is not None:
            self._backend.close_timeout = timeout   # also for a call that performs a close requested during it
        super().close(terminate)
