"""The worker processes of a pool: spawn, start-up handshake, side-channel messaging,
liveness and killing.

This room owns the processes and their pipes and nothing else: it never touches
the shared region except to post commands through the wire it is given, and it
decides nothing about restarts.  It offers process verbs (spawn, kill, reap, dead)
and reads that never wait longer than the caller asks (``poll``, ``receive``,
``answer``, ``queued``); the waiting is the caller's, in the parent's one loop
(``shmpool.waiting``), and a broken pipe is reported (``EOFError``/``OSError``),
never acted on here, so a worker is never replaced from inside this room.
"""
from __future__ import annotations

import collections
import multiprocessing.process as mp_process
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil

from . import protocol as P
from .constructors import ShardConstructors
from .errors import EnvError, PoolResourceError, WorkerDiedError
from .hosted_shard import HostedWorker
from .layout import same_space
from .pids import alive
from .thread_limits import found_for_fork
from .waiting import SLICE_NS, in_slices
from .workers import loop
from .workers.inherited import collection_paused

if TYPE_CHECKING:
    from threadpoolctl import ThreadpoolController

__all__ = ["SLICE_NS", "WorkerSet", "death", "kill_processes", "collection_paused"]   # SLICE_NS: pool, region
CLOSE_GRACE_S = 5.0          # how long close() lets envs close before killing workers


def death(code: int | None) -> str:
    """How a worker process ended, in words."""
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code is None:  # reaped by someone else (a SIGCHLD handler, os.wait()): status unknown
        return "is gone (reaped outside shmpool, exit status unknown)"
    return f"exited with code {code}"


def _closed(proc) -> bool:
    try:
        proc.exitcode  # noqa: B018 - raises once the Process object is closed
    except ValueError:
        return True
    return False


def kill_processes(procs: list, owner_pid: int) -> None:
    """Finalizer for a pool dropped without close(): no worker outlives it.  Only in the
    process that started them (a forked child's exit must not kill its parent's workers)."""
    if os.getpid() != owner_pid:
        return
    for proc in procs:
        try:
            if proc.exitcode is None:   # (ValueError once closed: nothing to do)
                proc.kill()
                proc.join(timeout=2.0)
        except Exception:
            pass


def refuse_in_daemonic_process() -> None:
    """A daemonic process (a ``multiprocessing.Pool`` worker) may not start children, and Python says only
    ``daemonic processes are not allowed to have children``: say what that means for a pool, and the ways out."""
    me = mp_process.current_process()
    if not me.daemon:
        return
    raise RuntimeError(
        f"this process is daemonic (a multiprocessing.Pool worker, say: {me.name}), and Python does not let a "
        "daemonic process start processes, so this pool cannot start its worker processes. Either step every "
        "env in this process with num_workers=1, parent_shard=True, or build the pool in a non-daemonic "
        "process: multiprocessing.Process(daemon=False), or a concurrent.futures.ProcessPoolExecutor worker")


