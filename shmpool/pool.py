"""The pool: worker processes pinned to cores, stepping envs in shared memory."""
from __future__ import annotations

import collections
import itertools
import mmap
import multiprocessing as mp
import os
import signal
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.reduction import send_handle
from typing import Any

import cloudpickle
import numpy as np
import posix_ipc
import psutil
from gymnasium.vector import AutoresetMode

from . import _core
from . import layout as L
from . import protocol as P
from .actions import ActionWriter
from .arguments import check_count, env_constructors, shard_sizes
from .autoreset import DISABLED, NEXT_STEP, parse_autoreset_mode
from .batched import BatchedEnvs, check_hosting
from .errors import EnvError, PoolClosedError, WorkerDiedError, WorkerRestartedError
from .infos import InfoReader, add_info
from .resets import check_reset_mask, seed_list
from .topology import allowed_cpus, oversubscribed, resolve_cpus, resolve_wait_policy
from .workers import loop

_SLICE_NS = 50_000_000        # longest uninterrupted wait: liveness is checked between slices
_CLOSE_GRACE_S = 5.0          # how long close() lets envs close before killing workers
_WATCH_S = 0.1                # restart mode: recv() checks the workers at least this often


class Pool:
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
    ``restarts``, ``worker_restarts`` and ``restart_log`` count the restarts.
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
        **env_kwargs: Any,
    ) -> None:
        self._closed = True          # until start-up succeeds, close() has little to do
        self._procs: list = []
        self._shm_fd: int | None = None   # kept open only to start replacement workers
        self._conns: list = []
        self._region = None
        self._wire = None
        fns = env_constructors(env, num_envs, env_kwargs)
        self.num_envs = n = len(fns)
        self.cpus = resolve_cpus(cpus)
        if num_workers is None:
            num_workers = min(len(self.cpus), n)
        self.num_workers = w = check_count("num_workers", num_workers)
        if w > n:
            raise ValueError(f"num_workers={w} is more than num_envs={n}: every worker needs an env")
        self.batch_size = n if batch_size is None else check_count("batch_size", batch_size)
        if self.batch_size > n:
            raise ValueError(f"batch_size={self.batch_size} is more than num_envs={n}")
        if step_timeout is not None and not step_timeout > 0:
            raise ValueError(f"step_timeout must be positive seconds or None, got {step_timeout}")
        if wake not in ("auto", "futex", "semaphore"):
            raise ValueError(f"wake must be 'auto', 'futex' or 'semaphore', got {wake!r}")
        if wake == "futex" and not _core.have_futex():
            raise ValueError("wake='futex' but this platform has no futex")
        self._worker_cpu = [self.cpus[k % len(self.cpus)] for k in range(w)]
        crowded = oversubscribed(self._worker_cpu, allowed_cpus())
        self.wait_policy, self.worker_wait_policy = resolve_wait_policy(wait_policy, crowded)
        if crowded and "spin" in (self.wait_policy.name, self.worker_wait_policy.name):
            warnings.warn(
                f"wait_policy 'spin' with {w} workers on cpus {sorted(set(self._worker_cpu))} and the parent "
                "sharing them: a spinning process keeps a core another one needs; expect a large slowdown",
                RuntimeWarning, stacklevel=2)
        self.step_timeout = step_timeout
        self.autoreset_mode = parse_autoreset_mode(autoreset_mode)
        self._copy = copy
        self._use_sems = wake == "semaphore" or not _core.have_futex()
        self._init_restarts(on_worker_error, w, startup_timeout)
        if on_worker_error == "restart" and isinstance(fns, BatchedEnvs):
            # A replacement marks envs one by one as restarted; a batched shard is one object.
            raise ValueError("on_worker_error='restart' is not supported for batched envs (shmpool.batched.Batched): "
                             "use on_worker_error='raise'")
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        seeds = [None] * n if seed is None else [int(seed) + i for i in range(n)]

        self._sizes = shard_sizes(n, w)
        ends = list(itertools.accumulate(self._sizes))
        self._bounds = [(end - size, end) for size, end in zip(self._sizes, ends)]
        self._owner = np.repeat(np.arange(w, dtype=np.int32), self._sizes)
        self._side = [collections.deque() for _ in range(w)]
        self._closed = False
        self._finalizer = None
        try:
            self._start(fns, seeds, self.worker_wait_policy, start_method, startup_timeout)
        except BaseException:
            self._closed = True
            self._abort_startup()
            self._kill_workers()
            self._release()
            raise

    # --- start-up -----------------------------------------------------------

    def _start(self, fns, seeds, policy, start_method, startup_timeout) -> None:
        ctx = mp.get_context(start_method)
        me = (os.getpid(), psutil.Process().create_time(), threading.current_thread() is threading.main_thread())
        saved = {k: os.environ.get(k) for k in loop.THREAD_ENV_VARS}
        os.environ.update({k: "1" for k in loop.THREAD_ENV_VARS})  # spawned workers start with 1 thread
        try:
            for k, (a, b) in enumerate(self._bounds):
                parent_end, child_end = ctx.Pipe(duplex=True)
                self._worker_args.append((k, self._worker_cpu[k], me, cloudpickle.dumps(fns[a:b]), a, seeds[a:b]))
                proc = ctx.Process(
                    target=loop.main,
                    args=(child_end, *self._worker_args[k]),
                    name=f"shmpool-worker-{k}",
                    daemon=True,
                )
                proc.start()
                child_end.close()
                self._procs.append(proc)
                self._conns.append(parent_end)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self._finalizer = weakref.finalize(self, _kill_processes, list(self._procs))
        deadline = None if startup_timeout is None else time.monotonic() + startup_timeout

        described = [self._startup_message(k, P.Spaces, deadline) for k in range(self.num_workers)]
        first = described[0]
        obs_space, act_space = first.observation_space, first.action_space
        check_hosting(first.hosting, self.num_envs, self.batch_size, self.autoreset_mode)  # batched envs only
        for k, d in enumerate(described[1:], 1):
            if d.observation_space != obs_space or d.action_space != act_space:
                a = self._bounds[k][0]
                raise ValueError(
                    f"env {a} (worker {k}) has spaces {d.observation_space}, {d.action_space}; env 0 has "
                    f"{obs_space}, {act_space}: all envs of a pool must share their spaces")
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.metadata = first.metadata
        self.render_mode = first.render_mode
        self.spec = first.spec
        self._layout = layout = L.Layout.build(self.num_envs, self._sizes, obs_space, act_space)

        # The region is unlinked the moment it exists: workers get its file
        # descriptor over their socket, so no crash can leave it in /dev/shm.
        shm = posix_ipc.SharedMemory(None, posix_ipc.O_CREX, size=layout.size)
        try:
            shm.unlink()
            self._region = mmap.mmap(shm.fd, layout.size)
            sems = sem_names = None
            if self._use_sems:
                sems = [posix_ipc.Semaphore(None, posix_ipc.O_CREX)
                        for _ in range(_core.Wire.signal_count(self.num_workers))]
                sem_names = [s.name for s in sems]
            self._wire = _core.Wire(self._region, self._sizes, num_envs=self.num_envs,
                                    sems=sems, slice_ns=_SLICE_NS)
            self._wire.init_header()
            self._map_msg = P.MapRegion(layout, policy, _SLICE_NS, sem_names, self.autoreset_mode)
            if self.on_worker_error == "restart":
                self._ctx, self._shm_fd = ctx, os.dup(shm.fd)
            for conn, proc in zip(self._conns, self._procs):
                P.send(conn, self._map_msg)
                send_handle(conn, shm.fd, proc.pid)
            try:
                for k in range(self.num_workers):
                    self._startup_message(k, P.Ready, deadline)
            finally:
                for s in sems or ():
                    s.unlink()
        finally:
            shm.close_fd()

        self._views = views = L.Views(layout, self._region)
        self._wire.bind_results(layout.offsets["status"], layout.offsets["info_mask"])
        self._infos = InfoReader(views, self._region)
        self._obs_views = L.assemble(obs_space, views.obs)
        self._actions = ActionWriter(act_space, layout, views)
        self._sync_seq = 0
        self._step_target: int | None = None   # sync-counter value a pending step_async waits for
        self._tail = 0
        self._in_flight = np.zeros(self.num_envs, dtype=np.uint8)
        self._n_flight = 0
        self._batch_ids = np.zeros(self.batch_size, dtype=np.uint32)
        self._all_ids = np.arange(self.num_envs, dtype=np.int64)
        self._blocked: tuple[type, str] | None = (RuntimeError, "call reset() or async_reset() before stepping")

    def _startup_message(self, k: int, expected: type, deadline: float | None):
        conn = self._conns[k]
        while True:
            if conn.poll(_SLICE_NS / 1e9):
                try:
                    msg = P.receive(conn)
                except EOFError:
                    self._raise_died(k, "starting")
                if type(msg) is expected:
                    return msg
                if isinstance(msg, P.Failure):
                    raise self._env_error(k, msg, then="the pool was not created")
                raise P.ProtocolError(f"worker {k} sent {type(msg).__name__} while starting, "
                                      f"expected {expected.__name__}")
            if self._procs[k].exitcode is not None:
                self._raise_died(k, "starting")
            if deadline is not None and time.monotonic() > deadline:
                a, b = self._bounds[k]
                raise TimeoutError(
                    f"worker {k} (envs {a}..{b - 1}) did not finish building its envs within "
                    "startup_timeout")

    # --- public API: sync ---------------------------------------------------

    def reset(self, seed: int | Sequence[int | None] | None = None, options: dict | None = None):
        """Reset every env; returns ``(obs, infos)``.

        ``seed``: an int gives env ``i`` the seed ``seed + i``; a list gives one per env.
        ``options``: one dict for every env, or a list with one dict (or None) per env.
        ``options["reset_mask"]`` (bool array, one per env) resets only those envs,
        as gymnasium's vector envs do; the other envs keep their observations."""
        self._check_open()
        seeds = seed_list(seed, self.num_envs)
        mask = None
        if isinstance(options, (list, tuple)):
            if len(options) != self.num_envs:
                raise ValueError(f"options list has {len(options)} entries, the pool has {self.num_envs} envs")
            options = list(options)
        elif options is not None and "reset_mask" in options:
            options = dict(options)
            mask = check_reset_mask(options.pop("reset_mask"), self.num_envs)
        self._drain_in_flight()

        def send_reset(k: int) -> None:
            a, b = self._bounds[k]
            shard_options = options[a:b] if isinstance(options, list) else options
            self._send(k, P.Reset(seeds[a:b], shard_options, None if mask is None else mask[a:b].tolist()), "reset")
            self._wire.post(k, P.CMD_MESSAGE)

        for k in range(self.num_workers):
            send_reset(k)
        self._replies("reset", retry=send_reset)  # a reset is safe to repeat on a replacement worker
        self._blocked = None
        infos = self._collect(None, "reset")
        return self._out_obs(), infos

    def step(self, actions, env_ids=None):
        """Step every env (or, with ``env_ids``, send to those envs and ``recv()``).

        ``actions``: batched like ``action_space`` (``(num_envs, *shape)``).
        Returns ``(obs, rewards, terminated, truncated, infos)`` in env order."""
        if env_ids is not None:
            self.send(actions, env_ids)
            return self.recv()
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions) -> None:
        """Start stepping every env with ``actions``; ``step_wait()`` returns the results."""
        if self._blocked is not None:
            raise self._blocked[0](self._blocked[1])
        if self._step_target is not None:
            raise RuntimeError("step_async() while a step is pending; call step_wait() first")
        if self._n_flight:
            raise RuntimeError(
                f"step() needs every env idle but {self._n_flight} are in flight from send(); "
                "recv() them first")
        if self.autoreset_mode == DISABLED:
            self._refuse_ended_envs()
        self._actions.write(actions)
        self._step_target = (self._sync_seq + self.num_workers) & 0xFFFFFFFF
        self._wire.post_all(P.CMD_STEP)

    def step_wait(self, timeout: float | None = None):
        """Results of the pending ``step_async()``, in env order.

        ``timeout`` (seconds): raise ``TimeoutError`` if the step is not done by
        then; the step stays pending and ``step_wait()`` can be called again."""
        target = self._step_target
        if target is None:
            self._check_open()
            raise RuntimeError("step_wait() without a pending step_async()")
        wire, policy = self._wire, self.wait_policy
        if self._step_resync or not wire.wait_sync(
                target, policy, _SLICE_NS if timeout is None else min(_SLICE_NS, int(timeout * 1e9))):
            def ready(slice_ns):
                if self._step_resync:
                    return self._all_done(slice_ns)
                return wire.wait_sync(target, policy, slice_ns)
            self._wait("step", ready, timeout, on_restart=self._restep)
        if self._step_resync:
            # A replaced worker stepped its shard again: every worker is idle
            # now, so the counter is stable and the next target counts from it.
            self._sync_seq = wire.sync_count()
            self._step_resync = False
        else:
            self._sync_seq = target
        self._step_target = None
        infos = self._collect(None, "step")
        v = self._views
        if self._copy:
            return self._out_obs(), v.reward.copy(), v.terminated.copy(), v.truncated.copy(), infos
        return self._obs_views, v.reward, v.terminated, v.truncated, infos

    # --- public API: async --------------------------------------------------

    def async_reset(self) -> None:
        """Reset every env without waiting; results arrive through ``recv()``."""
        self._check_open()
        self._drain_in_flight()
        self._blocked = None
        self._dispatch(self._claim(None), reset=True)

    def send(self, actions, env_ids=None) -> None:
        """Start stepping ``env_ids`` (all envs when None) with ``actions``; returns at once.

        ``actions`` is batched like ``action_space`` with ``len(env_ids)`` rows."""
        if self._blocked is not None:
            raise self._blocked[0](self._blocked[1])
        if self._step_target is not None:
            raise RuntimeError("a step_async() is pending; call step_wait() first")
        ids = self._claim(env_ids)
        try:
            if self.autoreset_mode == DISABLED:
                self._refuse_ended_envs(ids)
            self._actions.write(actions, ids)
        except BaseException:
            self._in_flight[ids] = 0
            raise
        self._dispatch(ids, reset=False)

    def recv(self):
        """The first ``batch_size`` envs to finish, in completion order.

        Returns ``(obs, rewards, terminated, truncated, infos)`` with
        ``infos["env_id"]`` (int32) naming the env of each row."""
        self._check_open()
        if self._watch and time.monotonic() >= self._next_watch:
            # The other workers can fill every batch while a dead one's envs
            # starve unseen: look at the processes now and then.
            self._next_watch = time.monotonic() + _WATCH_S
            self._check_alive("recv")
        b = self.batch_size
        if self._n_flight == 0:
            raise RuntimeError("recv() with nothing in flight: call send() or async_reset() first")
        if self._n_flight < b:
            raise RuntimeError(
                f"recv() waits for batch_size={b} envs but only {self._n_flight} are in flight; "
                "send() more first")
        out = self._batch_ids
        got = self._take(out, b, "recv")
        ids = out[:got].astype(np.int32)
        self._in_flight[ids] = 0
        self._n_flight -= got
        v = self._views
        obs = L.assemble(self.single_observation_space, [a[ids] for a in v.obs])
        rewards, terminated, truncated = v.reward[ids], v.terminated[ids], v.truncated[ids]
        infos = self._collect(ids, "recv")
        infos["env_id"] = ids
        return obs, rewards, terminated, truncated, infos

    def _take(self, out, n: int, op: str) -> int:
        wire = self._wire
        got = self._take_ready(out, 0, n) if self._ready else 0
        if got < n:
            got += wire.take(0, out, got, n - got, self.wait_policy, _SLICE_NS)
        if got < n:
            # Slow path: a restart may happen while waiting, and must not owe
            # again an env already taken here.
            self._in_flight[out[:got]] = 0

            def more(slice_ns):
                nonlocal got
                if self._ready:
                    got += self._take_ready(out, got, n - got)
                new = wire.take(0, out, got, n - got, self.wait_policy, slice_ns)
                self._in_flight[out[got:got + new]] = 0
                got += new
                return got == n
            self._wait(op, more)
        return got

    def _take_ready(self, out, start: int, n: int) -> int:
        """Results a replaced worker had published, taken over at its restart."""
        got = 0
        while self._ready and got < n:
            out[start + got] = self._ready.popleft()
            got += 1
        return got

    # --- messages: call / attributes ----------------------------------------

    def call(self, name: str, *args, env_ids=None, **kwargs) -> tuple:
        """Call ``env.name(*args, **kwargs)`` (or read the attribute if it is not
        callable) in every env, or in ``env_ids`` only (the keyword is reserved);
        results in env order, or in the order of ``env_ids``.  Names are looked up
        through wrappers (``env.get_wrapper_attr``) as gymnasium's vector envs do."""
        return self._per_env("call", name, env_ids, lambda n: [(args, kwargs)] * n)

    def apply(self, fn: Callable[..., Any], *args, env_ids=None, **kwargs) -> tuple:
        """``fn(env, *args, **kwargs)`` run inside the workers for every env (or ``env_ids``);
        ``fn`` is cloudpickled, its results come back pickled, in env (or ``env_ids``) order."""
        blob = cloudpickle.dumps(fn)
        return self._per_env("apply", getattr(fn, "__name__", "fn"), env_ids, lambda n: [(blob, args, kwargs)] * n)

    def get_attr(self, name: str, env_ids=None) -> tuple:
        """``env.get_wrapper_attr(name)`` of every env or of ``env_ids`` (methods are returned, not called)."""
        return self._per_env("get_attr", name, env_ids, lambda n: [None] * n)

    def set_attr(self, name: str, values, env_ids=None) -> None:
        """Set ``name`` (``env.set_wrapper_attr``) on every env or on ``env_ids``: a list/tuple gives
        one value per env, anything else is shared."""
        def per_env(n):
            if not isinstance(values, (list, tuple)):
                return [values] * n
            if len(values) != n:
                raise ValueError(f"set_attr needs {n} values, got {len(values)}")
            return list(values)
        self._per_env("set_attr", name, env_ids, per_env)

    def _per_env(self, op: str, name: str, env_ids, payloads: Callable[[int], list]) -> tuple:
        """Run a message op on chosen envs; only the workers that own them are asked."""
        self._check_open()
        if env_ids is None:
            ids = list(range(self.num_envs))
        else:
            ids = [env_ids] if isinstance(env_ids, (int, np.integer)) else list(env_ids)
            bad = [i for i in ids if not isinstance(i, (int, np.integer)) or not 0 <= i < self.num_envs]
            if bad:
                raise ValueError(f"env ids {bad} are out of range for a pool of {self.num_envs} envs")
        items = payloads(len(ids))
        if self._step_target is not None:
            raise RuntimeError("a step_async() is pending; call step_wait() first")
        # Envs in flight from send() stay in flight: the workers serve them
        # before the message, and recv() still returns them.
        by_worker: dict[int, list[int]] = {}
        for pos, env_id in enumerate(ids):
            by_worker.setdefault(int(self._owner[env_id]), []).append(pos)
        for k, positions in by_worker.items():
            start = self._bounds[k][0]
            self._send(k, P.EnvCall(op, name, [int(ids[p]) - start for p in positions],
                                    [items[p] for p in positions]), f"{op} {name!r}")
            self._wire.post(k, P.CMD_MESSAGE)
        out: list = [None] * len(ids)
        for k, answer in zip(by_worker, self._replies(f"{op} {name!r}", list(by_worker))):
            for pos, value in zip(by_worker[k], answer):
                out[pos] = value
        return tuple(out)

    # --- worker restarts (on_worker_error="restart") -------------------------

    def _init_restarts(self, on_worker_error: str, num_workers: int, startup_timeout: float | None) -> None:
        if on_worker_error not in ("raise", "restart"):
            raise ValueError(f"on_worker_error must be 'raise' or 'restart', got {on_worker_error!r}")
        if on_worker_error == "restart" and self._use_sems:
            raise ValueError(
                "on_worker_error='restart' needs futex wake-ups: with wake='semaphore' (or without futexes) the "
                "semaphores are unlinked once the workers opened them, so a replacement could not open them")
        self.on_worker_error = on_worker_error
        self._watch = on_worker_error == "restart"
        self._next_watch = 0.0
        self.restarts = 0                              # workers replaced so far
        self.worker_restarts = [0] * num_workers       # ... per worker
        self.restart_log: list[dict] = []              # one entry per restart: who, why, when, how long
        self._generation = [0] * num_workers           # bumped per restart: answers owed by the old process die
        self._ready: collections.deque = collections.deque()  # taken-over results, before the wire's
        self._step_resync = False                      # a sync step re-posted to a replacement
        self._worker_args: list[tuple] = []
        self._startup_timeout = startup_timeout

    def _restart(self, k: int, op: str, cause: str | None = None) -> None:
        """Replace dead (or killed) worker ``k``; the rest of the pool never notices.

        Results it published and the parent had not taken stay valid (those whose
        side message was lost are recomputed); envs it still owed are requested
        again from the replacement, whose envs are freshly reset (unseeded) and
        answer their first step with the reset observation, reward 0, truncated
        True and info ``worker_restarted`` (see ``workers.loop.restarted``)."""
        t0 = time.monotonic()
        proc = self._procs[k]
        if proc.exitcode is None:
            proc.kill()
        proc.join(timeout=5.0)
        pid, code = proc.pid, proc.exitcode
        if cause is None:
            cause = _death(code)
        # What it sent before dying is still in the pipe: side messages of published results.
        conn = self._conns[k]
        try:
            while conn.poll(0):
                self._side[k].append(P.receive(conn))
        except (EOFError, OSError):
            pass  # EOF, or a message cut short by the death
        conn.close()
        published = self._wire.reset_worker(k)
        status = self._views.status
        messages = [m for m in self._side[k] if isinstance(m, (P.Failure, P.Extra)) and m.env_id is not None]
        keep, lost, used = [], [], 0
        if self._step_target is None:
            for e in published:
                if status[e] == P.STATUS_OK:
                    keep.append(e)
                elif used < len(messages) and messages[used].env_id == e:
                    keep.append(e)
                    used += 1
                else:
                    lost.append(e)
        self._side[k] = collections.deque(messages[:used])
        a, b = self._bounds[k]
        taken_over = set(published)
        owed = [e for e in range(a, b) if self._in_flight[e] and e not in taken_over]
        self._spawn_replacement(k, op, cause)
        redo = owed + lost
        if redo:  # step requests: a restarted env answers one with its restart result
            self._wire.dispatch(np.asarray(redo, dtype=np.int64), self._owner, False)
        self._ready.extend(keep)
        self.restarts += 1
        self.worker_restarts[k] += 1
        self._generation[k] += 1
        self.restart_log.append({"worker": k, "pid": pid, "exitcode": code, "cause": cause, "op": op,
                                 "new_pid": self._procs[k].pid, "in_flight": len(redo),
                                 "seconds": time.monotonic() - t0, "time": time.time()})

    def _spawn_replacement(self, k: int, op: str, cause: str) -> None:
        """Start worker ``k`` again (same envs, cpu and constructors), map the region,
        reset its envs.  If that fails, the pool is closed."""
        ctx = self._ctx
        parent_end, child_end = ctx.Pipe(duplex=True)
        saved = {v: os.environ.get(v) for v in loop.THREAD_ENV_VARS}
        os.environ.update({v: "1" for v in loop.THREAD_ENV_VARS})
        try:
            proc = ctx.Process(target=loop.main, args=(child_end, *self._worker_args[k]),
                               name=f"shmpool-worker-{k}", daemon=True)
            proc.start()
        finally:
            child_end.close()
            for v, value in saved.items():
                if value is None:
                    os.environ.pop(v, None)
                else:
                    os.environ[v] = value
        self._procs[k], self._conns[k] = proc, parent_end
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _kill_processes, list(self._procs))
        a, b = self._bounds[k]
        what = f"worker {k} (envs {a}..{b - 1}) {cause} during {op}; its replacement failed"
        deadline = None if self._startup_timeout is None else time.monotonic() + self._startup_timeout
        try:
            d = self._startup_message(k, P.Spaces, deadline)
            if d.observation_space != self.single_observation_space or d.action_space != self.single_action_space:
                raise ValueError(f"the replacement's envs have spaces {d.observation_space}, {d.action_space}; "
                                 f"the pool has {self.single_observation_space}, {self.single_action_space}")
            P.send(parent_end, self._map_msg)
            send_handle(parent_end, self._shm_fd, proc.pid)
            self._startup_message(k, P.Ready, deadline)
            P.send(parent_end, P.Restart())
            self._wire.post(k, P.CMD_MESSAGE)
            while True:
                if parent_end.poll(_SLICE_NS / 1e9):
                    msg = P.receive(parent_end)
                    if type(msg) is P.Reply:
                        break
                    if type(msg) is P.CallFailed:
                        raise self._env_error(k, msg, then="the replacement could not reset its envs")
                elif proc.exitcode is not None:
                    raise RuntimeError(f"the replacement {_death(proc.exitcode)} while resetting its envs")
                elif deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError("the replacement did not reset its envs within startup_timeout")
        except (WorkerDiedError, PoolClosedError) as exc:
            raise WorkerDiedError(f"{what}: {exc}", worker=k, pid=proc.pid, exitcode=proc.exitcode) from exc
        except BaseException as exc:
            self._kill_workers_now()
            if isinstance(exc, EnvError):
                first = str(exc).splitlines()[0].removesuffix("; the pool was not created")
                raise EnvError(f"{what}: {first}; the pool is closed\n--- remote traceback ---\n"
                               f"{exc.remote_traceback}", env_id=exc.env_id, worker=k, phase=exc.phase,
                               remote_type=exc.remote_type, remote_traceback=exc.remote_traceback,
                               remote_exception=exc.remote_exception) from exc
            raise WorkerDiedError(f"{what}: {exc}; the pool is closed", worker=k, pid=proc.pid,
                                  exitcode=proc.exitcode) from exc

    def _restep(self, workers: list[int]) -> None:
        """Replacements during a sync step step their shards again (restart results)."""
        if self._step_target is None:
            return
        for k in workers:
            self._wire.post(k, P.CMD_STEP)
        self._step_resync = True

    def _all_done(self, slice_ns: int) -> bool:
        """Every worker has handled its last command (one slice per worker at most)."""
        wire = self._wire
        for k in range(self.num_workers):
            if not wire.wait_done(k, wire.cmd_seq(k), self.wait_policy, slice_ns):
                return False
        return True

    # --- closing ------------------------------------------------------------

    def close(self) -> None:
        """Close every env and stop the workers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._blocked = (PoolClosedError, "the pool is closed")
        errors = []
        if self._wire is not None:
            for k in range(self.num_workers):
                if self._procs[k].exitcode is None:
                    self._wire.post(k, P.CMD_EXIT)
            deadline = time.monotonic() + _CLOSE_GRACE_S
            for k, conn in enumerate(self._conns):
                # Read until the worker's "closed" (its envs' close errors): a worker that
                # has already exited may have left it in the pipe, so exiting is no reason
                # to stop reading, only an empty pipe after the exit is.
                while time.monotonic() < deadline:
                    try:
                        if conn.poll(0.05):
                            msg = P.receive(conn)
                            if type(msg) is P.Closed:
                                errors += [(k, f) for f in msg.failures]
                                break
                            continue
                    except (EOFError, OSError):
                        break
                    if self._procs[k].exitcode is not None and not conn.poll(0):
                        break
        self._kill_workers()
        self._release()
        if errors:
            k, failure = errors[0]
            raise EnvError(
                f"env {failure.env_id} (worker {k}, pid {self._procs[k].pid}) raised in close: {failure.last_line} "
                f"(the pool is closed)\n--- remote traceback ---\n{failure.traceback}",
                env_id=failure.env_id, worker=k, phase="close", remote_type=failure.remote_type,
                remote_traceback=failure.traceback, remote_exception=failure.original())

    def _abort_startup(self) -> None:
        """Tell workers still waiting for their start-up message to exit now (a forked
        worker holds a copy of our end of its pipe, so closing ours gives it no EOF)."""
        for conn in self._conns:
            try:
                P.send(conn, P.Abort())
            except OSError:
                pass

    def _kill_workers(self) -> None:
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.exitcode is None:
                proc.kill()
        for proc in self._procs:
            proc.join(timeout=5.0)
        for conn in self._conns:
            conn.close()
        if self._finalizer is not None:
            self._finalizer.detach()

    def _release(self) -> None:
        if self._shm_fd is not None:
            os.close(self._shm_fd)
            self._shm_fd = None
        if self._wire is not None:
            self._wire.release()
        self._wire = None
        self._views = None
        self._obs_views = None
        self._actions = None
        if self._region is not None:
            try:
                self._region.close()
            except BufferError:
                pass  # the caller still holds views; the mapping goes when they do
            self._region = None

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass

    def __len__(self) -> int:
        return self.num_envs

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (f"Pool({self.num_envs} envs, {self.num_workers} workers on cpus {self._worker_cpu}, "
                f"batch_size={self.batch_size}, {self.wait_policy.name} waits, {state})")

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """How many envs were sent (or async-reset) and not received yet."""
        return self._n_flight

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def worker_cpus(self) -> list[int]:
        """The core each worker is pinned to."""
        return list(self._worker_cpu)

    def shard_of(self, worker: int) -> range:
        """Env ids owned by ``worker``."""
        return range(*self._bounds[worker])

    # --- internals ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("the pool is closed")

    def _out_obs(self):
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
        if env_ids is None:
            ids = self._all_ids
        else:
            ids = env_ids if type(env_ids) is np.ndarray else np.asarray(env_ids)
            if ids.ndim != 1 or ids.dtype.kind not in "iu":
                raise ValueError(f"env_ids must be a 1-d array of ints, got shape {ids.shape} dtype {ids.dtype}")
            if len(ids) == 0:
                raise ValueError("env_ids is empty")
            if ids.dtype != np.int64 or not ids.flags.c_contiguous:
                ids = np.ascontiguousarray(ids, dtype=np.int64)
        if self._wire.claim(ids, self._in_flight):
            return ids
        bad = ids[(ids < 0) | (ids >= self.num_envs)]
        if len(bad):
            raise ValueError(f"env ids {bad.tolist()} are out of range for a pool of {self.num_envs} envs")
        uniq, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"env ids {uniq[counts > 1].tolist()} appear more than once")
        busy = ids[self._in_flight[ids].astype(bool)]
        raise RuntimeError(f"env ids {busy.tolist()} are already in flight; recv() them first")

    def _dispatch(self, ids: np.ndarray, reset: bool) -> None:
        self._wire.dispatch(ids, self._owner, reset)
        self._n_flight += len(ids)

    def _drain_in_flight(self) -> None:
        """Receive and drop everything in flight (reset/call need idle workers)."""
        if self._step_target is not None:
            raise RuntimeError("a step_async() is pending; call step_wait() first")
        if self._n_flight:
            out = np.zeros(self._n_flight, dtype=np.uint32)
            got = self._take(out, self._n_flight, "drain")
            ids = out[:got].astype(np.int32)
            self._in_flight[ids] = 0
            self._n_flight -= got
            try:
                self._collect(ids, "drain")
            except EnvError:
                pass  # the reset that follows makes the failed env usable again

    def _wait(self, op: str, ready: Callable[[int], bool], timeout: float | None = None,
              on_restart: Callable[[list[int]], None] | None = None) -> None:
        """Repeat ``ready(slice_ns)`` waits, checking the workers and the step timeout
        between slices.  ``timeout`` raises TimeoutError and leaves the operation pending.
        With ``on_worker_error="restart"``, ``on_restart(workers)`` follows each restart."""
        start = time.monotonic()
        step_start = start
        try:
            while True:
                slice_ns = _SLICE_NS
                if timeout is not None:
                    left = timeout - (time.monotonic() - start)
                    if left <= 0:
                        raise TimeoutError(f"{op} did not finish within {timeout} s; it is still pending")
                    slice_ns = min(slice_ns, int(left * 1e9))
                if ready(slice_ns):
                    return
                self._pump_side()
                restarted = self._check_alive(op)
                if self.step_timeout is not None and time.monotonic() - step_start > self.step_timeout:
                    restarted += self._fail_timeout(op)
                if restarted:
                    step_start = time.monotonic()  # the replacements get a full step_timeout
                    if on_restart is not None:
                        on_restart(restarted)
        except KeyboardInterrupt:
            self._kill_workers_now()
            raise

    def _pump_side(self) -> None:
        """Move side messages already in the pipes into the queues, so no worker
        blocks on a full pipe while the parent waits for its results."""
        for conn, queue in zip(self._conns, self._side):
            try:
                while conn.poll(0):
                    queue.append(P.receive(conn))
            except (EOFError, OSError):
                pass  # a dead worker is reported by _check_alive

    def _check_alive(self, op: str) -> list[int]:
        """Raise for a dead worker, or (``on_worker_error="restart"``) replace it;
        returns the workers replaced."""
        dead = [k for k, proc in enumerate(self._procs) if proc.exitcode is not None or not _exists(proc.pid)]
        if dead and self.on_worker_error != "restart":
            self._raise_died(dead[0], op)
        for k in dead:
            self._restart(k, op)
        return dead

    def _raise_died(self, k: int, op: str):
        proc = self._procs[k]
        proc.join(timeout=0.5)
        code = proc.exitcode
        last = ""
        self._pump_side()
        for msg in self._side[k]:
            if isinstance(msg, P.Failure) and msg.env_id is None:  # not an env's error: the worker's own
                last = f"; its last words:\n{msg.traceback}"
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        elif code is None:  # reaped by someone else (a SIGCHLD handler, os.wait()): status unknown
            how = "is gone (reaped outside shmpool, exit status unknown)"
        else:
            how = f"exited with code {code}"
        a, b = self._bounds[k]
        pid = proc.pid
        self._kill_workers_now()
        raise WorkerDiedError(
            f"worker {k} (pid {pid}, cpu {self._worker_cpu[k]}, envs {a}..{b - 1}) {how} during {op}; "
            f"the pool is closed{last}", worker=k, pid=pid, exitcode=code)

    def _fail_timeout(self, op: str) -> list[int]:
        late = [k for k in range(self.num_workers) if self._wire.done_seq(k) != self._wire.cmd_seq(k)]
        if late and self.on_worker_error == "restart":
            for k in late:  # hung: kill and replace
                self._procs[k].kill()
                self._procs[k].join(timeout=5.0)
                self._restart(k, op, f"did not finish {op} within step_timeout={self.step_timeout} s "
                                     "and was killed")
            return late
        envs = [f"{a}..{b - 1}" for k, (a, b) in enumerate(self._bounds) if k in late]
        self._kill_workers_now()
        raise TimeoutError(
            f"{op} did not finish within step_timeout={self.step_timeout} s: workers {late} "
            f"(envs {', '.join(envs)}) are still busy; the pool is closed")

    def _kill_workers_now(self) -> None:
        """Fatal path: the workers' state is unknown, so stop them without asking."""
        if self._closed:
            return
        self._closed = True
        self._blocked = (PoolClosedError, "the pool is closed")
        for proc in self._procs:
            if proc.exitcode is None:
                proc.kill()
        self._kill_workers()
        self._release()

    def _replies(self, op: str, workers: list[int] | None = None, retry: Callable[[int], None] | None = None) -> list:
        """The answers of ``workers`` (all by default) to the message just posted, in that order.

        All answers are read before a failure is raised, so none is left in a pipe.
        A worker replaced while it owed an answer is asked again through ``retry(k)``
        once when given (the message is safe to repeat), else the call raises
        WorkerRestartedError."""
        workers = list(range(self.num_workers)) if workers is None else workers
        generations = [self._generation[k] for k in workers]
        answers = []
        for k, gen in zip(workers, generations):
            answer = self._reply(k, op, gen)
            if answer is _RESTARTED and retry is not None:
                retry(k)
                answer = self._reply(k, op, self._generation[k])
            if answer is _RESTARTED:
                a, b = self._bounds[k]
                last = next(e for e in reversed(self.restart_log) if e["worker"] == k)
                answer = WorkerRestartedError(
                    f"worker {k} (envs {a}..{b - 1}) {last['cause']} during {op} and was replaced "
                    f"(on_worker_error='restart'); the call was not retried, the pool is still open",
                    worker=k, pid=last["pid"], exitcode=last["exitcode"])
            answers.append(answer)
        for a in answers:
            if isinstance(a, (EnvError, WorkerRestartedError)):
                raise a
        return answers

    def _reply(self, k: int, op: str, generation: int | None = None):
        """Worker ``k``'s answer to a message (an EnvError if it failed), queueing side
        messages; ``_RESTARTED`` if the worker was replaced since ``generation``."""
        if generation is None:
            generation = self._generation[k]
        start = time.monotonic()
        try:
            while True:
                if self._generation[k] != generation:
                    return _RESTARTED
                conn = self._conns[k]
                if conn.poll(_SLICE_NS / 1e9):
                    try:
                        msg = P.receive(conn)
                    except (EOFError, OSError):  # OSError: reset, our unread message in its socket
                        self._worker_lost(k, op)
                        continue
                    if type(msg) is P.Reply:
                        return msg.value
                    if type(msg) is P.CallFailed:
                        return self._env_error(k, msg)
                    self._side[k].append(msg)
                    continue
                self._check_alive(op)
                if self.step_timeout is not None and time.monotonic() - start > self.step_timeout:
                    self._fail_timeout(op)
                    start = time.monotonic()
        except KeyboardInterrupt:
            self._kill_workers_now()
            raise

    def _side_message(self, k: int, env_id: int, op: str):
        """The next side message of worker ``k``; None if it died before sending it
        (and was replaced)."""
        if self._side[k]:
            return self._side[k].popleft()
        generation = self._generation[k]
        conn = self._conns[k]
        while not conn.poll(_SLICE_NS / 1e9):
            self._check_alive(op)
            if self._generation[k] != generation:
                return None
        try:
            return P.receive(conn)
        except (EOFError, OSError):
            self._worker_lost(k, op)
            return None

    def _send(self, k: int, msg: P.ToWorker, op: str) -> None:
        """Send a message to worker ``k``.  One found dead already is raised (or
        replaced, and the message goes to the replacement: nothing of it ran yet)."""
        try:
            P.send(self._conns[k], msg)
        except OSError:
            self._worker_lost(k, op)
            P.send(self._conns[k], msg)

    def _worker_lost(self, k: int, op: str) -> None:
        """Worker ``k``'s pipe closed: it died.  Raise, or replace it."""
        if self.on_worker_error != "restart":
            self._raise_died(k, op)
        self._restart(k, op)

    def _collect(self, ids: np.ndarray | None, op: str) -> dict:
        """Infos of a finished batch, plus the side messages its status bytes announce."""
        flags = self._wire.scan(ids)
        if not flags:
            return {}
        infos = self._infos.read(ids) if flags & P.SCAN_NUMERIC_INFO else {}
        if not flags & P.SCAN_SIDE_MESSAGE:
            return infos
        status = self._views.status if ids is None else self._views.status[ids]
        errors = []
        extras = []
        size = len(status)
        # Every announced message is read before anything can raise: one left in a
        # pipe would be paired with the next step's results from then on.
        for pos in np.flatnonzero(status):
            env_id = int(pos if ids is None else ids[pos])
            k = int(self._owner[env_id])
            msg = self._side_message(k, env_id, op)
            if msg is None:  # its worker died between publishing and sending it
                if status[pos] == P.STATUS_ERROR:
                    errors.append((k, P.Failure(env_id, op, "unknown", f"(worker {k} died before sending "
                                                "the traceback and was replaced)")))
                continue  # non-numeric infos of this result are lost
            if msg.env_id != env_id:
                raise P.ProtocolError(f"side channel out of order: expected env {env_id}, got "
                                      f"{type(msg).__name__} of env {msg.env_id}")
            if type(msg) is P.Extra:
                extras.append((int(pos), msg.infos))
            else:
                errors.append((k, msg))
        if errors:
            k, msg = errors[0]
            others = "" if len(errors) == 1 else f" ({len(errors) - 1} more envs failed too)"
            self._blocked = (RuntimeError, f"env {msg.env_id} raised {msg.remote_type} in {msg.phase}; "
                                           "call reset() before stepping again")
            raise self._env_error(k, msg, then=f"call reset() before stepping again{others}")
        for pos, extra in extras:
            add_info(infos, extra, pos, size)
        return infos

    def _env_error(self, k: int, failure: P.Failure, then: str | None = None) -> EnvError:
        env_id, tb = failure.env_id, failure.traceback
        who = f"env {env_id} (worker {k}, pid {self._procs[k].pid})" if env_id is not None else f"worker {k}"
        tail = f"; {then}" if then else ""
        return EnvError(f"{who} raised in {failure.phase}: {failure.last_line}{tail}\n--- remote traceback ---\n{tb}",
                        env_id=env_id, worker=k, phase=failure.phase, remote_type=failure.remote_type,
                        remote_traceback=tb, remote_exception=failure.original())


_RESTARTED = object()   # a worker owed an answer and was replaced


def _death(code: int | None) -> str:
    """How a worker process ended, in words."""
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _exists(pid: int) -> bool:
    """False once ``pid`` is gone for good: a worker reaped behind multiprocessing's back
    (its ``exitcode`` then stays None forever) must still count as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _kill_processes(procs) -> None:
    """Finalizer for a pool dropped without close(): no worker outlives it."""
    for proc in procs:
        try:
            if proc.exitcode is None:
                proc.kill()
                proc.join(timeout=2.0)
        except Exception:
            pass
