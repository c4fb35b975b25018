"""The pool: worker processes pinned to cores, stepping envs in shared memory.

``Pool`` is the public API and the dispatch bookkeeping; it delegates to rooms of
one job each (see ARCHITECTURE.md): ``state.Lifecycle`` (the one state, checked at
every entry, and the entry lock), ``region.Region`` (the shared memory),
``workerset.WorkerSet`` (processes, pipes, liveness) and ``restarts.Restarts``
(only with ``on_worker_error="restart"``).
"""
from __future__ import annotations

import functools
import itertools
import multiprocessing as mp
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from . import _core, openmp
from . import layout as L
from . import protocol as P
from ._evenness import LeadLimit
from .actions import ActionWriter
from .arguments import (
    check_batch_size,
    check_env_ids,
    check_max_concurrency,
    check_max_lead,
    check_num_workers,
    check_on_worker_error,
    check_options_list,
    check_parent_shard,
    check_seed,
    check_step_timeout,
    check_typos,
    check_wake,
    env_constructors,
    env_id_array,
    env_id_list,
    keywords_of,
    shard_sizes,
    workers_within,
)
from .autoreset import DISABLED, NEXT_STEP, SAME_STEP, parse_autoreset_mode
from .batched import BatchedEnvs, check_hosting
from .costs import cheap_enough, step_cost
from .errors import EnvError, PerformanceWarning, PoolClosedError, SpacesDifferError, WorkerDiedError
from .fallback import Lane, LatestValues, SlowActionSender, warn_slow
from .infos import InfoReader
from .region import Region
from .resets import check_reset_mask, seed_list
from .restarts import Restarts
from .restarts import take as restarts_take
from .state import Lifecycle, LifecycleFacts
from .supervisor import Supervisor, pack_each
from .topology import (
    allowed_cpus,
    choose_wait_policy,
    cpu_quota,
    default_num_workers,
    oversubscribed,
    resolve_cpus,
    trainer_threads,
    usable_cores,
)
from .workerset import SLICE_NS, WorkerSet

_LIVE_POOLS: weakref.WeakSet = weakref.WeakSet()   # for the fork hook below
_ADVISED = False   # the OpenMP advice (Pool._advise) was given in this process


def _public(method: Callable) -> Callable:
    """A public entry: one call at a time per pool (other threads wait; a signal
    handler re-entering is refused), and a ``close()`` that came meanwhile runs as
    the call leaves (raising ``PoolClosedError``)."""
    @functools.wraps(method)
    def entry(self, *args, **kwargs):
        life = self._life
        life.enter()
        try:
            return method(self, *args, **kwargs)
        except KeyboardInterrupt as exc:
            # Mid-call the workers' state is unknown, whichever slice of the wait was hit:
            # stop them, and say so on the way out.
            self._kill_workers_now()
            if not any(INTERRUPTED in note for note in getattr(exc, "__notes__", ())):
                exc.add_note(f"shmpool: {INTERRUPTED} ({method.__name__} was interrupted)")
            raise
        finally:
            life.leave(self._close_now)
    return entry


INTERRUPTED = "the pool was closed and its workers killed"


