"""``RayPool``: one shmpool :class:`~shmpool.Pool` per Ray node (or per NUMA node of each), one API.

::

    import ray, shmpool.distributed as sd

    ray.init(address="auto")
    with sd.RayPool("CartPole-v1", num_envs=4 * 256, batch_size=256, seed=0) as pool:
        obs, infos = pool.reset()                       # obs: (1024, 4) float32
        obs, rew, term, trunc, infos = pool.step(actions)   # actions: (1024,)
        pool.async_reset()
        obs, rew, term, trunc, infos = pool.recv()      # 256 rows, infos["env_id"] global int32
        pool.send(actions[:256], infos["env_id"])

Layout: the envs are split into contiguous ranges, one per pool (pool ``k`` owns
``pool.env_range(k)``); each pool lives in a Ray actor pinned to its node
(``NodeAffinitySchedulingStrategy``, hard) and steps its envs in its own pinned
worker processes through shared memory, exactly as a local :class:`~shmpool.Pool`.
Only whole sub-batches cross the network, as numpy arrays through Ray's object store.

Sync ``step``/``reset`` send each pool its slice of the actions and concatenate
the answers in env order: the results are the local pool's for the same seeds
(env ``i`` gets seed ``seed + i`` wherever it runs).

Async (EnvPool semantics at sub-batch granularity): each pool's local ``Pool``
has ``batch_size = sub_batch_sizes[k]`` (by default pool ``k``'s share of
``batch_size``, proportional to its envs).  ``recv()`` keeps at most one
``recv`` outstanding per pool, waits (``ray.wait``) for whichever sub-batches
finish first and concatenates them until it has ``batch_size`` rows; rows of a
sub-batch beyond ``batch_size`` are kept (they are finished) and returned first
by the next ``recv``.  So ``recv`` returns exactly ``batch_size`` envs, the
first to finish counted in whole sub-batches, in completion order of the
sub-batches.  A pool is only asked for a sub-batch when at least that many of
its envs are in flight; if no pool can give one (the caller held back envs so
that every pool has fewer in flight than its sub-batch) ``recv`` raises
``RuntimeError`` at once instead of waiting forever.  Sending back the envs
``recv`` returned (EnvPool's loop) never gets there with the default sizes
when ``batch_size * n_k / num_envs`` is an integer for every pool.  A ``send``
that gives a pool a whole sub-batch carries that pool's next ``recv`` in the
same actor call (one Ray round trip); an actor runs one call at a time, so
envs sent to a pool whose ``recv`` is outstanding start once it returns.

Faults: an actor (or its node) dying raises :class:`RemotePoolDiedError` (a
:class:`~shmpool.WorkerDiedError`) naming the node and its env range, and closes
the pool.  With ``on_worker_error="restart"`` the pool is rebuilt (on the same
node if it is alive, else wherever Ray finds room), its envs are reset, and
each of them comes back once with ``truncated=True`` and
``infos["worker_restarted"]`` set: at once for the envs that were in flight,
and in place of the next result for the envs the caller held; under NEXT_STEP
the step after that row is an autoreset step (the reset observation again,
reward 0, no flags), the local pool's convention.  No wait is
unbounded: waits run in slices, checking between slices that the nodes with
outstanding work are alive (``ray.nodes()``), and ``step_timeout`` bounds each
call.
"""
from __future__ import annotations

import collections
import functools
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import cloudpickle
import numpy as np

try:
    import ray
    import ray.exceptions
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as _exc:  # pragma: no cover - exercised only without ray
    raise ImportError("shmpool.distributed needs ray: pip install 'shmpool[ray]' (or 'ray>=2.9')") from _exc

from .arguments import (
    POOL_KEYWORDS,
    check_count,
    check_env_ids,
    check_on_worker_error,
    check_options_list,
    check_seed,
    check_step_timeout,
    env_constructors,
    env_id_array,
    env_id_list,
    shard_sizes,
)
from .autoreset import NEXT_STEP
from .errors import EnvError, PoolClosedError, ShmpoolError, WorkerDiedError
from .pool import Pool
from .resets import check_reset_mask, seed_list

__all__ = ["RayPool", "RemotePoolDiedError"]

_SLICE_S = 0.25            # longest uninterrupted ray.wait; liveness is checked between slices
_LIVENESS_EVERY_S = 1.0    # how often a waiting call asks the GCS which nodes are alive
_DEATH = (ray.exceptions.RayActorError,)  # ActorDiedError, ActorUnavailableError are subclasses


class RemotePoolDiedError(WorkerDiedError):
    """The actor holding one of a :class:`RayPool`'s pools died (or its node did).

    ``worker`` is the pool's index, ``pid`` the actor's process id, ``node_id``
    the Ray node (hex) and ``env_range`` the global env ids it owned."""

    def __init__(self, message: str, *, worker: int, pid: int, node_id: str, env_range: range) -> None:
        super().__init__(message, worker=worker, pid=pid, exitcode=None)
        self.node_id = node_id
        self.env_range = env_range


# --- the actor ---------------------------------------------------------------------------------


def _numa_cpu_groups() -> list[list[int]]:
    """The cores this process may use, grouped by NUMA node (one group if sysfs has none)."""
    allowed = sorted(os.sched_getaffinity(0))
    groups = []
    base = "/sys/devices/system/node"
    try:
        names = sorted((d for d in os.listdir(base) if d.startswith("node") and d[4:].isdigit()),
                       key=lambda d: int(d[4:]))
    except OSError:
        names = []
    from .topology import parse_cpu_list
    for name in names:
        try:
            with open(f"{base}/{name}/cpulist") as f:
                cpus = set(parse_cpu_list(f.read().strip()))
        except (OSError, ValueError):
            continue
        group = [c for c in allowed if c in cpus]
        if group:
            groups.append(group)
    return groups or [allowed]


