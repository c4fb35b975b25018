"""A sync step's observations read off the connections straight into its output (``StepTargets``,
``_inbox.ReadTarget``): over socket pairs, no Ray.  The joined rows must be what numpy's concatenation of the
pools' answers gives, whether each answer was read into place, read whole, or a mix."""
from __future__ import annotations

import signal
import socket
import time

import numpy as np
import pytest

pytest.importorskip("ray")   # shmpool.distributed imports ray
from shmpool.distributed import channel as ch  # noqa: E402
from shmpool.distributed._inbox import FrameInbox, ReadTarget  # noqa: E402
from shmpool.distributed.batches import FramedRows, Rows  # noqa: E402
from shmpool.distributed.step_targets import AnswerForm, StepTargets, read_step  # noqa: E402

OBS = (8, 16, 8)   # 1 KiB per env: a pool of 4 or more envs is read into place


def answer(n: int, seed: int, keys: tuple = ("lives",)) -> Rows:
    rng = np.random.default_rng(seed)
    infos = {k: rng.integers(0, 9, n) for k in keys}
    return Rows(np.arange(n), rng.integers(0, 256, (n, *OBS), dtype=np.uint8), rng.normal(size=n),
                rng.random(n) > 0.5, rng.random(n) > 0.5, infos)


def rows_of(sizes: list[int]) -> list[slice]:
    """Each pool's rows of the batch, the pools one after the other."""
    ends = np.cumsum([0, *sizes]).tolist()
    return [slice(a, b) for a, b in zip(ends, ends[1:])]


def frame_bytes(rows: Rows) -> bytes:
    return b"".join(bytes(p) for p in ch.encode(ch.Answer(value=rows)))


def expected(blocks: list[Rows]) -> dict:
    out = {f: np.concatenate([getattr(b, f) for b in blocks]) for f in ("ids", "obs", "rew", "term", "trunc")}
    out["infos"] = {k: np.concatenate([b.infos[k] for b in blocks]) for k in blocks[0].infos}
    return out


def assert_joined(rows: Rows, blocks: list[Rows]) -> None:
    want = expected(blocks)
    for f in ("ids", "obs", "rew", "term", "trunc"):
        got = getattr(rows, f)
        assert got.dtype == want[f].dtype and got.shape == want[f].shape, f
        np.testing.assert_array_equal(got, want[f], err_msg=f)
    assert rows.infos.keys() == want["infos"].keys()
    for k, v in want["infos"].items():
        np.testing.assert_array_equal(rows.infos[k], v, err_msg=k)


class Pools:
    """One socket pair per pool: the test writes each pool's answer, the driver's reader reads it."""

    def __init__(self, count: int) -> None:
        self.pairs = [socket.socketpair() for _ in range(count)]
        for _, b in self.pairs:
            b.setblocking(False)
        self.readers = [ch.FrameReader() for _ in range(count)]

    def step(self, targets: list, blocks: list[Rows], piece: int = 0) -> list:
        """Each pool answers ``blocks[k]`` (in pieces of ``piece`` bytes when given); the decoded answers."""
        out = []
        for (a, b), reader, target, block in zip(self.pairs, self.readers, targets, blocks):
            data = frame_bytes(block)
            got: list = []
            for at in range(0, len(data), piece or len(data)):
                a.sendall(data[at:at + (piece or len(data))])
                messages, ended = reader.read_available(b, [target])
                assert ended is None
                got += messages
            assert len(got) == 1
            out.append(got[0].value)
        return out

    def close(self) -> None:
        for a, b in self.pairs:
            a.close()
            b.close()


@pytest.fixture
def pools():
    p = Pools(3)
    yield p
    p.close()


