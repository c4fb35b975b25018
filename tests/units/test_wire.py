"""The wire (``shmpool._core``) without workers: a control region over an anonymous mapping, the test
playing both sides.  One section per idea of the wire: the region's map and counters, waiting, the rings
with their claims and tickets, the status scan, a worker's reset, and words in any buffer."""
from __future__ import annotations

import mmap
import struct
import threading
import time

import numpy as np
import posix_ipc
import pytest

from shmpool import _core

LINE = _core.LINE
HEADER = 4 * LINE          # meta, sync counter, completion tickets, doorbell
BLOCK = 2 * LINE           # per worker: line A (the parent's), line B (the worker's)
SYNC, DOORBELL = LINE, 3 * LINE
POLL = _core.WaitPolicy("t", 1000, 1000)
SLEEP = _core.WaitPolicy("sleep", 0, 0)   # straight to the futex (or semaphore) after one short spin
# A wait that is never woken sleeps out its whole timeout: the wake tests give it 10 s and
# check it came back in under half, a margin no loaded CI machine comes near.
LONG_NS = 10_000_000_000


def wire_over(shards, *, sems=None, sync_start=0, extra=0):
    n = sum(shards)
    buf = mmap.mmap(-1, _core.control_size(n, list(shards)) + extra)
    wire = _core.Wire(buf, list(shards), num_envs=n, sems=sems)
    wire.init_header(sync_start)
    return wire, buf


def block_a(worker: int) -> int:
    return HEADER + worker * BLOCK


def block_b(worker: int) -> int:
    return HEADER + worker * BLOCK + LINE


def ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# --- the control region: its map, commands and counters --------------------------------------

def test_constants_the_protocol_relies_on():
    assert (_core.CMD_STEP, _core.CMD_ASYNC, _core.CMD_MESSAGE, _core.CMD_EXIT) == (1, 2, 3, 4)
    assert (_core.REQ_RESET, _core.REQ_ENV_MASK) == (2**31, 2**31 - 1)
    assert (_core.SCAN_SIDE_MESSAGE, _core.SCAN_NUMERIC_INFO) == (1, 2)
    assert LINE == 128 and _core.Wire.signal_count(3) == 8
    assert _core.have_futex()   # Linux


def test_control_size_is_header_blocks_and_three_rings_per_worker():
    # rings of 4-byte slots, each rounded up to a LINE: a 2-env shard's take one LINE, a 40-env one's two
    assert _core.control_size(42, [2, 40]) == HEADER + 2 * BLOCK + 3 * LINE + 3 * 2 * LINE


@pytest.mark.parametrize("shards,num_envs,size,message", [
    ([1] * 1025, 1025, None, "at most 1024 workers per pool"),
    ([2, 2], 4, 64, "buffer too small for the control region"),
    ([2, 0], 2, None, "every shard needs an env"),
    ([2, 1], 4, None, "shard sizes add up to 3, not num_envs=4"),
])
def test_a_wire_refuses_a_region_it_cannot_map(shards, num_envs, size, message):
    buf = mmap.mmap(-1, size or _core.control_size(num_envs, shards))
    with pytest.raises(ValueError, match=f"^{message}$"):
        _core.Wire(buf, shards, num_envs=num_envs)


def test_the_header_names_its_pool():
    buf = mmap.mmap(-1, _core.control_size(2, [1, 1]))   # room for either geometry below
    wire = _core.Wire(buf, [2], num_envs=2)
    with pytest.raises(RuntimeError, match="^shared region does not hold this pool's control block$"):
        wire.check_header()   # nothing written yet
    wire.init_header(7)
    wire.check_header()
    assert wire.sync_count() == 7 == _core.load_word(buf, SYNC)
    with pytest.raises(RuntimeError, match="control block"):
        _core.Wire(buf, [1, 1], num_envs=2).check_header()   # the same bytes, another geometry


def test_release_lets_the_mapping_close():
    wire, buf = wire_over([2])
    assert wire.slice_ns == 50_000_000
    wire.release()
    wire.release()   # twice is harmless
    buf.close()      # BufferError while the wire still held the buffer


