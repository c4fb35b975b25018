"""The pool: worker processes pinned to cores, stepping envs in shared memory.

``Pool`` is the public API: the calls every pool answers are :class:`~shmpool.surface.PoolSurface`'s (the
one ``state.Lifecycle``, checked at every entry, and the entry lock); the work is
:class:`~shmpool.local_backend.LocalBackend`'s, which delegates to rooms of one job each (see
ARCHITECTURE.md): ``region.Region`` (the shared memory), ``workerset.WorkerSet``
(processes, pipes, liveness), ``dispatch.Dispatch`` (what is in flight),
``supervisor.Supervisor`` (the waits and the side channels) and
``restarts.Restarts`` (only with ``on_worker_error="restart"``).  The rooms are
handed their parts and a weak ``fatal`` callback; none holds the pool.  ``Pool`` itself resolves
the arguments into a plan, builds the backend and adds what only a local pool has (its workers'
pids and cores, its plan).
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import _core
from .arguments import check_seed, check_typos, env_constructors, keywords_of
from .autoreset_modes import NEXT_STEP, parse_autoreset_mode
from .gym_compat import AutoresetMode
from .local_backend import LocalBackend
from .neighbours import pinned_neighbours
from .plan import plan_pool
from .surface import PoolSurface

COPY_REFUSED = ("a Pool cannot be pickled or copied: it owns worker processes and shared memory; "
                "build a new Pool (with the same arguments) where you need one")


class Pool(PoolSurface):
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
        side messages and commands are the workers'; ``shmpool.hosted_shard``).  It
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

    _copy_refused = COPY_REFUSED

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
        super().__init__()
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
        self.autoreset_mode = parse_autoreset_mode(autoreset_mode)
        self.strict = bool(strict)
        if observation_mode not in ("same", "different"):
            raise ValueError(f"observation_mode must be 'same' or 'different', got {observation_mode!r}")
        self.observation_mode = observation_mode
        seed = check_seed(seed)
        seeds = [None] * n if seed is None else [seed + i for i in range(n)]
        backend = LocalBackend(fns, plan, seeds=seeds, autoreset_mode=self.autoreset_mode, copy=copy,
                               strict=self.strict, observation_mode=observation_mode, start_method=start_method,
                               startup_timeout=startup_timeout, fatal=self._weakly(self._kill_workers_now))
        self._open(backend)
        self._look_again_for_neighbours()

    def _look_again_for_neighbours(self) -> None:
        """Another trainer's pool planned at the same moment looked before our workers existed, and we before its:
        look again now that ours run, and warn once of what the plan did not know (``shmpool.neighbours``)."""
        plan = self.plan
        if not plan.pinned or plan.neighbours or not plan.process_cpus:
            return
        found = pinned_neighbours(plan.process_cpus, exclude=self._backend.workers.pids)
        if found:
            said = plan.warnings
            self.plan = dataclasses.replace(plan, neighbours=tuple(found))
            for note in self.plan.warnings:
                if note not in said:
                    warnings.warn(note, RuntimeWarning, stacklevel=3)

    # --- properties ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (f"Pool({self.num_envs} envs, {self.plan.describe_layout()}, batch_size={self.batch_size}, "
                f"{self.wait_policy.name} waits ({self.wait_choice}), OpenMP: {self.plan.openmp.detail}, "
                f"{self._life.state.value})")

    @property
    def worker_pids(self) -> list[int]:
        return list(self._backend.workers.pids)

    @property
    def worker_cpus(self) -> list[int | None]:
        """The core each worker is pinned to (None for a ``parent_shard``)."""
        return list(self._backend.workers.cpus)

    @property
    def restart_log(self):
        """The latest 1,000 restarts, oldest first: dicts with worker, pid, exitcode, cause, op,
        new_pid, in_flight, seconds, time."""
        return self._backend.restart_log

    @property
    def worker_restarts(self) -> list[int]:
        """Workers replaced so far, per worker."""
        return list(self._backend.restart_record.per_worker)

    def shard_of(self, worker: int) -> range:
        """Env ids owned by ``worker``."""
        return range(*self._backend.workers.bounds[worker])


__all__ = ["Pool"]