class Pool(LifecycleFacts):
    """Many envs stepped by pinned worker processes through one shared-memory region.

    ``env`` is a gymnasium id (with ``**env_kwargs`` for ``gymnasium.make``), a
    callable returning an env, or a list of such callables (one per env).

    Sync use (gymnasium ``VectorEnv`` semantics, NEXT_STEP autoreset)::

        obs, infos = pool.reset(seed=0)              # obs: (num_envs, *obs_shape)
        obs, rew, term, trunc, infos = pool.step(actions)   # actions: (num_envs, *act_shape)

    Async use (EnvPool semantics)::

        pool.async_reset()
        obs, rew, term, trunc, infos = pool.recv()   # the first batch_size envs to finish
        pool.send(actions, infos["env_id"])

    Shapes and dtypes follow the single-env spaces with a leading batch axis;
    Dict/Tuple observations come back as dicts/tuples of arrays.  Rewards are
    float64, flags bool.  Infos use gymnasium's vector layout (``key`` array
    plus ``_key`` mask); ``recv`` adds ``infos["env_id"]`` (int32).

    Leaves that cannot live in shared memory (Text, Sequence, Graph, OneOf,
    custom ``Space`` subclasses) travel pickled per env through each worker's
    pipe while the rest of a Dict/Tuple stays in shared memory (one
    ``UserWarning`` at construction names them): such a leaf is batched as a
    tuple with one value per env, as gymnasium's ``concatenate`` batches it,
    and its actions are any sequence with one value per env
    (``shmpool.fallback``).

    Arrays returned by ``step`` and ``reset`` are views into shared memory,
    valid until the next ``step``/``reset``/``recv`` overwrites them; pass
    ``copy=True`` to get fresh arrays instead.  ``recv`` always returns fresh
    arrays (it gathers the batch in completion order).

    ``on_worker_error``: ``"raise"`` (default) raises ``WorkerDiedError`` and
    closes the pool when a worker dies; ``"restart"`` replaces a worker that
    died or overran ``step_timeout`` (same envs, cpu and constructors; envs reset
    unseeded).  Each of its envs then reports one result with the reset
    observation, reward 0, terminated False, truncated True and
    ``infos["worker_restarted"]``: envs in flight at once, envs the caller held
    at their next step; results it had already published are delivered as they
    were.  A ``call``/``get_attr``/``set_attr``/``apply`` it owed raises
    ``WorkerRestartedError``; a ``reset()`` is sent again once.  If the
    replacement cannot start, the error is raised and the pool closed.
    ``restarts``, ``worker_restarts`` and ``restart_log`` (the latest 1,000)
    count the restarts.

    ``strict`` (default True): actions are checked against the action space
    before anything is sent (Discrete/MultiDiscrete/MultiBinary values in the
    space, no NaN in a Box, no inf where the bound is finite: ``ValueError``),
    and an env's non-finite reward or an observation of another shape, or of a
    dtype only an unsafe cast fits, raises ``EnvError`` (``ResultError``).
    ``strict=False`` does what gymnasium's ``AsyncVectorEnv`` does: the env
    decides what an action means, rewards are delivered as they are (NaN,
    inf), and observations are cast into the space's dtype as gymnasium's
    shared-memory write casts them.  Either way, actions whose shape or dtype
    the shared slots cannot hold are refused.

    ``observation_mode``: ``"same"`` (default): every env must have the same
    observation space; ``"different"``: their spaces may differ in bounds
    (gymnasium's ``observation_mode="different"``: same type, shapes and
    dtypes); ``single_observation_space`` is env 0's and
    ``observation_spaces`` lists each env's.

    Threads: every public method is one locked call, so a pool used from several
    threads runs their calls one after another (a ``step()`` is one call); the
    order between threads is theirs to arrange.  ``close()`` may come from any
    thread or a signal handler: a call in progress then ends with
    ``PoolClosedError``.  A pool cannot be copied or pickled, and a forked child
    cannot use its parent's pool.

    Parameters
    ----------
    env : str | Callable[[], gymnasium.Env] | Sequence[Callable[[], gymnasium.Env]]
        A gymnasium id (built with ``gymnasium.make(env, **env_kwargs)``), one
        constructor (called ``num_envs`` times), or one constructor per env.
        Constructors are cloudpickled and unpickled once per env inside the workers, so each env
        gets its own copy of what its constructor captured (as with one process per env).
    num_envs : int | None, default None
        How many envs; required with an id or one constructor, else ``len(env)``.
    num_workers : int | None, default None
        Worker processes.  None: one per usable core — the cores of ``cpus``
        (default: ``os.sched_getaffinity(0)``, so ``taskset``/``numactl`` are
        respected), capped by a cgroup CPU quota (``docker --cpus``), and at most
        ``num_envs``.  Envs are split into contiguous shards that need not be equal.
    batch_size : int | None, default None
        How many envs ``recv()`` returns (EnvPool's ``batch_size``); None: ``num_envs``.
    cpus : str | Iterable[int] | None, default None
        Cores to pin workers to, ``"0-3,8"`` or a list; worker ``k`` gets
        ``cpus[k % len(cpus)]``.  None: every core this process may run on.
    seed : int | None, default None
        Seeds the first ``reset()``: env ``i`` gets ``seed + i`` (EnvPool's convention).
        None: unseeded, unless ``reset(seed=...)`` says otherwise.
    wait_policy : str | WaitPolicy | tuple, default "auto"
        How the parent and the workers wait for each other: ``"auto"``, ``"spin"``,
        ``"hybrid"``, ``"yield"``, ``"block"``, a ``shmpool.WaitPolicy`` or a
        ``(parent, worker)`` pair.  ``"auto"``: when workers plus this process
        outnumber the cores the parent sleeps (``block``) until the last worker
        wakes it, else it spins 50 µs then sleeps (``hybrid``); workers are
        adaptive: they yield-spin only while commands come within ~200 µs of each
        other, else sleep on a futex, so a trainer computing between steps keeps the
        cores.  ``wait_choice`` says what was picked and why.
    step_timeout : float | None, default None
        Seconds any wait on the workers may last (``step``, ``reset``, ``recv``,
        ``call``...); past it ``TimeoutError`` (or a restart, see ``on_worker_error``).
        None: no bound (a dead worker is still noticed within a second).
    startup_timeout : float | None, default 300.0
        Seconds the workers may take to build their envs; None: no bound.
    copy : bool, default False
        True: ``step``/``reset`` return fresh arrays instead of views of shared memory.
    start_method : str | None, default None
        ``multiprocessing`` start method for the workers (``"forkserver"``,
        ``"spawn"``, ``"fork"``); None: multiprocessing's default for the platform.
    wake : str, default "auto"
        How sleepers are woken: ``"futex"`` (Linux), ``"semaphore"`` (posix
        semaphores), ``"auto"``: futex where there is one.
    autoreset_mode : str | gymnasium.vector.AutoresetMode, default NEXT_STEP
        ``NEXT_STEP`` (gymnasium's default), ``SAME_STEP`` (the final observation in
        ``infos["final_obs"]``, as SB3 expects) or ``DISABLED`` (reset ended envs
        yourself with ``reset(options={"reset_mask": mask})``).
    on_worker_error : str, default "raise"
        ``"raise"`` or ``"restart"`` (see above).
    pin : bool, default True
        True: worker ``k`` runs only on ``worker_cpus[k]``.  False: workers run wherever
        the scheduler puts them among the allowed cores (as EnvPool's threads do by
        default), which lets them move away from a core that another process (a busy
        neighbour, the trainer's spinning OpenMP threads) holds.
    max_concurrency : int | None, default None
        At most this many envs step (or reset) at the same time (``AsyncVectorEnv``'s
        keyword).  A worker steps its envs one after another, so this caps the default
        ``num_workers``; an explicit ``num_workers`` above it is a ValueError.
    max_lead : int | "auto" | None, default "auto"
        Async evenness (``batch_size < num_envs``): ``recv`` returns finished envs in
        completion order, except that an env already ``max_lead`` steps ahead of the
        least-advanced env still out waits until that one catches up, so the envs out
        advance at the same rate to within ``max_lead`` steps (EnvPool's threads share
        one queue and get this for free; here envs are bound to workers that need not
        run at the same speed).  ``"auto"``: 8 when every env comes from one
        constructor (an id, one callable, or one callable repeated), None for a list
        of different constructors (envs of unequal cost must not be paced by the
        slowest).  None: pure completion order.  Envs you keep (received, not sent
        back) hold nothing back.
    parent_shard : bool | "auto", default "auto"
        True: this process steps the last shard itself, where it would otherwise sleep
        waiting for a worker, and only the other shards get worker processes (its
        side messages and commands are the workers'; ``shmpool.workers.hosted``).  It
        saves a process hop and a wake-up per step, and a core, at the price of
        isolation: an env that crashes the interpreter takes this process with it, and
        ``step_timeout`` cannot interrupt it (so the two do not go together).
        ``"auto"``: True when the default worker layout leaves no core (or quota) for
        this process (2 workers on 2 cores; any pool under a 1-CPU quota, which then runs
        no worker process at all), unless ``num_workers``, ``step_timeout`` or
        ``on_worker_error="restart"`` was given (each asks for processes), or
        ``batch_size < num_envs`` while torch (or ``OMP_NUM_THREADS``) runs fewer threads
        than there are usable cores: a core is then free while the trainer computes, worker
        processes step during it, and this process steps its shard only inside ``recv``
        (one env at a time, until the batch is full).  Set torch's threads before building
        the pool: they are read then.
    **env_kwargs
        Passed to ``gymnasium.make`` with an id (e.g. ``frame_skip=5``).

    Attributes
    ----------
    num_envs, num_workers, batch_size : int
        As resolved from the parameters.
    max_lead : int | None
        As resolved from the parameter.
    cpus : list[int]
        The cores the pool may use; ``worker_cpus`` the core of each worker.
    cpu_quota : float | None
        The cgroup CPU quota in cores (``cpu.max`` / ``cpu.cfs_quota_us``), None if unlimited.
    wait_policy, worker_wait_policy : WaitPolicy
        The parent's and the workers' wait policies; ``wait_choice`` says why.
    single_observation_space, single_action_space : gymnasium.Space
        One env's spaces (the pool's arrays add a leading ``num_envs`` or batch axis).
    metadata, render_mode, spec
        The first env's.
    closed : bool
        Whether ``close()`` ran (or start-up failed).
    in_flight : int
        Envs sent or async-reset and not received yet.
    worker_pids : list[int]
        The workers' process ids (this process's for a ``parent_shard``).
    parent_shard : int | None
        The worker index whose shard this process steps, None if every shard has a process.
    restarts, worker_restarts, restart_log
        Restart counts: total, per worker, and the latest 1,000 events.
    """

    def __init__(
        self,
        env: str | Callable[[], Any] | Sequence[Callable[[], Any]],
        num_envs: int | None = None,
        *,
        num_workers: int | None = None,
        batch_size: int | None = None,
        cpus: str | Iterable[int] | None = None,
        seed: int | None = None,
        wait_policy: str | _core.WaitPolicy = "auto",
        step_timeout: float | None = None,
        startup_timeout: float | None = 300.0,
        copy: bool = False,
        start_method: str | None = None,
        wake: str = "auto",
        autoreset_mode: str | AutoresetMode = NEXT_STEP,
        on_worker_error: str = "raise",
        pin: bool = True,
        strict: bool = True,
        observation_mode: str = "same",
        max_concurrency: int | None = None,
        max_lead: int | str | None = "auto",
        parent_shard: bool | str = "auto",
        **env_kwargs: Any,
    ) -> None:
        self._life = Lifecycle()
        self._life.close()           # until start-up succeeds, close() has nothing to do
        self._workers: WorkerSet | None = None
        self._region: Region | None = None
        check_typos("Pool", env_kwargs, keywords_of(Pool.__init__))
        fns = env_constructors(env, num_envs, env_kwargs)
        self.num_envs = n = len(fns)
        # A Batched env is one constructor sliced into shards: its envs are alike.
        alike = isinstance(fns, BatchedEnvs) or all(f is fns[0] for f in fns)
        self.max_lead = check_max_lead(max_lead, alike)
        self.cpus = resolve_cpus(cpus)
        self.cpu_quota = cpu_quota()   # cgroup CPU limit in cpus (docker --cpus), None if none
        chosen = num_workers is not None
        if not chosen:
            num_workers = default_num_workers(self.cpus, self.cpu_quota, n)
        self.max_concurrency = check_max_concurrency(max_concurrency)
        num_workers = workers_within(num_workers, self.max_concurrency, chosen)
        self.num_workers = w = check_num_workers(num_workers, n)
        self.batch_size = check_batch_size(batch_size, n)
        self.step_timeout = check_step_timeout(step_timeout)
        self.on_worker_error = check_on_worker_error(on_worker_error)
        use_sems = check_wake(wake, _core.have_futex(), on_worker_error, isinstance(fns, BatchedEnvs))
        worker_cpus = [self.cpus[k % len(self.cpus)] for k in range(w)]
        allowed = allowed_cpus()
        trainer = trainer_threads()   # read once: the layout and the wait choice see the same trainer
        hosting = check_parent_shard(parent_shard, oversubscribed(worker_cpus, allowed, self.cpu_quota),
                                     chosen, self.step_timeout, self.on_worker_error, self.batch_size < n,
                                     trainer.leaves_a_core(usable_cores(allowed, self.cpu_quota)))
        self.layout_note = ""
        if hosting and parent_shard == "auto" and w > 1 and not isinstance(fns, BatchedEnvs) \
                and trainer.torch_threads is not None:
            # A trainer beside us and envs this cheap: every env here beats any hand-off (shmpool.costs).
            # The last env's constructor: scripts give env 0 the extras (video, rendering).
            cost = step_cost(fns[-1])
            if cheap_enough(cost, n):
                self.num_workers = w = 1
                worker_cpus = worker_cpus[:1]
                self.layout_note = (f"every env stepped in this process: a step of one env costs {cost * 1e6:.0f} µs, "
                                    f"{n} of them less than handing a shard to a worker beside the trainer")
        self.parent_shard = w - 1 if hosting else None
        if hosting:   # the last (never the largest) shard: the parent also gathers the results
            worker_cpus = worker_cpus[:-1]
        crowded = oversubscribed(worker_cpus, allowed, self.cpu_quota)
        self.wait_choice = choose_wait_policy(wait_policy, worker_cpus, allowed, self.cpu_quota, trainer,
                                              hosted=hosting)
        self.wait_policy, self.worker_wait_policy = self.wait_choice.parent, self.wait_choice.worker
        if crowded and "spin" in (self.wait_policy.name, self.worker_wait_policy.name):
            warnings.warn(
                f"wait_policy 'spin' with {w} workers on cpus {sorted(set(worker_cpus))} and the parent "
                "sharing them: a spinning process keeps a core another one needs; expect a large slowdown",
                RuntimeWarning, stacklevel=2)
        self._advise(trainer, has_processes=len(worker_cpus) > 0)
        self.autoreset_mode = parse_autoreset_mode(autoreset_mode)
        self._copy = copy
        self.strict = bool(strict)
        if observation_mode not in ("same", "different"):
            raise ValueError(f"observation_mode must be 'same' or 'different', got {observation_mode!r}")
        self.observation_mode = observation_mode
        seed = check_seed(seed)
        seeds = [None] * n if seed is None else [seed + i for i in range(n)]
        self._restarts = Restarts(w, startup_timeout)
        self._supervisor = Supervisor(self)
        self._replacing = on_worker_error == "restart"
        # recv()'s take: the restart room's (watching the workers, taken-over results first) or the
        # plain one; a function, not a bound method, so the pool holds no reference cycle.
        self._take = restarts_take if self._replacing else Pool._take_results

        sizes = shard_sizes(n, w)
        ends = list(itertools.accumulate(sizes))
        self._sizes = sizes
        self._owner = np.repeat(np.arange(w, dtype=np.int32), sizes)
        self.pinned = bool(pin)
        self._workers = WorkerSet(mp.get_context(start_method), [(e - s, e) for s, e in zip(sizes, ends)],
                                  worker_cpus + [None] * hosting, self.pinned, self.parent_shard)
        try:
            self._start(fns, seeds, use_sems, startup_timeout)
        except BaseException:
            self._workers.abort_startup()
            self._workers.kill_now()
            self._release()
            raise
        self._life = Lifecycle()       # open, NEEDS_RESET
        _LIVE_POOLS.add(self)

    # --- start-up -----------------------------------------------------------------------

    @staticmethod
    def _advise(trainer, has_processes: bool) -> None:
        """Once per process: torch's threads spin on the workers' cores and the pool could not
        set their spin count (``shmpool.openmp``); say what it costs and the line that fixes it."""
        global _ADVISED
        advice = openmp.advice(trainer.torch_threads) if has_processes else None
        if advice is not None and not _ADVISED:
            _ADVISED = True
            warnings.warn(advice, PerformanceWarning, stacklevel=3)

    def _start(self, fns, seeds, use_sems: bool, startup_timeout: float | None) -> None:
        workers = self._workers
        deadline = None if startup_timeout is None else time.monotonic() + startup_timeout
        workers.spawn_all(fns, seeds, deadline)
        workers.guard(self)
        described = workers.agreed_spaces(deadline)
        first = described[0]
        obs_space, act_space = first.observation_space, first.action_space
        check_hosting(first.hosting, self.num_envs, self.batch_size, self.autoreset_mode)  # batched envs only
        self.observation_spaces = self._observation_spaces(described)
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.metadata = first.metadata
        self.render_mode = first.render_mode
        self.spec = first.spec
        layout = L.Layout.build(self.num_envs, self._sizes, obs_space, act_space,
                                final_obs=self.autoreset_mode == SAME_STEP)
        # Leaves that cannot live in shared memory travel pickled (shmpool.fallback).
        self._obs_lane = Lane.of(obs_space)
        warn_slow(self._obs_lane, Lane.of(act_space), stacklevel=4)
        self._region = region = Region(layout, self._sizes, use_sems)
        self._map_msg = P.MapRegion(layout, self.worker_wait_policy, SLICE_NS, region.semaphore_names,
                                    self.autoreset_mode, self.strict)
        workers.map_region(list(range(self.num_workers)), self._map_msg, region, deadline)
        region.started(keep_fd=self._replacing)

        self._wire = region.wire
        self._views = views = region.views()
        self._infos = InfoReader(views, region.map, obs_space)
        self._actions = ActionWriter(act_space, layout, views, self.strict)
        self._all_ids = np.arange(self.num_envs, dtype=np.int64)
        if self._obs_lane is None:
            self._obs_views = L.assemble(obs_space, views.obs)
        else:
            self._obs_views = None   # rebuilt per call around the latest pickled values
            self._slow_obs = LatestValues(self._obs_lane, self.num_envs)
        if self._actions.lane is not None:
            self._slow_actions = SlowActionSender(views.act_version, self._owner, self._all_ids)
        self._sync_seq = self._wire.sync_count()   # where the region's header started it
        self._step_target: int | None = None   # sync-counter value a pending step_async waits for
        self._in_flight = np.zeros(self.num_envs, dtype=np.uint8)
        self._batch_ids = np.zeros(self.batch_size, dtype=np.uint32)
        self._lead = LeadLimit(self.num_envs, self.max_lead)
        self._taken = np.zeros(self.batch_size, dtype=np.uint32)

    def _observation_spaces(self, described: list) -> tuple:
        """Each env's observation space, judged against ``observation_mode``: ``"same"`` wants
        them equal, ``"different"`` of one type, shape and dtype (bounds may differ)."""
        spaces: list = []
        for (a, b), d in zip(self._workers.bounds, described):
            spaces += d.observation_spaces or [d.observation_space] * (b - a)
        first, different = spaces[0], self.observation_mode == "different"
        # Each distinct object once: a worker's unchanged spaces are one object, and Box
        # equality runs allclose over the bounds (slow for large spaces times many envs).
        accepted = {id(first)}
        for i, space in enumerate(spaces):
            if id(space) in accepted:
                continue
            if space == first or (different and L.same_layout(space, first)):
                accepted.add(id(space))
                continue
            allowed = ("spaces of one type, shape and dtype" if different else
                       "one space (observation_mode='different' accepts spaces that differ in bounds only)")
            raise SpacesDifferError(f"env {i} has observation space {space}; env 0 has {first}: all envs of a pool "
                                    f"must share their spaces: {allowed}", tuple(spaces))
        return tuple(spaces)

    # --- public API: sync ---------------------------------------------------------------

    @_public
    def reset(self, seed: int | Sequence[int | None] | None = None, options: dict | None = None):
        """Reset every env; returns ``(obs, infos)``.

        ``seed``: an int gives env ``i`` the seed ``seed + i``; a list gives one per env.
        ``options``: one dict for every env, or a list with one dict (or None) per env.
        ``options["reset_mask"]`` (bool array, one per env) resets only those envs,
        as gymnasium's vector envs do; the other envs keep their observations."""
        life = self._life
        life.check_open()
        seeds = seed_list(seed, self.num_envs)
        mask = None
        if isinstance(options, (list, tuple)):
            options = check_options_list(options, self.num_envs)
        elif options is not None and "reset_mask" in options:
            options = dict(options)
            mask = check_reset_mask(options.pop("reset_mask"), self.num_envs)
        # Packed before anything is sent: options that cannot travel change nothing anywhere.
        if isinstance(options, list):
            packed = pack_each(options, range(self.num_envs), lambda i: f"reset: the options for env {i}")
        else:
            packed = pack_each([options], [0], lambda i: "reset: the options")[0]
        life.check_idle()
        self._drain_in_flight()
        call = next(self._supervisor.calls)

        def send_reset(k: int) -> None:
            a, b = self._workers.bounds[k]
            shard_options = packed[a:b] if isinstance(packed, list) else packed
            shard_mask = None if mask is None else mask[a:b].tolist()
            self._supervisor.message(k, P.Reset(call, seeds[a:b], shard_options, shard_mask), "reset")

        for k in range(self.num_workers):
            send_reset(k)
        self._supervisor.replies("reset", call, retry=send_reset)  # safe to repeat on a replacement worker
        life.ready()
        infos = self._supervisor.collect(None, "reset")
        return self._out_obs(), infos

    @_public
    def step(self, actions, env_ids=None):
        """Step every env (or, with ``env_ids``, send to those envs and ``recv()``).

        ``actions``: batched like ``action_space`` (``(num_envs, *shape)``).
        Returns ``(obs, rewards, terminated, truncated, infos)`` in env order."""
        if env_ids is not None:
            self._send(actions, env_ids)
            return self._recv()
        self._step_async(actions)
        return self._step_wait(None)

    @_public
    def step_async(self, actions) -> None:
        """Start stepping every env with ``actions``; ``step_wait()`` returns the results."""
        self._step_async(actions)

    @_public
    def step_wait(self, timeout: float | None = None):
        """Results of the pending ``step_async()``, in env order.

        ``timeout`` (seconds): raise ``TimeoutError`` if the step is not done by
        then; the step stays pending and ``step_wait()`` can be called again."""
        return self._step_wait(timeout)

    def _step_async(self, actions) -> None:
        self._life.check_step_async()
        if self.autoreset_mode == DISABLED:
            self._refuse_ended_envs()
        slow = self._actions.write(actions)
        versions = None if slow is None else self._slow_actions.stamp(None)
        self._step_target = (self._sync_seq + self.num_workers) & 0xFFFFFFFF
        self._wire.post_all(P.CMD_STEP)
        self._life.step_posted()
        if slow is not None:
            self._send_slow_actions(None, versions, slow)

    def _step_wait(self, timeout: float | None):
        life = self._life
        life.check_step_wait()
        self._workers.serve_hosted()
        wire, policy = self._wire, self.wait_policy
        if not wire.wait_sync(self._step_target, policy,
                              SLICE_NS if timeout is None else min(SLICE_NS, int(timeout * 1e9))):
            # A restart during the step re-targets it (restarts.restep): read the target each slice.
            self._supervisor.wait("step", lambda slice_ns: wire.wait_sync(self._step_target, policy, slice_ns), timeout,
                       on_restart=self._supervisor.restep)
        self._sync_seq = self._step_target
        self._step_target = None
        life.step_done()
        infos = self._supervisor.collect(None, "step")
        v = self._views
        if self._copy:
            return self._out_obs(), v.reward.copy(), v.terminated.copy(), v.truncated.copy(), infos
        obs = self._obs_views if self._obs_lane is None else self._out_obs()
        return obs, v.reward, v.terminated, v.truncated, infos

    # --- public API: async --------------------------------------------------------------

    @_public
    def async_reset(self) -> None:
        """Reset every env without waiting; results arrive through ``recv()``."""
        self._life.check_idle()
        self._drain_in_flight()
        self._life.ready()
        self._dispatch(self._claim(None), reset=True)

    @_public
    def send(self, actions, env_ids=None) -> None:
        """Start stepping ``env_ids`` (all envs when None) with ``actions``; returns at once.

        ``actions`` is batched like ``action_space`` with ``len(env_ids)`` rows."""
        self._send(actions, env_ids)

    @_public
    def recv(self):
        """The first ``batch_size`` envs to finish, in completion order (except that none
        runs more than ``max_lead`` steps ahead of the least-advanced env out).

        Returns ``(obs, rewards, terminated, truncated, infos)`` with
        ``infos["env_id"]`` (int32) naming the env of each row."""
        return self._recv()

    def _send(self, actions, env_ids) -> None:
        self._life.check_send()
        ids = self._claim(env_ids)
        try:
            if self.autoreset_mode == DISABLED:
                self._refuse_ended_envs(ids)
            slow = self._actions.write(actions, ids)
        except BaseException:
            self._in_flight[ids] = 0
            raise
        versions = None if slow is None else self._slow_actions.stamp(ids)
        self._dispatch(ids, reset=False)
        if slow is not None:
            self._send_slow_actions(ids, versions, slow)

    def _send_slow_actions(self, ids, versions, values: list[tuple]) -> None:
        """After the dispatch (a worker reads them when its step needs them, so a large
        message never waits for a worker that is not reading): see ``shmpool.fallback``."""
        for k, msg in self._slow_actions.messages(ids, versions, values):
            try:
                P.send(self._workers.conns[k], msg)
            except OSError:
                # Dead: the wait that follows finds it.  A replacement's envs answer their
                # next step with the restart result, which needs no action.
                pass

    def _recv(self):
        life = self._life
        b = self.batch_size
        life.check_recv(b)
        out = self._batch_ids
        got = self._take_in_turn(out, b)
        ids = out[:got].astype(np.int32)
        # take/put rather than fancy indexing: half the cost for a batch of a few rows.
        self._in_flight.put(ids, 0)
        life.in_flight -= got
        v = self._views
        rewards, terminated, truncated = v.reward.take(ids), v.terminated.take(ids), v.truncated.take(ids)
        infos = self._supervisor.collect(ids, "recv")
        rows = [a.take(ids, axis=0) for a in v.obs]
        if self._obs_lane is None:
            obs = L.assemble(self.single_observation_space, rows)
        else:  # after collect: it brings the pickled leaves
            obs = self._obs_lane.assemble(rows, self._slow_obs.batch(ids.tolist()))
        infos["env_id"] = ids
        return obs, rewards, terminated, truncated, infos

    def _take_in_turn(self, out, b: int) -> int:
        """``recv``'s take: finished envs in completion order, except that none gets more
        than ``max_lead`` steps ahead of the least-advanced env out (``shmpool._evenness``)."""
        order, life = self._lead, self._life
        if self.max_lead is None:
            return self._take(self, out, b, "recv")
        if b >= life.in_flight and not order.n_held:   # everything out comes back anyway
            got = self._take(self, out, b, "recv")
            order.received(out[:got])
            return got
        taken, in_flight = self._taken, self._in_flight
        got = order.release(in_flight, out, 0, b)
        while got < b:
            at_workers = life.in_flight - order.n_held - got
            want = min(b - got, at_workers)
            if want <= 0:
                raise RuntimeError(f"recv: {b - got} envs short with none at the workers (held "
                                   f"{order.held_envs()}); this is a bug in shmpool")
            n = self._take(self, taken, want, "recv")
            got += order.admit(taken[:n], in_flight, out, got)
            got += order.release(in_flight, out, got, b - got)
        return got

    def _take_results(self, out, n: int, op: str, start: int = 0) -> int:
        """Fill ``out[start:n]`` with env ids the workers published, in completion order.
        The one place that takes from the wire."""
        wire, workers = self._wire, self._workers
        got = start
        # The hosted shard's envs one at a time, taking what is ready between them: recv
        # returns once its batch is full and the worker processes get new work sooner.
        while got < n and workers.serve_hosted_some(1):
            got += wire.take_ready(out, got, n - got)
        if got < n:
            got += wire.take(out, got, n - got, self.wait_policy, SLICE_NS)
        if got < n:
            # Slow path: a restart may happen while waiting, and must not owe
            # again an env already taken here.
            self._in_flight[out[:got]] = 0

            def more(slice_ns):
                nonlocal got
                if self._replacing:
                    got += self._restarts.take_ready(out, got, n - got)
                new = wire.take(out, got, n - got, self.wait_policy, slice_ns)
                self._in_flight[out[got:got + new]] = 0
                got += new
                return got == n
            self._supervisor.wait(op, more)
        return got

    # --- messages: call / attributes ------------------------------------------------------

    def call(self, name: str, *args, env_ids=None, **kwargs) -> tuple:
        """Call ``env.name(*args, **kwargs)`` (or read the attribute if it is not
        callable) in every env, or in ``env_ids`` only (the keyword is reserved);
        results in env order, or in the order of ``env_ids``.  Names are looked up
        through wrappers (``env.get_wrapper_attr``) as gymnasium's vector envs do."""
        return self._per_env(P.CALL, name, env_ids, lambda n: [(args, kwargs)] * n)

    def apply(self, fn: Callable[..., Any], *args, env_ids=None, **kwargs) -> tuple:
        """``fn(env, *args, **kwargs)`` run inside the workers for every env (or ``env_ids``);
        ``fn`` is cloudpickled, its results come back pickled, in env (or ``env_ids``) order."""
        return self._per_env(P.APPLY, getattr(fn, "__name__", "fn"), env_ids,
                             lambda n: [(fn, args, kwargs)] * n)

    def get_attr(self, name: str, env_ids=None) -> tuple:
        """``env.get_wrapper_attr(name)`` of every env or of ``env_ids`` (methods are returned, not called)."""
        return self._per_env(P.GET_ATTR, name, env_ids, lambda n: [None] * n)

    def set_attr(self, name: str, values, env_ids=None) -> None:
        """Set ``name`` (``env.set_wrapper_attr``) on every env or on ``env_ids``: a list/tuple gives
        one value per env, anything else is shared."""
        def per_env(n):
            if not isinstance(values, (list, tuple)):
                return [values] * n
            if len(values) != n:
                raise ValueError(f"set_attr needs {n} values, got {len(values)}")
            return list(values)
        self._per_env(P.SET_ATTR, name, env_ids, per_env)

    @_public
    def _per_env(self, op: str, name: str, env_ids, payloads: Callable[[int], list]) -> tuple:
        """Run a message op on chosen envs; only the workers that own them are asked."""
        self._life.check_open()
        ids = env_id_list(env_ids, self.num_envs)
        items = payloads(len(ids))
        self._life.check_idle()
        return self._supervisor.ask_envs(op, name, ids, items)

    # --- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close every env and stop the workers. Idempotent.  From a signal handler or
        another thread while a call is in progress, that call ends with
        ``PoolClosedError`` and the pool is closed as it leaves (from another thread,
        ``close()`` waits for that)."""
        life = self._life
        if not life.begin_close():
            return
        try:
            self._close_now()
        finally:
            life.end_close()

    def _close_now(self) -> None:
        """Close with no call inside the wire (the caller holds the entry lock)."""
        self._life.close()
        _LIVE_POOLS.discard(self)
        failures = self._workers.stop(self._wire)
        self._release()
        if failures:
            k, failure = failures[0]
            raise EnvError(
                f"env {failure.env_id} (worker {k}, pid {self._workers.pids[k]}) raised in close: "
                f"{failure.last_line} (the pool is closed)\n--- remote traceback ---\n{failure.traceback}",
                env_id=failure.env_id, worker=k, phase="close", remote_type=failure.remote_type,
                remote_traceback=failure.traceback, remote_exception=failure.original())

    def _kill_workers_now(self) -> None:
        """Fatal path (inside a call that is about to raise): the workers' state is
        unknown, so stop them without asking and free the region."""
        if self._life.closed:
            return
        self._life.close()
        _LIVE_POOLS.discard(self)
        self._workers.kill_now()
        self._release()

    def _release(self) -> None:
        """Drop every view of the region the pool made, then the region itself: a closed
        pool holds no memory unless the caller still holds arrays it returned."""
        self._wire = self._views = self._obs_views = self._actions = self._infos = None
        if self._region is not None:
            self._region.release()
            self._region = None

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._life.closed:
                self.close()
        except Exception:
            pass

    def __reduce__(self):
        raise TypeError("a Pool cannot be pickled or copied: it owns worker processes and shared memory; "
                        "build a new Pool (with the same arguments) where you need one")

    def __copy__(self):
        self.__reduce__()

    def __deepcopy__(self, memo):
        self.__reduce__()

    # --- properties ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.num_envs

    def __repr__(self) -> str:
        quota = "" if self.cpu_quota is None else f", cpu quota {self.cpu_quota:g}"
        cpus = [c for c in self._workers.cpus if c is not None]
        where = f"on cpus {cpus}" if self.pinned else f"unpinned on cpus {self.cpus}"
        if self.parent_shard is not None:
            processes = f"{len(cpus)} in processes {where}" if cpus else "no worker process"
            where = f"({processes}, worker {self.parent_shard}'s shard stepped in this process)"
        if self.layout_note:
            where = f"({self.layout_note})"
        workers = "1 worker" if self.num_workers == 1 else f"{self.num_workers} workers"
        return (f"Pool({self.num_envs} envs, {workers} {where}{quota}, "
                f"batch_size={self.batch_size}, {self.wait_policy.name} waits ({self.wait_choice}), "
                f"OpenMP: {openmp.TUNING.detail}, {self._life.state.value})")

    @property
    def worker_pids(self) -> list[int]:
        return list(self._workers.pids)

    @property
    def worker_cpus(self) -> list[int | None]:
        """The core each worker is pinned to (None for a ``parent_shard``)."""
        return list(self._workers.cpus)

    @property
    def restarts(self) -> int:
        """Workers replaced so far (``on_worker_error="restart"``)."""
        return self._restarts.count

    @property
    def worker_restarts(self) -> list[int]:
        """Workers replaced so far, per worker."""
        return self._restarts.per_worker

    @property
    def restart_log(self):
        """The latest 1,000 restarts, oldest first: dicts with worker, pid, exitcode, cause, op,
        new_pid, in_flight, seconds, time."""
        return self._restarts.log

    def shard_of(self, worker: int) -> range:
        """Env ids owned by ``worker``."""
        return range(*self._workers.bounds[worker])

    # --- dispatch bookkeeping -------------------------------------------------------------------

    def _out_obs(self):
        if self._obs_lane is not None:
            arrays = [a.copy() for a in self._views.obs] if self._copy else self._views.obs
            return self._obs_lane.assemble(arrays, self._slow_obs.batch(None))
        if not self._copy:
            return self._obs_views
        return L.assemble(self.single_observation_space, [a.copy() for a in self._views.obs])

    def _refuse_ended_envs(self, ids: np.ndarray | None = None) -> None:
        """Without autoreset, stepping an env whose episode ended is a caller bug."""
        v = self._views
        done = v.terminated | v.truncated
        ended = np.flatnonzero(done) if ids is None else ids[done[ids]]
        if len(ended):
            raise ValueError(
                f"envs {ended.tolist()} ended their episodes and autoreset is disabled: reset them with "
                "reset(options={'reset_mask': mask}) before stepping")

    def _claim(self, env_ids) -> np.ndarray:
        """Validate env ids and mark them in flight (one C pass; numpy only to word an error)."""
        ids = self._all_ids if env_ids is None else env_id_array(env_ids)
        if self._wire.claim(ids, self._in_flight):
            return ids
        check_env_ids(ids, self.num_envs)
        busy = ids[self._in_flight[ids].astype(bool)]
        raise RuntimeError(f"env ids {busy.tolist()} are already in flight; recv() them first")

    def _dispatch(self, ids: np.ndarray, reset: bool) -> None:
        if self.max_lead is not None:
            self._lead.sent(ids)
        self._wire.dispatch(ids, self._owner, reset)
        self._life.in_flight += len(ids)

    def _drain_in_flight(self) -> None:
        """Receive and drop everything in flight (reset/call need idle workers)."""
        n = self._life.in_flight
        if n:
            held = self._lead.drop_held()
            out = np.zeros(n, dtype=np.uint32)
            out[:len(held)] = held
            got = len(held) + self._take(self, out[len(held):], n - len(held), "drain")
            ids = out[:got].astype(np.int32)
            self._in_flight[ids] = 0
            self._life.in_flight -= got
            try:
                self._supervisor.collect(ids, "drain")
            except (WorkerDiedError, PoolClosedError):
                raise   # the pool's own fate, not the dropped results'
            except Exception:
                # Dropped results: their env errors and infos gymnasium could not batch go with them
                # (the reset that follows makes a failed env usable again).
                pass


def _forked_child() -> None:
    """In a forked child: every pool is its parent's.  Refuse its use, and make sure
    nothing in the child (``__del__``, the finalizer) touches the parent's workers."""
    for pool in list(_LIVE_POOLS):
        pool._life.forked()
        if pool._workers is not None:
            pool._workers.disown()
    _LIVE_POOLS.clear()


os.register_at_fork(after_in_child=_forked_child)

__all__ = ["Pool"]
