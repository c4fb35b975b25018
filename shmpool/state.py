"""The one explicit state of a pool, checked at every public entry.

A pool (``Pool``, ``RayPool``) holds one :class:`Lifecycle`: the :class:`PoolState`,
how many envs ``send()``/``async_reset()`` put in flight, which ``*_async()`` call is
:class:`Pending` (the pool's own ``step_async()``, or a ``reset_async()``/``call_async()``
the gymnasium face runs in a thread), why stepping is refused, and the lock that makes
each public call whole.  Every refusal is raised here: ``PoolClosedError``, a
:class:`CallPendingError` or :class:`NoCallPendingError` naming the pending call, or a
``RuntimeError``; the messages live here too, so every face words the same mistake the same
way, and a face with other words (gymnasium's) translates the refusal, never the state.

Entry protocol of a public method (``Pool`` and ``RayPool`` both)::

    life = self._life
    life.enter(op)               # one lock per pool: a second thread's call is refused, never interleaved
    try:
        life.check_send()        # or check_step_async(), check_recv(...), ...
        ...                      # the work, then a transition: life.step_posted(), ...
    finally:
        life.leave()             # runs a close() requested meanwhile, then raises PoolClosedError

``close()`` asks :meth:`Lifecycle.begin_close` first: when a call is in progress (a signal
handler of the calling thread, or another thread) the close is deferred to that call's
``leave()``, so the shared memory is never released under a call that is using it.
"""
from __future__ import annotations

import enum
import functools
import os
import threading
import time
from collections.abc import Callable

from .errors import PoolClosedError


class Pending(enum.Enum):
    """An ``*_async()`` call whose ``*_wait()`` has not collected it yet; the values are the
    stems gymnasium names the pairs with (``reset_async``/``reset_wait``, ...)."""

    RESET = "reset"
    STEP = "step"
    CALL = "call"


class CallOrderError(RuntimeError):
    """A call refused because of which ``*_async()`` call is pending: ``call`` names that call."""

    def __init__(self, message: str, call: Pending) -> None:
        super().__init__(message)
        self.call = call

    def __reduce__(self):
        return type(self), (str(self), self.call)


class CallPendingError(CallOrderError):
    """Refused because ``call`` was started and is not collected yet."""


class NoCallPendingError(CallOrderError):
    """``<call>_wait()`` refused: no ``<call>_async()`` is pending."""


class ConcurrentCallError(RuntimeError):
    """A call refused because another thread is inside one of the pool's calls: a pool serves one thread at a
    time (a second caller waiting its turn would get the step after the first's, and with ``copy=False`` the
    first caller's arrays would be overwritten by it)."""


def call_pending_message(op: str, pending: Pending) -> str:
    """``op`` refused while ``pending`` is started and not collected."""
    return f"{op}() while a {pending.value}_async() is pending; call {pending.value}_wait() first"


def no_call_pending_message(expected: Pending) -> str:
    """``<expected>_wait()`` refused: nothing of its kind is pending."""
    return f"{expected.value}_wait() without a pending {expected.value}_async()"


# Refusals shared word for word by Pool and RayPool (and asserted by the tests).
CLOSED = "the pool is closed"
RESET_FIRST = "call reset() or async_reset() before stepping"
STEP_PENDING_ASYNC = "step_async() while a step is pending; call step_wait() first"
STEP_PENDING_OTHER = "a step_async() is pending; call step_wait() first"
NO_PENDING_STEP = no_call_pending_message(Pending.STEP)
NOTHING_IN_FLIGHT = "recv() with nothing in flight: call send() or async_reset() first"
CLOSED_DURING_CALL = "the pool was closed (by a signal handler or another thread) while this call was in progress"
REENTERED = ("the pool was called again from the thread that is already inside one of its calls (a signal "
             "handler?); only close() may be called there")


def concurrent_call_message(op: str, thread: str, inside: str) -> str:
    """``op`` refused in this thread because ``thread`` is inside the pool's call ``inside``."""
    def named(call: str) -> str:   # "step()", or a description ("a per-env call") as it is
        return call if " " in call else f"{call}()"
    return (f"{named(op)} from thread {threading.current_thread().name!r} while thread {thread!r} is inside this "
            f"pool's {named(inside)}: a pool serves one thread at a time (a second caller waiting its turn would get "
            "the step after the first's, and with copy=False overwrite the first caller's arrays); call it from one "
            "thread, or give each thread a pool of its own")


