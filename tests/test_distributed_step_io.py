"""A RayPool's common sync step in C (``DirectStep`` with its ``StepIO``), over socket pairs, no Ray: the requests
it writes are the ones the Python path frames, its joined result is numpy's concatenation of the pools' answers,
anything off its path sends nothing and goes back to Python, and a write cut short or a read not done within the
slice leaves the replies as the Python path leaves them."""
from __future__ import annotations

import signal
import socket
import threading
import time

import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("ray")   # shmpool.distributed imports ray
from test_distributed_step_targets import SocketPools, rows_of  # noqa: E402

from shmpool.distributed import channel as ch  # noqa: E402
from shmpool.distributed.action_check import ActionCheck  # noqa: E402
from shmpool.distributed.batches import Rows  # noqa: E402
from shmpool.distributed.direct_step import DirectStep  # noqa: E402

OBS = (8, 16, 8)   # 1 KiB an env: every pool's observations are read into place
SIZES = [4, 5]


def answer(n: int, seed: int, keys: tuple = ("lives", "_lives")) -> Rows:
    """A pool's step answer as an actor makes it (bool ``_key`` masks, as a Pool's infos have)."""
    rng = np.random.default_rng(seed)
    infos = {k: (rng.random(n) > 0.5 if k.startswith("_") else rng.integers(0, 9, n)) for k in keys}
    return Rows(np.arange(n), rng.integers(0, 256, (n, *OBS), dtype=np.uint8), rng.normal(size=n),
                rng.random(n) > 0.5, rng.random(n) > 0.5, infos)


def actor_bytes(rows: Rows) -> bytes:
    return b"".join(bytes(p) for p in ch.answer_parts(rows))


def assert_step(out: tuple, blocks: list[Rows]) -> None:
    """``out`` is a step's ``(obs, rew, term, trunc, infos)``: the blocks' fields concatenated, fresh arrays."""
    for got, field in zip(out[:4], ("obs", "rew", "term", "trunc")):
        want = np.concatenate([getattr(b, field) for b in blocks])
        assert got.dtype == want.dtype and got.shape == want.shape, field
        np.testing.assert_array_equal(got, want, err_msg=field)
    assert out[4].keys() == blocks[0].infos.keys()
    for k in blocks[0].infos:
        np.testing.assert_array_equal(out[4][k], np.concatenate([b.infos[k] for b in blocks]), err_msg=k)


class Wire(SocketPools):
    """A driver's :class:`DirectStep` over one socket pair per pool, for a Discrete(3) action per env; the test
    plays the actors: it reads their requests and writes their answers."""

    def __init__(self, sizes: list[int] = SIZES, space: spaces.Space | None = None, strict: bool = True) -> None:
        super().__init__(sizes)
        space = spaces.Discrete(3) if space is None else space
        self.direct = DirectStep(rows_of(sizes), ActionCheck(space, sum(sizes), strict))
        self.rng = np.random.default_rng(0)
        self.space = space

    def actions(self) -> np.ndarray:
        return np.stack([self.space.sample() for _ in range(sum(self.sizes))])

    def request(self, k: int) -> tuple:
        """Pool ``k``'s next request, read whole: (method, args)."""
        body, meta_len, count = ch.recv_frame(self.pairs[k][1])
        body = np.frombuffer(body, np.uint8)
        call = ch.plain_call(body, meta_len, count)
        if call is None:
            request = ch.decode_body(body, meta_len, count)
            call = request.method, request.args
        return call

    def requests(self) -> list:
        return [self.request(k) for k in range(len(self.pairs))]

    def assert_requests(self, actions: np.ndarray) -> None:
        for (method, args), rows in zip(self.requests(), rows_of(self.sizes)):
            assert method == "step" and len(args) == 1
            np.testing.assert_array_equal(args[0], actions[rows])
            assert args[0].dtype == actions.dtype

    def answer(self, blocks: list, only: list[int] | None = None) -> None:
        for k, block in enumerate(blocks):
            if only is None or k in only:
                self.pairs[k][1].sendall(block if type(block) is bytes else actor_bytes(block))

    def nothing_sent(self) -> bool:
        for _, actor in self.pairs:
            if actor.fileno() == -1:   # closed by the test: that pool is gone
                continue
            actor.setblocking(False)
            try:
                actor.recv(1)
            except BlockingIOError:
                continue
            finally:
                actor.settimeout(5)
            return False
        return True

    def python_step(self, seed: int) -> tuple:
        """A step the Python path sends and reads (what the C path must equal)."""
        actions = self.actions()
        replies = self.direct.send(actions, self.channels)
        self.assert_requests(actions)
        blocks = [answer(n, seed + k) for k, n in enumerate(self.sizes)]
        self.answer(blocks)
        out = self.direct.collect(replies, 5.0)
        assert_step(out, blocks)
        return out

    def learnt(self) -> Wire:
        """Two steps through Python: the first teaches the answers' layouts, the second's send makes the C step."""
        assert self.direct.send_whole(self.actions(), self.channels) is None   # nothing known yet
        assert self.nothing_sent()
        self.python_step(100)
        assert self.direct.io is None
        self.python_step(200)
        assert self.direct.io is not None
        return self


