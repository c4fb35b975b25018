"""A gymnasium ``VectorEnv`` over a :class:`shmpool.Pool`: drop-in for ``AsyncVectorEnv``.

The pool does the stepping, autoreset and info batching; this face adds what
gymnasium's own vector envs promise on top: copied observations, ``AsyncVectorEnv``'s
exception types and messages for calls out of order, and
``call``/``get_attr``/``set_attr`` that see through wrappers the way
``SyncVectorEnv`` does (``env.get_wrapper_attr``/``set_wrapper_attr``).

The face keeps no state of its own: which ``*_async()`` call is pending is the pool's
:class:`shmpool.state.Lifecycle` (a pending step is the pool's; the face records there the
``reset_async``/``call_async`` it runs in a thread), whose checks refuse every call out of
order; the face words each refusal as ``AsyncVectorEnv`` does (:func:`gymnasium_refusal`).
"""
from __future__ import annotations

import builtins
import copy as _copy
import functools
import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import logger
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces import Dict, Tuple
from gymnasium.vector.utils import batch_space

from .arguments import POOL_KEYWORDS, check_typos, keywords_of
from .autoreset_modes import as_gymnasium, parse_autoreset_mode
from .background import BackgroundCall
from .errors import EnvError, PoolClosedError, SpacesDifferError, rebuild_error
from .gym_compat import (
    DEFAULT_AUTORESET,
    NOT_CALLABLE,
    AutoresetMode,
    batch_differing_spaces,
    is_space_dtype_shape_equiv,
    not_callable,
    present_infos,
    vector_metadata,
)
from .pool import Pool
from .reset_args import check_reset_mask, seed_list
from .state import CallOrderError, CallPendingError, Lifecycle, NoCallPendingError, Pending, PoolState
from .surface import PoolSurface

__all__ = ["POOL_PARAMETERS", "VECTOR_PARAMETERS", "VectorEnv", "WaitTimeoutError"]

# Pool parameters a VectorEnv forwards; any other keyword is an env kwarg (gymnasium ids only).
POOL_PARAMETERS = POOL_KEYWORDS
# Keywords a VectorEnv takes besides its envs: its own (AsyncVectorEnv's among them) and the pool's.
VECTOR_PARAMETERS = POOL_PARAMETERS | {"copy", "autoreset_mode", "observation_mode", "shared_memory", "context",
                                       "daemon", "worker"}


class WaitTimeoutError(multiprocessing.TimeoutError, TimeoutError):
    """``reset_wait``/``step_wait``/``call_wait(timeout)`` ran out of time; the call is still pending.

    Both ``multiprocessing.TimeoutError`` (what ``AsyncVectorEnv`` raises) and
    the builtin ``TimeoutError`` (what the pool raises) catch it."""