def test_commands_are_numbered_per_worker_and_stamped():
    wire, buf = wire_over([2, 2])
    before = time.monotonic_ns()
    assert wire.post(0, _core.CMD_STEP) == 1 and wire.post(0, _core.CMD_MESSAGE) == 2
    after = time.monotonic_ns()
    assert wire.command(0) == (2, _core.CMD_MESSAGE) and wire.cmd_seq(1) == 0
    stamp, = struct.unpack_from("<q", buf, block_a(0) + 24)   # CLOCK_MONOTONIC, what adaptive waits learn from
    assert before <= stamp <= after
    wire.post_all(_core.CMD_EXIT)
    assert wire.command(0) == (3, _core.CMD_EXIT) and wire.command(1) == (1, _core.CMD_EXIT)
    assert _core.load_word(buf, block_a(1)) == 1   # the command counter: first word of the parent's line
    for bad in (-1, 2):
        with pytest.raises(IndexError, match=f"^no worker {bad}$"):
            wire.post(bad, _core.CMD_STEP)


def test_finished_commands_and_shards_are_counted():
    wire, buf = wire_over([2, 2])
    assert not wire.wait_done(1, 1, POLL, 1_000_000)
    wire.finish(1, 1)
    assert wire.done_seq(1) == 1 == _core.load_word(buf, block_b(1)) and wire.done_seq(0) == 0
    assert wire.wait_done(1, 1, POLL, 1_000_000)
    with pytest.raises(IndexError, match="^no worker 2$"):
        wire.wait_done(2, 1, POLL, 1_000_000)
    wire.finish_shard()
    wire.finish_shard()
    assert wire.sync_count() == 2 and wire.wait_sync(2, POLL, 1_000_000)


def test_sync_counter_wraps_at_2_32():
    """The sync counter is a 32-bit word that wraps in long runs (2**32 shards): a target
    just past the wrap must not count as reached before it, nor be missed after."""
    wire, buf = wire_over([2])
    _core.store_word(buf, SYNC, 2**32 - 2)
    assert wire.sync_count() == 2**32 - 2
    target = (wire.sync_count() + 3) & 0xFFFFFFFF  # what step_async computes: 1, past the wrap
    assert target == 1
    for count in (2**32 - 1, 0):
        wire.finish_shard()
        assert wire.sync_count() == count
        assert not wire.wait_sync(target, POLL, 1_000_000), f"target {target} reached at count {count}"
    wire.finish_shard()
    assert wire.sync_count() == 1 and wire.wait_sync(target, POLL, 1_000_000)


# --- waiting: spin, yield, then futex or semaphore --------------------------------------------

def test_a_wait_returns_unmet_at_its_slice():
    wire, _ = wire_over([2])
    assert not wire.wait_sync(1, POLL, 2_000_000)
    assert not wire.wait_command(0, 0, POLL, 2_000_000)   # a non-adaptive command wait
    wire.post(0, _core.CMD_STEP)
    assert wire.wait_command(0, 0, POLL, 2_000_000) and not wire.wait_command(0, 1, POLL, 1_000_000)


def _semaphores(n: int) -> list:
    sems = [posix_ipc.Semaphore(None, posix_ipc.O_CREX) for _ in range(n)]
    for sem in sems:
        sem.unlink()   # the objects live while open; nothing is left in /dev/shm
    return sems


def _sleep_and_wake(wire, buf, wait, wake, flag_at: int, target: int) -> None:
    """``wait`` sleeps in a thread; once its flag is up (and its target written beside it), ``wake``
    must bring it back well before its 10 s timeout, with the flag down again."""
    result = {}
    sleeper = threading.Thread(target=lambda: result.setdefault("met", wait()))
    t0 = time.perf_counter()
    sleeper.start()
    while _core.load_word(buf, flag_at + 4) != 1:
        assert sleeper.is_alive(), "the wait returned without sleeping"
        time.sleep(0.001)
    assert _core.load_word(buf, flag_at + 8) == target
    wake()
    sleeper.join(LONG_NS / 1e9)
    assert result == {"met": True}
    assert time.perf_counter() - t0 < LONG_NS / 2e9, "the sleeper was not woken: it slept out its timeout"
    assert _core.load_word(buf, flag_at + 4) == 0


