"""Comparing a pool's outputs with a reference's (gymnasium's SyncVectorEnv): trees of arrays compared
leaf by leaf, seeded actions, one env's row of a batch, and a send()/recv() round gathered per env.
Shared by the tests of several rooms (pool, faces)."""
import gymnasium as gym
import numpy as np


def tree_equal(a, b, path="obs"):
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            tree_equal(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            tree_equal(x, y, f"{path}[{i}]")
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} vs {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {a.shape} vs {b.shape}"
        if a.dtype == object and a.ndim == 0:   # one object (None, a string, an env's own value)
            assert a.item() == b.item(), f"{path}: {a.item()!r} vs {b.item()!r}"
        elif a.dtype == object:
            for i, (x, y) in enumerate(zip(a, b)):
                if x is None or y is None or isinstance(x, str):
                    assert x == y, f"{path}[{i}]: {x!r} vs {y!r}"
                else:
                    tree_equal(x, y, f"{path}[{i}]")
        else:
            np.testing.assert_array_equal(a, b, err_msg=path)


def actions_for(space, n, steps, seed=123):
    space = gym.vector.utils.batch_space(space, n)
    space.seed(seed)
    return [space.sample() for _ in range(steps)]


def gather_async(pool, n, actions, batch):
    """send() every env, recv() in batches; returns per-env results and checks each id once."""
    pool.send(actions)
    seen = []
    results = {}
    for _ in range(n // batch):
        obs, rew, term, trunc, infos = pool.recv()
        ids = infos["env_id"]
        assert ids.dtype == np.int32 and len(ids) == batch
        for row, env_id in enumerate(ids):
            results[int(env_id)] = (
                env_row(obs, row), rew[row], term[row], trunc[row],
                info_row(infos, row))
        seen.extend(ids.tolist())
    assert sorted(seen) == list(range(n)), "every env must be received exactly once per send"
    return results


def info_row(infos, i):
    return {k: info_row(v, i) if isinstance(v, dict) else v[i] for k, v in infos.items() if k != "env_id"}


def env_row(obs, i):
    if isinstance(obs, dict):
        return {k: env_row(v, i) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(env_row(v, i) for v in obs)
    return obs[i]