@pytest.mark.parametrize("piece", [0, 7, 1000], ids=["whole", "7-byte pieces", "1000-byte pieces"])
def test_once_each_pool_s_answer_is_known_the_next_is_read_into_the_step_output(pools, piece):
    sizes = [4, 5, 6]
    targets = StepTargets(rows_of(sizes))
    assert targets.targets() == [None, None, None]   # nothing known yet: read whole, joined by copying
    first = [answer(n, k) for k, n in enumerate(sizes)]
    assert_joined(targets.join(pools.step([None] * 3, first)), first)
    joiner = targets.joiner = Counted(targets.joiner)   # learnt from the first answers
    for step in range(1, 4):
        aimed = targets.targets()
        assert all(type(t) is ReadTarget for t in aimed)
        blocks = [answer(n, 10 * step + k) for k, n in enumerate(sizes)]
        answers = pools.step(aimed, blocks, piece)
        assert all(t.filled for t in aimed) and all(a.target is not None for a in answers)
        rows = targets.join(answers)
        assert_joined(rows, blocks)
        assert all(np.shares_memory(rows.obs, t.into) for t in aimed)   # the obs were read there, not copied
        assert rows.obs.flags.c_contiguous and rows.obs.flags.writeable and rows.obs.base is None
        assert not any(np.shares_memory(rows.obs, a.frame[0]) for a in answers)
        if step == 1:
            kept = rows.obs
    np.testing.assert_array_equal(kept, expected([answer(n, 10 + k) for k, n in enumerate(sizes)])["obs"])
    assert joiner.joins == 3   # every step after the first joined its other columns by the plan


class Counted:
    """A :class:`~shmpool.distributed._frames.JoinPlan` that counts its joins."""

    def __init__(self, plan) -> None:
        assert plan is not None
        self.plan, self.joins = plan, 0

    def join(self, bodies):
        self.joins += 1
        return self.plan.join(bodies)


def test_an_answer_of_another_layout_is_read_whole_and_the_next_step_reads_it_into_place(pools):
    """An info key that appears changes one pool's layout: that answer is read whole (its target untouched), the
    rows are still right, and from the next step on the new layout is read into place."""
    sizes = [4, 4, 4]
    targets = StepTargets(rows_of(sizes))
    targets.join(pools.step([None] * 3, [answer(4, k) for k in range(3)]))
    aimed = targets.targets()
    sentinel = [t.into.copy() for t in aimed]
    blocks = [answer(4, 20), answer(4, 21, keys=("lives", "episode")), answer(4, 22)]
    with_episode = pools.step(aimed, [blocks[0], blocks[1], blocks[2]])
    assert [t.filled for t in aimed] == [True, False, True]
    np.testing.assert_array_equal(aimed[1].into, sentinel[1])   # the declined target was not written
    # pool 1's rows carry "episode": the join is numpy's, keys merged as merge_infos merges them
    rows = targets.join(with_episode)
    np.testing.assert_array_equal(rows.obs, np.concatenate([b.obs for b in blocks]))
    np.testing.assert_array_equal(rows.rew, np.concatenate([b.rew for b in blocks]))
    np.testing.assert_array_equal(rows.infos["episode"][4:8], blocks[1].infos["episode"])
    aimed = targets.targets()
    blocks = [answer(4, 30), answer(4, 31, keys=("lives", "episode")), answer(4, 32)]
    answers = pools.step(aimed, blocks)
    assert [t.filled for t in aimed] == [True, True, True]
    assert targets.joiner is None   # the pools' info keys differ: the rest is joined the general way
    rows = targets.join(answers)
    np.testing.assert_array_equal(rows.obs, np.concatenate([b.obs for b in blocks]))
    np.testing.assert_array_equal(rows.rew, np.concatenate([b.rew for b in blocks]))
    np.testing.assert_array_equal(rows.infos["episode"][4:8], blocks[1].infos["episode"])
    aimed = targets.targets()
    blocks = [answer(4, 40), answer(4, 41), answer(4, 42)]   # pool 1 back to the others' keys: read whole, then planned
    answers = pools.step(aimed, blocks)
    assert [t.filled for t in aimed] == [True, False, True]
    assert_joined(targets.join(answers), blocks)
    assert targets.joiner is not None
    aimed = targets.targets()
    blocks = [answer(4, 50), answer(4, 51), answer(4, 52)]
    assert_joined(targets.join(pools.step(aimed, blocks)), blocks)


def test_answers_read_into_place_and_whole_join_alike(pools):
    """A step where one answer was read into place and another whole (or the rows were read before the join):
    joined from their arrays, with the same result."""
    sizes = [4, 6, 5]
    targets = StepTargets(rows_of(sizes))
    targets.join(pools.step([None] * 3, [answer(n, k) for k, n in enumerate(sizes)]))
    aimed = targets.targets()
    blocks = [answer(n, 40 + k) for k, n in enumerate(sizes)]
    answers = pools.step([aimed[0], None, aimed[2]], blocks)
    assert [a.target is not None for a in answers] == [True, False, True]
    assert FramedRows.join_unread(answers) is None   # a targeted frame's body lacks its obs: never joined from it
    assert_joined(targets.join(answers), blocks)
    aimed = targets.targets()
    blocks = [answer(n, 50 + k) for k, n in enumerate(sizes)]
    answers = pools.step(aimed, blocks)
    np.testing.assert_array_equal(answers[1].obs, blocks[1].obs)   # read before the join: a view of the target
    assert_joined(targets.join(answers), blocks)