@pytest.mark.parametrize("bed", ["futex", "semaphore"])
def test_a_sleeping_waiter_is_woken(bed):
    sems = _semaphores(_core.Wire.signal_count(2)) if bed == "semaphore" else None
    wire, buf = wire_over([2, 2], sems=sems)
    _sleep_and_wake(wire, buf, lambda: wire.wait_sync(1, SLEEP, LONG_NS), wire.finish_shard, SYNC, 1)
    _sleep_and_wake(wire, buf, lambda: wire.wait_done(1, 5, SLEEP, LONG_NS), lambda: wire.finish(1, 5),
                    block_b(1), 5)
    _sleep_and_wake(wire, buf, lambda: wire.wait_command(0, 0, SLEEP, LONG_NS),
                    lambda: wire.post(0, _core.CMD_STEP), block_a(0), 1)


def test_a_waker_wakes_only_a_sleeper_whose_target_is_reached():
    """Semaphores show it: a release the sleeper did not ask for would end its wait unmet."""
    sems = _semaphores(_core.Wire.signal_count(1))
    wire, buf = wire_over([2], sems=sems)
    wire.finish_shard()
    assert sems[0].value == 0   # nobody sleeps: no release (and no syscall)
    result = {}
    sleeper = threading.Thread(target=lambda: result.setdefault("met", wire.wait_sync(3, SLEEP, LONG_NS)))
    sleeper.start()
    while _core.load_word(buf, SYNC + 4) != 1:
        time.sleep(0.001)
    wire.finish_shard()   # 2: short of the sleeper's 3
    time.sleep(0.05)
    assert sleeper.is_alive() and sems[0].value == 0
    wire.finish_shard()
    sleeper.join(LONG_NS / 1e9)
    assert result == {"met": True}


def test_wait_policy_says_what_it_is():
    assert repr(_core.WaitPolicy("t", 1, 2)) == "WaitPolicy('t', spin_ns=1, yield_ns=2)"
    assert repr(_core.WaitPolicy("a", 1, 2, True)) == "WaitPolicy('a', spin_ns=1, yield_ns=2, adaptive=True)"


# --- the rings: claims, requests, completions and their tickets -------------------------------

def test_claims_mark_envs_in_flight_or_nothing():
    flying = np.zeros(3, dtype=np.uint8)
    assert _core.claim_ids(ids(2, 0), flying) and flying.tolist() == [1, 0, 1]
    for refused in (ids(1, 2), ids(1, 1), ids(1, 3), ids(1, -1)):   # in flight, repeated, out of range
        assert not _core.claim_ids(refused, flying) and flying.tolist() == [1, 0, 1]
    assert _core.claim_ids(ids(), flying)
    wire, _ = wire_over([2, 2])
    with pytest.raises(ValueError, match="^in_flight must have one byte per env$"):
        wire.claim(ids(0), flying)
    flying = np.zeros(4, dtype=np.uint8)
    assert wire.claim(ids(3, 1), flying) and flying.tolist() == [0, 1, 0, 1]
    assert not wire.claim(ids(0, 0), flying) and flying.tolist() == [0, 1, 0, 1]


def test_requests_go_to_their_owners_ring_and_post_only_them():
    wire, _ = wire_over([2, 2])
    wire.dispatch(ids(3, 2), np.array([0, 0, 1, 1], dtype=np.int32), False)
    assert wire.cmd_seq(0) == 0 and wire.command(1) == (1, _core.CMD_ASYNC)
    assert wire.pop_request(0) == -1
    assert [wire.pop_request(1) for _ in range(3)] == [3, 2, -1]


