"""Waiting on the workers, and what is read between and after the waits.

Every wait of a pool on its workers runs in the parent's one loop (``shmpool.waiting``,
sliced by ``SLICE_NS``): a step, a take, a side message, an answer.  Between two slices the
supervisor checks, in this order: a ``close()`` requested meanwhile (the call ends with
``PoolClosedError``), dead workers (raise and close, or replace them through the
restart room), and the step timeout.  It also reads what a finished batch
announces on the side channels (``collect``) and the answers to side messages
(``replies``), and takes finished envs from the wire (``take``).  It is built with the
parts it uses (as ``distributed.recovery`` is) and holds no reference to the pool: its
fatal path is the ``fatal`` callback, its restart path the ``restarts`` room when the
pool has one: the supervisor calls it, never the other way round, and acts on what a
replacement needs next in its one wait (``AfterRestart``).  Replacements happen only between
two slices (or when a send finds a pipe broken), never from inside the worker set, which only
polls and reads: a pipe found broken mid-read is noted (``broken``) and the worker is lost at
the next look between slices.  It never frees anything itself.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _core
from . import protocol as P
from .dispatch import Dispatch
from .errors import EnvError, PoolClosedError, WorkerDiedError, WorkerRestartedError
from .infos import InfoReader, add_info, collides, merge_in_env_order
from .reset_args import ResetRequest
from .restarts import AfterRestart, Restarts
from .state import CLOSED_DURING_CALL, Lifecycle
from .waiting import SLICE_NS, in_slices
from .workerset import WorkerSet

WATCH_S = 0.1         # restart mode: recv() looks at the processes at least this often

class Supervisor:
    """The waits, liveness checks and side-channel reads of one pool.

    Parts: the worker set, the dispatch room (wire, owners, in-flight marks), the region's
    status bytes, the info reader, the lifecycle, the pool's wait policy and step timeout;
    ``fatal()`` kills the workers and frees the region (the call then raises);
    ``store_pickled_obs(env_id, values)`` keeps observation leaves that travel pickled."""

    def __init__(self, workers: WorkerSet, dispatch: Dispatch, status: np.ndarray, infos: InfoReader,
                 life: Lifecycle, wait_policy: _core.WaitPolicy, step_timeout: float | None, fatal: Callable[[], None],
                 store_pickled_obs: Callable[[int, object], None] | None = None) -> None:
        self.workers = workers
        self.dispatch = dispatch
        self.wire = dispatch.wire
        self.status = status
        self.infos = infos
        self.life = life
        self.wait_policy = wait_policy
        self.step_timeout = step_timeout
        self.fatal = fatal
        self.store_pickled_obs = store_pickled_obs
        self.restarts: Restarts | None = None   # the restart room (use_restarts), in restart mode only
        self.next_watch = 0.0   # restart mode: when recv next looks at the processes
        # Side messages read before their env's turn: a worker sends them in its completion
        # order, and recv hands out an env it held back (max_lead) after envs that finished later.
        self.early: dict[int, P.Extra | P.Failure] = {}
        self.calls = itertools.count(1)   # message commands' numbers: an answer names the call it answers
        self.broken: set[int] = set()     # workers whose pipe ended mid-read: lost at the next look between slices

    def collect(self, ids: np.ndarray | None, op: str) -> dict:
        """Infos of a finished batch, plus the side messages its status bytes announce."""
        flags = self.wire.scan(ids)
        if not flags:
            return {}
        if not flags & P.SCAN_SIDE_MESSAGE:
            return self.infos.read(ids) if flags & P.SCAN_NUMERIC_INFO else {}
        # The side messages are read even if batching the columns fails: one left in a pipe would
        # be paired with the next step's results from then on.
        infos: dict = {}
        unbatchable: Exception | None = None
        if flags & P.SCAN_NUMERIC_INFO:
            try:
                infos = self.infos.read(ids)
            except Exception as exc:
                unbatchable = exc
        status = self.status if ids is None else self.status[ids]
        errors = []
        extras = []
        size = len(status)
        # Every announced message is read before anything can raise: one left in a
        # pipe would be paired with the next step's results from then on.
        announced = np.flatnonzero(status)
        later = set() if ids is None else {int(e) for e in ids[announced]}
        for pos in announced:
            env_id = int(pos if ids is None else ids[pos])
            k = int(self.dispatch.owner[env_id])
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
                    pickled = None if msg.pickled_obs is None else P.unpack(msg.pickled_obs)
                except Exception as exc:
                    errors.append((k, unreadable(env_id, op, "infos", exc)))
                    continue
                extras.append((int(pos), extra))
                if pickled is not None:  # observation leaves that travel pickled (shmpool.pickled)
                    self.store_pickled_obs(env_id, pickled)
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
            self.life.needs_reset(f"env {msg.env_id} raised {msg.remote_type} in {msg.phase}; "
                                        "call reset() before stepping again")
            raise self.workers.env_error(k, msg, then=f"call reset() before stepping again{others}")
        if any(collides(infos, extra) for _, extra in extras):
            # A key some envs put in its column and others aside (its value changed type):
            # gymnasium's batching depends on the env order, so it is replayed in that order.
            own = self.infos.read_each(ids) if flags & P.SCAN_NUMERIC_INFO else [{} for _ in range(size)]
            return merge_in_env_order(own, extras)
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
            msg = self.next_side_message(k, op)
            if msg is None:   # its worker died and was replaced: the restart room salvaged what it sent
                return self.early.pop(env_id, None)
            if msg.env_id == env_id:
                return msg
            if msg.env_id in later or self.dispatch.lead.is_held(msg.env_id):
                self.early[msg.env_id] = msg
                msg = None
                continue
            raise P.ProtocolError(f"side channel out of order: expected env {env_id}, got "
                                  f"{type(msg).__name__} of env {msg.env_id}")
        return msg

    def next_side_message(self, k: int, op: str):
        """Worker ``k``'s next side message, waited for in slices (liveness between them, no step
        timeout); None if it died before sending it and was replaced."""
        ws = self.workers
        msg = ws.queued(k)
        if msg is not None:
            return msg
        return self._read_in_slices(k, ws.generation[k], lambda: ws.receive(k), op, timed=False)

    def answer(self, k: int, generation: int, call: int, op: str):
        """Worker ``k``'s answer to message command ``call``: a ``Reply``, a ``CallFailed``, or None if
        it was replaced since ``generation``.  Waited for in slices (liveness and step timeout between
        them; no pump, which would move the awaited answer out of the pipe)."""
        ws = self.workers
        return self._read_in_slices(k, generation, lambda: ws.answer(k, call), op, timed=True)

    def _read_in_slices(self, k: int, generation: int, read: Callable[[], Any], op: str, *, timed: bool):
        """What ``read()`` takes from worker ``k``'s pipe once it polls readable (None from ``read``: not
        yet), waited for in slices without pumping; None if the worker was replaced since ``generation``.
        A pipe that breaks mid-read is noted (``broken``): the look between slices acts on it."""
        ws = self.workers
        got = []

        def ready(slice_ns: int) -> bool:
            if ws.generation[k] != generation:   # replaced between two slices
                return True
            if not ws.poll(k, slice_ns / 1e9):
                return False
            try:
                found = read()
            except (EOFError, OSError):
                self.broken.add(k)
                return False
            if found is None:
                return False
            got.append(found)
            return True

        self.wait(op, ready, timed=timed, pump=False)
        return got[0] if got else None

    def use_restarts(self, restarts: Restarts) -> None:
        """``on_worker_error="restart"``: dead workers are replaced, and recv and drain take through
        the restart room (it watches the workers and hands out taken-over results first)."""
        self.restarts = restarts

    @property
    def recv_take(self) -> Callable[[np.ndarray, int, str], int]:
        """The take of ``recv`` and ``drain``: the restart room's in restart mode, else ``take``."""
        return self.take if self.restarts is None else self.take_watching

    def take_watching(self, out: np.ndarray, n: int, op: str) -> int:
        """``recv``'s take in restart mode: watch the workers now and then (the others can
        fill every batch while a dead one's envs starve unseen), hand out taken-over
        results first, then the wire's."""
        if time.monotonic() >= self.next_watch:
            self.next_watch = time.monotonic() + WATCH_S
            self.check_alive(op)
        got = self.restarts.take_ready(out, 0, n)
        return self.take(out, n, op, got) if got < n else got

    def take(self, out: np.ndarray, n: int, op: str, start: int = 0) -> int:
        """Fill ``out[start:n]`` with env ids the workers published, in completion order.
        The one place that takes from the wire."""
        wire, workers, in_flight = self.wire, self.workers, self.dispatch.in_flight
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
            in_flight[out[:got]] = 0

            def more(slice_ns):
                nonlocal got
                if self.restarts is not None:
                    got += self.restarts.take_ready(out, got, n - got)
                new = wire.take(out, got, n - got, self.wait_policy, slice_ns)
                in_flight[out[got:got + new]] = 0
                got += new
                return got == n
            self.wait(op, more)
        return got

    def wait(self, op: str, ready: Callable[[int], bool], timeout: float | None = None, *,
             timed: bool = True, pump: bool = True) -> None:
        """Repeat ``ready(slice_ns)`` waits in the parent's one loop (``shmpool.waiting``), checking
        close requests, the workers and (``timed``) the step timeout between slices, after moving
        piped side messages to their queues (``pump``).  ``timeout`` raises TimeoutError and leaves
        the operation pending.  With ``on_worker_error="restart"``, a worker replaced while a sync
        step is pending steps its shard again (``AfterRestart.STEP_AGAIN``): this wait then
        waits until every worker is idle, re-targets the step at the counter (the dead
        worker's count may or may not be in it) and goes on with ``ready``."""
        since = time.monotonic()
        deadline = None if timeout is None else since + timeout
        settling = False   # replacements are stepping again: wait for all idle, then re-target

        def each_slice(slice_ns: int) -> bool:
            nonlocal settling
            if settling and self.all_done(slice_ns):
                settling = False
                self.dispatch.retarget()
            return not settling and ready(slice_ns)

        def between() -> None:
            nonlocal since, settling
            if pump:
                self.workers.pump()
            step_again = self.between_slices(op, since if timed else None)
            if step_again:
                since = time.monotonic()  # the replacements get a full step_timeout
                for k in step_again:
                    self.wire.post(k, P.CMD_STEP)
                settling = True

        try:
            if not in_slices(each_slice, between, deadline):
                raise TimeoutError(f"{op} did not finish within {timeout} s; it is still pending")
        except KeyboardInterrupt:
            self.fatal()
            raise

    def between_slices(self, op: str, since: float | None = None) -> list[int]:
        """Between two slices of a wait: a close() requested meanwhile ends the call; dead
        workers raise (or are replaced); ``since`` given, the step timeout is checked.
        Returns the workers replaced that must step again (a sync step is pending)."""
        if self.life.close_requested:
            raise PoolClosedError(CLOSED_DURING_CALL)
        restarted = self.check_alive(op)
        limit = self.step_timeout
        if since is not None and limit is not None and time.monotonic() - since > limit:
            restarted += self.fail_timeout(op)
        return restarted

    def check_alive(self, op: str) -> list[int]:
        """Raise for a dead worker (or one whose pipe broke), or (``on_worker_error="restart"``)
        replace it; returns the workers replaced that must step again."""
        lost = sorted(set(self.workers.dead()) | self.broken)
        self.broken.clear()
        return [k for k in lost if self.worker_lost(k, op) is AfterRestart.STEP_AGAIN]

    def worker_lost(self, k: int, op: str, cause: str | None = None) -> AfterRestart:
        """Worker ``k`` died (or was killed): replace it (and say what the wait must do next), or
        close the pool and raise."""
        if self.restarts is not None:
            return self.restarts.replace(k, op, cause)
        err = self.workers.died(k, op)
        self.fatal()
        raise err

    def fail_timeout(self, op: str) -> list[int]:
        late = [k for k in range(len(self.workers)) if self.wire.done_seq(k) != self.wire.cmd_seq(k)]
        if late and self.restarts is not None:
            step_again = []
            for k in late:  # hung: kill and replace
                self.workers.kill(k)
                after = self.worker_lost(k, op, f"did not finish {op} within step_timeout={self.step_timeout} s "
                                                "and was killed")
                if after is AfterRestart.STEP_AGAIN:
                    step_again.append(k)
            return step_again
        envs = [f"{a}..{b - 1}" for k, (a, b) in enumerate(self.workers.bounds) if k in late]
        self.fatal()
        raise TimeoutError(
            f"{op} did not finish within step_timeout={self.step_timeout} s: workers {late} "
            f"(envs {', '.join(envs)}) are still busy; the pool is closed")

    def all_done(self, slice_ns: int) -> bool:
        """Every worker has handled its last command (one slice per worker at most)."""
        wire = self.wire
        self.workers.serve_hosted()
        for k in range(len(self.workers)):
            if not wire.wait_done(k, wire.cmd_seq(k), self.wait_policy, slice_ns):
                return False
        return True

    def message(self, k: int, msg: P.ToWorker, op: str) -> None:
        """Send a side message to worker ``k`` and post the command that makes it read it."""
        try:
            self.workers.send(k, msg)
        except OSError:   # found dead: raise, or replace it and send to the replacement
            self.worker_lost(k, op)
            self.workers.send(k, msg)
        self.wire.post(k, P.CMD_MESSAGE)

    def drain(self) -> None:
        """Receive and drop everything in flight (reset and messages need idle workers)."""
        ids = self.dispatch.drain(self.recv_take)
        if not len(ids):
            return
        try:
            self.collect(ids, "drain")
        except (WorkerDiedError, PoolClosedError):
            raise   # the pool's own fate, not the dropped results'
        except Exception:
            # Dropped results: their env errors and infos gymnasium could not batch go with them
            # (the reset that follows makes a failed env usable again).
            pass

    def reset(self, request: ResetRequest) -> None:
        """Reset every env as ``request`` says; returns once every worker has answered (a worker
        replaced meanwhile is asked again: a reset is safe to repeat)."""
        call = next(self.calls)

        def send_reset(k: int) -> None:
            self.message(k, P.Reset(call, *request.for_shard(*self.workers.bounds[k])), "reset")

        for k in range(len(self.workers)):
            send_reset(k)
        self.replies("reset", call, retry=send_reset)

    def ask_envs(self, op: str, name: str, ids: list[int], items: list) -> tuple:
        """``EnvCall(op, name)`` for env ``ids[i]`` with ``items[i]``; only the workers that own
        them are asked.  Their answers, in the order of ``ids``.  Envs in flight from send()
        stay in flight: the workers serve them before the message, and recv() still returns them.

        Every payload is pickled before anything is sent: one that cannot be is a ``TypeError``
        naming the env, and no env was asked."""
        what = f"{op} {name!r}"
        part = "value" if op == P.SET_ATTR else "arguments"
        blobs = P.pack_each(items, ids, lambda env_id: f"{what}: the {part} for env {env_id}")
        by_worker: dict[int, list[int]] = {}
        for pos, env_id in enumerate(ids):
            by_worker.setdefault(int(self.dispatch.owner[env_id]), []).append(pos)
        call = next(self.calls)
        for k, positions in by_worker.items():
            start = self.workers.bounds[k][0]
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
            raise self.workers.env_error(k, failure)
        return tuple(out)

    def replies(self, op: str, call: int, workers: list[int] | None = None,
                retry: Callable[[int], None] | None = None) -> list:
        """The answers of ``workers`` (all by default) to message command ``call``, in that
        order: each a ``Reply``'s packed values (None when it has none).

        All answers are read before a failure is raised, so none is left in a pipe (and an
        answer to an earlier call that was left is dropped: it names its call).  A worker
        replaced while it owed an answer is asked again through ``retry(k)`` once when given
        (the message is safe to repeat), else the call raises WorkerRestartedError."""
        workers = list(range(len(self.workers))) if workers is None else workers
        ws = self.workers
        ws.serve_hosted()
        generations = [ws.generation[k] for k in workers]
        answers = []
        try:
            for k, gen in zip(workers, generations):
                answer = self.answer(k, gen, call, op)
                if answer is None and retry is not None:
                    retry(k)
                    answer = self.answer(k, ws.generation[k], call, op)
                if answer is None:   # replaced while it owed the answer (restart mode only)
                    assert self.restarts is not None
                    answer = self.restarts.owed_error(k, op)
                elif type(answer) is P.CallFailed:
                    answer = ws.env_error(k, answer)
                else:
                    answer = answer.values
                answers.append(answer)
        except KeyboardInterrupt:
            self.fatal()
            raise
        for a in answers:
            if isinstance(a, (EnvError, WorkerRestartedError)):
                raise a
        return answers


def unreadable(env_id: int, op: str, what: str, exc: BaseException) -> P.Failure:
    """The failure of env ``env_id`` whose ``what`` (its infos, its answer) arrived but cannot be
    rebuilt in this process (a class it cannot import, a ``__reduce__`` that raises)."""
    line = f"{type(exc).__name__}: its {what} cannot be read in this process: {exc}"
    return P.Failure(env_id, op, type(exc).__name__, line)
