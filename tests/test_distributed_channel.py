"""The direct connection between a RayPool's driver and its actors (shmpool.distributed.channel), on
real sockets in this process: no Ray cluster, so each test takes milliseconds."""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

pytest.importorskip("ray")

from shmpool.distributed import channel as ch  # noqa: E402
from shmpool.distributed.batches import Rows  # noqa: E402

TOKEN = b"0123456789abcdef"


def roundtrip(message):
    a, b = socket.socketpair()
    with a, b:
        ch.send_parts(a, ch.encode(message))
        return ch.recv_message(b)


def test_arrays_cross_as_fresh_aligned_writable_copies_of_any_layout():
    obs = {"img": np.arange(2 * 3 * 5, dtype=np.uint8).reshape(2, 3, 5), "vec": np.ones((2, 3), np.float32)}
    infos = {"lives": np.array([3, 2]), "_lives": np.array([True, False]), "text": np.array(["a", None], dtype=object),
             "fn": lambda: 7, "scalar": np.float64(2.5), "strided": np.arange(10)[::3], "empty": np.zeros((0, 4)),
             "zero_d": np.array(1.5), "pairs": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
             "s": np.array(["xy", "z"])}
    sent = Rows(np.arange(2), obs, np.array([0.5, -1.0]), np.array([False, True]), np.zeros(2, bool), infos)
    got = roundtrip(ch.Answer(value=sent)).value
    assert isinstance(got, Rows)
    for x, y in [(got.ids, sent.ids), (got.rew, sent.rew), (got.term, sent.term), (got.obs["img"], obs["img"]),
                 (got.obs["vec"], obs["vec"])] + [(got.infos[k], infos[k]) for k in
                                                  ("lives", "_lives", "strided", "empty", "zero_d", "pairs", "s")]:
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)
        assert x.flags.writeable and x.flags.aligned and not np.shares_memory(x, y)
    assert got.infos["text"].tolist() == ["a", None]
    assert got.infos["fn"]() == 7 and got.infos["scalar"] == 2.5


def serve(handle):
    return ch.ChannelServer("127.0.0.1", TOKEN, handle, frozenset({"echo", "fail", "unpicklable"}))


def handler(method, args):
    if method == "fail":
        raise KeyError("no such env")
    if method == "unpicklable":
        class Local(Exception):   # a class defined in a function: pickle cannot name it
            pass
        err = Local("odd")
        err.lock = threading.Lock()
        raise err
    return args


def test_calls_are_answered_in_order_and_errors_come_back_typed():
    server = serve(handler)
    channel = ch.Channel.connect(server.address, TOKEN, 5)
    try:
        replies = [channel.call("echo", i, np.full(3, i)) for i in range(5)]
        failed = channel.call("fail")
        odd = channel.call("unpicklable")
        refused = channel.call("close")
        done = ch.wait(replies + [failed, odd, refused], 8, 5.0)
        assert len(done) == 8
        for i, r in enumerate(replies):
            assert r.answer.value[0] == i and r.answer.value[1].tolist() == [i, i, i]
        assert isinstance(failed.answer.error, KeyError) and "no such env" in str(failed.answer.error)
        assert isinstance(odd.answer.error, RuntimeError) and str(odd.answer.error) == "Local: odd"
        assert isinstance(refused.answer.error, ValueError)
        assert str(refused.answer.error) == "'close' is not a call this actor serves"
    finally:
        channel.close()
        server.close()


def test_a_wrong_token_is_hung_up_on_and_the_driver_still_gets_in():
    server = serve(handler)
    try:
        stranger = socket.create_connection(server.address, timeout=5)
        stranger.sendall(b"x" * len(TOKEN) + b"more")
        try:
            hung_up = stranger.recv(1) == b""   # closed without a word
        except ConnectionResetError:          # or reset: the bytes it sent were never read
            hung_up = True
        assert hung_up
        stranger.close()
        channel = ch.Channel.connect(server.address, TOKEN, 5)
        reply = channel.call("echo", "hi")
        assert ch.wait([reply], 1, 5.0) == [reply] and reply.answer.value == ("hi",)
        channel.close()
    finally:
        server.close()