def test_targets_follow_the_order_of_the_replies_on_one_connection():
    """Two answers arrive in one read: the first goes to the first target, the second (no target) is read whole; and
    a frame under way when a read returns keeps its target for the next read."""
    a, b = socket.socketpair()
    b.setblocking(False)
    inbox = FrameInbox()
    first, second = answer(4, 1), answer(4, 2)
    prefix_source = ch.FrameReader()
    a.sendall(frame_bytes(answer(4, 0)))
    (known,), _ = prefix_source.read_available(b)
    form = AnswerForm.of(known.value, 4)
    assert form is not None
    with a, b:
        into = np.zeros((4, *OBS), np.uint8)
        target = ReadTarget(form.prefix, form.at, into)
        a.sendall(frame_bytes(first) + frame_bytes(second))
        frames, status = inbox.read(b.fileno(), [target, None])
        assert status == 0 and len(frames) == 2 and target.filled
        np.testing.assert_array_equal(into, first.obs)
        got = ch.decode_body(*frames[1])
        np.testing.assert_array_equal(got.value.obs, second.obs)
        # a frame cut in the middle of its obs: the rest is read into the same target on the next call
        into2 = np.zeros_like(into)
        target2 = ReadTarget(form.prefix, form.at, into2)
        data = frame_bytes(second)
        cut = form.at + 16 + 100   # header (16 bytes) + body up to 100 bytes into the obs
        a.sendall(data[:cut])
        assert inbox.read(b.fileno(), [target2]) == ([], 0) and not target2.filled
        a.sendall(data[cut:])
        frames, status = inbox.read(b.fileno(), [target2])
        assert len(frames) == 1 and target2.filled
        np.testing.assert_array_equal(into2, second.obs)


def test_a_read_target_refuses_memory_it_cannot_fill_and_only_empty_observations_are_copied():
    with pytest.raises(ValueError, match="a target's array must be C-contiguous and writable"):
        ReadTarget(b"abc", 16, np.zeros((4, 4), np.uint8)[:, ::2])
    frozen = np.zeros(8, np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="a target's array must be C-contiguous and writable"):
        ReadTarget(b"abc", 16, frozen)
    with pytest.raises(ValueError, match="a target at 2 overlaps its prefix of 3 bytes"):
        ReadTarget(b"abc", 2, np.zeros(8, np.uint8))
    a, b = socket.socketpair()
    with a, b:
        b.setblocking(False)
        small = Rows(np.arange(2), np.zeros((2, 4), np.float32), np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), {})
        a.sendall(frame_bytes(small))
        (got,), _ = ch.FrameReader().read_available(b)
        form = AnswerForm.of(got.value, 2)   # 32 bytes of observations: read into place too (the step in C needs it)
        assert form is not None and form.shape == (2, 4)
        empty = Rows(np.arange(2), np.zeros((2, 0), np.float32), np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), {})
        a.sendall(frame_bytes(empty))
        (got,), _ = ch.FrameReader().read_available(b)
        assert AnswerForm.of(got.value, 2) is None    # no bytes to read into place
        a.sendall(frame_bytes(answer(4, 0)))
        (got,), _ = ch.FrameReader().read_available(b)
        assert AnswerForm.of(got.value, 5) is None    # not the pool's row count: not a step answer of this pool
        assert AnswerForm.of(got.value, 4) is not None


def test_a_target_filled_by_a_frame_that_is_not_rows_makes_that_answer_an_error():
    """Only a Rows answer can have been aimed at: anything else whose bytes matched is that call's error (the
    reader's stream stays usable)."""
    from shmpool.distributed._frames import array_offsets
    request = ch.Request("step", (np.arange(4096, dtype=np.uint8).reshape(4, 1024),))
    data = b"".join(bytes(p) for p in ch.encode(request))
    a, b = socket.socketpair()
    with a, b:
        b.setblocking(False)
        inbox = FrameInbox()
        a.sendall(data)
        ((body, meta_len, count),), _ = inbox.read(b.fileno())
        start = 8 * count + meta_len
        assert type(ch.decode_body(body, meta_len, count)) is ch.Request   # its layout is learnt
        _, layout, _ = ch.LAYOUTS.known(body[8 * count:start].tobytes())
        target = ReadTarget(body[:start].tobytes(), array_offsets(start, layout)[0], np.zeros((4, 1024), np.uint8))
        reader = ch.FrameReader()
        a.sendall(data + frame_bytes(answer(4, 0)))
        (wrong, right), ended = reader.read_available(b, [target, None])
    assert target.filled and ended is None
    assert isinstance(wrong.error, ValueError)
    assert str(wrong.error) == "a frame read into place is a PlainCall, not a Rows answer"
    np.testing.assert_array_equal(right.value.obs, answer(4, 0).obs)


