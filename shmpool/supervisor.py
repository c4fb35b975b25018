"""Waiting on the workers, and what is read between and after the waits.

Every wait of a pool is sliced (``SLICE_NS``); between two slices the supervisor
checks, in this order: a ``close()`` requested meanwhile (the call ends with
``PoolClosedError``), dead workers (raise and close, or replace them through the
restart room), and the step timeout.  It also reads what a finished batch
announces on the side channels (``collect``) and the answers to side messages
(``replies``).  It may touch the pool's state, worker set and wire; it never frees
anything except through the pool's fatal path.
"""
from __future__ import annotations

import functools
import itertools
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from . import protocol as P
from .errors import EnvError, PoolClosedError, WorkerRestartedError
from .infos import add_info, collides, merge_in_env_order
from .state import CLOSED_DURING_CALL
from .workerset import SLICE_NS

if TYPE_CHECKING:
    from .pool import Pool


class Supervisor:
    """The waits, liveness checks and side-channel reads of one pool."""

    def __init__(self, pool: Pool) -> None:
        self.pool = weakref.proxy(pool)   # the pool owns its supervisor: no reference cycle
        # Side messages read before their env's turn: a worker sends them in its completion
        # order, and recv hands out an env it held back (max_lead) after envs that finished later.
        self.early: dict[int, P.Extra | P.Failure] = {}
        self.calls = itertools.count(1)   # message commands' numbers: an answer names the call it answers

    def collect(self, ids: np.ndarray | None, op: str) -> dict:
        """Infos of a finished batch, plus the side messages its status bytes announce."""
        flags = self.pool._wire.scan(ids)
        if not flags:
            return {}
        if not flags & P.SCAN_SIDE_MESSAGE:
            return self.pool._infos.read(ids) if flags & P.SCAN_NUMERIC_INFO else {}
        # The side messages are read even if batching the columns fails: one left in a pipe would
        # be paired with the next step's results from then on.
        infos: dict = {}
        unbatchable: Exception | None = None
        if flags & P.SCAN_NUMERIC_INFO:
            try:
                infos = self.pool._infos.read(ids)
            except Exception as exc:
                unbatchable = exc
        status = self.pool._views.status if ids is None else self.pool._views.status[ids]
        errors = []
        extras = []
        size = len(status)
        # Every announced message is read before anything can raise: one left in a
        # pipe would be paired with the next step's results from then on.
        announced = np.flatnonzero(status)
        later = set() if ids is None else {int(e) for e in ids[announced]}
        for pos in announced:
            env_id = int(pos if ids is None else ids[pos])
            k = int(self.pool._owner[env_id])
            later.discard(env_id)
            msg = self._side_message(k, env_id, op, later)
            if msg is None:  # its worker died between publishing and sending it
                if status[pos] == P.STATUS_ERROR:
                    errors.append((k, P.Failure(env_id, op, "unknown", f"(worker {k} died before sending "
                                                "the traceback and was replaced)")))
                continue  # non-numeric infos of this result are lost
            if type(msg) is P.Extra:
                try:
                    extra = P.unpack(msg.infos)
                    slow = None if msg.slow_obs is None else P.unpack(msg.slow_obs)
                except Exception as exc:
                    errors.append((k, unreadable(env_id, op, "infos", exc)))
                    continue
                extras.append((int(pos), extra))
                if slow is not None:  # observation leaves that travel pickled (shmpool.fallback)
                    self.pool._slow_obs.store(env_id, slow)
            else:
                errors.append((k, msg))
        if unbatchable is not None and not errors:
            raise unbatchable
        if errors:
            # An env's own exception first, the pool's checks of results (ResultError) after it:
            # SyncVectorEnv raises the first exception of its loop and checks results only after it.
            errors.sort(key=lambda e: e[1].remote_type == "ResultError")
            k, msg = errors[0]
            others = "" if len(errors) == 1 else f" ({len(errors) - 1} more envs failed too)"
            self.pool._life.needs_reset(f"env {msg.env_id} raised {msg.remote_type} in {msg.phase}; "
                                        "call reset() before stepping again")
            raise self.pool._workers.env_error(k, msg, then=f"call reset() before stepping again{others}")
        if any(collides(infos, extra) for _, extra in extras):
            # A key some envs put in its column and others aside (its value changed type):
            # gymnasium's batching depends on the env order, so it is replayed in that order.
            return merge_in_env_order(infos, extras, size, self.pool._infos.numpy_keys)
        for pos, extra in extras:
            add_info(infos, extra, pos, size)
        return infos

    def _side_message(self, k: int, env_id: int, op: str, later: set[int]):
        """Worker ``k``'s side message for ``env_id`` (None if it died before sending it).
        Messages met first that belong to envs taken but not handed out yet (``later`` in this
        batch, or held back by the pool's ``max_lead``) wait in ``early`` for their turn;
        any other is a broken protocol."""
        msg = self.early.pop(env_id, None)
        while msg is None:
            msg = self.pool._workers.side_message(k, functools.partial(self.between_slices, op), self.lost_in(op))
            if msg is None:   # its worker died and was replaced: the restart room salvaged what it sent
                return self.early.pop(env_id, None)
            if msg.env_id == env_id:
                return msg
            if msg.env_id in later or self.pool._lead.is_held(msg.env_id):
                self.early[msg.env_id] = msg
                msg = None
                continue
            raise P.ProtocolError(f"side channel out of order: expected env {env_id}, got "
                                  f"{type(msg).__name__} of env {msg.env_id}")
        return msg

    def wait(self, op: str, ready: Callable[[int], bool], timeout: float | None = None,
             on_restart: Callable[[list[int]], None] | None = None) -> None:
        """Repeat ``ready(slice_ns)`` waits, checking close requests, the workers and the
        step timeout between slices.  ``timeout`` raises TimeoutError and leaves the
        operation pending.  With ``on_worker_error="restart"``, ``on_restart(workers)``
        follows each restart."""
        start = time.monotonic()
        step_start = start
        try:
            while True:
                slice_ns = SLICE_NS
                if timeout is not None:
                    left = timeout - (time.monotonic() - start)
                    if left <= 0:
                        raise TimeoutError(f"{op} did not finish within {timeout} s; it is still pending")
                    slice_ns = min(slice_ns, int(left * 1e9))
                if ready(slice_ns):
                    return
                self.pool._workers.pump()
                restarted = self.between_slices(op, step_start)
                if restarted:
                    step_start = time.monotonic()  # the replacements get a full step_timeout
                    if on_restart is not None:
                        on_restart(restarted)
        except KeyboardInterrupt:
            self.pool._kill_workers_now()
            raise

    def between_slices(self, op: str, since: float | None = None) -> list[int]:
        """Between two slices of a wait: a close() requested meanwhile ends the call; dead
        workers raise (or are replaced); ``since`` given, the step timeout is checked.
        Returns the workers replaced."""
        if self.pool._life.close_requested:
            raise PoolClosedError(CLOSED_DURING_CALL)
        restarted = self.check_alive(op)
        limit = self.pool.step_timeout
        if since is not None and limit is not None and time.monotonic() - since > limit:
            restarted += self.fail_timeout(op)
        return restarted

    def check_alive(self, op: str) -> list[int]:
        """Raise for a dead worker, or (``on_worker_error="restart"``) replace it;
        returns the workers replaced."""
        dead = self.pool._workers.dead()
        for k in dead:
            self.worker_lost(k, op)
        return dead

    def worker_lost(self, k: int, op: str, cause: str | None = None) -> None:
        """Worker ``k`` died (or was killed): replace it, or close the pool and raise."""
        if self.pool._replacing:
            self.pool._restarts.replace(self.pool, k, op, cause)
            return
        err = self.pool._workers.died(k, op)
        self.pool._kill_workers_now()
        raise err

    def lost_in(self, op: str) -> Callable[[int], None]:
        return lambda k: self.worker_lost(k, op)

    def fail_timeout(self, op: str) -> list[int]:
        late = [k for k in range(self.pool.num_workers) if self.pool._wire.done_seq(k) != self.pool._wire.cmd_seq(k)]
        if late and self.pool._replacing:
            for k in late:  # hung: kill and replace
                self.pool._workers.kill(k)
                self.worker_lost(k, op, f"did not finish {op} within step_timeout={self.pool.step_timeout} s "
                                         "and was killed")
            return late
        envs = [f"{a}..{b - 1}" for k, (a, b) in enumerate(self.pool._workers.bounds) if k in late]
        self.pool._kill_workers_now()
        raise TimeoutError(
            f"{op} did not finish within step_timeout={self.pool.step_timeout} s: workers {late} "
            f"(envs {', '.join(envs)}) are still busy; the pool is closed")

    def restep(self, workers: list[int]) -> None:
        self.pool._restarts.restep(self.pool, workers)

    def all_done(self, slice_ns: int) -> bool:
        """Every worker has handled its last command (one slice per worker at most)."""
        wire = self.pool._wire
        self.pool._workers.serve_hosted()
        for k in range(self.pool.num_workers):
            if not wire.wait_done(k, wire.cmd_seq(k), self.pool.wait_policy, slice_ns):
                return False
        return True

    def message(self, k: int, msg: P.ToWorker, op: str) -> None:
        """Send a side message to worker ``k`` and post the command that makes it read it."""
        self.pool._workers.send(k, msg, self.lost_in(op))
        self.pool._wire.post(k, P.CMD_MESSAGE)

    def ask_envs(self, op: str, name: str, ids: list[int], items: list) -> tuple:
        """``EnvCall(op, name)`` for env ``ids[i]`` with ``items[i]``; only the workers that own
        them are asked.  Their answers, in the order of ``ids``.  Envs in flight from send()
        stay in flight: the workers serve them before the message, and recv() still returns them.

        Every payload is pickled before anything is sent: one that cannot be is a ``TypeError``
        naming the env, and no env was asked."""
        what = f"{op} {name!r}"
        part = "value" if op == P.SET_ATTR else "arguments"
        blobs = pack_each(items, ids, lambda env_id: f"{what}: the {part} for env {env_id}")
        by_worker: dict[int, list[int]] = {}
        for pos, env_id in enumerate(ids):
            by_worker.setdefault(int(self.pool._owner[env_id]), []).append(pos)
        call = next(self.calls)
        for k, positions in by_worker.items():
            start = self.pool._workers.bounds[k][0]
            self.message(k, P.EnvCall(call, op, name, [ids[p] - start for p in positions],
                                      [blobs[p] for p in positions]), what)
        out: list = [None] * len(ids)
        errors = []
        for k, answer in zip(by_worker, self.replies(what, call, list(by_worker))):
            for pos, blob in zip(by_worker[k], answer or ()):
                try:
                    out[pos] = P.unpack(blob)
                except Exception as exc:
                    errors.append((k, unreadable(ids[pos], what, "answer", exc)))
        if errors:
            k, failure = errors[0]
            raise self.pool._workers.env_error(k, failure)
        return tuple(out)

    def replies(self, op: str, call: int, workers: list[int] | None = None,
                retry: Callable[[int], None] | None = None) -> list:
        """The answers of ``workers`` (all by default) to message command ``call``, in that
        order: each a ``Reply``'s packed values (None when it has none).

        All answers are read before a failure is raised, so none is left in a pipe (and an
        answer to an earlier call that was left is dropped: it names its call).  A worker
        replaced while it owed an answer is asked again through ``retry(k)`` once when given
        (the message is safe to repeat), else the call raises WorkerRestartedError."""
        workers = list(range(self.pool.num_workers)) if workers is None else workers
        ws = self.pool._workers
        ws.serve_hosted()
        lost = self.lost_in(op)

        def between(since: float) -> bool:
            """Liveness and step timeout (no pump: it would move the awaited replies
            out of the pipes); True when a worker was replaced (a fresh start)."""
            return bool(self.between_slices(op, since))

        generations = [ws.generation[k] for k in workers]
        answers = []
        try:
            for k, gen in zip(workers, generations):
                answer = ws.reply(k, gen, call, between, lost)
                if answer is None and retry is not None:
                    retry(k)
                    answer = ws.reply(k, ws.generation[k], call, between, lost)
                if answer is None:
                    answer = self.pool._restarts.owed_error(self.pool, k, op)
                elif type(answer) is P.CallFailed:
                    answer = ws.env_error(k, answer)
                else:
                    answer = answer.values
                answers.append(answer)
        except KeyboardInterrupt:
            self.pool._kill_workers_now()
            raise
        for a in answers:
            if isinstance(a, (EnvError, WorkerRestartedError)):
                raise a
        return answers


def pack_each(items: list, ids: list[int], describe: Callable[[int], str]) -> list[bytes]:
    """``items`` (one per env of ``ids``) packed for the side channel, an object shared by many
    envs once; ``TypeError`` naming the env (``describe(env_id)``) when one cannot be."""
    blobs: list[bytes] = []
    memo: dict[int, bytes] = {}   # id of an item -> its blob (items stay referenced meanwhile)
    for env_id, item in zip(ids, items):
        blob = memo.get(id(item))
        if blob is None:
            try:
                blob = P.pack(item)
            except Exception as exc:
                raise TypeError(f"{describe(env_id)} cannot be pickled: {exc}") from exc
            memo[id(item)] = blob
        blobs.append(blob)
    return blobs


def unreadable(env_id: int, op: str, what: str, exc: BaseException) -> P.Failure:
    """The failure of env ``env_id`` whose ``what`` (its infos, its answer) arrived but cannot be
    rebuilt in this process (a class it cannot import, a ``__reduce__`` that raises)."""
    line = f"{type(exc).__name__}: its {what} cannot be read in this process: {exc}"
    return P.Failure(env_id, op, type(exc).__name__, line)
