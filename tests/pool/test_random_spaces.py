"""Pools over randomly generated spaces round-trip exactly what SyncVectorEnv returns."""
import copy

import gymnasium as gym
import numpy as np
import pytest
from compare import tree_equal
from gymnasium import spaces

import shmpool

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

BOX_DTYPES = [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.float16, np.float32,
              np.float64]


@st.composite
def leaf_space(draw):
    kind = draw(st.sampled_from(["box", "discrete", "multidiscrete", "multibinary"]))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=3)))
    if kind == "box":
        dtype = np.dtype(draw(st.sampled_from(BOX_DTYPES)))
        if dtype.kind == "f":
            return spaces.Box(-2.0, 2.0, shape, dtype)
        return spaces.Box(0, 9, shape, dtype)
    if kind == "discrete":
        return spaces.Discrete(draw(st.integers(1, 5)), start=draw(st.integers(-3, 3)))
    if kind == "multidiscrete":
        return spaces.MultiDiscrete(np.full(shape or (2,), draw(st.integers(2, 4))))
    return spaces.MultiBinary(shape or 3)


def nested(leaf):
    return st.recursive(
        leaf,
        lambda children: st.one_of(
            st.dictionaries(st.sampled_from("abcd"), children, min_size=1, max_size=3).map(spaces.Dict),
            st.lists(children, min_size=1, max_size=3).map(lambda xs: spaces.Tuple(tuple(xs))),
        ),
        max_leaves=5,
    )


class SampledEnv(gym.Env):
    """Observations sampled from its space with its own seeded generator; infos with varied types."""

    def __init__(self, obs_space, act_space):
        # Own copies: SyncVectorEnv's envs share one process, and a shared space
        # would share its sampling generator between envs.
        self.observation_space = copy.deepcopy(obs_space)
        self.action_space = copy.deepcopy(act_space)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        return self.observation_space.sample(), {"t": self.t}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        r = float(self.np_random.normal())
        info = {"t": self.t, "u8": np.uint8(self.t % 7), "f32": np.float32(r)}
        if self.t % 2:
            info["name"] = f"s{self.t}"
        return self.observation_space.sample(), r, self.t % 5 == 0, False, info


def round_trip(obs_space, act_space, n: int, seed: int) -> None:
    """A pool and SyncVectorEnv over ``SampledEnv(obs_space, act_space)`` agree on a reset and 6 steps."""
    def make():
        return SampledEnv(obs_space, act_space)

    ref = gym.vector.SyncVectorEnv([make] * n)
    with shmpool.Pool(make, n, num_workers=min(2, n)) as pool:
        tree_equal(ref.reset(seed=seed)[0], pool.reset(seed=seed)[0])
        batch = gym.vector.utils.batch_space(act_space, n)
        batch.seed(seed)
        for t in range(6):
            act = batch.sample()
            r, p = ref.step(act), pool.step(act)
            for field, x, y in zip(("obs", "reward", "terminated", "truncated", "infos"), r, p):
                tree_equal(x, y, f"{field} at step {t}")
    ref.close()


def test_every_leaf_kind_round_trips():
    # The fast part's example of the drawn spaces below: every Box dtype and leaf kind, nested both ways,
    # in one pool.
    leaves = [spaces.Box(-2.0, 2.0, (2,), d) if np.dtype(d).kind == "f" else spaces.Box(0, 9, (3, 1), d)
              for d in BOX_DTYPES]
    leaves += [spaces.Discrete(5, start=-3), spaces.MultiDiscrete(np.full((2, 2), 3)), spaces.MultiBinary((2, 3)),
               spaces.Box(0, 9, (), np.int32)]
    obs_space = spaces.Dict({"a": spaces.Tuple(tuple(leaves[:7])), "b": spaces.Dict({"c": spaces.Tuple(tuple(
        leaves[7:]))})})
    act_space = spaces.Tuple((spaces.Discrete(3), spaces.Dict({"x": spaces.Box(-1.0, 1.0, (2,), np.float32),
                                                              "y": spaces.MultiBinary(2)})))
    round_trip(obs_space, act_space, n=3, seed=7)


@pytest.mark.slow   # 25 pools over drawn spaces (~8 s); the fast part's example: test_every_leaf_kind_round_trips
@hypothesis.settings(max_examples=25, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(obs_space=nested(leaf_space()), act_space=nested(leaf_space()),
                  n=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_random_spaces_round_trip(obs_space, act_space, n, seed):
    round_trip(obs_space, act_space, n, seed)
