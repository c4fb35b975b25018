"""Side messages (non-numeric infos, tracebacks) stay paired with their step after a
parent-side error while collecting (issue 12, bug 1: stale infos for good)."""
import functools

import numpy as np
import pytest
from envs import CounterEnv

import shmpool


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
