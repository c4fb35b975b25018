"""shmpool.state: the one state of a pool, its refusals and its entry lock (no workers needed)."""
import threading

import pytest

from shmpool.errors import PoolClosedError
from shmpool.state import (
    NO_PENDING_STEP,
    NOTHING_IN_FLIGHT,
    RESET_FIRST,
    STEP_PENDING_ASYNC,
    STEP_PENDING_OTHER,
    Lifecycle,
    PoolState,
)


def test_refusals_follow_the_state():
    life = Lifecycle()
    with pytest.raises(RuntimeError, match=RESET_FIRST.replace("(", r"\(").replace(")", r"\)")):
        life.check_step_async()
    with pytest.raises(RuntimeError, match="reset"):
        life.check_send()
    life.check_idle()
    life.ready()
    life.check_step_async()
    life.step_posted()
    assert life.state is PoolState.STEP_PENDING
    with pytest.raises(RuntimeError) as err:
        life.check_step_async()
    assert str(err.value) == STEP_PENDING_ASYNC
    with pytest.raises(RuntimeError) as err:
        life.check_send()
    assert str(err.value) == STEP_PENDING_OTHER
    with pytest.raises(RuntimeError) as err:
        life.check_idle()
    assert str(err.value) == STEP_PENDING_OTHER
    life.check_step_wait()
    life.step_done()
    with pytest.raises(RuntimeError) as err:
        life.check_step_wait()
    assert str(err.value) == NO_PENDING_STEP
    with pytest.raises(RuntimeError) as err:
        life.check_recv(2)
    assert str(err.value) == NOTHING_IN_FLIGHT
    life.in_flight = 1
    with pytest.raises(RuntimeError, match="only 1 are in flight"):
        life.check_recv(2)
    with pytest.raises(RuntimeError, match="1 are in flight from send"):
        life.check_step_async()
    life.check_send()
    life.needs_reset("env 3 raised ValueError in step; call reset() before stepping again")
    with pytest.raises(RuntimeError, match="env 3 raised"):
        life.check_send()
    life.close()
    for check in (life.check_open, life.check_idle, life.check_step_async, life.check_send, life.check_step_wait):
        with pytest.raises(PoolClosedError, match="the pool is closed"):
            check()
    assert life.closed


def test_reentry_from_the_same_thread_is_refused_and_close_deferred():
    life = Lifecycle()
    life.enter()
    with pytest.raises(RuntimeError, match="signal handler"):
        life.enter()
    assert life.begin_close() is False      # a signal handler's close(): deferred
    assert life.close_requested
    closed = []
    with pytest.raises(PoolClosedError, match="while this call was in progress"):
        life.leave(lambda: (closed.append(1), life.close()))
    assert closed == [1] and life.closed
    assert life.begin_close() is False       # already closed: nothing to do
    assert life.lock.acquire(False)          # and the lock was released
    life.lock.release()


def test_close_from_another_thread_waits_for_the_call():
    life = Lifecycle()
    life.ready()
    life.enter()
    result = []

    def closer():
        if life.begin_close():
            result.append("closed by close()")
            life.close()
            life.end_close()
        else:
            result.append("closed by the call")

    t = threading.Thread(target=closer)
    t.start()
    t.join(0.2)
    assert t.is_alive() and life.close_requested   # waiting for the call to leave
    with pytest.raises(PoolClosedError):
        life.leave(life.close)
    t.join(5)
    assert result == ["closed by the call"] and life.closed


def test_forked_refuses_everything():
    life = Lifecycle()
    life.ready()
    life.forked()
    with pytest.raises(PoolClosedError, match="inherited by fork"):
        life.check_send()
    assert life.closed and life.begin_close() is False
