"""The pool: worker processes pinned to cores, stepping envs in shared memory.

``Pool`` is the public API; it delegates to rooms of one job each (see
ARCHITECTURE.md): ``state.Lifecycle`` (the one state, checked at every entry, and the
entry lock), ``region.Region`` (the shared memory), ``workerset.WorkerSet``
(processes, pipes, liveness), ``dispatch.Dispatch`` (what is in flight),
``supervisor.Supervisor`` (the waits and the side channels) and
``restarts.Restarts`` (only with ``on_worker_error="restart"``).  The rooms are
handed their parts and a weak ``fatal`` callback; none holds the pool.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from . import _core, openmp
from . import layout as L
from . import protocol as P
from .actions import ActionWriter
from .arguments import check_seed, check_typos, env_constructors, env_id_list, keywords_of
from .autoreset_modes import DISABLED, NEXT_STEP, SAME_STEP, parse_autoreset_mode
from .batched import check_hosting
from .dispatch import Dispatch
from .gym_compat import AutoresetMode
from .infos import InfoReader
from .memory import check_room
from .neighbours import pinned_neighbours
from .pickled import LatestValues, PickledActionSender, PickledLeaves, warn_pickled
from .plan import plan_pool
from .region import Region
from .reset_args import reset_request
from .restarts import RestartRecord, Restarts
from .state import Lifecycle, LifecycleFacts, public_entry
from .supervisor import Supervisor
from .workerset import SLICE_NS, WorkerSet

_LIVE_POOLS: weakref.WeakSet = weakref.WeakSet()   # for the fork hook below


class Pool(LifecycleFacts):
    """Many envs stepped by pinned worker processes through one shared-memory region.

    ``env`` is a gymnasium id (with ``**env_kwargs`` for ``gymnasium.make``), a
    recipe id (``"Pong-v5"``, ``"shmpool-recipe/Ant-v5"``: ``shmpool.list_tasks()``, with the
    recipe's options as ``**env_kwargs``), a callable returning an env, or a list of such
    callables (one per env).

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
    (``shmpool.pickled``).

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
        A gymnasium id (built with ``gymnasium.make(env, **env_kwargs)``), a recipe id
        (a built-in task gymnasium has no id for, ``"Pong-v5"``, or any ``"shmpool-recipe/<id>"``;
        ``env_kwargs`` are its options; ``shmpool.registration`` says what an id means), one
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
        isolation: that shard's constructors and steps run in this process, so an env that
        ends its process (``os._exit``, a fatal signal, a segfault in native code) ends the
        trainer, where in a worker process the pool raises ``WorkerDiedError`` (and
        ``AsyncVectorEnv`` a ``BrokenPipeError``), and one that calls ``sys.exit`` raises
        ``SystemExit`` here; nothing can intercept ``os._exit``: ``parent_shard=False``
        gives every shard a process.  ``step_timeout`` cannot interrupt it either (so the two
        do not go together).
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
    plan : PoolPlan
        Every setting as resolved from the parameters and the machine (``shmpool.plan``);
        ``num_envs``, ``num_workers``, ``batch_size``, ``max_lead``, ``cpus`` (the cores the pool
        may use), ``cpu_quota`` (cgroup, in cores), ``parent_shard``, ``wait_policy`` and
        ``worker_wait_policy`` repeat its values, ``wait_choice`` says why.
    single_observation_space, single_action_space : gymnasium.Space
        One env's spaces (the pool's arrays add a leading ``num_envs`` or batch axis).
    metadata, render_mode, spec
        The first env's.
    closed : bool
        Whether ``close()`` ran (or start-up failed).
    in_flight : int
        Envs sent or async-reset and not received yet.
    worker_pids, worker_cpus : list
        Each worker's process id (this process's for a ``parent_shard``) and core.
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
        self.plan = plan = plan_pool(
            fns, num_workers=num_workers, batch_size=batch_size, cpus=cpus, wait_policy=wait_policy,
            step_timeout=step_timeout, wake=wake, on_worker_error=on_worker_error, pin=pin,
            max_concurrency=max_concurrency, max_lead=max_lead, parent_shard=parent_shard)
        self.num_envs = n = plan.num_envs
        self.num_workers = plan.num_workers
        self.batch_size = plan.batch_size
        self.max_lead = plan.max_lead
        self.max_concurrency = plan.max_concurrency
        self.cpus = list(plan.cpus)
        self.cpu_quota = plan.cpu_quota
        self.parent_shard = plan.parent_shard
        self.pinned = plan.pinned
        self.step_timeout = plan.step_timeout
        self.on_worker_error = plan.on_worker_error
        self.layout_note = plan.layout_note
        self.wait_choice = plan.wait_choice
        self.wait_policy, self.worker_wait_policy = self.wait_choice.parent, self.wait_choice.worker
        for note in plan.warnings:   # said once, here: a spinning wait on shared cores, another pool's cores
            warnings.warn(note, RuntimeWarning, stacklevel=2)
        self._spin = openmp.NOT_HELD   # its share of openmp.QUIET once started: told of every step
        self.autoreset_mode = parse_autoreset_mode(autoreset_mode)
        self._copy = copy
        self.strict = bool(strict)
        if observation_mode not in ("same", "different"):
            raise ValueError(f"observation_mode must be 'same' or 'different', got {observation_mode!r}")
        self.observation_mode = observation_mode
        seed = check_seed(seed)
        seeds = [None] * n if seed is None else [seed + i for i in range(n)]
        self._restart_record = RestartRecord(plan.num_workers)
        self._replacing = plan.on_worker_error == "restart"
        self._supervisor = self._restarts = None   # built by _start (the restart room in restart mode only)
        self._startup_timeout = startup_timeout
        self._owner = plan.owner
        self._workers = WorkerSet(mp.get_context(start_method), plan.bounds, list(plan.worker_cpus),
                                  plan.pinned, plan.parent_shard)
        life = Lifecycle()   # open, NEEDS_RESET: the pool's once start-up succeeded
        try:
            self._start(fns, seeds, startup_timeout, life)
        except BaseException:
            self._workers.abort_startup()
            self._workers.kill_now()
            self._release()
            raise
        self._life = life
        _LIVE_POOLS.add(self)
        self._spin = openmp.hold(self.plan.openmp)
        self._look_again_for_neighbours()

    def _look_again_for_neighbours(self) -> None:
        """Another trainer's pool planned at the same moment looked before our workers existed, and we before its:
        look again now that ours run, and warn once of what the plan did not know (``shmpool.neighbours``)."""
        plan = self.plan
        if not plan.pinned or plan.neighbours or not plan.process_cpus:
            return
        found = pinned_neighbours(plan.process_cpus, exclude=self._workers.pids)
        if found:
            said = plan.warnings
            self.plan = dataclasses.replace(plan, neighbours=tuple(found))
            for note in self.plan.warnings:
                if note not in said:
                    warnings.warn(note, RuntimeWarning, stacklevel=3)

    # --- start-up -----------------------------------------------------------------------

    def _start(self, fns, seeds, startup_timeout: float | None, life: Lifecycle) -> None:
        workers = self._workers
        deadline = None if startup_timeout is None else time.monotonic() + startup_timeout
        workers.spawn_all(fns, seeds, deadline)
        workers.guard(self)
        sizes = list(self.plan.shard_sizes)
        layout: L.Layout | None = None

        def lay_out_and_check(first: P.Spaces) -> None:
            # A region too large is refused from worker 0's spaces alone, before the others are read.
            nonlocal layout
            layout = L.Layout.build(self.num_envs, sizes, first.observation_space, first.action_space,
                                    final_obs=self.autoreset_mode == SAME_STEP)
            check_room(layout.size)

        described = workers.agreed_spaces(deadline, lay_out_and_check)
        first = described[0]
        obs_space, act_space = first.observation_space, first.action_space
        check_hosting(first.hosting, self.num_envs, self.batch_size, self.autoreset_mode)  # batched envs only
        self.observation_spaces = L.observation_spaces(self._workers.bounds, described, self.observation_mode)
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.metadata = first.metadata
        self.render_mode = first.render_mode
        self.spec = first.spec
        # Leaves that cannot live in shared memory travel pickled (shmpool.pickled).
        self._obs_pickled = PickledLeaves.of(obs_space)
        warn_pickled(self._obs_pickled, PickledLeaves.of(act_space), stacklevel=4)
        self._region = region = Region(layout, sizes, self.plan.use_semaphores)
        self._map_msg = P.MapRegion(layout, self.worker_wait_policy, SLICE_NS, region.semaphore_names,
                                    self.autoreset_mode, self.strict)
        workers.map_region(list(range(self.num_workers)), self._map_msg, region, deadline)
        region.started(keep_fd=self._replacing)

        self._views = views = region.views()
        self._actions = ActionWriter(act_space, layout, views, self.strict)
        self._dispatch = dispatch = Dispatch(region.wire, self._owner, life, self.batch_size, self.max_lead)
        store_pickled_obs = None
        if self._obs_pickled is None:
            self._obs_views = L.assemble(obs_space, views.obs)
        else:
            self._obs_views = None   # rebuilt per call around the latest pickled values
            self._pickled_obs = LatestValues(self._obs_pickled, self.num_envs)
            store_pickled_obs = self._pickled_obs.store
        if self._actions.pickled is not None:
            self._pickled_actions = PickledActionSender(views.act_version, self._owner, dispatch.all_ids)
        fatal = _weak_method(self._kill_workers_now)   # the rooms must not keep the pool alive
        self._supervisor = supervisor = Supervisor(
            workers, dispatch, views.status, InfoReader(views, region.map, obs_space), life,
            self.wait_policy, self.step_timeout, fatal, store_pickled_obs)
        if self._replacing:
            self._restarts = Restarts(self._restart_record, workers, region, dispatch, supervisor.status,
                                      supervisor.early, self._map_msg, (obs_space, act_space),
                                      self._startup_timeout, fatal)
            supervisor.use_restarts(self._restarts)

    # --- public API: sync ---------------------------------------------------------------

    @public_entry
    def reset(self, seed: int | Sequence[int | None] | None = None, options: dict | None = None):
        """Reset every env; returns ``(obs, infos)``.

        ``seed``: an int gives env ``i`` the seed ``seed + i``; a list gives one per env.
        ``options``: one dict for every env, or a list with one dict (or None) per env.
        ``options["reset_mask"]`` (bool array, one per env) resets only those envs,
        as gymnasium's vector envs do; the other envs keep their observations."""
        life = self._life
        life.check_open()
        request = reset_request(seed, options, self.num_envs)   # checked and packed before anything is sent
        life.check_idle()
        self._supervisor.drain()
        self._supervisor.reset(request)
        life.ready()
        infos = self._supervisor.collect(None, "reset")
        return self._out_obs(), infos

    @public_entry
    def step(self, actions, env_ids=None):
        """Step every env (or, with ``env_ids``, send to those envs and ``recv()``).

        ``actions``: batched like ``action_space`` (``(num_envs, *shape)``).
        Returns ``(obs, rewards, terminated, truncated, infos)`` in env order."""
        if env_ids is not None:
            self._send(actions, env_ids)
            return self._recv()
        self._step_async(actions)
        return self._step_wait(None)

    @public_entry
    def step_async(self, actions) -> None:
        """Start stepping every env with ``actions``; ``step_wait()`` returns the results."""
        self._step_async(actions)

    @public_entry
    def step_wait(self, timeout: float | None = None):
        """Results of the pending ``step_async()``, in env order.

        ``timeout`` (seconds): raise ``TimeoutError`` if the step is not done by
        then; the step stays pending and ``step_wait()`` can be called again."""
        return self._step_wait(timeout)

    def _step_async(self, actions) -> None:
        self._life.check_step_async()
        if self.autoreset_mode == DISABLED:
            self._refuse_ended_envs()
        pickled = self._actions.write(actions)
        versions = None if pickled is None else self._pickled_actions.stamp(None)
        self._dispatch.post_step(P.CMD_STEP)
        self._life.step_posted()
        self._spin.stepped()
        if pickled is not None:
            self._send_pickled_actions(None, versions, pickled)

    def _step_wait(self, timeout: float | None):
        life = self._life
        life.check_step_wait()
        self._workers.serve_hosted()
        dispatch, policy = self._dispatch, self.wait_policy
        wire = dispatch.wire
        if not wire.wait_sync(dispatch.step_target, policy,
                              SLICE_NS if timeout is None else min(SLICE_NS, int(timeout * 1e9))):
            # A restart during the step re-targets it (Supervisor.wait): read the target each slice.
            self._supervisor.wait("step", lambda slice_ns: wire.wait_sync(dispatch.step_target, policy, slice_ns),
                                  timeout)
        dispatch.step_done()
        life.step_done()
        infos = self._supervisor.collect(None, "step")
        v = self._views
        if self._copy:
            return self._out_obs(), v.reward.copy(), v.terminated.copy(), v.truncated.copy(), infos
        obs = self._obs_views if self._obs_pickled is None else self._out_obs()
        return obs, v.reward, v.terminated, v.truncated, infos

    # --- public API: async --------------------------------------------------------------

    @public_entry
    def async_reset(self) -> None:
        """Reset every env without waiting; results arrive through ``recv()``."""
        self._life.check_idle()
        self._supervisor.drain()
        self._life.ready()
        dispatch = self._dispatch
        dispatch.dispatch(dispatch.claim(None), reset=True)

    @public_entry
    def send(self, actions, env_ids=None) -> None:
        """Start stepping ``env_ids`` (all envs when None) with ``actions``; returns at once.

        ``actions`` is batched like ``action_space`` with ``len(env_ids)`` rows."""
        self._send(actions, env_ids)

    @public_entry
    def recv(self):
        """The first ``batch_size`` envs to finish, in completion order (except that none
        runs more than ``max_lead`` steps ahead of the least-advanced env out).

        Returns ``(obs, rewards, terminated, truncated, infos)`` with
        ``infos["env_id"]`` (int32) naming the env of each row."""
        return self._recv()

    def _send(self, actions, env_ids) -> None:
        self._life.check_send()
        dispatch = self._dispatch
        ids = dispatch.claim(env_ids)
        try:
            if self.autoreset_mode == DISABLED:
                self._refuse_ended_envs(ids)
            pickled = self._actions.write(actions, ids)
        except BaseException:
            dispatch.unclaim(ids)
            raise
        versions = None if pickled is None else self._pickled_actions.stamp(ids)
        dispatch.dispatch(ids, reset=False)
        self._spin.stepped()
        if pickled is not None:
            self._send_pickled_actions(ids, versions, pickled)

    def _send_pickled_actions(self, ids, versions, values: list[tuple]) -> None:
        """After the dispatch (a worker reads them when its step needs them, so a large
        message never waits for a worker that is not reading): see ``shmpool.pickled``."""
        for k, msg in self._pickled_actions.messages(ids, versions, values):
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
        dispatch = self._dispatch
        out = dispatch.batch_ids
        got = dispatch.take_in_turn(out, b, self._supervisor.recv_take)
        ids = out[:got].astype(np.int32)
        dispatch.received(ids)
        v = self._views
        rewards, terminated, truncated = v.reward.take(ids), v.terminated.take(ids), v.truncated.take(ids)
        infos = self._supervisor.collect(ids, "recv")
        rows = [a.take(ids, axis=0) for a in v.obs]
        if self._obs_pickled is None:
            obs = L.assemble(self.single_observation_space, rows)
        else:  # after collect: it brings the pickled leaves
            obs = self._obs_pickled.assemble(rows, self._pickled_obs.batch(ids.tolist()))
        infos["env_id"] = ids
        return obs, rewards, terminated, truncated, infos

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

    @public_entry
    def _per_env(self, op: str, name: str, env_ids, payloads: Callable[[int], list]) -> tuple:
        """Run a message op on chosen envs; only the workers that own them are asked."""
        self._life.check_open()
        ids = env_id_list(env_ids, self.num_envs)
        items = payloads(len(ids))
        self._life.check_idle()
        return self._supervisor.ask_envs(op, name, ids, items)

    # --- closing ----------------------------------------------------------------------------

    def close(self, terminate: bool = False) -> None:
        """Close every env and stop the workers. Idempotent.  From a signal handler or
        another thread while a call is in progress, that call ends with
        ``PoolClosedError`` and the pool is closed as it leaves (from another thread,
        ``close()`` waits for that).

        ``terminate``: kill the workers at once, without asking their envs to close or
        waiting for the call they are in (``AsyncVectorEnv.close(terminate=True)``).  An env
        the trainer's own process runs (the parent shard) cannot be killed: a call in it
        still ends first."""
        life = self._life
        if not life.begin_close(kill=terminate):
            return
        try:
            if terminate:
                self._kill_workers_now()
            else:
                self._close_now()
        finally:
            life.end_close()

    def _close_now(self) -> None:
        """Close with no call inside the wire (the caller holds the entry lock)."""
        self._life.close()
        _LIVE_POOLS.discard(self)
        self._spin.end()
        failures = self._workers.stop(self._dispatch.wire)
        self._release()
        if failures:
            k, failure = failures[0]
            raise self._workers.env_error(k, failure, then="the pool is closed")

    def _kill_workers_now(self) -> None:
        """Fatal path (inside a call that is about to raise): the workers' state is
        unknown, so stop them without asking and free the region."""
        if self._life.closed:
            return
        self._life.close()
        _LIVE_POOLS.discard(self)
        self._spin.end()
        self._workers.kill_now()
        self._release()

    def _release(self) -> None:
        """Drop every view of the region the pool made, then the region itself: a closed
        pool holds no memory unless the caller still holds arrays it returned."""
        self._views = self._obs_views = self._actions = None
        self._dispatch = self._supervisor = self._restarts = None
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

    def __copy__(self, memo=None):
        self.__reduce__()

    __deepcopy__ = __copy__

    # --- properties ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.num_envs

    def __repr__(self) -> str:
        return (f"Pool({self.num_envs} envs, {self.plan.describe_layout()}, batch_size={self.batch_size}, "
                f"{self.wait_policy.name} waits ({self.wait_choice}), OpenMP: {self.plan.openmp.detail}, "
                f"{self._life.state.value})")

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
        return self._restart_record.count

    @property
    def worker_restarts(self) -> list[int]:
        """Workers replaced so far, per worker."""
        return list(self._restart_record.per_worker)

    @property
    def restart_log(self):
        """The latest 1,000 restarts, oldest first: dicts with worker, pid, exitcode, cause, op,
        new_pid, in_flight, seconds, time."""
        return self._restart_record.log

    def shard_of(self, worker: int) -> range:
        """Env ids owned by ``worker``."""
        return range(*self._workers.bounds[worker])

    def _out_obs(self):
        if self._obs_pickled is not None:
            arrays = [a.copy() for a in self._views.obs] if self._copy else self._views.obs
            return self._obs_pickled.assemble(arrays, self._pickled_obs.batch(None))
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


def _weak_method(method: Callable[[], None]) -> Callable[[], None]:
    """``method`` called through a weak reference to its object (a no-op once it is gone)."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:
            bound()
    return call


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