class VectorEnv(gymnasium.vector.VectorEnv):
    """gymnasium ``VectorEnv`` whose envs run in a :class:`shmpool.Pool`.

    ``env_fns`` is one of:

    - a list of callables returning envs (drop-in for ``AsyncVectorEnv(env_fns)``),
    - a gymnasium id with ``num_envs`` (other keywords that are not pool
      parameters go to ``gymnasium.make``), or a recipe id (``"Pong-v5"``,
      ``"shmpool-recipe/Ant-v5"``; those keywords are the recipe's options, EnvPool's
      names for Atari; ``shmpool.registration`` says what an id means),
    - one callable with ``num_envs``,
    - an already built :class:`shmpool.Pool` or
      :class:`shmpool.distributed.RayPool`; the VectorEnv then owns it and
      closes it.

    ``copy=True`` (gymnasium's default) returns a fresh copy of the observations
    from ``reset``/``step``; ``copy=False`` returns the pool's shared-memory
    buffers, overwritten by the next call.  Rewards (float64, ``(num_envs,)``)
    and terminated/truncated flags (bool, ``(num_envs,)``) are always fresh
    arrays, as gymnasium returns them.

    ``autoreset_mode``: ``AutoresetMode`` or its name; default NEXT_STEP, or
    the pool's own mode when a pool is given.  Under gymnasium 0.29 the
    default is 0.29's only autoreset (same step, ``infos["final_observation"]``
    and ``infos["final_info"]``) and infos have 0.29's layout; see
    ``shmpool.gym_compat``.  ``**pool_kwargs`` go to
    :class:`shmpool.Pool` (``num_workers``, ``batch_size``, ``cpus``, ``seed``,
    ``wait_policy``, ``step_timeout``, ...).

    Values travel as ``AsyncVectorEnv`` delivers them (``strict=False``, the
    default): actions reach the envs unchecked against the space (an
    out-of-range Discrete action is the env's to refuse), rewards come back as
    the envs return them (NaN, inf; float64), and observations are cast into
    the space's dtype as gymnasium's shared-memory write casts them (a Python
    float into a uint8 Box, a scalar into shape ``(1,)``).  Only what the
    shared slots cannot hold is refused: actions of another shape, of a dtype
    that does not cast ``same_kind`` (floats into a Discrete), or integers that
    do not fit the action dtype (``ValueError`` before any env steps).
    ``strict=True`` adds shmpool's checks: actions must lie in the action
    space (``ValueError`` naming the envs), and a non-finite reward or an
    observation of another shape or of a dtype only an unsafe cast fits raises
    (the env's error, ``ResultError``).

    ``AsyncVectorEnv``'s keywords:

    - ``observation_mode``: ``"same"`` (default; envs whose observation
      spaces differ raise gymnasium's ``RuntimeError``), ``"different"``
      (spaces may differ in bounds, not in type, shape or dtype;
      ``observation_space`` is ``batch_differing_spaces`` of them) or an
      ``(observation_space, single_observation_space)`` tuple, whose single
      space must have every env's shape and dtype, as in ``AsyncVectorEnv``.
      Any other value raises gymnasium's ``ValueError``.
    - ``shared_memory``: accepted, True or False alike: observations always
      travel through shared memory here (the reason gymnasium offers False,
      spaces it cannot lay out, is the pool's business, not this flag's).
    - ``context``: the ``multiprocessing`` start method, as the pool's
      ``start_method`` (give one of the two).
    - ``daemon``: True is what the pool does; False is refused: the workers
      are always daemonic processes that the pool stops itself, so an env in
      them cannot start processes of its own with ``multiprocessing``.
    - ``worker``: None only.  ``AsyncVectorEnv``'s worker functions speak its
      pipe protocol, which these workers do not use; autoreset is chosen with
      ``autoreset_mode`` and code runs in the workers with ``pool.apply``.

    ``reset_wait``, ``step_wait`` and ``call_wait`` take ``timeout`` (seconds)
    and raise :class:`WaitTimeoutError` (a ``multiprocessing.TimeoutError``,
    as ``AsyncVectorEnv`` raises, with its message) when the call is not done
    by then.  Unlike ``AsyncVectorEnv``, whose pipes are out of step after a
    timeout, the call stays pending: the same ``*_wait()`` collects it later
    (other calls raise ``AlreadyPendingCallError`` until then), or ``close()``
    ends it.  ``reset_async``/``call_async`` start the work at once (in a
    thread); ``reset()``/``call()`` do it in the calling thread.

    Shapes: observations are batched like ``observation_space``
    (``batch_space(single_observation_space, num_envs)``), actions like
    ``action_space``; infos are gymnasium's vector layout (``key`` array plus
    ``_key`` bool mask, nested dicts recursed).

    The EnvPool-style path (``async_reset``, ``send``, ``recv``,
    ``step(actions, env_id)``) goes straight to the pool; with
    ``batch_size < num_envs`` ``recv`` returns the first ``batch_size`` envs
    to finish, with ``infos["env_id"]`` (int32).
    """

    def __init__(
        self,
        env_fns: str | Callable[[], gymnasium.Env] | Sequence[Callable[[], gymnasium.Env]] | PoolSurface,
        num_envs: int | None = None,
        *,
        copy: bool = True,
        autoreset_mode: str | AutoresetMode | None = None,
        strict: bool | None = None,
        observation_mode: str | tuple[gymnasium.Space, gymnasium.Space] = "same",
        shared_memory: bool = True,
        context: str | None = None,
        daemon: bool = True,
        worker: Callable | None = None,
        **pool_kwargs: Any,
    ) -> None:
        self._pool: PoolSurface | None = None
        self.closed = True  # until the pool exists: __del__ and close() have nothing to do
        check_observation_mode(observation_mode)
        check_async_keywords(daemon, worker)
        if context is not None:
            if pool_kwargs.get("start_method") not in (None, context):
                raise ValueError(f"context={context!r} and start_method={pool_kwargs['start_method']!r} "
                                 "disagree: both name the multiprocessing start method, give one")
            pool_kwargs["start_method"] = context
        if isinstance(env_fns, PoolSurface):
            pool = env_fns
            if pool_kwargs:
                raise TypeError(f"pool options {sorted(pool_kwargs)} cannot be given with an already built Pool")
            if num_envs is not None and num_envs != pool.num_envs:
                raise ValueError(f"num_envs={num_envs} but the pool has {pool.num_envs} envs")
            if autoreset_mode is not None and parse_autoreset_mode(autoreset_mode) != pool.autoreset_mode:
                raise ValueError(
                    f"autoreset_mode={autoreset_mode!r} but the pool was built with {pool.autoreset_mode!r}")
            pool_strict = getattr(pool, "strict", True)
            if strict is not None and bool(strict) != pool_strict:
                raise ValueError(f"strict={strict!r} but the pool was built with strict={pool_strict!r}")
        else:
            # The pool takes ids, callables and env kwargs itself.
            # The pool accepts spaces that differ in bounds; observation_mode is judged below, with
            # AsyncVectorEnv's errors.
            check_typos("VectorEnv", pool_kwargs, POOL_KEYWORDS | keywords_of(VectorEnv.__init__))
            try:
                pool = Pool(env_fns, num_envs,
                            autoreset_mode=DEFAULT_AUTORESET if autoreset_mode is None else autoreset_mode,
                            strict=bool(strict), observation_mode="different", **pool_kwargs)
            except SpacesDifferError as exc:
                raise async_vector_env_error(observation_mode, exc) from None
        self._pool = pool
        self._life: Lifecycle = pool.lifecycle   # the one state: what is pending, whether closed
        self.copy = copy
        self.strict = getattr(pool, "strict", True)
        self.observation_mode = observation_mode
        self.shared_memory = shared_memory
        self.context = context
        self.daemon = daemon
        self.worker = worker
        self.max_concurrency = getattr(pool, "max_concurrency", None)
        self.autoreset_mode: AutoresetMode = as_gymnasium(pool.autoreset_mode)
        self.num_envs = pool.num_envs
        self.single_observation_space = pool.single_observation_space
        self.single_action_space = pool.single_action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self._apply_observation_mode(observation_mode)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        # A copy, as SyncVectorEnv makes, so the env's class-level metadata is never touched.
        self.metadata = vector_metadata(pool.metadata, self.autoreset_mode)
        self.render_mode = pool.render_mode
        # Like Sync/AsyncVectorEnv: no spec unless make_vec sets one (the env's own
        # spec does not describe how to rebuild the vector env).
        self.spec = None
        # What gymnasium 0.29's VectorEnv.__init__ sets: its close() reads viewer, its wrappers
        # (RecordEpisodeStatistics, ...) ask is_vector_env.  1.x reads neither.
        self.viewer = None
        self.is_vector_env = True
        self._structured_actions = isinstance(self.single_action_space, (Dict, Tuple))
        self._background: BackgroundCall | None = None   # the reset_async/call_async at work (or done)
        self.closed = False

    def _apply_observation_mode(self, mode: str | tuple) -> None:
        """``observation_mode`` judged as ``AsyncVectorEnv`` judges it, with its errors (the
        pool is closed first)."""
        per_env = getattr(self._pool, "observation_spaces", None) or (self.single_observation_space,) * self.num_envs
        distinct = list({id(s): s for s in per_env}.values())   # one per worker, unless they differ
        first = distinct[0]
        if mode == "same":
            if any(s != first for s in distinct[1:]):
                self._pool.close()
                raise RuntimeError(SAME_MODE_DIFFERS)
            return
        if mode == "different":
            self.single_observation_space = per_env[0]
            self.observation_space = batch_differing_spaces(list(per_env))
            return
        batched, single = mode
        if not isinstance(batched, gymnasium.Space) or not isinstance(single, gymnasium.Space):
            self._pool.close()
            raise TypeError(
                f"Expected both elements of observation_mode to be Spaces, got {type(batched)} and {type(single)}")
        if not all(is_space_dtype_shape_equiv(single, s) for s in distinct):
            self._pool.close()
            raise RuntimeError(CUSTOM_MODE_DIFFERS)
        self.observation_space, self.single_observation_space = batched, single

    # --- properties gymnasium's vector envs have --------------------------

    @property
    def pool(self) -> PoolSurface:
        """The :class:`shmpool.Pool` (or ``RayPool``) doing the work."""
        return self._pool

    @property
    def batch_size(self) -> int:
        """How many envs ``recv()`` returns (EnvPool's ``batch_size``)."""
        return self._pool.batch_size

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """Each env's ``np_random_seed``, as ``SyncVectorEnv``/``AsyncVectorEnv`` report it."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Copies of each env's random generator."""
        return self.get_attr("np_random")

    # --- reset ------------------------------------------------------------

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the envs; returns ``(obs, infos)``.

        ``seed``: an int gives env ``i`` the seed ``seed + i``; a list gives one per env.
        Every env's ``reset`` gets ``seed=`` and ``options=`` (None included), as gymnasium calls it.
        ``options["reset_mask"]`` (bool ``(num_envs,)``) resets only those envs."""
        seeds = self._check_reset(seed, options)
        return self._reset_now(seeds, options)

    def reset_async(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Start a reset; ``reset_wait()`` returns its results.

        Errors in the arguments are raised here, as ``AsyncVectorEnv`` raises them;
        the envs' own errors at ``reset_wait``."""
        seeds = self._check_reset(seed, options)
        self._background = BackgroundCall("reset", self._reset_now, seeds, options)
        self._life.call_started(Pending.RESET)

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Results of the reset started by ``reset_async()``: ``(obs, infos)``.

        ``timeout`` (seconds): :class:`WaitTimeoutError` if the reset is not done by
        then; it stays pending, and ``reset_wait()`` can be called again."""
        self._check_collect(Pending.RESET)
        return self._collect("reset_wait", timeout)

    def _check_reset(self, seed, options) -> list:
        """The checks of ``reset_async``, in ``AsyncVectorEnv``'s order; one seed per env."""
        self._check_open()
        seeds = seed_list(seed, self.num_envs)
        self._check_nothing_pending("reset_async")
        if options is not None and "reset_mask" in options:
            # Checked here, where AsyncVectorEnv checks it; unlike gymnasium, the
            # caller's dict keeps its "reset_mask" (the pool takes it out of a copy).
            check_reset_mask(options["reset_mask"], self.num_envs)
        return seeds

    def _reset_now(self, seeds: list, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        try:
            obs, infos = self._pool.reset(seed=seeds, options=options)
        except EnvError as err:
            raise _retyped(err) from None
        return self._out(obs), present_infos(infos, self.num_envs)

    def _collect(self, op: str, timeout: float | None) -> Any:
        """The result of the pending reset/call; raises WaitTimeoutError (still pending) after ``timeout``."""
        if not self._background.wait(timeout):
            raise WaitTimeoutError(f"The call to `{op}` has timed out after {timeout} second(s).")
        done, self._background = self._background, None
        self._life.call_collected()
        return done.result()

    # --- step -------------------------------------------------------------

    def step(self, actions, env_id=None):
        """Step every env; returns ``(obs, rewards, terminated, truncated, infos)`` in env order.

        ``actions`` is batched like ``action_space``.  EnvPool's form
        ``step(actions, env_id)`` sends to those envs and returns ``recv()``."""
        if env_id is not None:
            self.send(actions, env_id)
            return self.recv()
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions) -> None:
        """Start stepping every env with ``actions``; ``step_wait()`` returns the results.

        A wrong number of actions raises ``ValueError`` before any env steps (so
        does a wrong shape or dtype); an action batch that is not iterable
        raises gymnasium's ``TypeError``."""
        self._check_nothing_pending("step_async")
        if not self._structured_actions and type(actions) is not np.ndarray:
            try:
                iter(actions)
            except TypeError:
                raise TypeError(f"Unable to iterate over the following elements: {actions}") from None
        self._pool.step_async(actions)   # the pool's state is now STEP_PENDING

    def step_wait(self, timeout: float | None = None):
        """Results of the pending ``step_async()``: ``(obs, rewards, terminated, truncated, infos)``.

        ``obs`` batched like ``observation_space``; rewards float64 and flags
        bool, each ``(num_envs,)``.  ``timeout`` (seconds) raises
        :class:`WaitTimeoutError` (a ``multiprocessing.TimeoutError``, as
        ``AsyncVectorEnv`` raises) and, unlike ``AsyncVectorEnv``, leaves the step
        pending, so ``step_wait()`` can be called again."""
        self._check_collect(Pending.STEP)
        # The pool moves its own state: done or failed, the step is no longer pending; a wait that
        # timed out leaves it pending; a fatal error closes the pool.
        try:
            obs, rewards, terminated, truncated, infos = self._pool.step_wait(timeout)
        except TimeoutError:
            if self._pool.closed:  # the pool's own step_timeout is fatal: pass it on as it is
                raise
            raise WaitTimeoutError(f"The call to `step_wait` has timed out after {timeout} second(s).") from None
        except EnvError as err:
            raise _retyped(err) from None
        return (self._out(obs), rewards.copy(), terminated.copy(), truncated.copy(),
                present_infos(infos, self.num_envs, self.autoreset_mode, terminated, truncated))

    # --- EnvPool-style async ----------------------------------------------

    def async_reset(self) -> None:
        """Reset every env without waiting; the results arrive through ``recv()``."""
        self._check_nothing_pending("async_reset")
        self._pool.async_reset()

    def send(self, actions, env_id=None) -> None:
        """Start stepping the envs ``env_id`` (all when None) with ``actions``; returns at once.

        ``actions`` has ``len(env_id)`` rows, each like ``single_action_space``."""
        self._check_nothing_pending("send")
        self._pool.send(actions, env_id)

    def recv(self):
        """The first ``batch_size`` envs to finish: ``(obs, rewards, terminated, truncated, infos)``.

        Rows are in completion order; ``infos["env_id"]`` (int32) names each
        row's env.  All arrays are fresh."""
        self._check_nothing_pending("recv")
        try:
            obs, rewards, terminated, truncated, infos = self._pool.recv()
        except EnvError as err:
            raise _retyped(err) from None
        return obs, rewards, terminated, truncated, present_infos(infos, len(rewards), self.autoreset_mode,
                                                                  terminated, truncated)

    # --- calls and attributes ---------------------------------------------

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``env.get_wrapper_attr(name)(*args, **kwargs)`` in every env (the attribute itself
        if it is not callable); one result per env, in env order."""
        self._check_nothing_pending("call_async")
        return self._call_now(name, args, kwargs)

    def call_async(self, name: str, /, *args: Any, **kwargs: Any) -> None:
        """Start a call; ``call_wait()`` returns its results."""
        self._check_nothing_pending("call_async")
        self._background = BackgroundCall("call", self._call_now, name, args, kwargs)
        self._life.call_started(Pending.CALL)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Results of the call started by ``call_async()``, one per env.

        ``timeout`` (seconds): :class:`WaitTimeoutError` if the call is not done by
        then; it stays pending, and ``call_wait()`` can be called again."""
        self._check_collect(Pending.CALL)
        return self._collect("call_wait", timeout)

    def _call_now(self, name: str, args: tuple, kwargs: dict) -> tuple[Any, ...]:
        if name in NOT_CALLABLE:   # AsyncVectorEnv refuses them (they would desync the vector env)
            raise not_callable(name)
        try:
            return self._pool.call(name, *args, **kwargs)
        except EnvError as err:
            raise _retyped(err) from None

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """``name`` of every env, in env order.  As in gymnasium, this is ``call(name)``:
        a method is called (without arguments) and its result returned."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set ``name`` in every env (``env.set_wrapper_attr``): a list or tuple gives one
        value per env, anything else is given to all."""
        self._check_open()
        per_env = isinstance(values, (list, tuple))
        if per_env and len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments.")
        self._check_nothing_pending("set_attr")
        try:
            self._pool.set_attr(name, list(values) if per_env else values)
        except EnvError as err:
            raise _retyped(err) from None

    def render(self) -> tuple[Any, ...] | None:
        """Every env's ``render()``, in env order (``AsyncVectorEnv.render`` semantics)."""
        return self.call("render")

    # --- closing ------------------------------------------------------------

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Close the envs and stop the workers.

        ``terminate``: kill the workers at once, as ``AsyncVectorEnv`` does, without
        closing their envs or waiting for a pending call.  ``timeout`` is accepted for
        ``AsyncVectorEnv`` compatibility; the pool bounds closing itself (envs get a few
        seconds to close, then workers are killed)."""
        if self._pool is None:
            return
        pending = self._life.pending
        if pending is not None:
            logger.warn(f"Calling `close` while waiting for a pending call to `{pending.value}` to complete.")
        # A reset/call still at work in its thread, or a pending step, ends with the pool's close
        # (which also clears what is pending).
        self._background = None
        self._pool.close(terminate=terminate)

    def __del__(self) -> None:
        try:
            if not self.closed:
                self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        """gymnasium's ``VectorEnv(<id>, num_envs=n)`` and the pool's plan: ``... over Pool(...)``
        (layout, waits and why, crowding), what a user asks when the speed surprises them."""
        return f"{super().__repr__()} over {self._pool!r}"

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- internals ----------------------------------------------------------

    def _check_open(self) -> None:
        """Every entry's first check: the pool is open."""
        try:
            self._life.check_open()
        except PoolClosedError as refusal:
            raise self._refusal(refusal, "") from None

    def _check_nothing_pending(self, op: str) -> None:
        """``op`` starts work: open, and no call pending."""
        try:
            self._life.check_nothing_pending(op)
        except LIFECYCLE_REFUSALS as refusal:
            raise self._refusal(refusal, op) from None

    def _check_collect(self, call: Pending) -> None:
        """``<call>_wait``: open, and ``call`` is the call pending."""
        try:
            self._life.check_collect(call)
        except LIFECYCLE_REFUSALS as refusal:
            raise self._refusal(refusal, f"{call.value}_wait") from None

    def _refusal(self, refusal: Exception, op: str) -> Exception:
        return gymnasium_refusal(refusal, op, type(self).__name__, closed_by_caller=self.closed,
                                 forked=self._life.state is PoolState.FORKED)

    def _out(self, obs):
        if not self.copy:
            return obs
        if type(obs) is np.ndarray:
            return obs.copy()
        return _copy.deepcopy(obs)  # what gymnasium does; dict/tuple observations