def test_a_connection_that_ends_loses_every_pending_reply_and_every_later_call():
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_nothing():   # reads the token and one request, then its process "dies"
        conn, _ = listener.accept()
        ch.recv_exact(conn, len(TOKEN))
        ch.recv_message(conn)
        conn.close()

    thread = threading.Thread(target=answer_nothing)
    thread.start()
    channel = ch.Channel.connect(listener.getsockname(), TOKEN, 5)
    first, second = channel.call("step", 1), channel.call("step", 2)
    assert ch.wait([first, second], 2, 5.0) == [first, second]
    thread.join()
    assert isinstance(first.lost, ch.ChannelClosedError) and second.lost is first.lost
    assert "ended" in str(first.lost) and first.answer is None
    later = channel.call("step", 3)
    assert later.done and later.lost is first.lost
    channel.close()
    listener.close()


def test_wait_returns_at_its_timeout_and_at_once_with_zero():
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]))
    thread.start()
    channel = ch.Channel.connect(listener.getsockname(), TOKEN, 5)
    thread.join()
    reply = channel.call("step", 1)
    t0 = time.monotonic()
    assert ch.wait([reply], 1, 0) == []
    assert time.monotonic() - t0 < 0.05
    assert ch.wait([reply], 1, 0.2) == [] and 0.2 <= time.monotonic() - t0 < 1.0
    assert not reply.done
    channel.close()
    accepted[0].close()
    listener.close()


