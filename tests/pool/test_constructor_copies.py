"""Each env gets its own copy of what its constructor captured, as under AsyncVectorEnv.

AsyncVectorEnv sends every constructor to its own process, so ``[lambda: Env(space)] * 3`` gives
each env a private ``space`` (and its random generator).  shmpool runs several envs per worker and
one shard in the trainer's process (``parent_shard``); these tests check that those envs do not
share the captured object either: the same trajectories as AsyncVectorEnv, seeded the same way."""
from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv

import shmpool
from shmpool.vector import VectorEnv

NUM_ENVS = 4
STEPS = 4


class SpaceSampler(gym.Env):
    """Observes samples of the space its constructor was given; ``reset(seed=s)`` seeds that space."""

    action_space = spaces.Discrete(2)

    def __init__(self, space: spaces.Space) -> None:
        self.observation_space = space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def text_space() -> spaces.Space:
    return spaces.Text(max_length=6, min_length=6)


def box_space() -> spaces.Space:
    return spaces.Box(0, 1000, (3,), np.int64)


def shared_constructors(space: spaces.Space) -> list:
    # One closure repeated: every env's constructor captures the very same space object.
    return [lambda: SpaceSampler(space)] * NUM_ENVS


def observed(obs) -> list:
    """One step's observations as plain values (a Pool's arrays are views it overwrites next step)."""
    return [o.tolist() if isinstance(o, np.ndarray) else o for o in obs]


def trajectory(env) -> list:
    obs, _ = env.reset(seed=7)
    rows = [observed(obs)]
    for _ in range(STEPS):
        obs, *_ = env.step(np.zeros(NUM_ENVS, dtype=np.int64))
        rows.append(observed(obs))
    return rows


FACES = {
    # Two workers for four envs: envs 0 and 1 share worker 0, envs 2 and 3 worker 1.
    "Pool": lambda fns: shmpool.Pool(fns, num_workers=2, parent_shard=False),
    "VectorEnv": lambda fns: VectorEnv(fns, num_workers=2, parent_shard=False),
    # The last shard (envs 2 and 3) is stepped in this process.
    "Pool parent_shard": lambda fns: shmpool.Pool(fns, num_workers=2, parent_shard=True),
}


@pytest.mark.parametrize("make_space", [text_space, box_space], ids=["Text", "Box"])
@pytest.mark.parametrize("face", list(FACES))
def test_envs_of_one_worker_sample_as_under_async_vector_env(face, make_space, no_leaks):
    ref = AsyncVectorEnv(shared_constructors(make_space()), shared_memory=False)
    try:
        expected = trajectory(ref)
    finally:
        ref.close()
    # The envs' samples differ from each other (else sharing could not show).
    assert len({str(o) for o in expected[1]}) == NUM_ENVS
    space, twin = make_space(), make_space()
    space.seed(123)
    twin.seed(123)
    with FACES[face](shared_constructors(space)) as env:
        got = trajectory(env)
    assert got == expected
    # The trainer's own object was neither reseeded nor sampled by the envs (AsyncVectorEnv's never is).
    assert np.asarray(space.sample()).tolist() == np.asarray(twin.sample()).tolist()


class _ByReference(gym.Env):
    """A class pickled by reference: unpickling it again gives the same object."""


def test_a_constructor_found_by_reference_is_unpickled_twice_not_once_per_env(monkeypatch):
    from shmpool import constructors

    loads = []
    real = constructors.cloudpickle.loads
    monkeypatch.setattr(constructors.cloudpickle, "loads", lambda blob: loads.append(1) or real(blob))
    space = spaces.Box(0, 1, (2,))
    closures = [lambda: SpaceSampler(space)] * 50
    by_reference = [_ByReference] * 50
    packed = pickle.loads(pickle.dumps(constructors.ShardConstructors.pack(closures + by_reference)))
    fns = packed.unpack()
    assert len(loads) == 50 + 2
    assert len({id(f) for f in fns[:50]}) == 50     # each closure its own copy (and its own space)
    assert all(f is _ByReference for f in fns[50:])


def test_a_constructor_is_pickled_once_for_every_shard():
    """The trainer keeps one blob per constructor (for restarts and the hosted shard), not one per shard:
    a captured 100 MB array cost 100 MB more in the trainer for each worker."""
    from shmpool.constructors import ShardConstructors
    big = np.zeros(1000)
    fns = [lambda: SpaceSampler(spaces.Box(0, 1, (1,))) if big is not None else None] * 4
    blobs: dict = {}
    first, second = ShardConstructors.pack(fns[:2], blobs=blobs), ShardConstructors.pack(fns[2:], blobs=blobs)
    assert first.per_env[0] is first.per_env[1] is second.per_env[0] is second.per_env[1]
    assert len(blobs) == 1


class LockedCartPole(gym.Wrapper):
    """CartPole built under a lock the trainer holds between builds, logging to a file it opened."""

    def __init__(self, lock, log):
        with lock:
            log.write("built\n")
            log.flush()
        super().__init__(gym.make("CartPole-v1"))


@pytest.mark.parametrize("parent_shard", [False, True], ids=["workers", "parent_shard"])
def test_a_constructor_that_cannot_be_pickled_is_inherited_as_async_vector_env_inherits_it(parent_shard, tmp_path,
                                                                                         no_leaks):
    """A constructor capturing a lock and an open file: AsyncVectorEnv (fork) takes it, and so does a pool whose
    workers are forked (each worker inherits it as fork leaves it; a hosted shard uses the trainer's own);
    trajectories equal AsyncVectorEnv's.  Without fork nothing can inherit it: a TypeError says so."""
    import multiprocessing
    import threading
    lock, log = threading.Lock(), open(tmp_path / "log.txt", "w")
    fns = [lambda: LockedCartPole(lock, log)] * NUM_ENVS
    ref = AsyncVectorEnv(fns, context="fork")
    try:
        expected = trajectory(ref)
    finally:
        ref.close()
    before = (tmp_path / "log.txt").read_text().count("built")
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard, start_method="fork") as pool:
        assert trajectory(pool) == expected
    log.close()
    assert (tmp_path / "log.txt").read_text().count("built") - before == NUM_ENVS   # each env, through the file
    if "forkserver" in multiprocessing.get_all_start_methods():
        with pytest.raises(TypeError, match=r"^env constructor <function .*> cannot be pickled \(TypeError: "
                                            r"cannot pickle '_thread.lock' object\); the workers are not forked"):
            shmpool.Pool(fns, num_workers=2, parent_shard=False, start_method="forkserver")