# --- refusals in AsyncVectorEnv's words ---------------------------------------------------

#: What the Lifecycle's checks raise for a call out of order or a closed pool.
LIFECYCLE_REFUSALS = (PoolClosedError, CallOrderError)


def gymnasium_refusal(refusal: Exception, op: str, name: str, *, closed_by_caller: bool,
                      forked: bool = False) -> Exception:
    """A refusal of the pool's Lifecycle (one of ``LIFECYCLE_REFUSALS``) of ``op``, by the vector
    env of class ``name``, as the exception ``AsyncVectorEnv`` raises for that mistake, word for
    word (the same in gymnasium 0.29 and 1.x): ``AlreadyPendingCallError`` and
    ``NoAsyncCallError`` with the pending call's stem as ``.name``, ``ClosedEnvironmentError``.  In a
    forked child (``forked``: a torch DataLoader worker, say) the pool is its parent's, not closed by an error:
    the ``ClosedEnvironmentError`` says so with the pool's own refusal, which names the fork and the fix."""
    if isinstance(refusal, CallPendingError):
        stem = refusal.call.value
        end = "" if op == "reset_async" else "."   # AsyncVectorEnv's reset_async says it without a full stop
        return AlreadyPendingCallError(
            f"Calling `{op}` while waiting for a pending call to `{stem}` to complete{end}", stem)
    if isinstance(refusal, NoCallPendingError):
        stem = refusal.call.value
        return NoAsyncCallError(f"Calling `{stem}_wait` without any prior call to `{stem}_async`.", stem)
    if forked:
        return ClosedEnvironmentError(f"Trying to operate on `{name}` in a forked child process: {refusal}")
    if closed_by_caller:
        return ClosedEnvironmentError(f"Trying to operate on `{name}`, after a call to `close()`.")
    return ClosedEnvironmentError(f"Trying to operate on `{name}`, whose pool was closed by an earlier error.")