def _slot_cpus(slot: int, per_node: int | str) -> list[int] | None:
    """The cores of pool ``slot`` among the ``per_node`` pools of this node (None: all)."""
    if per_node == "numa":
        groups = _numa_cpu_groups()
        return groups[slot % len(groups)]
    if per_node == 1:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    sizes = shard_sizes(len(allowed), per_node) if len(allowed) >= per_node else [1] * per_node
    start = sum(sizes[:slot]) % len(allowed)
    return [allowed[(start + i) % len(allowed)] for i in range(sizes[slot])]


class _RemoteError(Exception):
    """A shmpool error crossing Ray: its class, message and attributes (shmpool's errors take
    keyword-only arguments, which Ray cannot unpickle)."""

    def __init__(self, cls: type, message: str, attrs: dict) -> None:
        super().__init__(cls, message, attrs)

    def rebuild(self) -> BaseException:
        cls, message, attrs = self.args
        exc = cls.__new__(cls)
        Exception.__init__(exc, message)
        exc.__dict__.update(attrs)
        return exc


def _portable(method: Callable) -> Callable:
    """Actor method wrapper: shmpool's errors leave the actor as :class:`_RemoteError`."""
    @functools.wraps(method)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except ShmpoolError as exc:
            attrs = dict(vars(exc))
            try:
                cloudpickle.dumps(attrs)
            except Exception:
                attrs = {k: (None if k == "remote_exception" else v) for k, v in attrs.items()}
            raise _RemoteError(type(exc), str(exc), attrs) from None
    return wrapper


class _PoolActor:
    """Runs one local :class:`Pool` on its node; every method answers with plain numpy data."""

    def __init__(self, fns_blob: bytes, seed: int | None, batch_size: int, slot: int, per_node: int | str,
                 pool_kwargs: dict) -> None:
        fns = cloudpickle.loads(fns_blob)
        kwargs = dict(pool_kwargs)
        if "cpus" not in kwargs:
            cpus = _slot_cpus(slot, per_node)
            if cpus is not None:
                kwargs["cpus"] = cpus
        self.pool = Pool(fns, batch_size=batch_size, seed=seed, copy=False, **kwargs)

    def describe(self) -> dict:
        p = self.pool
        return {"observation_space": p.single_observation_space, "action_space": p.single_action_space,
                "metadata": p.metadata, "render_mode": p.render_mode, "spec": p.spec,
                "autoreset_mode": p.autoreset_mode, "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(),
                "hostname": os.uname().nodename, "num_workers": p.num_workers, "cpus": p.worker_cpus}

    @_portable
    def reset(self, seeds: list, options: Any):
        return self.pool.reset(seed=seeds, options=options)

    @_portable
    def step(self, actions: Any):
        return self.pool.step(actions)

    @_portable
    def async_reset(self) -> None:
        self.pool.async_reset()

    @_portable
    def send(self, actions: Any, env_ids: np.ndarray) -> None:
        self.pool.send(actions, env_ids)

    @_portable
    def recv(self):
        return self.pool.recv()

    @_portable
    def send_recv(self, actions: Any, env_ids: np.ndarray):
        self.pool.send(actions, env_ids)
        return self.pool.recv()

    @_portable
    def per_env(self, op: str, name: str, env_ids: list[int], args: tuple, kwargs: dict):
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
        self.pool.close()


_RemotePoolActor = ray.remote(_PoolActor)


# --- batches: rows of nested arrays ------------------------------------------------------------


def _concat(parts: list) -> Any:
    """Concatenate batched observations/actions (arrays, dicts or tuples of them) along axis 0."""
    first = parts[0]
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple):
        return tuple(_concat([p[i] for p in parts]) for i in range(len(first)))
    return np.concatenate(parts) if len(parts) > 1 else np.asarray(first)


def _rows(x: Any, index: Any) -> Any:
    """Rows ``index`` (a slice or an index array) of a batched structure."""
    if isinstance(x, dict):
        return {k: _rows(v, index) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_rows(v, index) for v in x)
    return np.asarray(x)[index]


def _batch_len(x: Any) -> int:
    if isinstance(x, dict):
        return _batch_len(next(iter(x.values())))
    if isinstance(x, tuple):
        return _batch_len(x[0])
    return len(x)


def _column(values: list, sizes: list[int]) -> np.ndarray:
    """One info key over several parts; ``None`` where a part lacks it (zeros / None there)."""
    present = [v for v in values if v is not None]
    ref = present[0]
    filled = []
    for v, n in zip(values, sizes):
        if v is None:
            v = (np.full(n, None, dtype=object) if ref.dtype == object
                 else np.zeros((n, *ref.shape[1:]), dtype=ref.dtype))
        filled.append(v)
    try:
        return np.concatenate(filled)
    except ValueError:  # shapes differ between parts: one object per row, as gymnasium does
        out = np.empty(sum(sizes), dtype=object)
        i = 0
        for v in filled:
            for row in v:
                out[i] = row
                i += 1
        return out


def _merge_infos(parts: list[dict], sizes: list[int]) -> dict:
    """gymnasium vector infos (``key`` + ``_key`` mask, nested dicts) of consecutive row blocks."""
    if len(parts) == 1:
        return parts[0]
    keys: dict[str, None] = {}
    for p in parts:
        keys.update(dict.fromkeys(p))
    out: dict = {}
    for key in keys:
        values = [p.get(key) for p in parts]
        sample = next(v for v in values if v is not None)
        if isinstance(sample, dict):
            out[key] = _merge_infos([v if v is not None else {} for v in values], sizes)
        elif key.startswith("_") and key[1:] in keys:
            out[key] = np.concatenate([np.asarray(v, dtype=bool) if v is not None else np.zeros(n, dtype=bool)
                                       for v, n in zip(values, sizes)])
        else:
            out[key] = _column([None if v is None else np.asarray(v) for v in values], sizes)
    return out


