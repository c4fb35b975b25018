"""The fallback lane: Text, Sequence, Graph, OneOf and custom spaces travel pickled.

The reference is gymnasium's ``AsyncVectorEnv`` (``shared_memory=False``: Sequence
and Graph have no shared-memory form there either); each test runs the same
facts over it and ``shmpool.VectorEnv``.  The envs echo their actions into their
observations, so equal observations also show the actions arrived unchanged.
"""
from __future__ import annotations

import os
import signal
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.spaces import GraphInstance
from gymnasium.vector import AutoresetMode

import shmpool

N = 4


class Bag(spaces.Space):
    """A custom space: frozensets of small ints (no shape, no dtype)."""

    def __init__(self, seed=None):
        super().__init__(None, None, seed)

    def sample(self, mask=None, probability=None):
        return frozenset(self.np_random.integers(0, 9, size=int(self.np_random.integers(0, 4))).tolist())

    def contains(self, x):
        return isinstance(x, frozenset)

    def __eq__(self, other):
        return isinstance(other, Bag)


class EchoEnv(gym.Env):
    """Samples its observations from its own space (reseeded from ``np_random`` at each
    reset, so unseeded autoresets stay reproducible); ``echo(obs, action)`` puts the
    action into the observation.  Episodes last 2-4 steps."""

    def __init__(self, obs_space, act_space, echo):
        self.observation_space, self.action_space, self.echo = obs_space, act_space, echo

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.left = int(self.np_random.integers(2, 5))
        return self.observation_space.sample(), {}

    def step(self, action):
        self.left -= 1
        obs = self.echo(self.observation_space.sample(), action)
        return obs, float(self.np_random.random()), False, self.left <= 0, {}


def dict_env():
    obs = spaces.Dict({"box": spaces.Box(-1, 1, (3,), np.float32), "text": spaces.Text(12),
                       "seq": spaces.Sequence(spaces.Box(0, 5, (2,), np.int64))})
    act = spaces.Dict({"move": spaces.Discrete(3), "say": spaces.Text(5)})
    return EchoEnv(obs, act, lambda o, a: {**o, "text": f"{a['say']}{a['move']}"})


def graph_env():
    obs = spaces.Graph(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(4))
    act = spaces.Box(-1, 1, (3,), np.float32)
    return EchoEnv(obs, act, lambda o, a: GraphInstance(o.nodes + a, o.edges, o.edge_links))


def oneof_env():
    sub = spaces.OneOf((spaces.Discrete(5), spaces.Box(-1, 1, (2,), np.float32)))
    return EchoEnv(sub, sub, lambda o, a: a)


def custom_env():
    return EchoEnv(Bag(), Bag(), lambda o, a: o | a)


ENVS = {"dict": dict_env, "graph": graph_env, "oneof": oneof_env, "custom": custom_env}


def exactly_equal(a, b, path="obs") -> None:
    """Same structure, types, dtypes and values (a GraphInstance is not just any tuple)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            exactly_equal(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), f"{path}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            exactly_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        np.testing.assert_array_equal(a, b, err_msg=path)
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def make_vec(kind: str, fn, mode=AutoresetMode.NEXT_STEP):
    if kind == "gymnasium":
        return gym.vector.AsyncVectorEnv([fn] * N, shared_memory=False, autoreset_mode=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return shmpool.VectorEnv([fn] * N, num_workers=2, autoreset_mode=mode)


def run(kind: str, name: str, mode=AutoresetMode.NEXT_STEP, steps: int = 12):
    """A seeded run with autoresets (DISABLED: partial resets of the envs that ended):
    every observation, reward and flag (SAME_STEP: and each final observation)."""
    env = make_vec(kind, ENVS[name], mode)
    try:
        assert env.observation_space == gym.vector.utils.batch_space(env.single_observation_space, N)
        env.action_space.seed(7)
        out = [env.reset(seed=3)[0]]
        for _ in range(steps):
            actions = env.action_space.sample()
            obs, rew, term, trunc, infos = env.step(actions)
            out.append((actions, obs, rew, term, trunc))
            ended = term | trunc
            if mode == AutoresetMode.SAME_STEP:
                out.append(tuple(infos["final_obs"][i] for i in np.flatnonzero(ended)))
            if mode == AutoresetMode.DISABLED and ended.any():
                out.append(env.reset(options={"reset_mask": ended})[0])
        return out
    finally:
        env.close()


@pytest.mark.parametrize("name", list(ENVS))
@pytest.mark.parametrize("kind", ["gymnasium", "shmpool"])
def test_observations_equal_async_vector_env(kind, name):
    """For both: the run equals a fresh AsyncVectorEnv run, autoresets included."""
    reference = run("gymnasium", name)
    got = run(kind, name)
    assert any(t[4].any() for t in got[1:]), "the run should cross an autoreset"
    exactly_equal(got, reference, "run")


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
@pytest.mark.parametrize("kind", ["gymnasium", "shmpool"])
def test_other_autoreset_modes_equal_async_vector_env(kind, mode):
    """SAME_STEP (final observations in the infos) and DISABLED with partial resets, which
    leave the other envs' pickled values as they were."""
    exactly_equal(run(kind, "dict", mode), run("gymnasium", "dict", mode), "run")


