"""The dispatch room (``shmpool.dispatch.Dispatch``) without processes: a wire over an anonymous
mapping, the test playing the workers on it (``pop_request``, ``publish``, ``finish_shard``)."""
from __future__ import annotations

import mmap

import numpy as np
import pytest

from shmpool import _core
from shmpool import protocol as P
from shmpool.dispatch import Dispatch
from shmpool.state import Lifecycle

POLICY = _core.WaitPolicy("t", 1000, 1000)


def room(shards=(2, 2), batch_size=4, max_lead=None):
    n = sum(shards)
    wire = _core.Wire(mmap.mmap(-1, _core.control_size(n, list(shards))), list(shards), num_envs=n)
    wire.init_header()
    owner = np.repeat(np.arange(len(shards), dtype=np.int32), shards)
    life = Lifecycle()
    life.ready()
    return Dispatch(wire, owner, life, batch_size, max_lead), life


def take_from(wire):
    """The supervisor's take, without its waits: what the workers published."""
    return lambda out, n, op: wire.take(out, 0, n, POLICY, 1_000_000)


def test_claim_dispatch_and_receive_keep_the_marks_and_the_count():
    d, life = room()
    ids = d.claim([3, 0])
    d.dispatch(ids, reset=False)
    assert life.in_flight == 2 and d.in_flight.tolist() == [1, 0, 0, 1]
    assert (d.wire.pop_request(0), d.wire.pop_request(1)) == (0, 3)   # each id to its owner's ring
    with pytest.raises(RuntimeError, match=r"env ids \[3\] are already in flight; recv\(\) them first"):
        d.claim([1, 3])
    assert d.in_flight.tolist() == [1, 0, 0, 1]   # a refused claim marks nothing
    d.received(np.array([3, 0], dtype=np.int32))
    assert life.in_flight == 0 and not d.in_flight.any()


def test_refused_actions_unclaim():
    d, life = room()
    ids = d.claim(None)
    d.unclaim(ids)
    assert not d.in_flight.any() and life.in_flight == 0
    with pytest.raises(ValueError, match="out of range"):
        d.claim([4])


def test_take_in_turn_is_completion_order():
    d, _ = room(batch_size=3)
    d.dispatch(d.claim(None), reset=False)
    for e in (2, 0, 3, 1):
        d.wire.publish(e)
    out = d.batch_ids
    assert d.take_in_turn(out, 3, take_from(d.wire)) == 3 and out.tolist() == [2, 0, 3]


def test_drain_takes_back_everything_out():
    d, life = room()
    d.dispatch(d.claim([0, 1, 2]), reset=True)
    assert [d.wire.pop_request(0) & 0xFFFF for _ in range(2)] == [0, 1]
    for e in (1, 2, 0):
        d.wire.publish(e)
    assert sorted(d.drain(take_from(d.wire)).tolist()) == [0, 1, 2]
    assert life.in_flight == 0 and not d.in_flight.any()
    assert d.drain(take_from(d.wire)).tolist() == []


def test_sync_target_counts_shards_and_wraps():
    d, _ = room()
    start = d.sync_seq
    d.post_step(P.CMD_STEP)
    assert d.step_target == (start + 2) & 0xFFFFFFFF
    assert not d.wire.wait_sync(d.step_target, POLICY, 1_000)
    d.wire.finish_shard()
    d.wire.finish_shard()
    assert d.wire.wait_sync(d.step_target, POLICY, 1_000)
    d.step_done()
    assert d.step_target is None and d.sync_seq == (start + 2) & 0xFFFFFFFF
    d.sync_seq = 0xFFFFFFFF
    d.post_step(P.CMD_STEP)
    assert d.step_target == 1   # modulo 2**32, as the wire's counter


def test_retarget_takes_the_counter():
    d, _ = room()
    d.post_step(P.CMD_STEP)
    for _ in range(3):   # a replacement finished its shard again
        d.wire.finish_shard()
    d.retarget()
    assert d.step_target == d.wire.sync_count()