class SocketPools:
    """One socket pair per pool of ``sizes`` envs: the driver's end in a real
    :class:`~shmpool.distributed.channel.Channel`, the other end the test's, which plays the pool's actor."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.pairs = [socket.socketpair() for _ in sizes]
        for driver, actor in self.pairs:
            driver.settimeout(5)
            actor.settimeout(5)
        self.channels = [ch.Channel(driver, ("pool", k)) for k, (driver, _) in enumerate(self.pairs)]

    def close(self) -> None:
        for c, (_, actor) in zip(self.channels, self.pairs):
            c.close()
            actor.close()


class Exchange(SocketPools):
    """Pools answering over socket pairs, and the step's targets learnt from one step read whole: what
    ``read_step`` reads a sync step from."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__(sizes)
        self.targets = StepTargets(rows_of(sizes))
        blocks = [answer(n, k) for k, n in enumerate(sizes)]
        replies = self.send()
        self.answer(blocks)
        assert len(ch.wait(replies, len(replies), 5.0)) == len(replies)
        assert_joined(self.targets.join(ch.Reply.values(replies)), blocks)   # learnt: the next steps have targets
        assert self.targets.joiner is not None

    def send(self) -> list:
        """The step's requests (their bytes are not read: the test answers for the pools)."""
        aimed = self.targets.targets()
        return [c.send_frame([b"step"], t) for c, t in zip(self.channels, aimed)]

    def answer(self, blocks: list, only: list[int] | None = None) -> None:
        for k, block in enumerate(blocks):
            if only is None or k in only:
                self.pairs[k][1].sendall(block if type(block) is bytes else frame_bytes(block))


@pytest.fixture
def exchange():
    e = Exchange([4, 5])
    yield e
    e.close()


def test_a_step_read_in_c_is_joined_from_the_bodies_and_settles_every_reply(exchange):
    for step in range(3):
        replies = exchange.send()
        blocks = [answer(n, 10 * step + k) for k, n in enumerate(exchange.sizes)]
        exchange.answer(blocks)
        rows = read_step(replies, 5.0, exchange.targets.join_read)
        assert_joined(rows, blocks)
        assert all(r.done and r.answer.value is rows for r in replies)
        assert not any(c.pending for c in exchange.channels)
        assert exchange.targets.obs is None   # the step's output handed out, not kept for the next


