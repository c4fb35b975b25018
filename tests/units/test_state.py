"""shmpool.state: the one state of a pool, its refusals and its entry lock (no workers needed)."""
import pickle
import re
import threading
import time

import pytest

from shmpool.errors import PoolClosedError
from shmpool.state import (
    NO_PENDING_STEP,
    NOTHING_IN_FLIGHT,
    RESET_FIRST,
    STEP_PENDING_ASYNC,
    STEP_PENDING_OTHER,
    CallPendingError,
    ConcurrentCallError,
    Lifecycle,
    NoCallPendingError,
    Pending,
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


def _in_thread(fn, name: str = "second") -> list:
    """What ``fn()`` returned or raised in a thread of its own, waited for up to 5 s (empty: still waiting)."""
    got: list = []

    def run():
        try:
            got.append(fn())
        except Exception as exc:  # noqa: BLE001 - the outcome is the test's subject
            got.append(exc)
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(5)
    return got


def test_a_second_thread_entering_during_a_call_is_refused_naming_both():
    """Issue 69: a second thread's call waited for the first's and then ran (a step after the first caller's,
    its views overwritten); it is refused at once, and gets in once the first call has left."""
    life = Lifecycle()
    life.ready()
    life.enter("step")
    got = _in_thread(lambda: life.enter("reset"))
    assert got and isinstance(got[0], ConcurrentCallError), got
    assert re.fullmatch(r"reset\(\) from thread 'second' while thread 'MainThread' is inside this pool's step\(\): .*"
                        r"one thread at a time.*", str(got[0])), str(got[0])
    assert pickle.loads(pickle.dumps(got[0])).args == got[0].args
    life.leave(life.close)
    assert _in_thread(lambda: (life.enter("reset"), life.leave(life.close), "in")[-1]) == ["in"]


def test_a_call_entering_while_another_thread_closes_the_pool_is_told_it_is_closed():
    life = Lifecycle()
    life.ready()
    assert life.begin_close()   # this thread closes: the lock is held until end_close()
    got = _in_thread(lambda: life.enter("step"))
    assert got and isinstance(got[0], PoolClosedError) and str(got[0]) == "the pool is closed", got
    life.close()
    life.end_close()


@pytest.mark.parametrize("requests, how", [
    ([False], "close"), ([True], "kill"), ([True, False], "kill"), ([False, True], "kill")],
    ids=["close", "terminate", "terminate then close", "close then terminate"])
def test_a_close_asked_during_a_call_is_performed_as_it_was_asked(requests, how):
    """``close(terminate=True)`` during another thread's call: the call kills as it leaves, instead of asking the
    workers to close (which waits for the env they are in); a plain close asked too does not undo the kill."""
    life = Lifecycle()
    life.ready()
    life.enter()
    closers = [threading.Thread(target=lambda kill=kill: life.begin_close(kill=kill)) for kill in requests]
    for t in closers:
        t.start()
    deadline = time.monotonic() + 5
    while not (life.close_requested and life.kill_requested == (how == "kill")) and time.monotonic() < deadline:
        time.sleep(0.001)
    done = []
    with pytest.raises(PoolClosedError):
        life.leave(lambda: (done.append("close"), life.close()), lambda: (done.append("kill"), life.close()))
    for t in closers:
        t.join(5)
    assert done == [how] and life.closed and not life.kill_requested


def test_forked_refuses_everything():
    life = Lifecycle()
    life.ready()
    life.forked()
    with pytest.raises(PoolClosedError, match="inherited by fork"):
        life.check_send()
    assert life.closed and life.begin_close() is False


def test_pending_is_the_pools_step_or_the_call_a_face_started():
    life = Lifecycle()
    life.ready()
    assert life.pending is None
    life.check_nothing_pending("set_attr")
    for wait in Pending:
        with pytest.raises(NoCallPendingError) as err:
            life.check_collect(wait)
        assert err.value.call is wait
        assert str(err.value) == f"{wait.value}_wait() without a pending {wait.value}_async()"
    life.step_posted()
    assert life.pending is Pending.STEP
    life.check_collect(Pending.STEP)
    with pytest.raises(CallPendingError) as err:
        life.check_nothing_pending("call_async")
    assert err.value.call is Pending.STEP
    assert str(err.value) == "call_async() while a step_async() is pending; call step_wait() first"
    life.step_done()
    for call in (Pending.RESET, Pending.CALL):
        life.call_started(call)
        assert life.pending is call
        life.check_collect(call)
        with pytest.raises(CallPendingError) as err:
            life.check_nothing_pending("step_async")
        assert err.value.call is call
        with pytest.raises(NoCallPendingError):
            life.check_step_wait()
        life.check_idle()   # the pool's own checks let the face's thread run the call
        life.call_collected()
        assert life.pending is None


def test_the_pools_step_refusals_name_the_pending_step():
    """Still RuntimeErrors with the pool's words, and typed so a face can translate them."""
    life = Lifecycle()
    life.ready()
    with pytest.raises(NoCallPendingError) as err:
        life.check_step_wait()
    assert str(err.value) == NO_PENDING_STEP and err.value.call is Pending.STEP
    life.step_posted()
    for check, message in ((life.check_step_async, STEP_PENDING_ASYNC), (life.check_send, STEP_PENDING_OTHER),
                           (life.check_idle, STEP_PENDING_OTHER)):
        with pytest.raises(CallPendingError) as err:
            check()
        assert isinstance(err.value, RuntimeError) and str(err.value) == message
        assert err.value.call is Pending.STEP


@pytest.mark.parametrize("end", ["close", "forked"])
def test_a_closed_pool_has_nothing_pending(end):
    life = Lifecycle()
    life.ready()
    life.call_started(Pending.RESET)
    getattr(life, end)()
    assert life.pending is None
    for check in (lambda: life.check_nothing_pending("reset_async"), lambda: life.check_collect(Pending.RESET)):
        with pytest.raises(PoolClosedError):
            check()


def test_refusals_pickle_with_their_call():
    for err in (CallPendingError("x", Pending.CALL), NoCallPendingError("y", Pending.RESET)):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and vars(back) == vars(err)