def test_an_answer_that_stops_half_way_does_not_hold_the_wait(monkeypatch):
    """A node that freezes mid-answer: the driver blocked in the read for the whole stall timeout (60 s),
    past its wait's slice, so neither ``step_timeout`` nor the node-liveness watch could act.  Now the
    wait returns at its timeout with the reply pending, and the rest of the frame completes it later."""
    monkeypatch.setattr(ch, "STALL_S", 3.0)
    listener = socket.create_server(("127.0.0.1", 0))
    parts = b"".join(bytes(p) for p in ch.encode(ch.Answer(value=np.arange(5000))))
    go_on = threading.Event()

    def half_then_rest():
        conn, _ = listener.accept()
        with conn:
            ch.recv_exact(conn, len(TOKEN))
            ch.recv_message(conn)
            conn.sendall(parts[:len(parts) // 2])
            go_on.wait(10)
            conn.sendall(parts[len(parts) // 2:])

    thread = threading.Thread(target=half_then_rest)
    thread.start()
    channel = ch.Channel.connect(listener.getsockname(), TOKEN, 5)
    reply = channel.call("step", 1)
    t0 = time.monotonic()
    assert ch.wait([reply], 1, 0.3) == []
    assert time.monotonic() - t0 < 1.5 and not reply.done
    go_on.set()
    assert ch.wait([reply], 1, 5.0) == [reply]
    np.testing.assert_array_equal(reply.answer.value, np.arange(5000))
    channel.close()
    thread.join()
    listener.close()


@pytest.mark.parametrize("side", ["answer", "request"])
def test_a_message_the_other_end_cannot_rebuild_is_that_call_s_error_and_the_next_still_arrives(side):
    """An answer holding a node-only class (the driver cannot unpickle it), or a request holding a driver-only
    one (the actor cannot): that call's error, and the connection goes on serving."""
    if side == "answer":
        server = serve(lambda method, args: ModuleMissing() if args == ("odd",) else args)
        odd_arg = "odd"
    else:
        server = serve(handler)
        odd_arg = ModuleMissing()
    channel = ch.Channel.connect(server.address, TOKEN, 5)
    try:
        odd, fine = channel.call("echo", odd_arg), channel.call("echo", "fine")
        assert ch.wait([odd, fine], 2, 5.0) == [odd, fine]
        assert isinstance(odd.answer.error, ModuleNotFoundError) and "no_such_module_here" in str(odd.answer.error)
        assert fine.answer.value == ("fine",) and channel.lost is None
    finally:
        channel.close()
        server.close()


class ModuleMissing:
    """Pickles as a class of a module the driver does not have (a node-only package)."""

    def __reduce__(self):
        return (__import__("importlib").import_module, ("no_such_module_here",))


def test_a_driver_idle_for_longer_than_the_stall_timeout_is_still_served(monkeypatch):
    """The stall timeout is for a frame that stops half-way, not for the time between calls: the actor
    used it for both, so a trainer that paused longer (an evaluation, a checkpoint) found its pools dead."""
    monkeypatch.setattr(ch, "STALL_S", 0.3)
    server = serve(handler)
    channel = ch.Channel.connect(server.address, TOKEN, 5)
    try:
        first = channel.call("echo", 1)
        assert ch.wait([first], 1, 5.0) == [first] and first.answer.value == (1,)
        time.sleep(0.8)
        later = channel.call("echo", 2)
        assert ch.wait([later], 1, 5.0) == [later]
        assert later.lost is None and later.answer.value == (2,)
    finally:
        channel.close()
        server.close()


def test_the_actor_spins_for_the_next_call_only_while_calls_come_quickly():
    gaps = ch.CallGaps(spin_s=0.002, keep=4)
    assert gaps.window() == 0.0   # nothing seen yet: sleep
    for _ in range(4):
        gaps.record(0.001)
    assert gaps.window() == 0.002
    gaps.record(0.05)
    gaps.record(0.05)   # half of the last four came late: the median is past the window
    assert gaps.window() == 0.0
    never = ch.CallGaps(spin_s=0.0)
    never.record(0.0001)
    assert never.window() == 0.0


def test_a_driver_that_pauses_finds_the_actor_asleep_past_its_window():
    a, b = socket.socketpair()
    gaps = ch.CallGaps(spin_s=0.002)
    for _ in range(8):
        gaps.record(0.0005)   # calls have been coming quickly: it spins first
    idle = ch.select.poll()
    idle.register(b.fileno(), ch.select.POLLIN)
    cpu = []

    def wait() -> None:
        start = time.thread_time()
        ch.await_call(idle, gaps)
        cpu.append(time.thread_time() - start)

    with a, b:
        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()   # nothing to read yet
        a.sendall(b"x")
        waiter.join(5)
        assert not waiter.is_alive() and cpu[0] < 0.1   # a 2 ms spin, then asleep (not 300 ms of polling)
        assert gaps.gaps[-1] >= 0.3


@pytest.mark.parametrize("nested", [False, True])
def test_a_step_answer_of_plain_arrays_crosses_whole(nested):
    """The usual answer (plain arrays, flat infos) is written in short; one with a nested info the long way:
    both arrive equal, in order, as fresh writable arrays."""
    infos = {"lives": np.array([3, 2], np.int64), "_lives": np.array([True, False]), "zero_d": np.array(1.5),
             "empty": np.zeros((2, 0), np.float32)}
    if nested:
        infos["final_info"] = {"r": np.array([1.0, 0.0])}
    sent = Rows(np.arange(2), np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4), np.array([0.5, -1.0]),
                np.array([False, True]), np.array([True, False]), infos)
    got = roundtrip(ch.Answer(value=sent))
    assert type(got) is ch.Answer and not got.failed and isinstance(got.value, Rows)
    rows = got.value
    assert list(rows.infos) == list(infos)
    pairs = [(rows.ids, sent.ids), (rows.obs, sent.obs), (rows.rew, sent.rew), (rows.term, sent.term),
             (rows.trunc, sent.trunc)] + [(rows.infos[k], infos[k]) for k in ("lives", "_lives", "zero_d", "empty")]
    for x, y in pairs:
        assert x.dtype == y.dtype and x.shape == y.shape and x.flags.writeable
        np.testing.assert_array_equal(x, y)
        assert not np.shares_memory(x, y)
    if nested:
        np.testing.assert_array_equal(rows.infos["final_info"]["r"], [1.0, 0.0])