def busy_envs_message(n_flight: int) -> str:
    """step() refused because ``send()`` left envs in flight."""
    return f"step() needs every env idle but {n_flight} are in flight from send(); recv() them first"


def short_batch_message(batch_size: int, n_flight: int) -> str:
    """recv() refused because fewer than a batch are in flight."""
    return f"recv() waits for batch_size={batch_size} envs but only {n_flight} are in flight; send() more first"


def forked_message(owner_pid: int) -> str:
    return (f"this pool belongs to process {owner_pid} and was inherited by fork into process {os.getpid()}: "
            "its workers serve the parent only; create a new pool in the child")


class PoolState(enum.Enum):
    """Where a pool is between calls."""

    NEEDS_RESET = "needs reset"    # built, or an env raised: stepping waits for reset()/async_reset()
    READY = "ready"                # steppable; ``Lifecycle.in_flight`` envs are out from send()
    STEP_PENDING = "step pending"  # step_async() posted; step_wait() collects it
    CLOSED = "closed"              # close(), or a fatal error closed it
    FORKED = "forked"              # this process is a fork of the pool's owner: nothing may touch it


class Lifecycle:
    """State, in-flight count, pending call, refusal reason and entry lock of one pool.

    Checks raise ``PoolClosedError`` once closed (or forked), ``CallPendingError``/
    ``NoCallPendingError`` (``RuntimeError``s naming the pending call) for a call out of
    order around a pending one, and ``RuntimeError`` for the other calls out of order;
    transitions are plain assignments kept here so every change of state has a name."""

    __slots__ = ("state", "reason", "in_flight", "started", "lock", "busy", "close_requested", "kill_requested",
                 "owner_pid", "inside")

    def __init__(self) -> None:
        self.state = PoolState.NEEDS_RESET
        self.reason = RESET_FIRST       # the refusal while NEEDS_RESET / CLOSED / FORKED
        self.in_flight = 0              # envs sent (or async-reset) and not received yet
        # A reset or call a face started in a thread (gymnasium's reset_async/call_async) and has
        # not collected; the pool's own checks ignore it, since that thread runs through them.
        self.started: Pending | None = None
        self.lock = threading.RLock()   # re-entrant only so a signal handler's close() is seen, not deadlocked
        self.busy = False               # a public call is between enter() and leave()
        self.close_requested = False    # close() came while busy: leave() performs it
        self.kill_requested = False     # ... as a kill (close(terminate=True)): the workers are not asked
        self.owner_pid = os.getpid()
        self.inside: tuple[str, str] | None = None   # (thread name, op) of the call in progress; op "close" closing

    # --- entry and exit ---------------------------------------------------------------

    def enter(self, op: str = "a call") -> None:
        """Start public call ``op``.  Refused while another thread is inside a call (:class:`ConcurrentCallError`;
        ``PoolClosedError`` while it closes the pool), or when re-entered from the same thread (a signal handler).
        Only ``close()`` waits for another thread's call (:meth:`begin_close`)."""
        while not self.lock.acquire(False):
            inside = self.inside
            if inside is not None:
                if inside[1] == "close":
                    raise PoolClosedError(CLOSED)
                raise ConcurrentCallError(concurrent_call_message(op, *inside))
            time.sleep(0)   # the holder has just taken the lock (or is giving it back) and says why in a moment
        if self.busy:
            self.lock.release()
            raise RuntimeError(REENTERED)
        self.busy = True
        self.inside = (threading.current_thread().name, op)

    def leave(self, close: Callable[[], None], kill: Callable[[], None] | None = None) -> None:
        """End a public call.  If ``close()`` was requested while it ran, run ``close`` (``kill``
        when the request was to kill and the pool gave one) now and raise ``PoolClosedError``
        (chained to whatever the call raised)."""
        self.busy = False   # first: a close() from a signal handler after this runs in full itself
        self.inside = None
        try:
            if self.close_requested:
                how = kill if self.kill_requested and kill is not None else close
                self.close_requested = self.kill_requested = False
                if self.state is not PoolState.CLOSED:
                    how()
                raise PoolClosedError(CLOSED_DURING_CALL)
        finally:
            self.lock.release()

    def begin_close(self, kill: bool = False) -> bool:
        """Called first by ``close()``.  True: no call is in progress, the caller holds
        the lock and closes now (and must ``end_close()``).  False: a call is in
        progress in this thread (a signal handler) and will close the pool when it
        ends, or the pool is already closed.  ``kill``: the close is to kill the workers
        without asking them (recorded for the call that performs it, :meth:`leave`)."""
        if self.lock.acquire(False):
            if self.busy:   # re-entered from a signal handler of the busy thread
                self.lock.release()
                if self.state is not PoolState.CLOSED and self.state is not PoolState.FORKED:
                    self._request_close(kill)
                return False
        else:               # another thread is inside a call: ask it to stop, wait for it to leave
            self._request_close(kill)
            self.lock.acquire()
        if self.state is PoolState.CLOSED or self.state is PoolState.FORKED:
            self.lock.release()
            return False
        self.busy = True
        self.inside = (threading.current_thread().name, "close")
        return True

    def _request_close(self, kill: bool) -> None:
        self.kill_requested = self.kill_requested or kill   # a kill asked once is not undone by a plain close
        self.close_requested = True

    def end_close(self) -> None:
        self.busy = False
        self.inside = None
        self.close_requested = self.kill_requested = False
        self.lock.release()

    # --- checks -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.state is PoolState.CLOSED or self.state is PoolState.FORKED

    @property
    def pending(self) -> Pending | None:
        """The ``*_async()`` call started and not collected: the pool's ``step_async()``, or the
        reset or call a face started; None when nothing is (or the pool is closed)."""
        if self.state is PoolState.STEP_PENDING:
            return Pending.STEP
        return self.started

    def check_nothing_pending(self, op: str) -> None:
        """A face's ``op`` that starts work (gymnasium's ``*_async``, ``set_attr``, ...): open,
        and no call pending, whoever started it."""
        self.check_open()
        pending = self.pending
        if pending is not None:
            raise CallPendingError(call_pending_message(op, pending), pending)

    def check_collect(self, expected: Pending) -> None:
        """``<expected>_wait()``: open, and ``expected`` is the call pending."""
        self.check_open()
        if self.pending is not expected:
            raise NoCallPendingError(no_call_pending_message(expected), expected)

    def check_open(self) -> None:
        """Anything but a closed (or inherited) pool."""
        if self.state is PoolState.CLOSED or self.state is PoolState.FORKED:
            raise PoolClosedError(self.reason)

    def check_idle(self) -> None:
        """reset(), async_reset(), call(), ...: open and no step_async() pending."""
        self.check_open()
        if self.state is PoolState.STEP_PENDING:
            raise CallPendingError(STEP_PENDING_OTHER, Pending.STEP)

    def check_step_async(self) -> None:
        """step_async(): steppable, no step pending, no env in flight."""
        if self.state is PoolState.READY and not self.in_flight:
            return
        self._refuse_stepping(STEP_PENDING_ASYNC)
        raise RuntimeError(busy_envs_message(self.in_flight))

    def check_send(self) -> None:
        """send(): steppable and no step pending (envs may be in flight)."""
        if self.state is not PoolState.READY:
            self._refuse_stepping(STEP_PENDING_OTHER)

    def check_step_wait(self) -> None:
        if self.state is not PoolState.STEP_PENDING:
            self.check_collect(Pending.STEP)   # raises: a pending step is the state STEP_PENDING

    def check_recv(self, batch_size: int) -> None:
        """recv(): open and at least ``batch_size`` envs in flight."""
        self.check_open()
        if self.in_flight < batch_size:
            if not self.in_flight:
                raise RuntimeError(NOTHING_IN_FLIGHT)
            raise RuntimeError(short_batch_message(batch_size, self.in_flight))

    def _refuse_stepping(self, pending_message: str) -> None:
        self.check_open()
        if self.state is PoolState.NEEDS_RESET:
            raise RuntimeError(self.reason)
        if self.state is PoolState.STEP_PENDING:
            raise CallPendingError(pending_message, Pending.STEP)

    # --- transitions --------------------------------------------------------------------

    def ready(self) -> None:
        """A reset (sync or async) was posted or done: stepping is allowed."""
        self.state = PoolState.READY
        self.reason = None

    def step_posted(self) -> None:
        self.state = PoolState.STEP_PENDING

    def step_done(self) -> None:
        self.state = PoolState.READY

    def call_started(self, call: Pending) -> None:
        """A face started ``call`` (``Pending.RESET`` or ``Pending.CALL``) in a thread; its wait collects it."""
        self.started = call

    def call_collected(self) -> None:
        """The face's wait collected the call it started (its result or its error)."""
        self.started = None

    def needs_reset(self, reason: str) -> None:
        """An env failed: refuse stepping with ``reason`` until the next reset."""
        self.state = PoolState.NEEDS_RESET
        self.reason = reason

    def close(self, reason: str = CLOSED) -> None:
        self.state = PoolState.CLOSED
        self.reason = reason
        self.in_flight = 0
        self.started = None      # a closed pool has nothing to collect

    def forked(self) -> None:
        """Called in a forked child: the pool is its parent's; refuse everything, fresh lock
        (a lock held by another parent thread at the fork would stay held here forever)."""
        self.state = PoolState.FORKED
        self.reason = forked_message(self.owner_pid)
        self.started = None
        self.lock = threading.RLock()
        self.busy = False
        self.inside = None
        self.close_requested = self.kill_requested = False


