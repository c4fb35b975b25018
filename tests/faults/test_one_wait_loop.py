"""The parent waits in one loop (``shmpool.waiting``): a dead worker is replaced between two of its slices,
never from inside the worker set, and every bound on a wait is a count of slices, not of seconds."""
import functools
import os
import signal
import threading
import time
import traceback

import numpy as np
import pytest
from envs import FaultyEnv

import shmpool
import shmpool.workerset
from shmpool import PoolClosedError, WorkerDiedError, WorkerRestartedError
from shmpool.restarts import Restarts
from shmpool.supervisor import Supervisor
from shmpool.waiting import SLICE_NS, in_slices

SLICE_S = SLICE_NS / 1e9
ZEROS = np.zeros(4, dtype=np.int64)
# three envs that never fail, the fourth hangs in its first step (in worker 1 of 2)
LAST_ENV_HANGS = [functools.partial(FaultyEnv, "never")] * 3 + [functools.partial(FaultyEnv, "step", 1, "hang")]
CLOSED_DURING_CALL = r"closed \(by a signal handler or another thread\) while this call was in progress"
# close() lets a hung worker's envs close for CLOSE_GRACE_S (5 s) before it kills the worker: the close tests
# below are about the call's wait ending at a look, not that grace, so they shorten it (the same code path).
SHORT_GRACE_S = 0.2


class Napper(FaultyEnv):
    """An env whose ``nap()`` sleeps ``seconds`` (a call that waits long enough to kill its worker in)."""

    def __init__(self, seconds: float = 0.0):
        super().__init__()
        self.seconds = seconds

    def nap(self):
        time.sleep(self.seconds)
        return "rested"


def counting_slices(monkeypatch, then=None) -> list[int]:
    """Count the supervisor's looks between two slices (``then(count)`` runs before each look)."""
    count = [0]
    real = Supervisor.between_slices

    def counted(self, *args, **kwargs):
        count[0] += 1
        if then is not None:
            then(count[0])
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Supervisor, "between_slices", counted)
    return count


def test_a_worker_killed_during_call_is_replaced_between_slices_not_inside_the_worker_set(monkeypatch, no_leaks):
    """Issue 70: the replacement was made from inside ``WorkerSet.reply`` (its pipe's EOF called back into the
    supervisor: ``WorkerSet → Supervisor → Restarts → WorkerSet`` on one stack)."""
    stacks = []
    real = Restarts.replace

    def recorded(self, *args, **kwargs):
        stacks.append(traceback.extract_stack())
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Restarts, "replace", recorded)
    fns = [functools.partial(Napper, 30.0)] * 2 + [functools.partial(Napper, 0.0)] * 2
    with shmpool.Pool(fns, num_workers=2, parent_shard=False, on_worker_error="restart") as pool:
        pool.reset(seed=0)
        killer = threading.Timer(0.3, os.kill, (pool.worker_pids[0], signal.SIGKILL))
        killer.start()
        try:
            with pytest.raises(WorkerRestartedError, match=r"worker 0 \(envs 0..1\) was killed by SIGKILL during "
                                                           r"call 'nap' and was replaced.*still open"):
                pool.call("nap")
        finally:
            killer.join()
        assert pool.restarts == 1 and len(stacks) == 1
        in_worker_set = [f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})" for f in stacks[0]
                         if f.filename.endswith(os.path.join("shmpool", "workerset.py"))]
        assert in_worker_set == [], in_worker_set
        names = [f.name for f in stacks[0]]
        assert names[-2] == "worker_lost" and {"in_slices", "between_slices", "check_alive"} <= set(names), names
        _, rew, _, trunc, _ = pool.step(ZEROS)
        assert trunc.tolist() == [True, True, False, False]   # the replaced shard's restart result


