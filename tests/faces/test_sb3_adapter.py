"""ShmVecEnv against SB3's own DummyVecEnv as the reference.

Two kinds of tests: contract tests parametrized over ``kind`` ("dummy", "shm")
that assert the same expected values for both classes, and comparison tests
that drive both with the same seeds and actions and require identical
observations, rewards, dones and info dicts (see ``assert_same`` for what
"identical" means for info scalars).
"""
from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from contextlib import closing

import gymnasium as gym
import heavy_imports
import numpy as np
import pytest
from envs import DictEnv
from gymnasium import spaces

import shmpool

heavy_imports.require("stable_baselines3")
pytestmark = pytest.mark.heavy_imports   # SB3 (and torch) in the test process
_VEC_ENV = "stable_baselines3.common.vec_env"
sb3 = heavy_imports.names(make_vec_env="stable_baselines3.common.env_util",
                          Monitor="stable_baselines3.common.monitor", DummyVecEnv=_VEC_ENV,
                          VecFrameStack=_VEC_ENV, VecMonitor=_VEC_ENV, VecNormalize=_VEC_ENV,
                          ShmVecEnv="shmpool.sb3")

KINDS = ["dummy", "shm"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- envs -----------------------------------------------------------------------


class FlatDictEnv(gym.ObservationWrapper):
    """DictEnv with its nested Tuple split into two keys (SB3 refuses nested spaces), plus a
    side-effecting method to check that env_method touches only the envs it names."""

    def __init__(self, max_len: int = 12):
        super().__init__(DictEnv(max_len))
        inner = self.env.observation_space
        self.observation_space = spaces.Dict({
            "pos": inner["pos"], "count": inner["count"], "flags": inner["flags"],
            "pair0": inner["pair"][0], "pair1": inner["pair"][1],
        })
        self.bumps = 0

    def observation(self, obs):
        return {"pos": obs["pos"], "count": obs["count"], "flags": obs["flags"],
                "pair0": obs["pair"][0], "pair1": obs["pair"][1]}

    def bump(self, k: int = 1) -> int:
        self.bumps += k
        return self.bumps


class TupleEnv(gym.ObservationWrapper):
    """DictEnv seen through a Tuple observation space."""

    def __init__(self):
        super().__init__(DictEnv())
        inner = self.env.observation_space
        self.observation_space = spaces.Tuple((inner["pos"], inner["count"], inner["flags"]))

    def observation(self, obs):
        return (obs["pos"], obs["count"], obs["flags"])


class BoxDictEnv(gym.ObservationWrapper):
    """DictEnv keeping only its Box leaves (VecFrameStack stacks Box leaves only)."""

    def __init__(self):
        super().__init__(DictEnv())
        inner = self.env.observation_space
        self.observation_space = spaces.Dict({"pos": inner["pos"], "pixels": inner["pair"][1]})

    def observation(self, obs):
        return {"pos": obs["pos"], "pixels": obs["pair"][1]}


class PaintEnv(gym.Env):
    """Renders an rgb_array of a colour drawn at reset (no pygame needed)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    observation_space = spaces.Box(0, 255, (3,), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        self.color = np.zeros(3, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.color = self.np_random.integers(0, 256, 3).astype(np.uint8)
        return self.color.copy(), {}

    def step(self, action):
        self.color = (self.color + 1 + action).astype(np.uint8)
        return self.color.copy(), 1.0, False, False, {}

    def render(self):
        return np.broadcast_to(self.color, (6, 8, 3)).copy()


ENVS = {
    "cartpole": functools.partial(gym.make, "CartPole-v1"),
    # short TimeLimit so truncations happen within the test
    "pendulum": functools.partial(gym.make, "Pendulum-v1", max_episode_steps=15),
    "dict": FlatDictEnv,
    "tuple": TupleEnv,
    "boxdict": BoxDictEnv,
}


def make(kind: str, fns):
    if kind == "dummy":
        return sb3.DummyVecEnv(fns)
    return sb3.ShmVecEnv(fns, num_workers=min(2, len(fns)))


# --- comparison helpers -------------------------------------------------------------

# numpy scalar types that gymnasium's batching cannot tell from python scalars
_AMBIGUOUS = (np.bool_, np.int64, np.float64)


def assert_same(ref, got, where="value"):
    """``got`` equals ``ref``: same keys (any order), equal values, same array dtypes/shapes,
    same scalar types except that an np.bool_/np.int64/np.float64 may come back as the
    equal python scalar (ShmVecEnv's documented limit)."""
    if isinstance(ref, dict):
        assert isinstance(got, dict), f"{where}: {type(got)} is not a dict"
        assert set(ref) == set(got), f"{where}: keys {sorted(map(str, ref))} != {sorted(map(str, got))}"
        for k in ref:
            assert_same(ref[k], got[k], f"{where}[{k!r}]")
    elif isinstance(ref, (list, tuple)):
        assert type(got) is type(ref) and len(got) == len(ref), f"{where}: {got!r} vs {ref!r}"
        for k, (a, b) in enumerate(zip(ref, got)):
            assert_same(a, b, f"{where}[{k}]")
    elif isinstance(ref, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: {type(got)} is not an ndarray"
        assert (got.dtype, got.shape) == (ref.dtype, ref.shape), \
            f"{where}: {got.dtype}{got.shape} vs {ref.dtype}{ref.shape}"
        np.testing.assert_array_equal(got, ref, err_msg=where)
    else:
        if isinstance(ref, _AMBIGUOUS):
            assert type(got) in (type(ref), type(ref.item())), f"{where}: {type(got)} vs {type(ref)}"
        else:
            assert type(got) is type(ref), f"{where}: {type(got)} vs {type(ref)}"
        assert got == ref, f"{where}: {got!r} != {ref!r}"


def drop_episode_time(infos):
    """Monitor's episode["t"] is wall time: never equal between two runs."""
    for info in infos:
        if "episode" in info:
            info["episode"].pop("t", None)
    return infos


def random_actions(space: spaces.Space, n: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    space = copy.deepcopy(space)
    space.seed(seed)
    return [np.stack([space.sample() for _ in range(n)]) for _ in range(steps)]


def trajectory(venv, actions, seed=3):
    """Everything a VecEnv returns over a reset and ``actions``, reset_infos included."""
    venv.seed(seed)
    out = [("reset", venv.reset(), copy.deepcopy(venv.reset_infos))]
    for a in actions:
        obs, rew, done, infos = venv.step(a)
        out.append(("step", obs, rew, done, drop_episode_time(infos), copy.deepcopy(venv.reset_infos)))
    return out


def assert_same_trajectories(ref, got):
    assert len(ref) == len(got)
    for t, (a, b) in enumerate(zip(ref, got)):
        assert_same(a, b, f"t={t}")


def dones_and_truncations(traj):
    steps = [x for x in traj if x[0] == "step"]
    dones = sum(int(x[3].sum()) for x in steps)
    truncs = sum(info["TimeLimit.truncated"] for x in steps for info in x[4])
    return dones, truncs


# --- trajectories ---------------------------------------------------------------------


@pytest.mark.parametrize("env", ["cartpole", "pendulum", "dict", "tuple"])
def test_trajectories_match_dummy(env, no_leaks):
    fns = [ENVS[env]] * 3
    with closing(sb3.DummyVecEnv(fns)) as ref, closing(sb3.ShmVecEnv(fns, num_workers=2)) as ours:
        assert ours.observation_space == ref.observation_space
        assert ours.action_space == ref.action_space
        actions = random_actions(ref.action_space, 3, 60)
        expected, got = trajectory(ref, actions), trajectory(ours, actions)
    assert_same_trajectories(expected, got)
    dones, truncs = dones_and_truncations(expected)
    assert dones >= 3, "the trajectory must cross episode ends"
    if env == "pendulum":
        assert truncs == dones  # every Pendulum episode ends by its TimeLimit


def test_step_types(no_leaks):
    with closing(sb3.ShmVecEnv([FlatDictEnv] * 3, num_workers=2)) as venv:
        obs = venv.reset()
        assert isinstance(obs, dict) and list(obs) == list(venv.observation_space.spaces)
        assert obs["count"].dtype == np.int64 and obs["count"].shape == (3,)
        obs2, rew, done, infos = venv.step(np.zeros((3, 2), np.float32))
        assert rew.dtype == np.float32 and done.dtype == bool and isinstance(infos, list) and len(infos) == 3
        # results are fresh arrays, not views the next step overwrites
        before = {k: v.copy() for k, v in obs2.items()}
        venv.step(np.zeros((3, 2), np.float32))
        assert_same(before, dict(obs2))


# --- seeding and options ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_seed_applies_at_next_reset_only(kind, no_leaks):
    with closing(make(kind, [ENVS["cartpole"]] * 3)) as venv:
        assert venv.seed(7) == [7, 8, 9]
        first = venv.reset()
        venv.seed(7)
        np.testing.assert_array_equal(venv.reset(), first)
        assert not np.array_equal(venv.reset(), first)  # seeds are used once
        expected = [gym.make("CartPole-v1").reset(seed=7 + i)[0] for i in range(3)]
        np.testing.assert_array_equal(first, np.stack(expected))


@pytest.mark.parametrize("kind", KINDS)
def test_set_options(kind, no_leaks):
    with closing(make(kind, [FlatDictEnv] * 3)) as venv:
        venv.set_options({"note": "all"})
        venv.reset()
        assert [info.get("note") for info in venv.reset_infos] == ["all"] * 3
        venv.reset()
        assert all("note" not in info for info in venv.reset_infos)  # options are used once
        venv.set_options([{"note": "a"}, {}, {"note": "c"}])
        venv.seed(1)
        venv.reset()
        assert [info.get("note") for info in venv.reset_infos] == ["a", None, "c"]
    with closing(make(kind, [ENVS["cartpole"]] * 2)) as venv:
        venv.set_options({"low": -0.001, "high": 0.001})
        assert np.abs(venv.reset()).max() <= 0.001


def test_seed_and_per_env_options_match_dummy(no_leaks):
    fns = [FlatDictEnv] * 3
    with closing(sb3.DummyVecEnv(fns)) as ref, closing(sb3.ShmVecEnv(fns, num_workers=2)) as ours:
        results = []
        for venv in (ref, ours):
            venv.seed(11)
            venv.set_options([{"note": "a"}, {}, {"note": "c"}])
            results.append((venv.reset(), copy.deepcopy(venv.reset_infos)))
        assert_same(results[0], results[1])


# --- attributes, methods, indices ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_env_method_indices_touch_only_named_envs(kind, no_leaks):
    with closing(make(kind, [FlatDictEnv] * 4)) as venv:
        assert venv.env_method("bump") == [1, 1, 1, 1]
        assert venv.env_method("bump", indices=1) == [2]
        assert venv.env_method("bump", 10, indices=[3, 0]) == [11, 11]
        assert venv.env_method("bump", k=100, indices=-1) == [111]
        assert venv.env_method("bump", indices=range(1, 3)) == [3, 2]
        assert venv.env_method("bump", indices=[]) == []
        assert venv.get_attr("bumps") == [11, 3, 2, 111]
        assert venv.get_attr("bumps", indices=[-4, 2]) == [11, 2]
        # the inner env's method, reached through the wrapper as get_wrapper_attr does
        assert venv.env_method("get_marker", "!", indices=[0]) == ["fresh!"]
        with pytest.raises(IndexError):
            venv.env_method("bump", indices=[4])
        assert venv.get_attr("bumps") == [11, 3, 2, 111]


@pytest.mark.parametrize("kind", KINDS)
def test_set_attr_semantics(kind, no_leaks):
    with closing(make(kind, [FlatDictEnv] * 3)) as venv:
        venv.set_attr("marker", "x", indices=1)
        # SB3 sets on the outermost wrapper: get_attr finds it there, the inner env keeps its own
        assert venv.get_attr("marker") == ["fresh", "x", "fresh"]
        assert venv.env_method("get_marker") == ["fresh"] * 3
        venv.set_attr("marker", ["a", "b"], indices=[0, 2])  # a list is one value, not one per env
        assert venv.get_attr("marker") == [["a", "b"], "x", ["a", "b"]]
        venv.set_attr("bumps", 5)
        assert venv.env_method("bump") == [6, 6, 6]


@pytest.mark.parametrize("kind", KINDS)
def test_errors_keep_their_type(kind, no_leaks):
    with closing(make(kind, [FlatDictEnv] * 2)) as venv:
        with pytest.raises(AttributeError):
            venv.get_attr("no_such_attribute")
        with pytest.raises(AttributeError):
            venv.env_method("no_such_method", indices=0)
        with pytest.raises(TypeError):
            venv.env_method("get_marker", 1)  # "fresh" + 1
        assert not venv.has_attr("no_such_attribute")
        assert venv.has_attr("marker")
        venv.reset()
        venv.step(np.zeros((2, 2), np.float32))  # still usable


def _monitored_cartpole():
    return sb3.Monitor(gym.make("CartPole-v1"))


def _raw_cartpole():
    from gymnasium.envs.classic_control import CartPoleEnv
    return CartPoleEnv()


@pytest.mark.parametrize("kind", KINDS)
def test_env_is_wrapped(kind, no_leaks):
    with closing(make(kind, [_monitored_cartpole, ENVS["cartpole"], _raw_cartpole])) as venv:
        assert venv.env_is_wrapped(sb3.Monitor) == [True, False, False]
        assert venv.env_is_wrapped(gym.wrappers.TimeLimit) == [True, True, False]
        assert venv.env_is_wrapped(sb3.Monitor, indices=-3) == [True]
        assert venv.env_is_wrapped(gym.wrappers.TimeLimit, indices=[2, 1]) == [False, True]


# --- rendering ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_get_images_and_render(kind, no_leaks):
    fns = [functools.partial(PaintEnv, render_mode="rgb_array")] * 2
    with closing(make(kind, fns)) as venv:
        assert venv.render_mode == "rgb_array"
        assert venv.metadata["render_fps"] == 10
        venv.seed(0)
        venv.reset()
        venv.step(np.array([0, 1]))
        images = venv.get_images()
        expected = []
        for i, action in enumerate([0, 1]):
            env = PaintEnv(render_mode="rgb_array")
            env.reset(seed=i)
            env.step(action)
            expected.append(env.render())
        assert_same(expected, list(images))
        tiled = venv.render()
        assert tiled.shape == (12, 8, 3)  # two images, one above the other
        np.testing.assert_array_equal(tiled[6:], expected[1])
    with closing(make(kind, [ENVS["cartpole"]] * 2)) as venv:
        venv.reset()
        with pytest.warns(UserWarning, match="render mode is None"):
            assert venv.get_images() == [None, None]


# --- SB3 VecEnv wrappers on top ----------------------------------------------------------

WRAPPERS = {
    "VecNormalize": ("pendulum", lambda v: sb3.VecNormalize(v, gamma=0.9)),
    "VecFrameStack": ("cartpole", lambda v: sb3.VecFrameStack(v, n_stack=4)),
    "VecFrameStack-dict": ("boxdict", lambda v: sb3.VecFrameStack(v, n_stack=2)),
    "VecMonitor": ("cartpole", lambda v: sb3.VecMonitor(v)),
}


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_vec_wrappers_on_top_match_dummy(name, no_leaks):
    env, wrap = WRAPPERS[name]
    fns = [ENVS[env]] * 3
    with closing(wrap(sb3.DummyVecEnv(fns))) as ref, closing(wrap(sb3.ShmVecEnv(fns, num_workers=2))) as ours:
        actions = random_actions(ref.action_space, 3, 50)
        expected, got = trajectory(ref, actions), trajectory(ours, actions)
    assert_same_trajectories(expected, got)
    assert dones_and_truncations(expected)[0] >= 3
    if name == "VecMonitor":
        assert any("episode" in info for x in got[1:] for info in x[4])


def test_make_vec_env_matches_dummy(no_leaks):
    kwargs = dict(n_envs=3, seed=5)
    with closing(sb3.make_vec_env("CartPole-v1", **kwargs)) as ref, \
            closing(sb3.make_vec_env("CartPole-v1", vec_env_cls=sb3.ShmVecEnv, vec_env_kwargs={"num_workers": 2},
                                 **kwargs)) as ours:
        assert isinstance(ours, sb3.ShmVecEnv) and ours.pool.num_workers == 2
        assert ours.render_mode == ref.render_mode == "rgb_array"
        assert ours.env_is_wrapped(sb3.Monitor) == [True] * 3
        # the action spaces were seeded inside the workers, as make_vec_env does
        assert_same(ref.env_method("get_wrapper_attr", "action_space"),
                    ours.env_method("get_wrapper_attr", "action_space"))
        actions = random_actions(ref.action_space, 3, 60)
        # make_vec_env already called seed(5): reset without reseeding
        expected = [ref.reset()] + [drop_episode_time(ref.step(a)[3]) for a in actions]
        got = [ours.reset()] + [drop_episode_time(ours.step(a)[3]) for a in actions]
    assert_same(expected, got)
    assert any("episode" in info for infos in got[1:] for info in infos)


# --- construction and lifecycle ---------------------------------------------------------


def test_constructor_forms(no_leaks):
    # gymnasium id: non-Pool keyword arguments go to gymnasium.make
    with closing(sb3.ShmVecEnv("CartPole-v1", num_envs=3, num_workers=2, max_episode_steps=4)) as venv:
        venv.reset()
        for _ in range(3):
            _, _, done, _ = venv.step(np.zeros(3, np.int64))
            assert not done.any()
        _, _, done, infos = venv.step(np.zeros(3, np.int64))
        assert done.all() and all(info["TimeLimit.truncated"] for info in infos)
        assert venv.env_is_wrapped(gym.wrappers.TimeLimit) == [True] * 3
    # one callable plus num_envs
    with closing(sb3.ShmVecEnv(FlatDictEnv, num_envs=2, num_workers=1)) as venv:
        assert venv.num_envs == 2 and venv.env_method("bump", indices=1) == [1]
    # an already built pool
    pool = shmpool.Pool([FlatDictEnv] * 2, num_workers=2, autoreset_mode="same_step")
    with closing(sb3.ShmVecEnv(pool)) as venv:
        assert venv.pool is pool
        assert venv.env_method("get_marker", indices=[1]) == ["fresh"]
    assert pool.closed
    with pytest.raises(ValueError, match="same_step"):
        sb3.ShmVecEnv(FlatDictEnv, num_envs=2, autoreset_mode="next_step")
    with pytest.raises(ValueError, match="num_envs is required"):
        sb3.ShmVecEnv("CartPole-v1")


def test_a_plain_pool_gets_every_method(no_leaks):
    """A pool built without ShmVecEnv: lookups still go through wrappers, env_is_wrapped walks the
    chain in the worker, and an env's AttributeError reaches has_attr as itself."""
    pool = shmpool.Pool("CartPole-v1", 3, num_workers=2, autoreset_mode="same_step")
    with closing(sb3.ShmVecEnv(pool)) as venv:
        assert venv.get_attr("gravity", indices=[2, 0]) == [9.8, 9.8]
        assert venv.env_is_wrapped(gym.wrappers.TimeLimit, indices=1) == [True]
        assert venv.env_is_wrapped(sb3.Monitor) == [False] * 3
        assert venv.env_method("get_wrapper_attr", "gravity", indices=-1) == [9.8]
        assert not venv.has_attr("no_such_attribute")
        venv.set_attr("marker", [1], indices=[0])
        assert venv.get_attr("marker", indices=0) == [[1]]
    with shmpool.Pool("CartPole-v1", 2, num_workers=1) as next_step_pool:
        with pytest.raises(ValueError, match="same_step"):
            sb3.ShmVecEnv(next_step_pool)


def test_reset_and_close_with_a_pending_step(no_leaks):
    venv = sb3.ShmVecEnv([ENVS["cartpole"]] * 2, num_workers=2)
    venv.reset()
    venv.step_async(np.zeros(2, np.int64))
    assert venv.reset().shape == (2, 4)  # the pending step is finished and dropped
    venv.step_async(np.zeros(2, np.int64))
    obs, rew, done, infos = venv.step_wait()
    assert obs.shape == (2, 4) and len(infos) == 2
    venv.step_async(np.zeros(2, np.int64))
    venv.close()
    venv.close()
    assert venv.closed


# --- the example --------------------------------------------------------------------


@pytest.mark.slow   # SB3's PPO learns (torch), the example end to end
def test_sb3_ppo_example_short_run(no_leaks):
    pytest.importorskip("torch")
    cmd = [sys.executable, os.path.join(REPO, "examples", "sb3_ppo.py"), "--total-timesteps", "2048",
           "--eval-episodes", "2", "--num-workers", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eval mean return" in proc.stdout


# --- Dict and Tuple actions as SB3 hands them: one action per env ------------------------


class EchoActionEnv(gym.Env):
    """Observes its last action, flattened: a Dict or Tuple action reaches the env intact or not."""

    def __init__(self, kind: str = "dict"):
        parts = {"a": gym.spaces.Discrete(3), "b": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}
        self.action_space = gym.spaces.Dict(parts) if kind == "dict" else gym.spaces.Tuple(tuple(parts.values()))
        self.observation_space = gym.spaces.Box(-5.0, 5.0, (3,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        a, b = (action["a"], action["b"]) if isinstance(action, dict) else action
        return np.array([a, *b], np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("kind", ["dummy", "shm"])
@pytest.mark.parametrize("space", ["dict", "tuple"])
def test_per_env_dict_and_tuple_actions(kind, space, no_leaks):
    fns = [functools.partial(EchoActionEnv, space)] * 3
    venv = make(kind, fns)
    with closing(venv):
        venv.action_space.seed(3)
        venv.reset()
        actions = [venv.action_space.sample() for _ in range(3)]  # what SB3's own suite passes
        obs, _, _, _ = venv.step(actions)
    for row, action in zip(obs, actions):
        a, b = (action["a"], action["b"]) if space == "dict" else action
        np.testing.assert_array_equal(row, np.array([a, *b], np.float32))


def test_each_env_is_built_once_as_subprocvecenv_builds_it(tmp_path, no_leaks):
    """SubprocVecEnv builds each env once, in its own process, and runs it only on the user's calls; the
    old layout probe built ShmVecEnv's last env once more and stepped it ~100 times beside torch."""
    from envs import journal_fns, journals
    from stable_baselines3.common.vec_env import SubprocVecEnv
    got = {}
    for name, cls in (("theirs", SubprocVecEnv), ("ours", sb3.ShmVecEnv)):
        folder = tmp_path / name
        folder.mkdir()
        venv = cls(journal_fns(folder, 4))
        venv.reset()
        venv.step(np.zeros(4, np.int64))
        venv.close()
        got[name] = journals(folder, 4)
    assert got["ours"] == got["theirs"] == [["build", "reset", "step"]] * 4, got
