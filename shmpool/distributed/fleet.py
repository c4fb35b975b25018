"""The actors of a :class:`~shmpool.distributed.RayPool`: starting them on their nodes, describing
a dead one, rebuilding one (``on_worker_error="restart"``), and stopping them all."""
from __future__ import annotations

import collections
import contextvars
import re
import secrets
import warnings
from typing import Any

import cloudpickle
import ray

from .. import layout
from .actor import ActorInfo, Resets, SpacesRefused, start_actor
from .channel import TOKEN_BYTES, Channel, Route
from .faults import Outcome, RemotePoolDiedError, Watch, gather, wait_done
from .placement import Placement, describe_range

REBUILD_TRIES = 3   # nodes tried for one rebuild before the RayPool gives up and closes
CONNECT_TIMEOUT_S = 30.0
# Where the direct connections of the RayPools built in this context run (None: each node's own address): a seam for a
# harness, set around a build (``ROUTE.set(route)`` ... ``ROUTE.reset(token)``); the bench's --netem link uses it.
ROUTE: contextvars.ContextVar[Route | None] = contextvars.ContextVar("shmpool_route", default=None)


def agreed_spaces(infos: list[ActorInfo | SpacesRefused], place: Placement, mode: str) -> tuple:
    """Each env's observation space (pool ``k``'s envs are ``place.env_range(k)``): the pools' spaces judged
    together as one local :class:`~shmpool.Pool` judges its workers' (``mode``: ``observation_mode``;
    ``SpacesDifferError`` names the first env that breaks it), once every pool's action space is the first's
    (ValueError naming the first env whose is not).  A pool that refused its own envs' spaces (in a mode as strict
    as ``mode`` or laxer) breaks the judgement over all of them too: equal spaces, and spaces of one type, shape and
    dtype, are each transitive."""
    ranges = [place.env_range(k) for k in range(len(infos))]
    described = [(k, d) for k, d in enumerate(infos) if isinstance(d, ActorInfo)]
    k0, first = described[0] if described else (0, None)
    for k, d in described[1:]:
        if d.action_space != first.action_space:
            raise ValueError(f"env {ranges[k].start} (pool {k}) has spaces {d.observation_space}, {d.action_space}; "
                             f"env {ranges[k0].start} has {first.observation_space}, {first.action_space}: all envs "
                             f"must share their action space")
    return layout.observation_spaces([(r.start, r.stop) for r in ranges], infos, mode)