@pytest.mark.parametrize("kind", ["gymnasium", "shmpool"])
def test_actions_reach_the_env_unchanged(kind):
    """The Dict env echoes ``say`` and ``move`` into ``obs['text']``, except on the
    autoreset step (NEXT_STEP: that step resets, its action is not used)."""
    env = make_vec(kind, dict_env)
    try:
        env.reset(seed=0)
        ended = np.zeros(N, bool)
        for t in range(8):
            says = tuple(f"{t}{i}x"[: 5] for i in range(N))
            moves = np.arange(N) % 3
            obs, _, term, trunc, _ = env.step({"move": moves, "say": says})
            assert type(obs["text"]) is tuple and len(obs["text"]) == N
            for i in range(N):
                if not ended[i]:
                    assert obs["text"][i] == f"{says[i]}{moves[i]}"
            ended = term | trunc
    finally:
        env.close()


def test_warning_names_the_slow_leaves():
    with pytest.warns(UserWarning) as record:
        env = shmpool.VectorEnv([dict_env] * 2, num_workers=1)
    env.close()
    messages = [str(w.message) for w in record if "shared memory" in str(w.message)]
    assert len(messages) == 1, messages
    assert "obs['text'] (Text)" in messages[0]
    assert "obs['seq'] (Sequence)" in messages[0]
    assert "action['say'] (Text)" in messages[0]
    assert "obs['box']" not in messages[0] and "action['move']" not in messages[0]


def test_no_warning_when_everything_is_shared():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        env = shmpool.VectorEnv("CartPole-v1", 2, num_workers=1)
    env.close()


def twins(fn, seed):
    """One in-process env per pool env, reset the way the pool resets them."""
    envs = [fn() for _ in range(N)]
    return envs, [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]


def twin_step(env, obs_action_ended):
    """What a NEXT_STEP vector env does with one env: reset after an ending step."""
    action, ended = obs_action_ended
    if ended:
        obs, _ = env.reset()
        return obs, False
    obs, _, term, trunc, _ = env.step(action)
    return obs, term or trunc


def pick(batch, row):
    """Row ``row`` of a batched Dict observation (arrays indexed, tuples of values picked)."""
    return {k: v[row] for k, v in batch.items()}


def test_pool_async_send_recv_matches_each_env_alone():
    """Pool with batch_size < num_envs: each received row equals that env stepped alone
    with the same actions (the pickled action of each send reaches its env)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pool = shmpool.Pool([dict_env] * N, num_workers=2, batch_size=2, seed=11)
    envs, expected = twins(dict_env, 11)
    ended = [False] * N
    try:
        pool.async_reset()
        rng = np.random.default_rng(0)
        for _ in range(20):
            obs, _, term, trunc, infos = pool.recv()
            ids = infos["env_id"]
            for row, i in enumerate(ids.tolist()):
                exactly_equal(pick(obs, row), expected[i], f"env {i}")
                ended[i] = bool(term[row] or trunc[row])
            moves = rng.integers(0, 3, len(ids))
            says = tuple(f"s{int(m)}{i}" for m, i in zip(moves, ids))
            pool.send({"move": moves, "say": says}, ids)
            for k, i in enumerate(ids.tolist()):
                expected[i], ended[i] = twin_step(envs[i], ({"move": moves[k], "say": says[k]}, ended[i]))
    finally:
        pool.close()


def test_pool_partial_reset_keeps_the_others_pickled_values():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pool = shmpool.Pool([custom_env] * N, num_workers=2, copy=True)
    try:
        before, _ = pool.reset(seed=5)
        stepped, *_ = pool.step(tuple(frozenset({i}) for i in range(N)))
        mask = np.array([True, False, True, False])
        after, _ = pool.reset(seed=[5, None, 7, None], options={"reset_mask": mask})
        assert type(after) is tuple and len(after) == N
        assert after[1] == stepped[1] and after[3] == stepped[3]
        assert after[0] == before[0]          # the same seed again
        assert all(frozenset({i}) <= stepped[i] for i in range(N))   # the actions arrived
    finally:
        pool.close()


def test_pool_restart_keeps_actions_and_observations_paired():
    """A worker killed mid-run is replaced: its envs report the restart, and from then on
    each step's pickled action still reaches its env (versions, not arrival order)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pool = shmpool.Pool([dict_env] * N, num_workers=2, on_worker_error="restart", seed=1)
    try:
        pool.reset()
        say = lambda t: tuple(f"{t}:{i}" for i in range(N))  # noqa: E731
        obs, *_ = pool.step({"move": np.zeros(N, np.int64), "say": say(0)})
        os.kill(pool.worker_pids[1], signal.SIGKILL)
        time.sleep(0.1)
        ended = np.zeros(N, bool)
        restarted_seen = False
        for t in range(1, 8):
            moves = np.full(N, t % 3)
            obs, _, term, trunc, infos = pool.step({"move": moves, "say": say(t)})
            restarted = infos.get("_worker_restarted", np.zeros(N, bool))
            restarted_seen |= bool(restarted.any())
            for i in range(N):
                if not ended[i] and not restarted[i]:
                    assert obs["text"][i] == f"{t}:{i}{t % 3}", (t, i, obs["text"])
            ended = term | trunc
        assert restarted_seen and pool.restarts == 1
    finally:
        pool.close()
