"""The Ray actor that hosts one local :class:`~shmpool.Pool` on its node, and what it answers with.

Every answer is a named type of plain numpy data (:class:`ActorInfo`, :class:`Resets`,
:class:`~.batches.Rows` with the pool's local env ids); shmpool's errors leave the actor as
:class:`RemoteError`, which Ray can unpickle."""
from __future__ import annotations

import functools
import os
import threading
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..errors import ShmpoolError, SpacesDifferError
from ..pool import Pool
from .batches import Rows
from .channel import ChannelServer, Route
from .placement import numa_cpu_groups, slot_cpus

# What the driver's direct connection may call: every call that touches the pool (describe stays a Ray call,
# since the connection's address is part of its answer).
CHANNEL_CALLS = frozenset({"reset", "observations", "step", "async_reset", "send", "recv", "send_recv", "per_env",
                           "close"})


@dataclass(frozen=True)
class ActorInfo:
    """What an actor reports once its pool is up: the pool's spaces and options, and where it runs."""

    observation_space: Any
    observation_spaces: tuple         # each env's: they may differ in bounds (observation_mode="different")
    action_space: Any
    metadata: dict
    render_mode: str | None
    spec: Any
    autoreset_mode: str
    pid: int
    node_id: str
    hostname: str
    num_workers: int
    cpus: list[int]
    cores: list[int]                  # every core the local pool's processes (the actor included) may use
    channel: tuple[str, int] | None   # where the actor listens for the driver's connection (None: Ray calls only)


@dataclass(frozen=True)
class SpacesRefused:
    """What an actor reports instead of :class:`ActorInfo` when its local pool refused its envs' observation spaces
    (``SpacesDifferError``): each env's, for the driver to judge with every pool's and name the env by its global
    id, as one local Pool over all the envs would."""

    observation_spaces: tuple


@dataclass(frozen=True)
class Resets:
    """A pool's ``reset`` answer: ``obs`` ``(n, *obs_shape)`` and vector ``infos``."""

    obs: Any
    infos: dict


class RemoteError(Exception):
    """A shmpool error crossing Ray: its class, message and attributes (shmpool's errors take
    keyword-only arguments, which Ray cannot unpickle)."""

    def __init__(self, cls: type, message: str, attrs: dict) -> None:
        super().__init__(cls, message, attrs)

    def rebuild(self) -> BaseException:
        """The original exception: its class, message and attributes."""
        cls, message, attrs = self.args
        exc = cls.__new__(cls)
        Exception.__init__(exc, message)
        exc.__dict__.update(attrs)
        return exc


def _portable(method: Callable) -> Callable:
    """Actor method wrapper: one pool call at a time (Ray's thread and the connection's thread), and
    shmpool's errors leave the actor as :class:`RemoteError`."""
    @functools.wraps(method)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        try:
            with self.lock:
                return method(self, *args, **kwargs)
        except ShmpoolError as exc:
            attrs = dict(vars(exc))
            try:
                cloudpickle.dumps(attrs)
            except Exception:   # the env's own exception object does not pickle: its type and text remain
                attrs = {k: (None if k == "remote_exception" else v) for k, v in attrs.items()}
            raise RemoteError(type(exc), str(exc), attrs) from None
    return wrapper