def test_rings_wrap_round_after_round():
    """Requests and completions through rings of one slot per env, many times round: the
    requests come out in each worker's dispatch order, the completions in publish order."""
    shards = [2, 3]
    wire, _ = wire_over(shards)
    owner = np.repeat(np.arange(2, dtype=np.int32), shards)
    rng = np.random.default_rng(0)
    out = np.zeros(5, dtype=np.uint32)
    for round_ in range(11):
        order = rng.permutation(5).astype(np.int64)
        reset = bool(round_ % 2)
        wire.dispatch(order, owner, reset)
        for w in range(2):
            got = []
            while (r := wire.pop_request(w)) != -1:
                assert bool(r & _core.REQ_RESET) is reset
                got.append(r & _core.REQ_ENV_MASK)
            assert got == [e for e in order.tolist() if owner[e] == w]
        finished = rng.permutation(5)
        for e in finished:
            wire.publish(int(e))
        assert wire.take(out, 0, 5, POLL, 1_000_000) == 5 and out.tolist() == finished.tolist()


def test_completions_are_taken_in_ticket_order_whichever_shard_ran_them():
    wire, _ = wire_over([1, 2, 2])
    with pytest.raises(IndexError, match="^env id 5 out of range$"):
        wire.publish(5)
    for e in (4, 0, 2, 1, 3):   # shards 2, 0, 1, 1, 2: the publisher finds each env's ring
        wire.publish(e)
    out = np.zeros(5, dtype=np.uint32)
    assert wire.take_ready(out, 0, 2) == 2 and out[:2].tolist() == [4, 0]
    assert wire.take_ready(out, 2, 3) == 3 and out.tolist() == [4, 0, 2, 1, 3]


def test_take_waits_one_slice_and_wakes_on_a_publication():
    wire, buf = wire_over([2])
    out = np.zeros(2, dtype=np.uint32)
    with pytest.raises(ValueError, match="^out is too short$"):
        wire.take(out, 1, 2, POLL, 1_000_000)
    wire.publish(1)
    assert wire.take_ready(out, 0, 2) == 1 and out[0] == 1   # what is there now, no wait for the rest
    assert wire.take(out, 1, 1, POLL, 1_000_000) == 0        # nothing more: one slice, then give up
    _sleep_and_wake(wire, buf, lambda: wire.take(out, 1, 1, SLEEP, LONG_NS) == 1, lambda: wire.publish(0),
                    DOORBELL, 2)
    assert out.tolist() == [1, 0]


def test_take_waits_for_any_publication_when_the_doorbell_runs_ahead():
    """After a restart the doorbell can count publications no ring holds any more: take must
    then wait for the next one, not spin on a target already passed."""
    wire, buf = wire_over([2])
    _core.store_word(buf, DOORBELL, 7)
    out = np.zeros(1, dtype=np.uint32)
    assert wire.take(out, 0, 1, POLL, 2_000_000) == 0
    _sleep_and_wake(wire, buf, lambda: wire.take(out, 0, 1, SLEEP, LONG_NS) == 1, lambda: wire.publish(1),
                    DOORBELL, 8)
    assert out[0] == 1


# --- the status scan --------------------------------------------------------------------------

def test_scan_reports_side_messages_and_numeric_infos():
    n = 4
    wire, buf = wire_over([2, 2], extra=64)
    status, masks = _core.control_size(n, [2, 2]), _core.control_size(n, [2, 2]) + 16
    with pytest.raises(RuntimeError, match=r"^bind_results\(\) first$"):
        wire.scan()
    for bad in ((-1, masks), (len(buf) - 3, masks), (status, masks + 4), (status, len(buf) - 24)):
        with pytest.raises(ValueError, match="^result arrays lie outside the region$"):
            wire.bind_results(*bad)
    wire.bind_results(status, masks)
    assert wire.scan() == 0
    buf[status + 1] = 1
    struct.pack_into("<Q", buf, masks + 8 * 3, 2**63)
    assert wire.scan() == _core.SCAN_SIDE_MESSAGE | _core.SCAN_NUMERIC_INFO
    batch = lambda *e: np.array(e, dtype=np.int32)  # noqa: E731
    assert wire.scan(batch(0, 1)) == _core.SCAN_SIDE_MESSAGE
    assert wire.scan(batch(3)) == _core.SCAN_NUMERIC_INFO
    assert wire.scan(batch(0, 2)) == 0 and wire.scan(batch()) == 0
    for bad in (4, -1):
        with pytest.raises(IndexError, match=f"^env id {bad} out of range$"):
            wire.scan(batch(0, bad))