# --- AsyncVectorEnv's keywords ----------------------------------------------------------


def check_observation_mode(mode: Any) -> None:
    """``observation_mode``: ``"same"``, ``"different"`` or a 2-tuple (its spaces are checked once
    the envs' own are known); anything else raises gymnasium's ValueError, word for word."""
    if isinstance(mode, tuple) and len(mode) == 2:
        return
    if isinstance(mode, str) and mode in ("same", "different"):
        return
    raise ValueError("Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and batch "
                     f"observation space, actual got {mode}")


# AsyncVectorEnv's errors for observation spaces that its observation_mode does not allow.
SAME_MODE_DIFFERS = ("AsyncVectorEnv(..., observation_mode='same') however some of the sub-environments observation "
                     "spaces are not equivalent. If this is intentional, use `observation_mode='different'` instead.")
CUSTOM_MODE_DIFFERS = ("AsyncVectorEnv(..., observation_mode='different' or custom space) however the "
                       "sub-environment's observation spaces do not share a common shape and dtype.")


def async_vector_env_error(mode: str | tuple, exc: SpacesDifferError) -> Exception:
    """The pool refused the envs' observation spaces: what ``AsyncVectorEnv`` raises for them
    under ``mode`` (for ``"different"``, gymnasium's own ``batch_differing_spaces`` error)."""
    if mode == "same":
        return RuntimeError(SAME_MODE_DIFFERS)
    if mode == "different":
        try:
            batch_differing_spaces(list(exc.observation_spaces))
        except (ValueError, TypeError) as gymnasium_error:
            return gymnasium_error
        return exc   # spaces gymnasium batches but one shared-memory layout cannot hold
    return RuntimeError(CUSTOM_MODE_DIFFERS)