class PoolActor:
    """Runs one local :class:`Pool` on its node; every method answers with plain numpy data.

    ``token``: when given, the actor also serves :data:`CHANNEL_CALLS` to the driver that presents it on a
    direct connection (:mod:`.channel`), on its node's address or where ``route`` says."""

    def __init__(self, fns_blob: bytes, seed: int | None, batch_size: int, slot: int, per_node: int | str,
                 pool_kwargs: dict, token: bytes | None = None, route: Route | None = None) -> None:
        self.lock = threading.RLock()
        fns = cloudpickle.loads(fns_blob)
        kwargs = dict(pool_kwargs)
        if "cpus" not in kwargs:
            cpus = slot_cpus(slot, per_node)
            if cpus is not None:
                kwargs["cpus"] = cpus
        if kwargs.get("cpus"):
            # The actor is its pool's parent: it lives on the pool's cores (its NUMA node's, its share of the
            # node's), so the pool's wait policy counts the cores it really has instead of spinning on a
            # core another pool's workers need.
            os.sched_setaffinity(0, kwargs["cpus"])
        self.refused: SpacesRefused | None = None
        try:
            self.pool = Pool(fns, batch_size=batch_size, seed=seed, copy=False, **kwargs)
        except SpacesDifferError as exc:   # the driver raises it, judged over every pool's envs
            self.refused, self.server = SpacesRefused(exc.observation_spaces), None
            return
        self.env_ids = np.arange(self.pool.num_envs, dtype=np.int64)   # every step answer's ids, never written
        self.obs: Any = None   # the pool's observations (copy=False: views of its region, current after every call)
        self.env_ids.flags.writeable = False
        # PoolActor's own functions bound to the instance, not the instance's methods: Ray's actor class wraps each
        # method for tracing, which a call that is not a Ray call has no use for and would pay on every step
        handlers = {name: types.MethodType(getattr(PoolActor, name), self) for name in CHANNEL_CALLS}
        if token is None:
            self.server = None
        elif route is None:   # the node's own address, the one Ray uses
            self.server = ChannelServer(ray.util.get_node_ip_address(), token, handlers)
        else:                 # a harness's link (the bench's, between two network namespaces)
            self.server = ChannelServer(route.host, token, handlers, route.listen_socket)

    def describe(self) -> ActorInfo | SpacesRefused:
        if self.refused is not None:
            return self.refused
        p = self.pool
        return ActorInfo(observation_space=p.single_observation_space, observation_spaces=p.observation_spaces,
                         action_space=p.single_action_space,
                         metadata=p.metadata, render_mode=p.render_mode, spec=p.spec,
                         autoreset_mode=p.autoreset_mode, pid=os.getpid(),
                         node_id=ray.get_runtime_context().get_node_id(), hostname=os.uname().nodename,
                         num_workers=p.num_workers, cpus=p.worker_cpus, cores=sorted(os.sched_getaffinity(0)),
                         channel=None if self.server is None else self.server.address)

    @_portable
    def reset(self, seeds: list, options: Any) -> Resets:
        obs, infos = self.pool.reset(seed=seeds, options=options)
        self.obs = obs
        return Resets(obs, infos)

    @_portable
    def observations(self) -> Resets:
        """What ``reset`` answers for a mask that leaves every env of this pool out: nothing is reset, the envs keep
        their observations (as gymnasium's vector envs keep those of envs a mask leaves out) and give no infos."""
        if self.obs is None:
            raise RuntimeError("this pool was never reset: it has no observations yet")
        return Resets(self.obs, {})

    @_portable
    def step(self, actions: Any) -> Rows:
        return Rows(self.env_ids, *self.pool.step(actions))   # (obs, rewards, terminated, truncated, infos)

    @_portable
    def async_reset(self) -> None:
        self.pool.async_reset()

    @_portable
    def send(self, actions: Any, env_ids: np.ndarray) -> None:
        self.pool.send(actions, env_ids)

    @_portable
    def recv(self) -> Rows:
        obs, rew, term, trunc, infos = self.pool.recv()
        return Rows(infos.pop("env_id").astype(np.int64), obs, rew, term, trunc, infos)

    def send_recv(self, actions: Any, env_ids: np.ndarray) -> Rows:
        """``send`` then ``recv`` in one actor call (one round trip)."""
        with self.lock:   # PoolActor's functions, as in serve: no tracing wrapper for a call that is not Ray's
            PoolActor.send(self, actions, env_ids)
            return PoolActor.recv(self)

    @_portable
    def per_env(self, op: str, name: str, env_ids: list[int], args: tuple, kwargs: dict) -> tuple:
        if op == "call":
            return self.pool.call(name, *args, env_ids=env_ids, **kwargs)
        if op == "get_attr":
            return self.pool.get_attr(name, env_ids=env_ids)
        if op == "set_attr":
            return self.pool.set_attr(name, args[0], env_ids=env_ids)
        if op == "apply":
            return self.pool.apply(cloudpickle.loads(args[0]), *args[1], env_ids=env_ids, **kwargs)
        raise ValueError(f"unknown op {op!r}")

    @_portable
    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.pool.close()


RemotePoolActor = ray.remote(PoolActor)


def start_actor(options: dict, node_id: str, fns_blob: Any, seed: int | None, batch_size: int, slot: int,
                per_node: int | str, pool_kwargs: dict, token: bytes | None, route: Route | None = None) -> Any:
    """A new :class:`PoolActor` pinned to ``node_id`` (unless ``options`` schedule it otherwise)."""
    opts = dict(options)
    opts.setdefault("scheduling_strategy", NodeAffinitySchedulingStrategy(node_id, soft=False))
    return RemotePoolActor.options(**opts).remote(fns_blob, seed, batch_size, slot, per_node, pool_kwargs, token,
                                                  route)


def pools_on_nodes(pools_per_node: int | str, nodes: Iterable[str], timeout: float | None) -> list[int]:
    """Pools on each node: the count given, or (``"numa"``) the NUMA nodes each Ray node reports."""
    nodes = list(nodes)
    if pools_per_node != "numa":
        return [int(pools_per_node)] * len(nodes)

    @ray.remote(num_cpus=0)
    def count() -> int:
        return len(numa_cpu_groups())

    refs = [count.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote()
            for nid in nodes]
    return ray.get(refs, timeout=timeout)