def test_a_step_that_cannot_be_read_in_c_settles_what_came_as_wait_would(exchange):
    """An error answer, a silent pool, a closed connection, a body longer than its layout: ``read_step`` gives
    None, and every answer that came has settled its reply (read into place or whole) as ``wait`` settles it."""
    replies = exchange.send()
    blocks = [answer(4, 1), ch.Answer(error=KeyError("no such env"))]
    exchange.answer([blocks[0], b"".join(bytes(p) for p in ch.encode(blocks[1]))])
    assert read_step(replies, 5.0, exchange.targets.join_read) is None
    assert replies[0].answer.value.target.filled   # read into its target, then decoded
    np.testing.assert_array_equal(replies[0].answer.value.obs, blocks[0].obs)
    assert isinstance(replies[1].answer.error, KeyError)
    assert exchange.targets.obs is not None   # still the step's: join() takes the decoded answers
    exchange.targets.join([answer(4, 1), answer(5, 2)])

    # pool 1 silent: the slice ends with pool 0's answer settled and pool 1's still pending; its answer, when it
    # comes in two pieces, is read by wait into its target
    replies = exchange.send()
    blocks = [answer(n, 20 + k) for k, n in enumerate(exchange.sizes)]
    exchange.answer(blocks, only=[0])
    start = time.monotonic()
    assert read_step(replies, 0.05, exchange.targets.join_read) is None
    # It waited its 0.05 s slice (less 10 ms for the clock's rounding), and returned: pool 1 never answers here,
    # so a wait past its slice would block for good; 2 s is 40x the slice for a loaded CI.
    assert 0.04 <= time.monotonic() - start < 2
    assert replies[0].done and not replies[1].done and len(exchange.channels[1].pending) == 1
    data = frame_bytes(blocks[1])
    exchange.answer([b"", data[:300]])
    assert ch.wait(replies, 2, 0.05) == [replies[0]]
    exchange.answer([b"", data[300:]])
    assert ch.wait(replies, 2, 5.0) == replies
    assert replies[1].target.filled
    assert_joined(exchange.targets.join(ch.Reply.values(replies)), blocks)

    # a body longer than its layout (the prefix matches): that call's error, the stream intact
    replies = exchange.send()
    blocks = [answer(n, 30 + k) for k, n in enumerate(exchange.sizes)]
    data = bytearray(frame_bytes(blocks[1]))
    meta_len, count, body_len = ch.HEADER.unpack_from(data)
    ch.HEADER.pack_into(data, 0, meta_len, count, body_len + 16)
    exchange.answer([blocks[0], bytes(data) + bytes(16)])
    assert read_step(replies, 5.0, exchange.targets.join_read) is None
    assert str(replies[1].answer.error) == (f"a frame of {body_len + 16} bytes is longer than its arrays' layout "
                                            f"({body_len} bytes)")
    exchange.targets.join([answer(4, 1), answer(5, 2)])

    # an answer of another layout as long as the learnt one (an info key renamed): not read into place, not joined
    # from its body (whose observations are its own), decoded whole
    replies = exchange.send()
    blocks = [answer(4, 35), answer(5, 36, keys=("level",))]
    assert len(frame_bytes(blocks[1])) == len(frame_bytes(answer(5, 36)))
    exchange.answer(blocks)
    assert read_step(replies, 5.0, exchange.targets.join_read) is None
    assert not replies[1].target.filled and list(replies[1].answer.value.infos) == ["level"]
    np.testing.assert_array_equal(replies[1].answer.value.obs, blocks[1].obs)
    exchange.targets.join([answer(4, 1), answer(5, 2)])

    # pool 0's connection closed: its reply lost, pool 1's answer settled
    replies = exchange.send()
    exchange.answer([b"", frame_bytes(answer(5, 41))])
    exchange.pairs[0][1].close()
    assert read_step(replies, 5.0, exchange.targets.join_read) is None
    assert isinstance(replies[0].lost, ch.ChannelClosedError) and replies[1].answer.value is not None


def test_a_step_read_in_c_needs_each_reply_alone_on_its_connection(exchange):
    first = exchange.channels[0].call("echo")   # an answer still pending before the step's
    replies = exchange.send()
    exchange.answer([answer(4, 1), answer(5, 2)])
    start = time.monotonic()
    assert read_step(replies, 5.0, exchange.targets.join_read) is None
    # Handed back at once, nothing read: a wait for the replies would take up to its 5 s (1 s: 5x under that).
    assert time.monotonic() - start < 1 and not any(r.done for r in replies + [first])


def test_a_signal_during_a_step_read_in_c_settles_what_was_read_before_it_raises(exchange):
    replies = exchange.send()
    blocks = [answer(4, 1), answer(5, 2)]
    exchange.answer(blocks, only=[0])

    def interrupt(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            read_step(replies, 5.0, exchange.targets.join_read)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert replies[0].done and replies[0].answer.value.target.filled
    np.testing.assert_array_equal(replies[0].answer.value.obs, blocks[0].obs)
    assert not replies[1].done and len(exchange.channels[1].pending) == 1


def test_collect_waits_one_slice_in_all_for_a_pool_that_does_not_answer(exchange):
    """``collect``'s read in C and its wait after it share one slice: a silent pool is the caller's to watch after
    ``timeout``, not twice that."""
    replies = exchange.send()
    exchange.answer([answer(4, 1)], only=[0])
    start = time.monotonic()
    timeout = 0.5
    assert exchange.targets.collect(replies, timeout) is None
    # One slice (less 20 ms for the clock's rounding), not two: two slices take 2 x timeout at the least, so
    # the upper bound fails on them however loaded the machine, and leaves a loaded CI 0.5 s over one slice.
    assert timeout - 0.02 <= time.monotonic() - start < 2 * timeout
    assert replies[0].done and not replies[1].done