class LifecycleFacts:
    """What every pool class (``Pool``, ``RayPool``) tells about its :class:`Lifecycle`
    (the class keeps it in ``_life``)."""

    _life: Lifecycle

    @property
    def closed(self) -> bool:
        """True once the pool is closed (or, in a forked child, not this process's to use)."""
        return self._life.closed

    @property
    def state(self) -> PoolState:
        """Where the pool is between calls (see :class:`PoolState`)."""
        return self._life.state

    @property
    def in_flight(self) -> int:
        """Envs sent (or async-reset) and not returned by ``recv()`` yet."""
        return self._life.in_flight

    @property
    def lifecycle(self) -> Lifecycle:
        """The pool's :class:`Lifecycle`: what a face over the pool checks and records its own
        calls in (the gymnasium face's ``reset_async``/``call_async``), so there is one state."""
        return self._life


INTERRUPTED = "the pool was closed and its workers killed"


def add_note(exc: BaseException, text: str) -> None:
    """``exc.add_note(text)`` (Python 3.11+); on 3.10 the note goes into ``__notes__`` as PEP 678
    keeps it, where code reading notes finds it (3.10's traceback does not print them)."""
    if hasattr(exc, "add_note"):
        exc.add_note(text)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), text]


ENTRY_NAMES = {"_per_env": "a per-env call"}   # how a refusal names an entry that is no public name