def _mark_restarted(infos: dict, size: int, rows: np.ndarray) -> dict:
    """Set ``infos["worker_restarted"]`` (and its mask) for ``rows`` of a batch of ``size``."""
    flag = np.zeros(size, dtype=bool)
    flag[rows] = True
    if "worker_restarted" in infos:
        flag |= infos["worker_restarted"]
    infos["worker_restarted"] = flag
    infos["_worker_restarted"] = flag.copy()
    return infos


class _Chunk:
    """Finished rows waiting to be returned by ``recv``: global ids, results and infos."""

    __slots__ = ("ids", "obs", "rew", "term", "trunc", "infos")

    def __init__(self, ids, obs, rew, term, trunc, infos) -> None:
        self.ids, self.obs, self.rew, self.term, self.trunc, self.infos = ids, obs, rew, term, trunc, infos

    def select(self, rows: np.ndarray) -> _Chunk:
        """The rows picked by a bool mask (or index array)."""
        return _Chunk(self.ids[rows], _rows(self.obs, rows), self.rew[rows], self.term[rows], self.trunc[rows],
                      _rows(self.infos, rows))

    def split(self, n: int) -> tuple[_Chunk, _Chunk]:
        head, tail = slice(0, n), slice(n, None)
        return (_Chunk(self.ids[head], _rows(self.obs, head), self.rew[head], self.term[head], self.trunc[head],
                       _rows(self.infos, head)),
                _Chunk(self.ids[tail], _rows(self.obs, tail), self.rew[tail], self.term[tail], self.trunc[tail],
                       _rows(self.infos, tail)))


# --- the pool ----------------------------------------------------------------------------------