class WorkerSet:
    """Worker ``k`` owns envs ``bounds[k]`` and runs pinned to ``cpus[k]`` (``pinned``), or
    wherever the scheduler puts it among the process's allowed cores (not ``pinned``).

    Worker ``hosted`` (if given) is no process: the pool's own process builds and steps
    that shard (``shmpool.hosted_shard``); its cpu is None and its pid the pool's."""

    def __init__(self, ctx, bounds: list[tuple[int, int]], cpus: list[int | None], pinned: bool = True,
                 hosted: int | None = None) -> None:
        self.ctx = ctx
        self.bounds = bounds
        self.cpus = cpus
        self.pinned = pinned
        self.hosted = hosted
        self.procs: list = []
        self.pids: list[int] = []
        self.conns: list = []
        self.side = [collections.deque() for _ in bounds]   # side messages read ahead of their turn
        self.generation = [0] * len(bounds)                  # bumped per replacement: answers owed die
        self.spaces_decoder = P.DecodedOnce()   # equal Spaces messages decode to one object
        self._args: list[tuple] = []
        self._finalizer: weakref.finalize | None = None
        self._guarded: weakref.ref = lambda: None   # the pool whose drop kills the workers
        self._owner_pid = os.getpid()

    def __len__(self) -> int:
        return len(self.bounds)

    # --- spawn and start-up ----------------------------------------------------------

    def spawn_all(self, fns, seeds: list, deadline: float | None = None) -> None:
        me = (os.getpid(), psutil.Process().create_time(), threading.current_thread() is threading.main_thread())
        blobs: dict = {}   # one blob per constructor for every shard (shmpool.constructors)
        inherit = self.ctx.get_start_method() == "fork"
        libraries = found_for_fork(self.ctx.get_start_method())   # looked up once for every worker forked here
        for k, (a, b) in enumerate(self.bounds):
            cpu = self.cpus[k] if self.pinned else None
            packed = ShardConstructors.pack(fns[a:b], inherit, blobs)
            if k == self.hosted:
                # Unpickled here too: the hosted envs get their own copies, not the trainer's objects.
                hosted_fns = packed.unpack()
            self._args.append((k, cpu, me, packed, a, seeds[a:b]))
            self.procs.append(None)
            self.conns.append(None)
            self.pids.append(0)
            if k != self.hosted:
                self.spawn(k, libraries)
        if self.hosted is not None:
            # Built after the processes are started, so their envs are built meanwhile.
            k = self.hosted
            a, b = self.bounds[k]
            worker = HostedWorker(k, hosted_fns, a, seeds[a:b], deadline)
            self.procs[k], self.conns[k], self.pids[k] = worker, worker.conn, worker.pid

    def spawn(self, k: int, libraries: ThreadpoolController | None = None) -> None:
        """Start worker ``k`` (again: a replacement gets the same envs, cpu and constructors).
        ``libraries``: this process's BLAS and OpenMP libraries as found for this fork (looked up here
        when not given: a replacement is forked from the trainer as it is now)."""
        refuse_in_daemonic_process()
        if libraries is None:
            libraries = found_for_fork(self.ctx.get_start_method())
        parent_end, child_end = self.ctx.Pipe(duplex=True)
        # The trainer's environment is never touched (another thread may start a process meanwhile): each worker
        # limits its own threads (shmpool.thread_limits).
        try:
            proc = self.ctx.Process(target=loop.main, args=(child_end, *self._args[k], libraries),
                                    name=f"shmpool-worker-{k}", daemon=True)
            try:
                with collection_paused():
                    proc.start()
            except BaseException:
                parent_end.close()
                raise
            self.procs[k], self.conns[k], self.pids[k] = proc, parent_end, proc.pid
        finally:
            child_end.close()

    def guard(self, pool: Any = None) -> None:
        """Kill the workers if ``pool`` is dropped without close(); without ``pool``, renew
        the guard of the pool given before (after a respawn: the new process list)."""
        if pool is not None:
            self._guarded = weakref.ref(pool)
        pool = self._guarded()
        if self._finalizer is not None:
            self._finalizer.detach()
        if pool is not None:
            self._finalizer = weakref.finalize(pool, kill_processes, self.processes(), self._owner_pid)

    def unguard(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()

    def disown(self) -> None:
        """In a forked child: these processes are the parent's.  Drop the finalizer, and
        take them out of multiprocessing's child registry, whose exit handler would
        otherwise SIGTERM every daemon process it lists (it cannot tell they are not ours)."""
        self.unguard()
        registry = getattr(mp_process, "_children", None)   # no public way to say "not my child"
        for proc in self.procs:
            if registry is not None:
                registry.discard(proc)

    def processes(self) -> list:
        """The worker processes (every worker but a hosted one)."""
        return [proc for k, proc in enumerate(self.procs) if k != self.hosted]

    def serve_hosted(self) -> None:
        """Serve the hosted shard's posted command, if any: called where the pool would
        otherwise wait for its workers."""
        if self.hosted is not None:
            self.procs[self.hosted].serve_posted()

    def serve_hosted_some(self, limit: int) -> int:
        """Step up to ``limit`` envs the hosted shard was sent; how many (0: none pending)."""
        return 0 if self.hosted is None else self.procs[self.hosted].serve_some(limit)

    def startup_message(self, k: int, expected: type, deadline: float | None):
        """Worker ``k``'s next start-up message, which must be of type ``expected`` (waited for in the
        parent's one loop, ``shmpool.waiting``; a worker that exits meanwhile is ``WorkerDiedError``)."""
        got = []

        def ready(slice_ns: int) -> bool:
            if not self.poll(k, slice_ns / 1e9):
                return False
            try:
                got.append(P.receive(self.conns[k], self.spaces_decoder))   # equal Spaces decode to one object
            except EOFError:
                raise self.died(k, "starting") from None
            return True

        def between() -> None:
            if self.procs[k].exitcode is not None:
                raise self.died(k, "starting")

        if not in_slices(ready, between, deadline):
            a, b = self.bounds[k]
            raise TimeoutError(
                f"worker {k} (envs {a}..{b - 1}) did not finish building its envs within startup_timeout")
        msg = got[0]
        if type(msg) is expected:
            return msg
        if isinstance(msg, P.Failure):
            raise self.startup_failure(k, msg)
        raise P.ProtocolError(f"worker {k} sent {type(msg).__name__} while starting, "
                              f"expected {expected.__name__}")

    def agreed_spaces(self, deadline: float | None,
                      judge_first: Callable[[P.Spaces], None] = lambda first: None) -> list[P.Spaces]:
        """Every worker's ``Spaces`` message (start-up step one), once all action spaces agree with
        worker 0's (observation spaces are judged by the pool, against its ``observation_mode``).
        ``judge_first(worker 0's message)`` runs before any other worker's is read: the pool checks
        there that its region fits, while the trainer holds one copy of the spaces."""
        first = self.startup_message(0, P.Spaces, deadline)
        judge_first(first)
        described = [first, *(self.startup_message(k, P.Spaces, deadline) for k in range(1, len(self.bounds)))]
        for k, d in enumerate(described[1:], 1):
            if not same_space(d.action_space, first.action_space):
                raise ValueError(
                    f"env {self.bounds[k][0]} (worker {k}) has spaces {d.observation_space}, {d.action_space}; env 0 "
                    f"has {first.observation_space}, {first.action_space}: all envs of a pool must share their spaces")
        return described

    def map_region(self, workers: list[int], msg: P.MapRegion, region: Any, deadline: float | None) -> None:
        """Start-up step two for ``workers``: the ``MapRegion`` message and the region's fd to
        each, then each one's ``Ready``."""
        for k in workers:
            if k == self.hosted:
                self.procs[k].bind(msg, region.map)   # the pool's own mapping
                continue
            P.send(self.conns[k], msg)
            region.hand_over(self.conns[k], self.procs[k].pid)
        for k in workers:
            self.startup_message(k, P.Ready, deadline)

    def abort_startup(self) -> None:
        """Tell workers still waiting for their start-up message to exit now (a forked
        worker holds a copy of our end of its pipe, so closing ours gives it no EOF)."""
        for conn in self.conns:
            try:
                if conn is not None:
                    P.send(conn, P.Abort())
            except OSError:
                pass

    # --- messaging -------------------------------------------------------------------

    def pump(self) -> None:
        """Move side messages already in the pipes into the queues, so no worker
        blocks on a full pipe while the parent waits for its results."""
        for conn, queue in zip(self.conns, self.side):
            try:
                while conn.poll(0):
                    queue.append(P.receive(conn))
            except (EOFError, OSError):
                pass  # a dead worker is reported by the liveness check

    def send(self, k: int, msg: P.ToWorker) -> None:
        """Send a message to worker ``k``.  ``OSError``: its pipe is broken (the worker is dead; the
        caller decides what that means)."""
        P.send(self.conns[k], msg)

    def poll(self, k: int, timeout: float = 0.0) -> bool:
        """Whether worker ``k``'s pipe has something to read (or has ended), waiting at most ``timeout``
        seconds (one slice of the caller's wait; a hosted shard's pipe never waits)."""
        return self.conns[k].poll(timeout)

    def receive(self, k: int):
        """Worker ``k``'s next message from its pipe (call after ``poll``).  ``EOFError``/``OSError``:
        the pipe ended or broke (the worker died, maybe with our unread message in its socket)."""
        return P.receive(self.conns[k])

    def queued(self, k: int):
        """Worker ``k``'s oldest side message read ahead of its turn, or None."""
        return self.side[k].popleft() if self.side[k] else None

    def answer(self, k: int, call: int):
        """What is already in worker ``k``'s pipe, read up to its answer to message command ``call``
        (a ``Reply`` or ``CallFailed``), which is returned; None if it has not come yet.  Side
        messages met on the way are queued, an answer to another (abandoned) call is dropped.
        ``EOFError``/``OSError``: the pipe ended or broke."""
        conn = self.conns[k]
        while conn.poll(0):
            msg = P.receive(conn)
            if type(msg) is P.Reply or type(msg) is P.CallFailed:
                if msg.call == call:
                    return msg
                continue
            self.side[k].append(msg)
        return None

    def salvage(self, k: int) -> list:
        """A dead worker's queued and still-piped side messages; its pipe is closed."""
        conn = self.conns[k]
        try:
            while conn.poll(0):
                self.side[k].append(P.receive(conn))
        except (EOFError, OSError):
            pass  # EOF, or a message cut short by the death
        conn.close()
        messages = list(self.side[k])
        self.side[k].clear()
        return messages

    # --- liveness ----------------------------------------------------------------------

    def dead(self) -> list[int]:
        # A hosted shard has this process's pid: it is dead only when it says so (exitcode).
        return [k for k, proc in enumerate(self.procs)
                if proc is not None and (proc.exitcode is not None or (k != self.hosted and not alive(proc.pid)))]

    def died(self, k: int, op: str) -> WorkerDiedError:
        """The error for worker ``k`` found dead during ``op`` (its last words when it left any)."""
        proc = self.procs[k]
        proc.join(timeout=0.5)
        code = proc.exitcode
        last = ""
        self.pump()
        for msg in self.side[k]:
            if isinstance(msg, P.Failure) and msg.env_id is None:  # not an env's error: the worker's own
                last = f"; its last words:\n{msg.traceback}"
        a, b = self.bounds[k]
        return WorkerDiedError(
            f"worker {k} (pid {proc.pid}, cpu {self.cpus[k]}, envs {a}..{b - 1}) {death(code)} during {op}; "
            f"the pool is closed{last}", worker=k, pid=proc.pid, exitcode=code)

    def startup_failure(self, k: int, failure: P.Failure) -> Exception:
        """The error for worker ``k``'s failure while starting: the worker's own resource limit
        (``PoolResourceError``, naming it) or an env's error."""
        limit = failure.original()
        if isinstance(limit, PoolResourceError):
            a, b = self.bounds[k]
            return PoolResourceError(
                f"worker {k} (pid {self.pids[k]}, envs {a}..{b - 1}): {limit}; the pool was not created",
                errno_=limit.errno, resource=limit.resource, size=limit.size, limit=limit.limit)
        return self.env_error(k, failure, then="the pool was not created")

    def env_error(self, k: int, failure: P.Failure, then: str | None = None) -> EnvError:
        env_id = failure.env_id
        who = f"env {env_id} (worker {k}, pid {self.pids[k]})" if env_id is not None else f"worker {k}"
        return EnvError.from_failure(failure, worker=k, who=who, then=then)

    # --- stopping ----------------------------------------------------------------------

    def stop(self, wire) -> list[tuple[int, P.Failure]]:
        """Ask every live worker to close its envs and exit; returns their close failures."""
        failures: list[tuple[int, P.Failure]] = []
        if wire is not None:
            for k, proc in enumerate(self.procs):
                if proc.exitcode is None:
                    wire.post(k, P.CMD_EXIT)
            if self.hosted is not None:
                self.procs[self.hosted].exit(CLOSE_GRACE_S)
            deadline = time.monotonic() + CLOSE_GRACE_S
            for k in range(len(self.conns)):
                failures += [(k, f) for f in self.closing_words(k, deadline)]
        self.reap()
        return failures

    def closing_words(self, k: int, deadline: float) -> list[P.Failure]:
        """Worker ``k``'s close failures from its ``Closed``, read until ``deadline`` (in the parent's one
        loop).  A worker that has already exited may have left its ``Closed`` in the pipe, so exiting is no
        reason to stop reading, only an empty pipe after the exit is."""
        conn, proc, words = self.conns[k], self.procs[k], []

        def ready(slice_ns: int) -> bool:
            try:
                if conn.poll(slice_ns / 1e9):
                    msg = P.receive(conn)
                    if type(msg) is P.Closed:
                        words.extend(msg.failures)
                        return True
                    return False
            except (EOFError, OSError):
                return True
            return proc.exitcode is not None and not conn.poll(0)

        in_slices(ready, lambda: None, deadline)
        return words

    def kill_now(self) -> None:
        """Fatal path: the workers' state is unknown, so stop them without asking."""
        for proc in self.procs:
            if proc is not None and proc.exitcode is None:
                proc.kill()
        self.reap()

    def reap(self) -> None:
        procs = [p for p in self.procs if p is not None and not _closed(p)]
        deadline = time.monotonic() + 2.0
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.exitcode is None:
                proc.kill()
        for proc in procs:
            proc.join(timeout=5.0)
            if proc.exitcode is not None:
                proc.close()   # its sentinel fd: a closed pool holds no file descriptors
        for conn in self.conns:
            if conn is not None:
                conn.close()
        self.unguard()

    def kill(self, k: int) -> None:
        """Kill worker ``k`` (hung past step_timeout) and wait for it."""
        self.procs[k].kill()
        self.procs[k].join(timeout=5.0)