@pytest.fixture
def wire():
    w = Wire().learnt()
    yield w
    w.close()


def test_the_c_step_sends_the_python_path_s_requests_and_joins_its_result(wire):
    for step in range(4):
        actions = wire.actions()
        replies = wire.direct.send_whole(actions, wire.channels)
        assert replies is not None and not any(r.target or r.done for r in replies)   # aimed by collect
        wire.assert_requests(actions)   # each pool's rows, framed as the Python path frames them
        blocks = [answer(n, 10 * step + k) for k, n in enumerate(wire.sizes)]
        wire.answer(blocks)
        out = wire.direct.io.collect(replies, 5.0)
        assert out is not None   # read and joined in C, not handed back to Python
        assert_step(out, blocks)
        assert all(r.target.filled and np.shares_memory(out[0], r.target.into) for r in replies)   # read in place
        assert all(r.done and r.answer.value is out for r in replies)
        assert not any(c.pending for c in wire.channels)
        assert out[0].flags.c_contiguous and out[0].flags.writeable
        if step == 0:
            kept = out[0]
    np.testing.assert_array_equal(kept, np.concatenate([answer(n, k).obs for k, n in enumerate(wire.sizes)]))


@pytest.mark.parametrize("case", ["int32 actions", "a row short", "a value out of range", "not contiguous",
                                  "a list", "a call pending", "a channel replaced", "a channel lost"])
def test_anything_off_the_c_step_s_path_sends_nothing_and_goes_back_to_python(wire, case):
    actions = wire.actions()
    channels = list(wire.channels)
    if case == "int32 actions":
        actions = actions.astype(np.int32)
    elif case == "a row short":
        actions = actions[:-1]
    elif case == "a value out of range":
        actions[3] = 3
    elif case == "not contiguous":
        actions = np.stack([actions, actions], axis=1)[:, 0]
        assert not actions.flags.c_contiguous
    elif case == "a list":
        actions = actions.tolist()
    elif case == "a call pending":
        pending = channels[1].call("echo")
        assert wire.request(1)[0] == "echo"   # that call's own request
    elif case == "a channel replaced":
        channels[0] = ch.Channel(wire.pairs[0][0], ("pool", 0))
    elif case == "a channel lost":
        wire.pairs[1][1].close()
        channels[1].read_available()
        assert channels[1].lost is not None
    assert wire.direct.send_whole(actions, channels) is None
    assert wire.nothing_sent()
    if case == "a call pending":
        assert not pending.done


def test_a_lenient_check_s_batch_goes_out_in_c_only_when_its_rows_are_contiguous():
    """``strict=False``: the C check passes any batch of the right dtype and shape, values unscanned; the C write
    takes the batch's own bytes, so a strided batch must go back to Python (which copies its rows)."""
    w = Wire(strict=False).learnt()
    try:
        actions = w.actions()
        strided = np.stack([actions, actions], axis=1)[:, 0]
        assert w.direct.send_whole(strided, w.channels) is None and w.nothing_sent()
        replies = w.direct.send_whole(actions, w.channels)
        assert replies is not None
        w.assert_requests(actions)
    finally:
        w.close()


def test_a_request_the_socket_takes_in_part_arrives_whole_and_in_order():
    """A batch bigger than the socket's buffer: the C write is cut, the channel sends the rest (waiting for the
    actor to read), and every pool gets its whole request; the step then reads and joins in C as usual."""
    w = Wire(space=spaces.Box(-1, 1, (4000,), np.float32)).learnt()   # 16 KB of actions an env
    try:
        for driver, _ in w.pairs:
            driver.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        assert 4 * 16000 > w.pairs[0][0].getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        for step in range(2):
            actions = w.actions()
            got: list = []
            reader = threading.Thread(target=got.extend, args=((w.request(k) for k in range(2)),))   # read as they come
            reader.start()
            replies = w.direct.send_whole(actions, w.channels)
            reader.join(10)
            assert replies is not None and len(got) == 2
            for (method, args), rows in zip(got, rows_of(w.sizes)):
                assert method == "step"
                np.testing.assert_array_equal(args[0], actions[rows])
            assert not any(r.done for r in replies)
            blocks = [answer(n, 50 + 10 * step + k) for k, n in enumerate(w.sizes)]
            w.answer(blocks)
            out = w.direct.io.collect(replies, 5.0)
            assert out is not None
            assert_step(out, blocks)
    finally:
        w.close()


