"""A sync step's answers read straight into its output (shmpool.distributed.batches.StepOutput over the direct
connections' frames, shmpool.distributed.wire.Landing): two pools' channels over socket pairs, answered by hand.
Whatever lands, the step's rows equal the copying join of the answers sent (dtypes and shapes included), every
output is fresh, and a layout that changed (an info key that comes or goes, a dtype, a shape, a renamed key of the
same length, a pool rebuilt, a lost connection) is never read as the old one."""
from __future__ import annotations

import copy
import socket

import numpy as np
import pytest

from shmpool.distributed.batches import Rows, StepOutput
from shmpool.distributed.channel import Answer, Channel, wait
from shmpool.distributed.wire import encode, send_parts

SIZES = (3, 2)


def answer(n: int, step: int, pool: int, **infos) -> Rows:
    """Pool ``pool``'s rows at ``step``: every value says where it came from; Pong-like infos unless given."""
    base = 1000 * step + 100 * pool
    ids = np.arange(n, dtype=np.int64)
    obs = (base + np.arange(n * 2 * 4).reshape(n, 2, 4)).astype(np.uint8)
    if not infos:
        infos = {"lives": base + ids, "_lives": np.ones(n, bool), "frame": (base + ids) * 4, "_frame": ids % 2 == 0}
    return Rows(ids, obs, base + ids / 2, ids % 2 == 0, ids % 3 == 0, infos)


class Pools:
    """Two pools' direct connections; each step's answers are sent by the test."""

    def __init__(self) -> None:
        self.pairs = [socket.socketpair() for _ in SIZES]
        self.channels = []
        for k, (driver, actor) in enumerate(self.pairs):
            driver.settimeout(5)
            actor.setblocking(False)
            self.channels.append(Channel(driver, ("pool", k)))
        starts = np.cumsum((0, *SIZES))
        self.output = StepOutput([slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])])

    def step(self, answers: list) -> tuple[Rows, list]:
        """One step: the requests out, the replies aimed, ``answers`` sent (None: the connection closes); the joined
        rows and the replies."""
        replies = [ch.call("step", np.zeros(n)) for ch, n in zip(self.channels, SIZES)]
        self.output.aim(replies)
        for (_, actor), rows in zip(self.pairs, answers):
            while True:   # the requests are not looked at
                try:
                    actor.recv(1 << 16)
                except BlockingIOError:
                    break
            if rows is None:
                actor.close()
            else:
                actor.setblocking(True)
                send_parts(actor, encode(Answer(rows)))
                actor.setblocking(False)
        assert len(wait(replies, len(replies), 5)) == len(replies)
        parts = [r.answer.value if r.lost is None else answer(n, 99, k) for k, (r, n) in enumerate(zip(replies, SIZES))]
        return self.output.join(parts), replies

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        for pair in self.pairs:
            for s in pair:
                s.close()


@pytest.fixture
def pools():
    p = Pools()
    yield p
    p.close()


def assert_same(got, want, where: str = "") -> None:
    """Equal values of the same structure, dtypes and shapes."""
    assert type(got) is type(want), where
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for key in want:
            assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        np.testing.assert_array_equal(got, want, err_msg=where)
    else:
        assert got == want, where


def assert_joined(got: Rows, sent: list) -> None:
    want = Rows.join(copy.deepcopy(sent))
    for field in ("ids", "obs", "rew", "term", "trunc", "infos"):
        assert_same(getattr(got, field), getattr(want, field), field)


def test_answers_of_one_layout_land_in_a_fresh_output_each_step(pools):
    """From the second step on, both answers land: the output is the step's rows (nothing joined), equal to the
    copying join, and no later step writes an output already returned."""
    kept = []
    for step in range(5):
        sent = [answer(n, step, k) for k, n in enumerate(SIZES)]
        rows, replies = pools.step(sent)
        assert_joined(rows, sent)
        assert [r.landed() is not None for r in replies] == [step > 0] * 2
        kept.append((rows, sent))
    for rows, sent in kept:
        assert_joined(rows, sent)
    outputs = [leaf for rows, _ in kept for leaf in (rows.obs, rows.rew, rows.infos["lives"])]
    assert not any(np.shares_memory(a, b) for i, a in enumerate(outputs) for b in outputs[i + 1:])


def _changed(n: int, step: int, pool: int, change: str) -> Rows:
    rows = answer(n, step, pool)
    if change == "a key comes":
        rows.infos.update(episode=np.full(n, 7.5), _episode=np.ones(n, bool))
    elif change == "a key goes":
        del rows.infos["frame"], rows.infos["_frame"]
    elif change == "a dtype of the same size":   # same frame length: only the pickle's bytes differ
        rows.infos["lives"] = rows.infos["lives"].astype(np.float64)
    elif change == "a dtype of another size":
        rows.infos["lives"] = rows.infos["lives"].astype(np.int32)
    elif change == "a key renamed, same length":
        rows.infos["lifes"] = rows.infos.pop("lives")
    elif change == "a row shape":
        rows.obs = np.ascontiguousarray(rows.obs.reshape(n, 4, 2))
    elif change == "an object column":   # pickled in band
        rows.infos["lives"] = np.array([f"x{i}" for i in range(n)], dtype=object)
    return rows


CHANGES = ["a key comes", "a key goes", "a dtype of the same size", "a dtype of another size",
           "a key renamed, same length", "a row shape", "an object column"]


@pytest.mark.parametrize("change, in_pools", [(c, p) for c in CHANGES for p in [(1,), (0, 1)]
                                              if (c, p) != ("a row shape", (1,))])   # no join: no pool answers so
def test_a_layout_that_changes_is_decoded_and_joined_then_lands_again(pools, change, in_pools):
    """A changed layout in one or both pools is read as what it is (decoded, joined by copying: equal to the join of
    what was sent); while it lasts it lands again when both pools keep one layout that joins by concatenation (learnt
    anew), and going back is read right too."""
    landed = []
    for step in range(7):
        changed = 2 <= step < 5
        sent = [_changed(n, step, k, change) if changed and k in in_pools else answer(n, step, k)
                for k, n in enumerate(SIZES)]
        rows, replies = pools.step(sent)
        assert_joined(rows, sent)
        landed.append(all(r.landed() is not None for r in replies))
    again = in_pools == (0, 1) and change != "an object column"   # one pool changed: filled or promoted columns
    assert landed == [False, True, False, again, again, False, True]


def test_a_rebuilt_pool_s_rows_or_a_lost_connection_are_joined_and_not_learnt(pools):
    """A pool whose rows came otherwise than through its reply (rebuilt: its restart rows) or whose connection was
    lost: the step is joined from the rows given, nothing is aimed at the next step."""
    pools.step([answer(n, 0, k) for k, n in enumerate(SIZES)])
    rows, replies = pools.step([answer(SIZES[0], 1, 0), None])
    assert replies[1].lost is not None and replies[0].landed() is not None
    assert_joined(rows, [answer(SIZES[0], 1, 0), answer(SIZES[1], 99, 1)])
    assert pools.output.plan is None
