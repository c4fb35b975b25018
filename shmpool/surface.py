"""One pool surface over any backend: the calls every pool answers, written once.

:class:`PoolSurface` is what a user calls (``Pool`` and ``RayPool`` are its subclasses, each building its
backend and adding its own properties) and what a face takes: each public call enters through
``state.public_entry`` (the entry lock, Ctrl-C, a close that came meanwhile), checks the one
:class:`~shmpool.state.Lifecycle`, checks the arguments every backend shares, asks the backend
(:class:`shmpool.backend.PoolBackend`) for the work and makes the transition.  Close, the context manager,
``len()`` and the refusal to be copied live here too.  It imports no backend (and no Ray).
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

from . import protocol as P
from .arguments import env_id_list
from .backend import PoolBackend, StepResult
from .state import INTERRUPTED, Lifecycle, LifecycleFacts, public_entry


class PoolSurface(LifecycleFacts):
    """The calls of a pool of ``num_envs`` envs, whatever steps them (see :class:`shmpool.Pool` for their
    meaning in full).  A subclass builds its backend and hands it to :meth:`_open`; until then (and after a
    start-up that failed) the pool is closed."""

    num_envs: int
    batch_size: int
    _backend: PoolBackend | None = None
    _entry_check: Callable[[], None] | None = None   # state.public_entry runs it first in every call
    _interrupted = INTERRUPTED                       # the note a Ctrl-C leaves
    _copy_refused = "a pool cannot be pickled or copied"

    def __init__(self) -> None:
        self._life = Lifecycle()
        self._life.close()   # until start-up succeeds there is nothing to close

    def _open(self, backend: PoolBackend) -> None:
        """Start-up succeeded: the pool's state is the backend's (``backend.life``, open, NEEDS_RESET), and
        its envs' spaces, metadata, render mode and spec are what the backend's envs reported."""
        self.observation_spaces = backend.observation_spaces
        self.single_observation_space = backend.single_observation_space
        self.single_action_space = backend.single_action_space
        self.metadata = backend.metadata
        self.render_mode = backend.render_mode
        self.spec = backend.spec
        self._backend = backend
        self._entry_check = backend.entry_check
        self._interrupted = backend.interrupted
        self._life = backend.life

    def _weakly(self, method: Callable[[], None]) -> Callable[[], None]:
        """``method`` of this pool called through a weak reference (a no-op once the pool is gone): what a
        backend's rooms are handed, so none keeps the pool alive."""
        ref = weakref.WeakMethod(method)

        def call() -> None:
            bound = ref()
            if bound is not None:
                bound()
        return call

    # --- sync -------------------------------------------------------------------------------

    @public_entry
    def reset(self, seed: int | Sequence[int | None] | None = None, options: Any = None) -> tuple[Any, dict]:
        """Reset every env; returns ``(obs, infos)`` in env order, obs ``(num_envs, *obs_shape)``.

        ``seed``: an int gives env ``i`` the seed ``seed + i``; a list gives one per env.
        ``options``: one dict for every env, or a list with one dict (or None) per env.
        ``options["reset_mask"]`` (bool array, one per env) resets only those envs,
        as gymnasium's vector envs do; the other envs keep their observations."""
        life, backend = self._life, self._backend
        life.check_open()
        request = backend.reset_request(seed, options)   # checked before anything is sent
        life.check_idle()
        backend.reset(request)
        life.ready()
        return backend.reset_result()

    @public_entry
    def step(self, actions: Any, env_ids: Any = None) -> StepResult:
        """Step every env (or, with ``env_ids``, ``send`` to those envs and ``recv()``).

        ``actions``: batched like ``action_space`` (``(num_envs, *shape)``).
        Returns ``(obs, rewards, terminated, truncated, infos)`` in env order: obs
        ``(num_envs, *obs_shape)``, rewards float64 ``(num_envs,)``, flags bool ``(num_envs,)``."""
        life, backend = self._life, self._backend
        if env_ids is not None:
            life.check_send()
            backend.send(actions, env_ids)
            life.check_recv(self.batch_size)
            return backend.recv()
        # step_async and step_wait under one entry, each verb called directly (the hot path)
        life.check_step_async()
        backend.post_step(actions)
        life.step_posted()
        backend.wait_step(None)
        life.step_done()
        return backend.step_result()

    @public_entry
    def step_async(self, actions: Any) -> None:
        """Start stepping every env with ``actions``; ``step_wait()`` returns the results."""
        self._life.check_step_async()
        self._backend.post_step(actions)
        self._life.step_posted()

    @public_entry
    def step_wait(self, timeout: float | None = None) -> StepResult:
        """Results of the pending ``step_async()``, in env order (see :meth:`step`).

        ``timeout`` (seconds): raise ``TimeoutError`` if the step is not done by
        then; the step stays pending and ``step_wait()`` can be called again."""
        life, backend = self._life, self._backend
        life.check_step_wait()
        backend.wait_step(timeout)
        life.step_done()
        return backend.step_result()

    # --- async ------------------------------------------------------------------------------

    @public_entry
    def async_reset(self) -> None:
        """Reset every env without waiting; results arrive through ``recv()``."""
        self._life.check_idle()
        self._backend.async_reset()
        self._life.ready()

    @public_entry
    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Start stepping ``env_ids`` (all envs when None) with ``actions``; returns at once.

        ``actions`` is batched like ``action_space`` with ``len(env_ids)`` rows."""
        self._life.check_send()
        self._backend.send(actions, env_ids)

    @public_entry
    def recv(self) -> StepResult:
        """The first ``batch_size`` envs to finish, in completion order (a local pool: except that
        none runs more than ``max_lead`` steps ahead of the least-advanced env out; a RayPool counts
        in whole sub-batches).

        Returns ``(obs, rewards, terminated, truncated, infos)`` with
        ``infos["env_id"]`` (int32) naming the env of each row."""
        self._life.check_recv(self.batch_size)
        return self._backend.recv()

    # --- per-env messages -------------------------------------------------------------------

    def call(self, name: str, *args: Any, env_ids: Any = None, **kwargs: Any) -> tuple:
        """Call ``env.name(*args, **kwargs)`` (or read the attribute if it is not
        callable) in every env, or in ``env_ids`` only (the keyword is reserved);
        results in env order, or in the order of ``env_ids``.  Names are looked up
        through wrappers (``env.get_wrapper_attr``) as gymnasium's vector envs do."""
        return self._per_env(P.CALL, name, env_ids, lambda n: [(args, kwargs)] * n)

    def apply(self, fn: Callable[..., Any], *args: Any, env_ids: Any = None, **kwargs: Any) -> tuple:
        """``fn(env, *args, **kwargs)`` run where the envs live, for every env (or ``env_ids``);
        ``fn`` is cloudpickled, its results come back pickled, in env (or ``env_ids``) order."""
        return self._per_env(P.APPLY, getattr(fn, "__name__", "fn"), env_ids,
                             lambda n: [(fn, args, kwargs)] * n)

    def get_attr(self, name: str, env_ids: Any = None) -> tuple:
        """``env.get_wrapper_attr(name)`` of every env or of ``env_ids`` (methods are returned, not called)."""
        return self._per_env(P.GET_ATTR, name, env_ids, lambda n: [None] * n)

    def set_attr(self, name: str, values: Any, env_ids: Any = None) -> None:
        """Set ``name`` (``env.set_wrapper_attr``) on every env or on ``env_ids``: a list/tuple gives
        one value per env, anything else is shared."""
        def per_env(n: int) -> list:
            if not isinstance(values, (list, tuple)):
                return [values] * n
            if len(values) != n:
                raise ValueError(f"set_attr needs {n} values, got {len(values)}")
            return list(values)
        self._per_env(P.SET_ATTR, name, env_ids, per_env)

    @public_entry
    def _per_env(self, op: str, name: str, env_ids: Any, payloads: Callable[[int], list]) -> tuple:
        """Run a message op on chosen envs; only the parts that hold them are asked."""
        self._life.check_open()
        ids = env_id_list(env_ids, self.num_envs)
        items = payloads(len(ids))
        self._life.check_idle()
        return self._backend.per_env(op, name, ids, items)

    # --- restarts ---------------------------------------------------------------------------

    @property
    def restarts(self) -> int:
        """Replacements so far (``on_worker_error="restart"``)."""
        return self._backend.restarts

    @property
    def restart_log(self) -> Any:
        """The latest restarts, oldest first."""
        return self._backend.restart_log

    # --- closing ----------------------------------------------------------------------------

    def close(self, terminate: bool = False) -> None:
        """Close every env and stop what runs them. Idempotent.  From a signal handler or
        another thread while a call is in progress, that call ends with
        ``PoolClosedError`` and the pool is closed as it leaves (from another thread,
        ``close()`` waits for that).

        ``terminate``: stop them at once, without asking their envs to close or
        waiting for the call they are in (``AsyncVectorEnv.close(terminate=True)``).  An env
        the trainer's own process runs (a local pool's parent shard) cannot be killed: a call in it
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
        """Close with no call inside the backend (the caller holds the entry lock)."""
        self._life.close()
        self._backend.close()

    def _kill_workers_now(self) -> None:
        """The fatal path (inside a call that is about to raise, a passed step timeout, Ctrl-C): the
        state of what runs the envs is unknown, so stop it without asking."""
        if self._life.closed:
            return
        self._life.close()
        self._backend.kill()

    def __enter__(self) -> PoolSurface:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._life.closed and self._backend.forgotten():
                PoolSurface.close(self)   # the surface's own: a subclass's close() may reset what forgotten() set
        except Exception:
            pass

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Its processes, memory or actors belong to this process: a copy (copy, deepcopy, pickle, a Ray
        # task's argument) could only close them under the original or fail later.
        raise TypeError(self._copy_refused)

    def __len__(self) -> int:
        return self.num_envs


__all__ = ["PoolSurface"]
