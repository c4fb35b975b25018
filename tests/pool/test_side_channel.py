"""Side messages (non-numeric infos, tracebacks) stay paired with their step after a
parent-side error while collecting (issue 12, bug 1: stale infos for good)."""
import functools

import numpy as np
import pytest
from envs import CounterEnv
from shmpool.workers import loop

import shmpool
from shmpool import protocol as P
from shmpool.hosted_shard import local_pipe


def _pool(num_workers: int, **kwargs) -> shmpool.Pool:
    # Env 0's second step puts 2**70 in its info: the parent cannot batch it and raises
    # while env 1's side message (its "tag") is still unread.
    return shmpool.Pool([functools.partial(CounterEnv, big_at=2), CounterEnv], num_workers=num_workers, **kwargs)


def _check_paired(obs, infos, n):
    assert obs[:, 0].tolist() == [n, n]
    assert list(infos["tag"]) == [f"t{n}", f"t{n}"]


@pytest.mark.parametrize("num_workers", [1, 2])
def test_sync_steps_after_an_info_error_pair_obs_and_infos(num_workers):
    with _pool(num_workers) as pool:
        pool.reset()
        obs, _, _, _, infos = pool.step(np.zeros(2, np.int64))
        _check_paired(obs, infos, 1)
        with pytest.raises(OverflowError):
            pool.step(np.zeros(2, np.int64))
        for n in (3, 4):
            obs, _, _, _, infos = pool.step(np.zeros(2, np.int64))
            _check_paired(obs, infos, n)
        obs, infos = pool.reset()
        assert list(infos["tag"]) == ["t0", "t0"]


@pytest.mark.parametrize("num_workers", [1, 2])
def test_async_recv_after_an_info_error_pairs_obs_and_infos(num_workers):
    with _pool(num_workers, batch_size=2) as pool:
        pool.async_reset()
        _, _, _, _, infos = pool.recv()
        ids = infos["env_id"]
        pool.send(np.zeros(2, np.int64), ids)
        obs, _, _, _, infos = pool.recv()
        assert obs[:, 0].tolist() == [1, 1] and list(infos["tag"]) == ["t1", "t1"]
        pool.send(np.zeros(2, np.int64), infos["env_id"])
        with pytest.raises(OverflowError):
            pool.recv()
        for n in (3, 4):
            pool.send(np.zeros(2, np.int64), np.arange(2))
            obs, _, _, _, infos = pool.recv()
            _check_paired(obs, infos, n)


def test_a_shard_in_this_process_hands_its_side_messages_over_unencoded(monkeypatch):
    # Nothing crosses a process, so the envelope is not pickled (its values stay packed blobs):
    # the infos are what a worker process would send, for less.
    encoded = []
    real = P.encode_for_parent
    monkeypatch.setattr(loop.P, "encode_for_parent", lambda msg: encoded.append(type(msg)) or real(msg))
    with shmpool.Pool([CounterEnv, CounterEnv], num_workers=1, parent_shard=True) as pool:
        pool.reset()
        encoded.clear()
        obs, _, _, _, infos = pool.step(np.zeros(2, np.int64))
        _check_paired(obs, infos, 1)
    assert P.Extra not in encoded


def test_the_in_process_pipe_gives_back_side_messages_and_refuses_anything_else():
    parent, shard = local_pipe()
    extra = P.Extra(3, P.pack({"tag": "t1"}))
    shard.send_message(extra)
    shard.send_bytes(P.encode_for_parent(P.Ready()))
    assert P.receive(parent) is extra
    assert type(P.receive(parent)) is P.Ready
    shard.send_message(P.Ready())
    with pytest.raises(P.ProtocolError, match="unexpected side-channel message Ready"):
        P.receive(parent)