class Fleet:
    """One actor per pool of ``placement``, each hosting a local Pool of that pool's envs.

    ``infos[k]``: what pool ``k``'s actor reported (None until it has); ``restarts`` and
    ``restart_log`` count and describe the rebuilds.  ``direct``: the pools' calls go over a direct
    connection to each actor (:mod:`.channel`) rather than through Ray."""

    def __init__(self, placement: Placement, fns: list, seed: int | None, pool_kwargs: list[dict],
                 actor_options: dict, startup_timeout: float | None, direct: bool = True) -> None:
        self.placement = placement
        self.seed = seed
        self.pool_kwargs = pool_kwargs
        self.actor_options = actor_options
        self.startup_timeout = startup_timeout
        self.blobs = [ray.put(cloudpickle.dumps(fns[r.start:r.stop]))
                      for r in map(placement.env_range, range(placement.num_pools))]
        self.actors: list = []
        self.token = secrets.token_bytes(TOKEN_BYTES) if direct else None
        self.route = ROUTE.get() if direct else None   # a harness's link (the bench's)
        self.channels: list[Channel | None] = [None for _ in range(placement.num_pools)]
        self.infos: list[ActorInfo | None] = [None for _ in range(placement.num_pools)]
        self.observation_spaces: tuple = ()   # each env's, once started
        self.restarts = 0
        self.restart_log: list[dict] = []

    # --- start and stop ----------------------------------------------------------------------

    def new_actor(self, k: int, node_id: str | None = None) -> Any:
        slot = self.placement.slots[k]
        start = int(self.placement.starts[k])
        return start_actor(self.actor_options, slot.node_id if node_id is None else node_id, self.blobs[k],
                           None if self.seed is None else self.seed + start, self.placement.sub_batch_sizes[k],
                           slot.index, slot.per_node, self.pool_kwargs[k], self.token, self.route)

    def connect(self, k: int) -> None:
        """Open the direct connection to pool ``k``'s actor; one that cannot be opened leaves that pool on
        Ray calls, with a warning (a driver outside the cluster's network, a firewall)."""
        old, self.channels[k] = self.channels[k], None
        if old is not None:
            old.close()
        address = self.infos[k].channel
        if address is None:
            return
        try:
            self.channels[k] = Channel.connect(address, self.token, CONNECT_TIMEOUT_S,
                                               *(() if self.route is None else (self.route.connect_socket,)))
        except OSError as exc:
            warnings.warn(f"pool {k}: its actor's direct connection ({address[0]}:{address[1]}) could not be "
                          f"opened ({exc}); its calls go through Ray, which is several times slower",
                          RuntimeWarning, stacklevel=4)

    def transport(self, k: int) -> str:
        """How pool ``k``'s calls travel: ``"direct"`` or ``"ray"``."""
        return "ray" if self.channels[k] is None else "direct"

    def call(self, k: int, method: str, *args: object) -> object:
        """Call ``method`` of pool ``k``'s actor: a :class:`~.channel.Reply`, or a Ray future without a connection."""
        channel = self.channels[k]
        if channel is not None:
            return channel.call(method, *args)
        return getattr(self.actors[k], method).remote(*args)

    def start(self, observation_mode: str = "same") -> list[ActorInfo]:
        """Start every actor and wait (bounded by ``startup_timeout``) for its report, then judge the pools' spaces
        together (:func:`agreed_spaces`; each env's observation space is then ``observation_spaces``); any failure
        kills them all and raises."""
        P = self.placement.num_pools
        try:
            self.actors = [self.new_actor(k) for k in range(P)]
            watch = Watch("start-up", self.startup_timeout, None, self.node_of, self.describe_pools)
            for o in gather([a.describe.remote() for a in self.actors], list(range(P)), watch):
                if o.death is not None:
                    raise self.death_error(o.pool, "start-up", o.death, o.node_gone) from o.death
                if o.error is not None:
                    raise o.error
                self.infos[o.pool] = o.value
            self.observation_spaces = agreed_spaces(self.infos, self.placement, observation_mode)
            for k in range(P):
                self.connect(k)
        except BaseException:
            self.kill_all()
            raise
        return self.infos  # type: ignore[return-value]

    def forget(self) -> None:
        """The user's ``ray.shutdown()`` took the actors: nothing is left to stop (a Ray call would
        start a new, empty Ray)."""
        self.close_channels()
        self.actors = []

    def close_channels(self) -> None:
        for channel in self.channels:
            if channel is not None:
                channel.close()
        self.channels = [None for _ in self.channels]

    def kill_all(self) -> None:
        self.close_channels()
        for actor in self.actors:
            ray.kill(actor)

    def close(self, timeout: float) -> None:
        """Close every local pool (waiting up to ``timeout`` s in all), then kill the actors."""
        futures = [self.call(k, "close") for k in range(len(self.actors))]
        if futures:
            wait_done(futures, len(futures), timeout)  # a pool that does not answer is killed anyway
        self.kill_all()
        self.actors = []

    # --- describing ----------------------------------------------------------------------------

    def node_of(self, k: int) -> str:
        """Pool ``k``'s node: the one its actor reported, else the one it was placed on."""
        info = self.infos[k]
        return info.node_id if info is not None else self.placement.slots[k].node_id

    def describe_pools(self, pools: list[int]) -> str:
        return "envs " + ", ".join(describe_range(self.placement.env_range(k)) for k in pools)

    def describe_death(self, k: int, op: str, exc: BaseException, node_gone: bool = False) -> str:
        info = self.infos[k]
        node = self.node_of(k)
        if node_gone:
            how = "its node left the cluster"
        elif getattr(exc, "actor_init_failed", False):
            # Ray words it "an error raised in its creation task" and the traceback; the error of the
            # local pool (an env's constructor, a misspelt option) is the traceback's last line.
            lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
            ours = [line for line in lines if re.match(r"[\w.]*(EnvError|PoolResourceError|TimeoutError): ", line)]
            how = "its local pool could not be built: " + ((ours or lines)[-1][:500] if lines else type(exc).__name__)
        else:
            text = str(exc).strip().splitlines()
            how = type(exc).__name__ + (f": {text[0][:300]}" if text else "")
        actor = (f"Ray actor pid {info.pid} on node {node} ({info.hostname})" if info is not None
                 else f"Ray actor on node {node}")
        return f"pool {k} ({actor}, envs {describe_range(self.placement.env_range(k))}) died during {op}: {how}"

    def death_error(self, k: int, op: str, exc: BaseException, node_gone: bool = False,
                    detail: str = "") -> RemotePoolDiedError:
        """The error that reports pool ``k``'s death (the caller closes the RayPool and raises it)."""
        info = self.infos[k]
        return RemotePoolDiedError(self.describe_death(k, op, exc, node_gone) + detail + "; the pool is closed",
                                   worker=k, pid=info.pid if info is not None else -1, node_id=self.node_of(k),
                                   env_range=self.placement.env_range(k))

    # --- rebuilding ----------------------------------------------------------------------------

    def rebuild(self, k: int, op: str, exc: BaseException, seeds: list | None, options: Any) -> Resets:
        """Replace pool ``k``'s dead actor (on its node if Ray thinks it alive, else on the alive node
        with the fewest of our pools) and reset its envs; raises :class:`RemotePoolDiedError` when
        :data:`REBUILD_TRIES` nodes failed (the caller closes the RayPool)."""
        what = self.describe_death(k, op, exc)
        warnings.warn(f"{what}; restarting it", RuntimeWarning, stacklevel=5)
        ray.kill(self.actors[k])
        if self.channels[k] is not None:
            self.channels[k].close()
            self.channels[k] = None
        old_node = self.node_of(k)
        seeds = [None] * self.placement.sizes[k] if seeds is None else seeds
        tried: list[str] = []
        failures: list[BaseException] = []
        for _ in range(REBUILD_TRIES):
            # A node on its way out can look alive for a few seconds and kill the new actor too.
            alive = [x["NodeID"] for x in ray.nodes() if x["Alive"] and x["NodeID"] not in tried]
            if not alive:
                break
            if old_node in alive:
                target = old_node
            else:
                load = collections.Counter(self.node_of(j) for j in range(self.placement.num_pools))
                target = min(alive, key=lambda nid: load[nid])
            tried.append(target)
            actor = self.new_actor(k, node_id=target)
            self.actors[k] = actor
            watch = Watch(f"restarting pool {k}", self.startup_timeout, None, lambda _, node=target: node,
                          self.describe_pools)
            try:
                answers = gather([actor.describe.remote(), actor.reset.remote(seeds, options)], [k, k], watch)
            except TimeoutError as slow:
                answers = [Outcome(k, death=slow)]
            dead = [o.death for o in answers if o.death is not None]
            if dead:
                failures.append(dead[0])
                ray.kill(actor)
                continue
            for o in answers:
                if o.error is not None:   # the new pool's reset raised: the caller's error, not a death
                    raise o.error
            info, resets = (o.value for o in answers)
            self.restarts += 1
            old = self.infos[k]
            self.restart_log.append({"pool": k, "old_pid": old.pid if old is not None else None, "old_node": old_node,
                                     "new_pid": info.pid, "new_node": target, "op": op, "cause": repr(exc)[:300]})
            self.infos[k] = info
            self.connect(k)
            return resets
        raise self.death_error(k, op, exc, detail=f"; restarting it failed on nodes {tried}: "
                                                  f"{failures[-1] if failures else 'no alive node'!r}") from exc