class RayPool:
    """Many envs in shmpool pools on several Ray nodes, with the API of :class:`shmpool.Pool`.

    ``env``: a gymnasium id (``**env_kwargs`` go to ``gymnasium.make``), one callable or a
    list of callables, cloudpickled once and built on the nodes.

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
    go to every local pool.

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
        **kwargs: Any,
    ) -> None:
        self._closed = True
        self._actors: list = []
        pool_params = POOL_KEYWORDS
        pool_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in pool_params}
        if "copy" in pool_kwargs:
            raise TypeError("'copy' is not a RayPool option: every array it returns is fresh")
        fns = env_constructors(env, num_envs, kwargs)
        self.num_envs = n = len(fns)
        self.on_worker_error = check_on_worker_error(on_worker_error)
        self.step_timeout = check_step_timeout(step_timeout)
        seed = check_seed(seed)
        if pools_per_node != "numa":
            pools_per_node = check_count("pools_per_node", pools_per_node)

        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        alive = {x["NodeID"]: x for x in ray.nodes() if x["Alive"]}
        if nodes is None:
            nodes = [nid for nid, x in alive.items() if x["Resources"].get("CPU", 0) > 0] or list(alive)
        nodes = list(nodes)
        missing = [nid for nid in nodes if nid not in alive]
        if missing:
            raise ValueError(f"nodes {missing} are not alive Ray nodes; alive: {sorted(alive)}")
        if not nodes:
            raise ValueError("no Ray node to run on")
        per = _numa_count(pools_per_node, nodes)
        self._slots = [(nid, p, pools_per_node) for nid, count in zip(nodes, per) for p in range(count)]
        P = len(self._slots)
        if env_counts is None:
            if n < P:
                raise ValueError(f"num_envs={n} is fewer than the {P} pools: every pool needs an env")
            sizes = shard_sizes(n, P)
        else:
            sizes = [check_count("env_counts[]", c) for c in env_counts]
            if len(sizes) != P or sum(sizes) != n:
                raise ValueError(f"env_counts {list(env_counts)} must give {P} pools summing to num_envs={n}")
        self._sizes = sizes
        self._starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self._owner = np.repeat(np.arange(P, dtype=np.int64), sizes)
        self.batch_size = B = n if batch_size is None else check_count("batch_size", batch_size)
        if B > n:
            raise ValueError(f"batch_size={B} is more than num_envs={n}")
        if sub_batch_sizes is None:
            subs = _apportion(B, sizes)
        else:
            subs = [check_count("sub_batch_sizes[]", b) for b in sub_batch_sizes]
            if len(subs) != P:
                raise ValueError(f"sub_batch_sizes needs {P} entries (one per pool), got {len(subs)}")
        for k, (b, s) in enumerate(zip(subs, sizes)):
            if b > s:
                raise ValueError(f"sub_batch_sizes[{k}]={b} is more than pool {k}'s {s} envs")
        self.sub_batch_sizes = subs
        self._seed = seed
        if per_pool_kwargs is not None and len(per_pool_kwargs) != P:
            raise ValueError(f"per_pool_kwargs needs {P} dicts (one per pool), got {len(per_pool_kwargs)}")
        if "on_worker_error" in pool_params:  # a dead worker inside a node: the local pool's own policy
            pool_kwargs.setdefault("on_worker_error", on_worker_error)
        self._pool_kwargs = [{**pool_kwargs, **(per_pool_kwargs[k] if per_pool_kwargs else {})} for k in range(P)]
        self._actor_options = {"num_cpus": 0, "max_restarts": 0, **(actor_options or {})}
        self._startup_timeout = startup_timeout
        self._blobs = [ray.put(cloudpickle.dumps(fns[a:a + s])) for a, s in zip(self._starts.tolist(), sizes)]

        # async state
        self._in_flight = np.zeros(n, dtype=bool)     # sent (or async-reset) and not returned by recv yet
        self._n_flight = 0
        self._avail = [0] * P                         # in flight at pool k and not claimed by a recv future
        self._outstanding: dict[Any, int] = {}        # recv future -> pool
        self._busy = [False] * P                      # pool k has an outstanding recv future
        self._ready: collections.deque[_Chunk] = collections.deque()
        self._n_ready = 0
        self._sends: list = []                        # fire-and-forget futures, checked for errors later
        self._held_restart: list[dict[int, _Chunk]] = [{} for _ in range(P)]  # env -> its restart row
        # NEXT_STEP: the step after a restart row is an autoreset step, as after any truncation (the
        # local pool's convention); the rebuilt env already is in its reset state, so it is answered
        # here with that observation, reward 0 and no flags, without stepping the env.
        self._env_autoreset: dict[int, Any] = {}     # async: env -> its reset observation (one row)
        self._sync_autoreset: dict[int, Any] = {}    # sync: pool -> its envs' reset observations
        self._step_refs: list | None = None
        self._last_liveness = 0.0
        self._describe: list[dict] = [{}] * P
        self.restarts = 0                             # pools rebuilt so far (on_worker_error="restart")
        self.restart_log: list[dict] = []             # one entry per rebuild: pool, old/new pid and node, op, cause

        self._closed = False
        try:
            self._actors = [self._new_actor(k) for k in range(P)]
            described = self._gather([a.describe.remote() for a in self._actors], "start-up",
                                     timeout=startup_timeout, restart=False)
        except BaseException:
            self._kill_all()
            raise
        self._describe = described
        d0 = described[0]
        for k, d in enumerate(described[1:], 1):
            if d["observation_space"] != d0["observation_space"] or d["action_space"] != d0["action_space"]:
                self._kill_all()
                raise ValueError(f"pool {k} has spaces {d['observation_space']}, {d['action_space']}; pool 0 has "
                                 f"{d0['observation_space']}, {d0['action_space']}: all envs must share spaces")
        self.single_observation_space = d0["observation_space"]
        self.single_action_space = d0["action_space"]
        self.metadata = d0["metadata"]
        self.render_mode = d0["render_mode"]
        self.spec = d0["spec"]
        self.autoreset_mode = d0["autoreset_mode"]
        self._blocked: str | None = "call reset() or async_reset() before stepping"

    # --- actors ------------------------------------------------------------------------------

    def _new_actor(self, k: int, node_id: str | None = None):
        node, slot, per_node = self._slots[k]
        node_id = node if node_id is None else node_id
        a = int(self._starts[k])
        opts = dict(self._actor_options)
        opts.setdefault("scheduling_strategy", NodeAffinitySchedulingStrategy(node_id, soft=False))
        seed = None if self._seed is None else self._seed + a
        return _RemotePoolActor.options(**opts).remote(
            self._blobs[k], seed, self.sub_batch_sizes[k], slot, per_node, self._pool_kwargs[k])

    def _kill_all(self) -> None:
        for actor in self._actors:
            try:
                ray.kill(actor)
            except Exception:
                pass

    # --- public API: properties ----------------------------------------------------------------

    @property
    def num_pools(self) -> int:
        """How many local pools (actors) the envs are spread over."""
        return len(self._slots)

    def env_range(self, k: int) -> range:
        """Global env ids owned by pool ``k``."""
        a = int(self._starts[k])
        return range(a, a + self._sizes[k])

    @property
    def nodes(self) -> list[dict]:
        """Per pool: ``node_id``, ``hostname``, actor ``pid``, ``num_workers``, worker ``cpus``, ``envs`` (range)."""
        return [{"node_id": d.get("node_id"), "hostname": d.get("hostname"), "pid": d.get("pid"),
                 "num_workers": d.get("num_workers"), "cpus": d.get("cpus"), "envs": self.env_range(k)}
                for k, d in enumerate(self._describe)]

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """Envs sent (or async-reset) and not returned by ``recv()`` yet."""
        return self._n_flight

    def __len__(self) -> int:
        return self.num_envs

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (f"RayPool({self.num_envs} envs in {self.num_pools} pools on {len({s[0] for s in self._slots})} "
                f"nodes, batch_size={self.batch_size}, sub-batches {self.sub_batch_sizes}, {state})")

    # --- public API: sync ----------------------------------------------------------------------

    def reset(self, seed: int | Sequence[int | None] | None = None, options: dict | Sequence | None = None):
        """Reset every env; returns ``(obs, infos)`` in env order, obs ``(num_envs, *obs_shape)``.

        ``seed``: an int gives env ``i`` the seed ``seed + i`` (on whichever node it runs),
        a list one per env.  ``options``: a dict for every env, a list with one per env, or a
        dict with ``"reset_mask"`` (bool ``(num_envs,)``) to reset only those envs."""
        self._check_open()
        seeds = seed_list(seed, self.num_envs)
        per_pool: list[Any] = [options] * self.num_pools
        if isinstance(options, (list, tuple)):
            options = check_options_list(options, self.num_envs)
            per_pool = [options[r.start:r.stop] for r in map(self.env_range, range(self.num_pools))]
        elif options is not None and "reset_mask" in options:
            mask = check_reset_mask(options["reset_mask"], self.num_envs)
            per_pool = []
            for r in map(self.env_range, range(self.num_pools)):
                sub = mask[r.start:r.stop]
                if not sub.any():
                    raise NotImplementedError(
                        f"reset_mask leaves pool {len(per_pool)} (envs {_fmt(r)}) out entirely; a RayPool "
                        "needs at least one env of each pool in the mask")
                per_pool.append({**options, "reset_mask": sub})
        self._forget_async()
        self._sync_autoreset.clear()
        refs = [self._actors[k].reset.remote(seeds[r.start:r.stop], per_pool[k])
                for k, r in enumerate(map(self.env_range, range(self.num_pools)))]
        results = self._gather(refs, "reset", reset_seeds=seeds, reset_options=per_pool)
        obs = _concat([r[0] for r in results])
        infos = _merge_infos([r[1] for r in results], self._sizes)
        self._blocked = None
        return obs, infos

    def step(self, actions: Any, env_ids: Any = None):
        """Step every env (or, with ``env_ids``, ``send`` then ``recv``).

        ``actions``: ``(num_envs, *act_shape)``.  Returns ``(obs, rewards, terminated,
        truncated, infos)`` in env order: obs ``(num_envs, *obs_shape)``, rewards float64
        ``(num_envs,)``, flags bool ``(num_envs,)``."""
        if env_ids is not None:
            self.send(actions, env_ids)
            return self.recv()
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Send every pool its slice of ``actions``; ``step_wait()`` returns the results."""
        self._check_ready()
        if self._step_refs is not None:
            raise RuntimeError("step_async() while a step is pending; call step_wait() first")
        if self._n_flight:
            raise RuntimeError(f"step() needs every env idle but {self._n_flight} are in flight from send(); "
                               "recv() them first")
        if _batch_len(actions) != self.num_envs:
            raise ValueError(f"actions have {_batch_len(actions)} rows, the pool has {self.num_envs} envs")
        self._forget_async()
        self._step_refs = [None if k in self._sync_autoreset else
                           self._actors[k].step.remote(_rows(actions, slice(r.start, r.stop)))
                           for k, r in enumerate(map(self.env_range, range(self.num_pools)))]

    def step_wait(self, timeout: float | None = None):
        """Results of the pending ``step_async()``, in env order (see :meth:`step`)."""
        refs = self._step_refs
        if refs is None:
            self._check_open()
            raise RuntimeError("step_wait() without a pending step_async()")
        pools = [k for k, ref in enumerate(refs) if ref is not None]
        try:
            got = self._gather([refs[k] for k in pools], "step", timeout=timeout, pools=pools)
        except TimeoutError:
            if self._closed:      # step_timeout: fatal, the pool is closed
                self._step_refs = None
            raise                 # ``timeout``: the step stays pending, step_wait() may be called again
        except BaseException:
            self._step_refs = None
            raise
        self._step_refs = None
        results: list = [None] * self.num_pools
        for k, r in zip(pools, got):
            results[k] = r
        for k in range(self.num_pools):
            if results[k] is None:   # the autoreset step after a restart: nothing ran on the node
                n = self._sizes[k]
                results[k] = (self._sync_autoreset.pop(k), np.zeros(n), np.zeros(n, dtype=bool),
                              np.zeros(n, dtype=bool), {})
        obs = _concat([r[0] for r in results])
        rew = np.concatenate([r[1] for r in results])
        term = np.concatenate([r[2] for r in results])
        trunc = np.concatenate([r[3] for r in results])
        infos = _merge_infos([r[4] for r in results], self._sizes)
        return obs, rew, term, trunc, infos

    # --- public API: async ---------------------------------------------------------------------

    def async_reset(self) -> None:
        """Reset every env without waiting; the results arrive through ``recv()``."""
        self._check_open()
        if self._step_refs is not None:
            raise RuntimeError("a step_async() is pending; call step_wait() first")
        self._forget_async()
        self._sync_autoreset.clear()
        for k, actor in enumerate(self._actors):
            self._sends.append((actor.async_reset.remote(), k))
            self._avail[k] = self._sizes[k]
        self._in_flight[:] = True
        self._n_flight = self.num_envs
        self._blocked = None

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Start stepping ``env_ids`` (global ids; all envs when None) with ``actions``
        (``(len(env_ids), *act_shape)``); returns at once."""
        self._check_ready()
        if self._step_refs is not None:
            raise RuntimeError("a step_async() is pending; call step_wait() first")
        ids = np.arange(self.num_envs) if env_ids is None else env_id_array(env_ids)
        check_env_ids(ids, self.num_envs)
        if self._in_flight[ids].any():
            raise RuntimeError(f"env ids {ids[self._in_flight[ids]].tolist()} are already in flight; recv() them first")
        if _batch_len(actions) != len(ids):
            raise ValueError(f"actions have {_batch_len(actions)} rows for {len(ids)} env ids")
        owners = self._owner[ids]
        self._in_flight[ids] = True
        self._n_flight += len(ids)
        for k in np.unique(owners).tolist():
            pos = np.flatnonzero(owners == k)
            mine = ids[pos]
            held, auto = self._held_restart[k], self._env_autoreset
            if held or auto:
                back = []
                for i in mine.tolist():
                    if i in held:   # reset by a restart while the caller held it: its restart row answers
                        chunk = held.pop(i)
                        if self.autoreset_mode == NEXT_STEP:
                            auto[i] = chunk.obs
                    elif i in auto:  # the autoreset step after its restart row
                        chunk = _Chunk(np.array([i]), auto.pop(i), np.zeros(1), np.zeros(1, dtype=bool),
                                       np.zeros(1, dtype=bool), {})
                    else:
                        continue
                    self._ready.append(chunk)
                    self._n_ready += 1
                    back.append(i)
                if back:
                    keep = ~np.isin(mine, back)
                    pos, mine = pos[keep], mine[keep]
                    if not len(mine):
                        continue
            local = (mine - self._starts[k]).astype(np.int64)
            b = self.sub_batch_sizes[k]
            if not self._busy[k] and self._avail[k] + len(mine) >= b:
                # the recv the next recv() would ask for, in the same actor call (one Ray round trip, not two)
                self._outstanding[self._actors[k].send_recv.remote(_rows(actions, pos), local)] = k
                self._busy[k] = True
                self._avail[k] += len(mine) - b
            else:
                self._sends.append((self._actors[k].send.remote(_rows(actions, pos), local), k))
                self._avail[k] += len(mine)

    def recv(self):
        """The first ``batch_size`` envs to finish, counted in whole sub-batches (see the module doc).

        Returns ``(obs, rewards, terminated, truncated, infos)``, ``batch_size`` rows in
        completion order, with ``infos["env_id"]`` (int32, global ids)."""
        self._check_open()
        B = self.batch_size
        if self._n_flight == 0:
            raise RuntimeError("recv() with nothing in flight: call send() or async_reset() first")
        if self._n_flight < B:
            raise RuntimeError(f"recv() waits for batch_size={B} envs but only {self._n_flight} are in flight; "
                               "send() more first")
        start = time.monotonic()
        while self._n_ready < B:
            self._issue()
            if not self._outstanding:
                raise RuntimeError(
                    f"recv() cannot finish: {self._n_ready} rows are ready and no pool has a whole sub-batch in "
                    f"flight (in flight per pool {self._avail}, sub-batches {self.sub_batch_sizes}); send the envs "
                    "recv() returned back, or choose sub_batch_sizes that divide what you send")
            refs = list(self._outstanding)
            done, _ = ray.wait(refs, num_returns=1, timeout=_SLICE_S)
            if done:
                if len(refs) > 1:
                    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                for ref in done:
                    self._take(ref)
            else:
                self._between_slices("recv", start, None, [self._outstanding[r] for r in refs])
        chunks = []
        got = 0
        while got < B:
            chunk = self._ready.popleft()
            size = len(chunk.ids)
            if got + size > B:
                chunk, rest = chunk.split(B - got)
                self._ready.appendleft(rest)
                size = B - got
            chunks.append(chunk)
            got += size
        self._n_ready -= B
        ids = np.concatenate([c.ids for c in chunks]).astype(np.int32)
        self._in_flight[ids] = False
        self._n_flight -= B
        obs = _concat([c.obs for c in chunks])
        rew = np.concatenate([c.rew for c in chunks])
        term = np.concatenate([c.term for c in chunks])
        trunc = np.concatenate([c.trunc for c in chunks])
        infos = _merge_infos([c.infos for c in chunks], [len(c.ids) for c in chunks])
        infos["env_id"] = ids
        return obs, rew, term, trunc, infos

    def _issue(self) -> None:
        """Ask every idle pool with a whole sub-batch in flight for one (after the sends queued before it)."""
        self._check_sends()
        for k, actor in enumerate(self._actors):
            if not self._busy[k] and self._avail[k] >= self.sub_batch_sizes[k]:
                self._outstanding[actor.recv.remote()] = k
                self._busy[k] = True
                self._avail[k] -= self.sub_batch_sizes[k]

    def _take(self, ref) -> None:
        k = self._outstanding.pop(ref)
        self._busy[k] = False
        try:
            obs, rew, term, trunc, infos = ray.get(ref)
        except _DEATH as exc:
            self._died(k, "recv", exc)
            return
        except ray.exceptions.RayTaskError as exc:
            if _local_death(exc):   # a worker of that pool died and the local pool closed itself
                self._died(k, "recv", _cause(exc))
                return
            self._blocked = f"pool {k} raised in recv; call reset() or async_reset()"
            raise self._raised(k, exc) from None
        ids = infos.pop("env_id").astype(np.int64) + self._starts[k]
        self._ready.append(_Chunk(ids, obs, rew, term, trunc, infos))
        self._n_ready += len(ids)

    def _check_sends(self) -> None:
        """Raise the first error of an earlier send (fire-and-forget) that has finished."""
        if not self._sends:
            return
        refs = [r for r, _ in self._sends]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        if not done:
            return
        finished = set(done)
        failed: list[tuple[int, BaseException]] = []
        pending = []
        for ref, k in self._sends:
            if ref not in finished:
                pending.append((ref, k))
                continue
            try:
                ray.get(ref)
            except (*_DEATH, ray.exceptions.RayTaskError) as exc:
                failed.append((k, exc))
        self._sends = pending
        dead: set[int] = set()
        for k, exc in failed:
            if isinstance(exc, _DEATH) or _local_death(exc):
                if k not in dead:
                    dead.add(k)
                    self._died(k, "send", exc if isinstance(exc, _DEATH) else _cause(exc))
            else:
                self._blocked = f"pool {k} raised in send; call reset() or async_reset()"
                raise self._raised(k, exc) from None

    # --- per-env messages ----------------------------------------------------------------------

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

    def _per_env(self, op: str, name: str, env_ids: Any, args: tuple, kwargs: dict) -> tuple:
        self._check_open()
        if self._step_refs is not None:
            raise RuntimeError("a step_async() is pending; call step_wait() first")
        ids = env_id_list(env_ids, self.num_envs)
        by_pool: dict[int, list[int]] = {}
        for pos, i in enumerate(ids):
            by_pool.setdefault(int(self._owner[i]), []).append(pos)
        pools = list(by_pool)
        refs = [self._actors[k].per_env.remote(op, name, [ids[p] - int(self._starts[k]) for p in by_pool[k]],
                                               args, kwargs) for k in pools]
        answers = self._gather(refs, op, pools=pools, restart=False)
        out: list = [None] * len(ids)
        for k, answer in zip(pools, answers):
            if answer is None:
                continue
            for pos, value in zip(by_pool[k], answer):
                out[pos] = value
        return tuple(out)

    # --- waiting, faults -----------------------------------------------------------------------

    def _gather(self, refs: list, op: str, *, timeout: float | None = None, pools: list[int] | None = None,
                restart: bool = True, reset_seeds: list | None = None, reset_options: list | None = None) -> list:
        """Results of one future per pool (``pools[i]`` for ``refs[i]``), waiting in slices.

        A dead pool raises, or in restart mode is rebuilt and answers with its reset."""
        pools = list(range(len(refs))) if pools is None else pools
        out: list = [None] * len(refs)
        left = dict(zip(refs, range(len(refs))))
        start = time.monotonic()
        while left:
            done, _ = ray.wait(list(left), num_returns=len(left), timeout=_SLICE_S)
            for ref in done:
                i = left.pop(ref)
                k = pools[i]
                try:
                    out[i] = ray.get(ref)
                except _DEATH as exc:
                    if not restart or self.on_worker_error != "restart":
                        self._fail(k, op, exc)
                    out[i] = self._restart(k, op, exc, reset_seeds, reset_options)
                except ray.exceptions.RayTaskError as exc:
                    if _local_death(exc):
                        if not restart or self.on_worker_error != "restart":
                            self._fail(k, op, _cause(exc))
                        out[i] = self._restart(k, op, _cause(exc), reset_seeds, reset_options)
                        continue
                    for other in left:   # let the rest finish so no actor is left mid-call
                        try:
                            ray.get(other, timeout=self.step_timeout)
                        except Exception:
                            pass
                    raise self._raised(k, exc) from None
            if left:
                try:
                    self._between_slices(op, start, timeout, [pools[i] for i in left.values()])
                except _PoolGone as gone:
                    k = gone.pool
                    i = pools.index(k)
                    ref = next(r for r, j in left.items() if j == i)
                    del left[ref]
                    if not restart or self.on_worker_error != "restart":
                        self._fail(k, op, gone.cause)
                    out[i] = self._restart(k, op, gone.cause, reset_seeds, reset_options)
        return out

    def _raised(self, k: int, exc: ray.exceptions.RayTaskError) -> BaseException:
        """Pool ``k``'s exception as the caller should see it: an ``EnvError`` gets the global
        env id (``env_id``) and the pool's node in its message."""
        err = _cause(exc)
        if isinstance(err, EnvError) and err.env_id is not None:
            err.env_id = int(err.env_id) + int(self._starts[k])
            node = self._describe[k].get("node_id") or self._slots[k][0]
            err.args = (f"env {err.env_id} (pool {k} on node {node}, envs {_fmt(self.env_range(k))}; local "
                        f"ids below count from {self.env_range(k).start}): {err.args[0] if err.args else ''}",)
        return err

    def _between_slices(self, op: str, start: float, timeout: float | None, waiting_on: list[int]) -> None:
        """After a slice with no answer: enforce the timeouts, and check the nodes are alive."""
        now = time.monotonic()
        if timeout is not None and now - start > timeout:
            raise TimeoutError(f"{op} did not finish within {timeout} s; it is still pending")
        if self.step_timeout is not None and now - start > self.step_timeout:
            late = sorted(set(waiting_on))
            self.close()
            raise TimeoutError(f"{op} did not finish within step_timeout={self.step_timeout} s: pools {late} "
                               f"(envs {', '.join(_fmt(self.env_range(k)) for k in late)}) did not answer; "
                               "the pool is closed")
        if now - self._last_liveness < _LIVENESS_EVERY_S:
            return
        self._last_liveness = now
        alive = {x["NodeID"] for x in ray.nodes() if x["Alive"]}
        for k in sorted(set(waiting_on)):
            node = self._describe[k].get("node_id") or self._slots[k][0]
            if node not in alive:
                cause = ray.exceptions.ActorDiedError()
                if op == "recv":
                    for ref, j in list(self._outstanding.items()):
                        if j == k:
                            del self._outstanding[ref]
                    self._busy[k] = False
                    self._died(k, op, cause, node_gone=True)
                    return
                raise _PoolGone(k, cause)

    def _describe_death(self, k: int, op: str, exc: BaseException, node_gone: bool = False) -> str:
        d = self._describe[k]
        node = d.get("node_id") or self._slots[k][0]
        if node_gone:
            how = "its node left the cluster"
        else:
            text = str(exc).strip().splitlines()
            how = type(exc).__name__ + (f": {text[0][:300]}" if text else "")
        actor = f"Ray actor pid {d['pid']} on node {node} ({d.get('hostname')})" if d else f"Ray actor on node {node}"
        return f"pool {k} ({actor}, envs {_fmt(self.env_range(k))}) died during {op}: {how}"

    def _fail(self, k: int, op: str, exc: BaseException, node_gone: bool = False):
        message = self._describe_death(k, op, exc, node_gone) + "; the pool is closed"
        d = self._describe[k]
        self.close()
        raise RemotePoolDiedError(message, worker=k, pid=d.get("pid") or -1,
                                  node_id=d.get("node_id") or self._slots[k][0],
                                  env_range=self.env_range(k)) from exc

    def _died(self, k: int, op: str, exc: BaseException, node_gone: bool = False) -> None:
        """A pool died during async use: raise, or rebuild it and queue its envs' restart rows."""
        if self.on_worker_error != "restart":
            self._fail(k, op, exc, node_gone)
        obs, infos = self._rebuild(k, op, exc, None, None)
        r = self.env_range(k)
        self._avail[k] = 0
        self._sends = [s for s in self._sends if s[1] != k]
        for ref, j in list(self._outstanding.items()):
            if j == k:
                del self._outstanding[ref]
        self._busy[k] = False
        # drop rows of this pool already waiting in _ready: their env is reset, so the restart row replaces them
        kept = collections.deque()
        for chunk in self._ready:
            mine = (chunk.ids >= r.start) & (chunk.ids < r.stop)
            if mine.any():
                chunk = chunk.select(~mine)
            if len(chunk.ids):
                kept.append(chunk)
        self._ready = kept
        self._n_ready = sum(len(c.ids) for c in kept)
        n = len(r)
        rows = _restart_rows(np.arange(r.start, r.stop), obs, infos, n)
        flying = self._in_flight[r.start:r.stop]
        self._held_restart[k] = {}
        if flying.any():
            self._ready.append(rows.select(flying))
            self._n_ready += int(flying.sum())
            if self.autoreset_mode == NEXT_STEP:
                for local in np.flatnonzero(flying).tolist():
                    self._env_autoreset[r.start + local] = _rows(obs, slice(local, local + 1))
        for local in np.flatnonzero(~flying).tolist():
            self._held_restart[k][r.start + local] = _restart_rows(
                np.array([r.start + local]), _rows(obs, slice(local, local + 1)),
                _rows(infos, slice(local, local + 1)), 1)

    def _restart(self, k: int, op: str, exc: BaseException, reset_seeds: list | None,
                 reset_options: list | None) -> tuple:
        """Rebuild pool ``k`` during a sync call; returns what the call expected of it."""
        r = self.env_range(k)
        seeds = None if reset_seeds is None else reset_seeds[r.start:r.stop]
        options = None if reset_options is None else reset_options[k]
        if isinstance(options, dict) and "reset_mask" in options:  # a new pool resets all its envs
            options = {key: v for key, v in options.items() if key != "reset_mask"} or None
        obs, infos = self._rebuild(k, op, exc, seeds, options)
        n = len(r)
        _mark_restarted(infos, n, np.arange(n))
        self._held_restart[k] = {}
        if op == "reset":
            return obs, infos
        if self.autoreset_mode == NEXT_STEP:
            self._sync_autoreset[k] = obs
        return (obs, np.zeros(n, dtype=np.float64), np.zeros(n, dtype=bool), np.ones(n, dtype=bool), infos)

    def _rebuild(self, k: int, op: str, exc: BaseException, seeds: list | None, options: Any) -> tuple:
        what = self._describe_death(k, op, exc)
        warnings.warn(f"{what}; restarting it", RuntimeWarning, stacklevel=4)
        try:
            ray.kill(self._actors[k])
        except Exception:
            pass
        node = self._slots[k][0]
        seeds = [None] * len(self.env_range(k)) if seeds is None else seeds
        tried: list[str] = []
        last: BaseException | None = None
        result = None
        for _ in range(3):
            # Its own node first, while Ray thinks it is alive; then the alive node with the fewest of our
            # pools (a node on its way out can look alive for a few seconds and kill the new actor too).
            alive = [x["NodeID"] for x in ray.nodes() if x["Alive"] and x["NodeID"] not in tried]
            if not alive:
                break
            if node in alive:
                target = node
            else:
                load = collections.Counter(d.get("node_id") for d in self._describe)
                target = min(alive, key=lambda nid: load[nid])
            tried.append(target)
            actor = self._new_actor(k, node_id=target)
            self._actors[k] = actor
            try:
                result = ray.get([actor.describe.remote(), actor.reset.remote(seeds, options)],
                                 timeout=self._startup_timeout)
                break
            except (*_DEATH, ray.exceptions.GetTimeoutError) as again:
                last = again
                try:
                    ray.kill(actor)
                except Exception:
                    pass
        if result is None:
            self.close()
            raise RemotePoolDiedError(f"{what}; restarting it failed on nodes {tried}: {last!r}; the pool is closed",
                                      worker=k, pid=self._describe[k].get("pid") or -1, node_id=node,
                                      env_range=self.env_range(k)) from exc
        desc, (obs, infos) = result
        self._slots[k] = (target, *self._slots[k][1:])
        self.restarts += 1
        self.restart_log.append({"pool": k, "old_pid": self._describe[k].get("pid"), "old_node": node,
                                 "new_pid": desc["pid"], "new_node": target, "op": op, "cause": repr(exc)[:300]})
        self._describe[k] = desc
        return obs, infos

    def _forget_async(self) -> None:
        """Drop async state before a sync call (the actors finish queued calls first, in order)."""
        self._check_sends()
        self._outstanding.clear()
        self._busy = [False] * self.num_pools
        self._avail = [0] * self.num_pools
        self._ready.clear()
        self._n_ready = 0
        self._in_flight[:] = False
        self._n_flight = 0
        self._held_restart = [{} for _ in range(self.num_pools)]
        self._env_autoreset = {}

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("the pool is closed")

    def _check_ready(self) -> None:
        self._check_open()
        if self._blocked is not None:
            raise RuntimeError(self._blocked)

    # --- closing -------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Close every local pool and stop the actors. Idempotent."""
        if self._closed:
            return
        self._closed = True
        refs = []
        for actor in self._actors:
            try:
                refs.append(actor.close.remote())
            except Exception:
                pass
        try:
            ray.wait(refs, num_returns=len(refs), timeout=timeout)
        except Exception:
            pass
        self._kill_all()
        self._actors = []
        self._outstanding.clear()
        self._sends = []

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed and ray.is_initialized():
                self.close(timeout=2.0)
        except Exception:
            pass


