"""A shard the pool's own process steps (``Pool(parent_shard=...)``): it runs in the trainer, so it
lives in ``shmpool/`` beside the worker set that holds it, not among the worker process's modules.

When the workers and the trainer's threads outnumber the cores, one more process
hop costs more than it saves: the parent would post a step, sleep, and be woken
(tens of microseconds per idle vCPU on a VM) while the core it sleeps on could
have stepped envs.  A hosted shard runs the same ``Server`` a worker process runs,
over the same region, but its commands are served by the parent at the points
where it would otherwise wait (``HostedWorker.serve_posted``); its side messages
go through an in-process pipe (``local_pipe``) instead of a socket.  Everything
else (start-up handshake, infos, failures, ``call``, close) is the worker's code.

What it gives up: an env that crashes the interpreter takes the trainer with it,
and ``step_timeout`` cannot interrupt it; ``Pool`` hosts a shard when asked, or under
``"auto"`` when the layout is crowded and nothing asks for processes
(``shmpool.arguments.check_parent_shard``).
"""
from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import sys
import threading
import time

import numpy as np

from . import protocol as P
from .workers.loop import BuiltEnvs, Server, bind_server, build_envs, close_quietly


class LocalEnd:
    """One end of an in-process pipe, with the ``Connection`` calls the side channel uses.

    Nothing can arrive while its reader waits (the writer is the same thread), so
    ``poll`` never sleeps and reading an empty pipe is a protocol error, not a wait."""

    never_blocks = True   # a send appends to a deque: protocol.send needs no writer thread for it
    in_process = True     # the worker loop hands its side messages over unencoded (protocol.handed_over)

    def __init__(self, inbox: collections.deque, outbox: collections.deque) -> None:
        self._inbox = inbox
        self._outbox = outbox
        self.closed = False

    def send_bytes(self, data) -> None:
        self.send_message(bytes(data))

    def send_message(self, msg) -> None:
        """A side message as it is (``protocol.handed_over``), or encoded bytes; ``recv_bytes`` gives
        either back as it is."""
        if self.closed:
            raise OSError("the in-process pipe is closed")
        self._outbox.append(msg)

    def recv_bytes(self):
        if self._inbox:
            return self._inbox.popleft()
        if self.closed:
            raise EOFError("the in-process pipe is closed")
        raise P.ProtocolError("read from an empty in-process pipe: nothing was sent")

    def poll(self, timeout: float | None = 0.0) -> bool:
        return bool(self._inbox)

    def close(self) -> None:
        self.closed = True


def local_pipe() -> tuple[LocalEnd, LocalEnd]:
    """Two connected in-process ends: (the pool's, the hosted shard's)."""
    to_parent: collections.deque = collections.deque()
    to_shard: collections.deque = collections.deque()
    return LocalEnd(to_parent, to_shard), LocalEnd(to_shard, to_parent)


class _Expired(BaseException):
    """A hosted shard's constructor or close ran past its bound (a BaseException, so that the
    env code's own ``except Exception`` cannot swallow it)."""