# --- a dead worker's reset --------------------------------------------------------------------

def test_reset_worker_hands_back_what_it_published_and_clears_its_block():
    wire, _ = wire_over([2, 2])
    wire.dispatch(ids(0, 1, 2), np.array([0, 0, 1, 1], dtype=np.int32), False)
    for e in (1, 2, 0):
        wire.publish(e)
    out = np.zeros(3, dtype=np.uint32)
    assert wire.take_ready(out, 0, 1) == 1 and out[0] == 1
    assert wire.reset_worker(0) == [0]   # published, not yet taken: valid results
    assert (wire.cmd_seq(0), wire.done_seq(0), wire.pop_request(0)) == (0, 0, -1)
    assert wire.cmd_seq(1) == 1 and wire.pop_request(1) == 2   # the other worker's block is untouched
    assert wire.take_ready(out, 0, 3) == 1 and out[0] == 2
    wire.publish(1)   # the replacement publishes from the start of a clean ring
    assert wire.take(out, 0, 1, POLL, 1_000_000) == 1 and out[0] == 1
    assert wire.reset_worker(1) == []
    with pytest.raises(IndexError, match="^no worker 2$"):
        wire.reset_worker(2)


def test_reset_worker_rings_the_doorbell_a_killed_worker_owed():
    """A worker killed between storing its completion head and ringing the doorbell."""
    wire, buf = wire_over([2, 2])
    wire.publish(1)
    _core.store_word(buf, DOORBELL, 0)
    _core.store_word(buf, block_b(0) + 32, 0)   # the head it had rung the doorbell for
    assert wire.reset_worker(0) == [1]
    assert _core.load_word(buf, DOORBELL) == 1
    wire.publish(3)
    out = np.zeros(1, dtype=np.uint32)
    assert wire.take(out, 0, 1, SLEEP, LONG_NS) == 1 and out[0] == 3


def test_reset_worker_refuses_a_corrupt_ring():
    wire, buf = wire_over([2])
    struct.pack_into("<Q", buf, block_b(0) + 24, 3)   # a head three past the tail of a 2-slot ring
    with pytest.raises(RuntimeError, match="^worker 0's completion ring is corrupt$"):
        wire.reset_worker(0)


# --- words in any writable buffer, and info masks ---------------------------------------------

def test_words_reject_bad_offsets():
    buf = mmap.mmap(-1, 64)
    with pytest.raises(ValueError, match="out of range or unaligned"):
        _core.load_word(buf, 62)
    assert _core.cas_word(buf, 8, 0, 5) and not _core.cas_word(buf, 8, 0, 6)
    assert _core.load_word(buf, 8) == 5


@pytest.mark.parametrize("masks,limit,want", [
    ([], 4, (0, 0, [])),
    ([0, 0], 4, (0, 0, [])),
    ([0, 5, 0, 3], 4, (7, 0, [(1, 5), (3, 3)])),
    ([6, 2, 2**63 + 2], 2, (2**63 + 6, 2, None)),   # more reporting than the limit: no list
    ([6, 2, 2**63 + 2], 3, (2**63 + 6, 2, [(0, 6), (1, 2), (2, 2**63 + 2)])),
])
def test_mask_summary_is_numpys_reductions(masks, limit, want):
    arr = np.array(masks, dtype=np.uint64)
    got = _core.mask_summary(arr, limit)
    assert got == want
    if len(arr):
        assert got[:2] == (int(np.bitwise_or.reduce(arr)), int(np.bitwise_and.reduce(arr)))