class _PoolGone(Exception):
    def __init__(self, pool: int, cause: BaseException) -> None:
        super().__init__(pool)
        self.pool = pool
        self.cause = cause


def _restart_rows(ids: np.ndarray, obs: Any, infos: dict, n: int) -> _Chunk:
    """Rows of rebuilt envs: their reset observation, reward 0, truncated, ``worker_restarted``."""
    infos = _mark_restarted(dict(infos), n, np.arange(n))
    return _Chunk(ids, obs, np.zeros(n, dtype=np.float64), np.zeros(n, dtype=bool), np.ones(n, dtype=bool), infos)


def _apportion(total: int, sizes: list[int]) -> list[int]:
    """``total`` split in proportion to ``sizes`` (largest remainders), each at least 1 and at most its size."""
    n = sum(sizes)
    exact = [total * s / n for s in sizes]
    out = [max(1, min(s, int(x))) for s, x in zip(sizes, exact)]
    order = sorted(range(len(sizes)), key=lambda k: exact[k] - int(exact[k]), reverse=True)
    i = 0
    while sum(out) < total and i < 4 * len(sizes):
        k = order[i % len(sizes)]
        if out[k] < sizes[k]:
            out[k] += 1
        i += 1
    return out


def _numa_count(pools_per_node: int | str, nodes: Iterable[str]) -> list[int]:
    """Pools on each node: the count given, or (``"numa"``) the NUMA nodes each Ray node reports."""
    nodes = list(nodes)
    if pools_per_node != "numa":
        return [int(pools_per_node)] * len(nodes)

    @ray.remote(num_cpus=0)
    def count() -> int:
        return len(_numa_cpu_groups())

    refs = [count.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote()
            for nid in nodes]
    return ray.get(refs, timeout=60)


def _local_death(exc: BaseException) -> bool:
    """A pool's own worker died inside its node (the local pool raised WorkerDiedError and closed)."""
    return isinstance(exc, ray.exceptions.RayTaskError) and isinstance(_cause(exc), WorkerDiedError)


def _cause(exc: ray.exceptions.RayTaskError) -> BaseException:
    """The remote exception itself when Ray kept it (its traceback is in the message)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, _RemoteError):
        return cause.rebuild()
    return cause if isinstance(cause, BaseException) else exc


def _fmt(r: range) -> str:
    return f"{r.start}..{r.stop - 1}"