def public_entry(method: Callable) -> Callable:
    """A pool's public method (the entry protocol above): one call at a time per pool (another
    thread's call meanwhile is refused, as a signal handler re-entering is), and a ``close()`` that came meanwhile
    runs as the call leaves (raising ``PoolClosedError``).  The pool gives ``_life``,
    ``_kill_workers_now()`` (the fatal path), ``_close_now()``, ``_entry_check`` (None, or a check its
    backend runs first in every call: Ray's, that Ray was not shut down) and ``_interrupted`` (what a
    Ctrl-C did, for the note the interrupt leaves with)."""
    op = ENTRY_NAMES.get(method.__name__, method.__name__)

    @functools.wraps(method)
    def entry(self, *args, **kwargs):
        life = self._life
        life.enter(op)
        try:
            check = self._entry_check
            if check is not None:
                check()
            return method(self, *args, **kwargs)
        except KeyboardInterrupt as exc:
            # Mid-call the workers' state is unknown, whichever slice of the wait was hit:
            # stop them, and say so on the way out.
            self._kill_workers_now()
            done = self._interrupted
            if not any(done in note for note in getattr(exc, "__notes__", ())):
                add_note(exc, f"shmpool: {done} ({op} was interrupted)")
            raise
        finally:
            life.leave(self._close_now, self._kill_workers_now)
    return entry
