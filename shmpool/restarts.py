"""``on_worker_error="restart"``: replace a dead (or hung) worker while the rest of the
pool never notices.

Only a pool built with ``on_worker_error="restart"`` ever calls into this room; in
"raise" mode a dead worker closes the pool, and the hot path (``step_wait``,
``recv``) has no restart branch.  It is built with the parts it uses: the worker set,
the region, the dispatch room (in-flight marks, the pending step's target), the status
bytes and the side messages held for later (``early``), and the ``fatal`` callback; it
holds no reference to the pool nor to the supervisor, which calls it and acts on what
``replace`` returns (``AfterRestart``): the supervisor's one wait re-steps a sync step's
replaced shards, so no wait is ever entered from inside another.  ``replace`` is called between
two slices of that wait; the replacement's start-up handshake is waited for in the parent's one
loop (``shmpool.waiting``), this room holding none of its own.  Each restart goes into
the pool's ``RestartRecord`` (counts and a bounded log), which outlives the room.
"""
from __future__ import annotations

import collections
import enum
import time
from collections.abc import Callable

import numpy as np

from . import protocol as P
from .dispatch import Dispatch
from .errors import EnvError, PoolClosedError, WorkerDiedError, WorkerRestartedError, with_traceback
from .layout import same_space
from .region import Region
from .waiting import in_slices
from .workerset import WorkerSet, death

LOG_LIMIT = 1000      # restart_log keeps the latest entries; ``restarts`` counts them all


class AfterRestart(enum.Enum):
    """What the supervisor's wait must do once a worker was replaced."""

    NOTHING = "nothing"        # no sync step pending: owed async envs were requested again
    STEP_AGAIN = "step again"  # a sync step is pending: post the replacement a step, wait until every
                               # worker is idle, then re-target the step at the counter (Dispatch.retarget)


class RestartRecord:
    """How many workers were replaced, per worker, and the latest ``LOG_LIMIT`` events
    (the pool's ``restarts``, ``worker_restarts``, ``restart_log``; kept after close)."""

    def __init__(self, num_workers: int) -> None:
        self.count = 0
        self.per_worker = [0] * num_workers
        self.log: collections.deque[dict] = collections.deque(maxlen=LOG_LIMIT)

    def add(self, event: dict) -> None:
        self.count += 1
        self.per_worker[event["worker"]] += 1
        self.log.append(event)