def check_async_keywords(daemon: Any, worker: Any) -> None:
    """``AsyncVectorEnv``'s ``daemon`` and ``worker``: the values that mean something here, or why not."""
    if worker is not None:
        raise TypeError(
            f"worker={worker!r} has no meaning for shmpool.VectorEnv: AsyncVectorEnv's worker functions speak "
            "its pipe protocol, and shmpool's workers run their own loop over shared memory. Choose autoreset "
            "with autoreset_mode=, run code inside the workers with env.pool.apply(fn)")
    if not daemon:
        raise ValueError(
            "daemon=False is not supported by shmpool.VectorEnv: its workers are always daemonic processes that "
            "the pool stops itself (on close, on error, or when the pool is dropped), so an env in them cannot "
            "start processes of its own with multiprocessing")


# --- exceptions of the env's own type -------------------------------------------


@functools.cache
def _combined_error(name: str) -> type | None:
    """``EnvError`` that is also the builtin exception ``name`` (None if impossible)."""
    typ = getattr(builtins, name, None)
    if (not isinstance(typ, type) or not issubclass(typ, Exception) or issubclass(EnvError, typ)
            or issubclass(typ, (StopIteration, StopAsyncIteration))):
        return None
    try:
        # BaseException's __str__: KeyError and friends would otherwise quote the message.
        return type(f"EnvError[{name}]", (EnvError, typ), {"__str__": BaseException.__str__,
                                                          "__reduce__": _reduce_combined,
                                                          "__module__": __name__})
    except TypeError:  # incompatible instance layouts
        return None


def _reduce_combined(err: EnvError) -> tuple:
    # The class is made at run time, so it pickles by the builtin's name and is made
    # again (the same cached class) where it is unpickled.
    return rebuild_combined_error, (err.remote_type, err.args, err.__dict__)


def rebuild_combined_error(name: str, args: tuple, fields: dict) -> EnvError:
    """Unpickling an ``EnvError[<builtin>]``: the same combined class, its message and fields."""
    return rebuild_error(_combined_error(name) or EnvError, args, fields)


def _retyped(err: EnvError) -> EnvError:
    """The pool's ``EnvError``, made an instance of the env's exception type too when that is
    a builtin: ``AsyncVectorEnv`` re-raises the env's own type, so ``except ValueError`` works."""
    cls = _combined_error(err.remote_type) if isinstance(err.remote_type, str) else None
    if cls is None:
        return err
    return err.copy_as(cls).with_traceback(err.__traceback__)
