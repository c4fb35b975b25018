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
If ``cpus`` are given for a pool (or ``pools_per_node`` splits a node), its actor runs on those
cores too.  Only whole sub-batches cross the network: by default over one TCP connection from
the driver to each actor (:mod:`.channel`, :mod:`.wire`: pickle protocol 5, arrays as out-of-band raw
bytes, a call costs a round trip and the bytes), else (``transport="ray"``, or a connection that could not
be opened) as ordinary Ray actor calls through Ray's object store, several milliseconds each.  Ray places, describes,
restarts and kills the actors either way.

What a call costs: a round trip per call plus the pickling and the copies of its bytes; bench/README ("latency
--ray", "--netem") has the measurements, over loopback and over a veth link between network namespaces.  It pays
when a node's envs take longer to step than the round trip, or when one machine's cores are
not enough; envs as cheap as CartPole step faster in one local Pool.

Sync ``step``/``reset`` send each pool its slice of the actions and concatenate
the answers in env order: the results are the local pool's for the same seeds
(env ``i`` gets seed ``seed + i`` wherever it runs).

Async (EnvPool semantics at sub-batch granularity): each pool's local ``Pool``
has ``batch_size = sub_batch_sizes[k]`` (by default pool ``k``'s share of
``batch_size``, proportional to its envs).  ``recv()`` keeps at most one
``recv`` outstanding per pool, waits for whichever sub-batches
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
same actor call (one round trip); an actor runs one call at a time, so
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

Rooms (one job each): :mod:`.api` (the public class: the pool surface, one :class:`~shmpool.state.Lifecycle`
checked at every entry, over :mod:`.ray_backend`, the backend verbs over the actors), :mod:`.actor` (the Ray
actor hosting a local Pool per node), :mod:`.batches` (batch
assembly, pure numpy), :mod:`.ledger` (async bookkeeping, pure numpy), :mod:`.placement` (nodes,
pools per node, env ranges, cores), :mod:`.fleet` (starting, rebuilding and stopping the actors),
:mod:`.channel` (the direct connection to an actor, Ray-free), :mod:`.faults` (bounded waits and how a
pool's answer is classified), :mod:`.wire` (the connection's one frame format, send path and read path),
:mod:`.action_check`.
:mod:`.batches`, :mod:`.ledger` and :mod:`.placement` import without Ray.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["RayPool", "RemotePoolDiedError"]

# Imported on first use (PEP 562): the pure rooms above, and a process that never builds a RayPool, do
# not load Ray (its import maps ~40 MB, which every later fork of that process copies the page tables of).
_PUBLIC = {"RayPool": ".api", "RemotePoolDiedError": ".faults"}


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(_PUBLIC[name], __name__)
    except ModuleNotFoundError as exc:
        if exc.name != "ray" and not (exc.name or "").startswith("ray."):
            raise
        raise ImportError("shmpool.distributed needs ray: pip install 'shmpool[ray]' (or 'ray>=2.9')") from exc
    value = getattr(module, name)
    globals()[name] = value   # found once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