class Restarts:
    """Replacing workers of one pool, and the results taken over from dead ones."""

    def __init__(self, record: RestartRecord, workers: WorkerSet, region: Region, dispatch: Dispatch,
                 status: np.ndarray, early: dict, map_msg: P.MapRegion, spaces: tuple,
                 startup_timeout: float | None, fatal: Callable[[], None]) -> None:
        self.record = record
        self.workers = workers
        self.region = region
        self.dispatch = dispatch
        self.status = status        # the envs' status bytes
        self.early = early          # side messages of envs already taken (the supervisor reads them there)
        self.map_msg = map_msg
        self.spaces = spaces        # (observation, action): a replacement's envs must have them
        self.fatal = fatal
        self.ready: collections.deque[int] = collections.deque()  # taken-over results, before the wire's
        self.startup_timeout = startup_timeout

    # --- the async path: results published by a dead worker -----------------------------

    def take_ready(self, out: np.ndarray, start: int, n: int) -> int:
        got = 0
        while self.ready and got < n:
            out[start + got] = self.ready.popleft()
            got += 1
        return got

    # --- replacing a worker ----------------------------------------------------------------

    def replace(self, k: int, op: str, cause: str | None = None) -> AfterRestart:
        """Replace dead (or killed) worker ``k``; returns what the waiting call must do next.

        Results it published and the parent had not taken stay valid (those whose side
        message was lost are recomputed); envs it still owed are requested again from
        the replacement, whose envs are freshly reset (unseeded) and answer their first
        step with the reset observation, reward 0, truncated True and info
        ``worker_restarted`` (see ``workers.loop.restarted``)."""
        t0 = time.monotonic()
        workers, wire, dispatch = self.workers, self.region.wire, self.dispatch
        proc = workers.procs[k]
        if proc.exitcode is None:
            proc.kill()
        proc.join(timeout=5.0)
        pid, code = proc.pid, proc.exitcode
        if cause is None:
            cause = death(code)
        # What it sent before dying: side messages of results it published (it sends one only
        # after publishing its result).
        messages = [m for m in workers.salvage(k) if isinstance(m, (P.Failure, P.Extra)) and m.env_id is not None]
        published = wire.reset_worker(k)
        status = self.status
        keep, lost = [], []
        taken_over = set(published)   # the parent had not taken these yet
        if dispatch.step_target is None:
            by_env = {}
            for m in messages:
                if m.env_id in taken_over:
                    by_env[m.env_id] = m
                else:   # its result was taken already (held back, or later in this batch)
                    self.early[m.env_id] = m
            for e in published:
                if status[e] == P.STATUS_OK:
                    keep.append(e)
                elif e in by_env:
                    keep.append(e)
                    workers.side[k].append(by_env[e])
                else:
                    lost.append(e)
        a, b = workers.bounds[k]
        lead = dispatch.lead   # envs it holds back are finished and taken: not owed
        owed = [e for e in range(a, b) if dispatch.in_flight[e] and e not in taken_over and not lead.is_held(e)]
        self._spawn_replacement(k, op, cause)
        redo = owed + lost
        if redo:  # step requests: a restarted env answers one with its restart result
            wire.dispatch(np.asarray(redo, dtype=np.int64), dispatch.owner, False)
        self.ready.extend(keep)
        workers.generation[k] += 1
        self.record.add({"worker": k, "pid": pid, "exitcode": code, "cause": cause, "op": op,
                         "new_pid": workers.procs[k].pid, "in_flight": len(redo),
                         "seconds": time.monotonic() - t0, "time": time.time()})
        return AfterRestart.NOTHING if dispatch.step_target is None else AfterRestart.STEP_AGAIN

    def _spawn_replacement(self, k: int, op: str, cause: str) -> None:
        """Start worker ``k`` again, map the region, reset its envs.  If that fails, the pool is closed."""
        workers, region = self.workers, self.region
        workers.spawn(k)
        workers.guard()
        proc = workers.procs[k]
        a, b = workers.bounds[k]
        what = f"worker {k} (envs {a}..{b - 1}) {cause} during {op}; its replacement failed"
        deadline = None if self.startup_timeout is None else time.monotonic() + self.startup_timeout

        def reset_done(slice_ns: int) -> bool:
            """The replacement's answer to its ``Restart`` (its envs reset) has come."""
            if not workers.poll(k, slice_ns / 1e9):
                return False
            msg = workers.receive(k)
            if type(msg) is P.CallFailed:
                raise workers.env_error(k, msg, then="the replacement could not reset its envs")
            return type(msg) is P.Reply

        def still_running() -> None:
            if proc.exitcode is not None:
                raise RuntimeError(f"the replacement {death(proc.exitcode)} while resetting its envs")

        try:
            d = workers.startup_message(k, P.Spaces, deadline)
            if not (same_space(d.observation_space, self.spaces[0]) and same_space(d.action_space, self.spaces[1])):
                raise ValueError(f"the replacement's envs have spaces {d.observation_space}, {d.action_space}; "
                                 f"the pool has {self.spaces[0]}, {self.spaces[1]}")
            workers.map_region([k], self.map_msg, region, deadline)
            workers.send(k, P.Restart(0))   # a new pipe: no earlier call's answer can be in it
            region.wire.post(k, P.CMD_MESSAGE)
            if not in_slices(reset_done, still_running, deadline):
                raise TimeoutError("the replacement did not reset its envs within startup_timeout")
        except (WorkerDiedError, PoolClosedError) as exc:
            raise WorkerDiedError(f"{what}: {exc}", worker=k, pid=proc.pid, exitcode=proc.exitcode) from exc
        except BaseException as exc:
            code = proc.exitcode       # read before the kill closes the process object
            self.fatal()
            if isinstance(exc, EnvError):
                first = exc.head.removesuffix("; the pool was not created")
                raise exc.copy_as(message=with_traceback(f"{what}: {first}; the pool is closed",
                                                         exc.remote_traceback)) from exc
            raise WorkerDiedError(f"{what}: {exc}; the pool is closed", worker=k, pid=proc.pid,
                                  exitcode=code) from exc

    def owed_error(self, k: int, op: str) -> WorkerRestartedError:
        """A worker replaced while it owed the answer to ``op``."""
        a, b = self.workers.bounds[k]
        last = next(e for e in reversed(self.record.log) if e["worker"] == k)
        return WorkerRestartedError(
            f"worker {k} (envs {a}..{b - 1}) {last['cause']} during {op} and was replaced "
            f"(on_worker_error='restart'); the call was not retried, the pool is still open",
            worker=k, pid=last["pid"], exitcode=last["exitcode"])