@contextlib.contextmanager
def bounded(seconds: float | None):
    """Interrupt the code inside with ``_Expired`` after ``seconds``: a worker process that hangs
    is killed, and this is what the pool's own process can do instead (a ``SIGALRM`` timer, so only
    on the main thread, and only for Python code and interruptible system calls).  A timer someone
    else set (``signal.setitimer``, pytest-timeout) is put back as it would have run, and when it
    is due first it is left alone."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    outer, interval = signal.getitimer(signal.ITIMER_REAL)
    if outer and outer <= seconds:
        yield
        return

    def expire(signum, frame):
        raise _Expired()
    previous = signal.signal(signal.SIGALRM, expire)
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3), interval)


@contextlib.contextmanager
def trainer_rngs_kept():
    """The global RNGs of this process (numpy's legacy one, Python's ``random``, torch's CPU one if
    torch is imported) as they were before the block.  The hosted envs' constructors run here: one
    that draws from a global RNG must not move the trainer's next draw, as it would not from one of
    ``AsyncVectorEnv``'s workers (which starts from a copy of the same state).  Once built, hosted envs
    that draw from a global RNG in ``step`` share the trainer's stream, as under ``SyncVectorEnv``;
    ``parent_shard=False`` keeps every env in a process of its own."""
    numpy_state = np.random.get_state()
    python_state = random.getstate()
    torch = sys.modules.get("torch")
    try:
        torch_state = torch.get_rng_state() if torch is not None else None
    except Exception:   # a stub or half-imported torch
        torch_state = None
    try:
        yield
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
        if torch_state is not None:
            torch.set_rng_state(torch_state)


class HostedWorker:
    """Shard ``index`` (envs ``start..``) built and stepped in the pool's own process.

    It stands where a worker's ``Process`` stands in ``WorkerSet`` (``pid``,
    ``exitcode``, ``kill``, ``join``, ``close``) and never dies on its own: its
    failures are its envs' (``EnvError``) or the parent's own."""

    exitcode = None   # never exits on its own

    def __init__(self, index: int, fns, start: int, seeds: list, deadline: float | None = None) -> None:
        self.index = index
        self.pid = os.getpid()
        self.conn, self._end = local_pipe()
        self._seeds = list(seeds)
        self._server: Server | None = None
        # Start-up step one now: the Spaces (or a Failure) wait in the pipe for the pool.
        try:
            with trainer_rngs_kept(), bounded(None if deadline is None else deadline - time.monotonic()):
                self._built: BuiltEnvs | None = build_envs(self._end, fns, start)
        except _Expired:
            raise TimeoutError(f"worker {index} (envs {start}..{start + len(fns) - 1}, stepped in this process) did "
                               "not finish building its envs within startup_timeout") from None

    def bind(self, msg: P.MapRegion, region) -> None:
        """Start-up step two over the pool's own mapping of the region; ``Ready`` (or a
        ``Failure``) waits in the pipe."""
        self._server = bind_server(self._end, self.index, self._built, msg, region, self._seeds, None)
        self._built = None

    def serve_posted(self) -> None:
        """Serve the command posted to this shard since the last one, if any."""
        if self._server is not None:
            self._guarded(self._server.serve_posted)

    def serve_some(self, limit: int) -> int:
        """Serve up to ``limit`` of this shard's async requests (``Server.serve_some``)."""
        if self._server is None:
            return 0
        return self._guarded(self._server.serve_some, limit) or 0

    def _guarded(self, serve, *args):
        """``serve(*args)``; what escapes the worker's own handling ends this shard (``_die``),
        except Ctrl-C, which the pool's entry turns into closing everything."""
        try:
            return serve(*args)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            self._die(exc)
            return None

    def _die(self, exc: BaseException) -> None:
        """What escapes the worker's own error handling (``SystemExit`` or ``GeneratorExit`` from
        an env, a bug) ends a worker process; here it ends this shard the same way: its last
        words in the pipe, an exit code, and the pool's liveness check finds it dead (the pool
        raises ``WorkerDiedError`` and closes), so nothing is stepped twice or half-served."""
        try:
            P.report(self._end, P.Failure.of(None, "worker loop", exc))
        except Exception:
            pass
        code = getattr(exc, "code", None)
        self.exitcode = code if type(code) is int and code else 1
        self.kill()

    def kill(self) -> None:
        """The fatal path: close the envs without asking, and let go of the region."""
        server, built = self._server, self._built
        self._drop()
        if server is not None:
            for env in server.shard.envs:
                close_quietly(env)
        elif built is not None:
            built.close()

    def exit(self, grace: float | None = None) -> None:
        """Serve a posted ``CMD_EXIT`` (the envs close; ``Closed`` waits in the pipe).  Envs that
        have not closed within ``grace`` seconds are left (as a worker process is killed then),
        and the ``Closed`` names the one that hung."""
        server = self._server
        if server is not None:
            try:
                with bounded(grace):
                    server.serve_posted()
            except _Expired:
                hung = server.closing if server.closing is not None else server.shard.start
                try:
                    raise TimeoutError(f"close() did not return within {grace} s")
                except TimeoutError as exc:
                    P.report(self._end, P.Closed([P.Failure.of(hung, "close", exc)]))
        self._drop()

    def _drop(self) -> None:
        # Views of the region must go before the pool unmaps it.
        server, self._server, self._built = self._server, None, None
        if server is not None:
            server.wire.release()
        self._end.close()

    def join(self, timeout: float | None = None) -> None:
        pass

    def close(self) -> None:
        pass