def test_step_timeout_is_met_within_its_slices(monkeypatch, no_leaks):
    count = counting_slices(monkeypatch)
    limit = 0.3
    with shmpool.Pool(LAST_ENV_HANGS, num_workers=2, parent_shard=False, step_timeout=limit) as pool:
        pool.reset()
        with pytest.raises(TimeoutError, match=r"step did not finish within step_timeout=0.3 s: workers \[1\] "
                                               r"\(envs 2..3\) are still busy; the pool is closed"):
            pool.step(ZEROS)
        assert pool.closed
    # Each slice lasts its full 50 ms while the worker hangs: the limit is passed at the look after its
    # sixth slice (one more: the step's own first slice comes before the supervisor's loop).
    assert 1 <= count[0] <= round(limit / SLICE_S) + 1, count[0]


def test_a_dead_worker_is_found_at_the_first_look_after_its_death(monkeypatch, no_leaks):
    count = counting_slices(monkeypatch)
    with shmpool.Pool([functools.partial(FaultyEnv, "never")] * 4, num_workers=2, parent_shard=False) as pool:
        pool.reset()
        pid = pool.worker_pids[1]
        os.kill(pid, signal.SIGKILL)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)   # dead (not reaped) before the step starts
        with pytest.raises(WorkerDiedError, match=r"worker 1 .* was killed by SIGKILL during step; the pool is closed"):
            pool.step(ZEROS)
    assert count[0] == 1


def test_close_from_a_signal_handler_ends_the_wait_at_that_look(monkeypatch, no_leaks):
    monkeypatch.setattr(shmpool.workerset, "CLOSE_GRACE_S", SHORT_GRACE_S)
    pools = []

    def close_on_third_look(n):
        if n == 3:
            signal.raise_signal(signal.SIGUSR1)   # its handler runs here, in this thread, as a signal's would

    count = counting_slices(monkeypatch, close_on_third_look)
    previous = signal.signal(signal.SIGUSR1, lambda *_: pools[0].close())
    try:
        with shmpool.Pool(LAST_ENV_HANGS, num_workers=2, parent_shard=False) as pool:
            pools.append(pool)
            pool.reset()
            with pytest.raises(PoolClosedError, match=CLOSED_DURING_CALL):
                pool.step(ZEROS)
            assert pool.closed
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert count[0] == 3


def test_close_from_another_thread_ends_the_wait_within_two_looks(monkeypatch, no_leaks):
    monkeypatch.setattr(shmpool.workerset, "CLOSE_GRACE_S", SHORT_GRACE_S)
    pools, after = [], []

    def close_from_a_thread(n):
        if n == 2:
            closer = threading.Thread(target=pools[0].close, daemon=True)
            closer.start()
            after.append(n)

    count = counting_slices(monkeypatch, close_from_a_thread)
    with shmpool.Pool(LAST_ENV_HANGS, num_workers=2, parent_shard=False) as pool:
        pools.append(pool)
        pool.reset()
        with pytest.raises(PoolClosedError, match=CLOSED_DURING_CALL):
            pool.step(ZEROS)
        assert pool.closed
    assert after == [2] and count[0] <= 4, count[0]


def test_the_loop_asks_ready_first_and_stops_at_its_deadline_after_a_look():
    """``in_slices`` over a fake clock: no seconds pass, the slices shrink to the deadline."""
    now_ns = [0]
    asked, looks = [], []

    def ready(slice_ns):
        asked.append(slice_ns)
        now_ns[0] += slice_ns
        return False

    def clock():
        return now_ns[0] / 1e9

    assert not in_slices(ready, lambda: looks.append(now_ns[0]), deadline=0.12, clock=clock)
    assert asked == [SLICE_NS, SLICE_NS, 20_000_000] and looks == [50_000_000, 100_000_000, 120_000_000]
    now_ns[0], asked[:] = 5_000_000_000, []
    # Past its deadline already: what has come is still taken, and what has not ends the wait after one look.
    assert in_slices(lambda ns: asked.append(ns) or True, lambda: None, deadline=1.0, clock=clock)
    assert not in_slices(ready, lambda: None, deadline=1.0, clock=clock)
    assert asked == [0, 0]