def test_answers_of_another_layout_are_joined_in_python_and_the_c_step_is_made_again_for_them(wire):
    actions = wire.actions()
    replies = wire.direct.send_whole(actions, wire.channels)
    wire.assert_requests(actions)
    blocks = [answer(n, 60 + k, keys=("level", "_level")) for k, n in enumerate(wire.sizes)]   # an info key renamed
    wire.answer(blocks)
    assert_step(wire.direct.collect(replies, 5.0), blocks)
    assert not any(r.target.filled for r in replies)   # another prefix: read whole, not into place
    assert wire.direct.io is None   # made for the old layout: retired
    assert wire.direct.send_whole(wire.actions(), wire.channels) is None and wire.nothing_sent()
    for step in range(2):   # the new layout learnt, then the C step made for it on the next send
        actions = wire.actions()
        replies = wire.direct.send(actions, wire.channels)
        wire.assert_requests(actions)
        blocks = [answer(n, 70 + 10 * step + k, keys=("level", "_level")) for k, n in enumerate(wire.sizes)]
        wire.answer(blocks)
        assert_step(wire.direct.collect(replies, 5.0), blocks)
    actions = wire.actions()
    replies = wire.direct.send_whole(actions, wire.channels)
    assert replies is not None
    wire.assert_requests(actions)
    blocks = [answer(n, 90 + k, keys=("level", "_level")) for k, n in enumerate(wire.sizes)]
    wire.answer(blocks)
    out = wire.direct.io.collect(replies, 5.0)
    assert out is not None
    assert_step(out, blocks)


def test_a_pool_silent_past_the_slice_leaves_its_reply_pending_and_the_join_reads_into_place(wire):
    actions = wire.actions()
    replies = wire.direct.send_whole(actions, wire.channels)
    wire.assert_requests(actions)
    blocks = [answer(n, 80 + k) for k, n in enumerate(wire.sizes)]
    wire.answer(blocks, only=[0])
    start = time.monotonic()
    timeout = 0.5
    assert wire.direct.collect(replies, timeout) is None
    # One slice in all, the read in C and the wait after it: two would take 2 x timeout at the least, so the
    # upper bound fails on them however loaded the machine (and leaves 0.5 s over one slice); the lower
    # bound, less 10 ms for the clock's rounding, that the slice was waited.
    assert timeout - 0.01 <= time.monotonic() - start < 2 * timeout
    assert replies[0].done and replies[0].target.filled and not replies[1].done
    data = actor_bytes(blocks[1])
    wire.answer([b"", data[:300]])   # the rest comes in pieces, read by the ordinary wait into its target
    assert ch.wait(replies, 2, 0.05) == [replies[0]]
    wire.answer([b"", data[300:]])
    assert ch.wait(replies, 2, 5.0) == replies and replies[1].target.filled
    out = wire.direct.join(ch.Reply.values(replies))
    assert_step(out, blocks)
    assert np.shares_memory(out[0], replies[1].target.into)   # read into the step's output, not copied there
    assert wire.direct.io is not None   # the same layout: the C step stays


def test_an_error_answer_settles_its_reply_for_the_caller_to_raise(wire):
    actions = wire.actions()
    replies = wire.direct.send_whole(actions, wire.channels)
    wire.assert_requests(actions)
    wire.answer([answer(4, 1), b"".join(bytes(p) for p in ch.encode(ch.Answer(error=KeyError("no such env"))))])
    assert wire.direct.collect(replies, 5.0) is None
    assert replies[0].answer.value.target.filled and isinstance(replies[1].answer.error, KeyError)
    assert not any(c.pending for c in wire.channels)


@pytest.mark.parametrize("answered", [[0], []], ids=["one pool answered", "none answered"])
def test_a_signal_during_the_read_in_c_settles_what_was_read_before_it_raises(wire, answered):
    actions = wire.actions()
    replies = wire.direct.send_whole(actions, wire.channels)
    wire.assert_requests(actions)
    blocks = [answer(n, 90 + k) for k, n in enumerate(wire.sizes)]
    wire.answer(blocks, only=answered)

    def interrupt(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            wire.direct.io.collect(replies, 5.0)
        # At the signal (0.2 s), not at the 5 s slice's end: 10x the idle time for a loaded CI.
        assert time.monotonic() - start < 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if answered:
        assert replies[0].done and replies[0].answer.value.target.filled
        np.testing.assert_array_equal(replies[0].answer.value.obs, blocks[0].obs)
    else:   # the signal came in the wait for the first answer: nothing read, nothing aimed
        assert not replies[0].done and replies[0].target is None
    assert not replies[1].done and len(wire.channels[1].pending) == 1
    wire.answer(blocks, only=[k for k in range(2) if k not in answered])   # what comes later is read as usual
    assert ch.wait(replies, 2, 5.0) == replies
    assert_step(wire.direct.join(ch.Reply.values(replies)), blocks)
