"""SAME_STEP autoreset: gymnasium's exact info layout, final observations through shared memory."""
from __future__ import annotations

import copy
import mmap
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
from envs import same
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from shmpool.workers.shard import Shard

import shmpool
from shmpool import layout as L
from shmpool.autoreset_modes import SAME_STEP
from shmpool.infos import InfoReader

N = 5
STEPS = 40


class EndingEnv(gym.Env):
    """Episodes of seeded lengths 2..6 (odd lengths terminate, even ones truncate), so envs end
    at different steps; step infos with python and numpy numbers, a string on odd steps, a
    nested ``episode`` dict at the end (itself nesting a dict), and an empty info for episodes
    of length 2.  ``obs_kind`` says what the observations are:

    - ``box``: float32 arrays of a float32 Box (what the final-obs slot carries);
    - ``dict``: a Dict of arrays (Box, MultiBinary, a Tuple of a uint8 Box): slot too;
    - ``float64``: float64 arrays for a float32 Box (castable, but not the slot's dtype);
    - ``int``: python ints of a Discrete space."""

    metadata = {"render_modes": []}

    def __init__(self, obs_kind: str = "box"):
        self.obs_kind = obs_kind
        if obs_kind == "dict":
            self.observation_space = spaces.Dict({
                "pos": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "bits": spaces.MultiBinary(3),
                "pair": spaces.Tuple((spaces.Box(0, 255, (2, 2), np.uint8),)),
            })
        elif obs_kind == "int":
            self.observation_space = spaces.Discrete(100)
        else:
            self.observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.t = self.length = 0

    def _obs(self):
        r = self.np_random
        if self.obs_kind == "dict":
            return {"pos": r.uniform(-1, 1, 2).astype(np.float32), "bits": r.integers(0, 2, 3).astype(np.int8),
                    "pair": (r.integers(0, 256, (2, 2)).astype(np.uint8),)}
        if self.obs_kind == "int":
            return int(r.integers(0, 100))
        return r.uniform(-1, 1, 3).astype(np.float64 if self.obs_kind == "float64" else np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(2, 7))
        return self._obs(), {"start": float(self.np_random.uniform()), "length": self.length}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        terminated = end and self.length % 2 == 1
        info = {"t": self.t, "score": np.float32(self.t * 0.5 + int(action))}
        if self.t % 2:
            info["tag"] = f"odd{self.t}"
        if end:
            info["episode"] = {"r": float(self.t), "l": self.t, "more": {"a": np.int32(action)}}
            if self.length == 2:
                info = {}
        return self._obs(), float(action), terminated, end and not terminated, info


def reference_loop(obs_kind: str, actions: list[np.ndarray], seed: int) -> list[tuple]:
    """SAME_STEP by its definition, one env at a time: per step, each env's
    (final observation or None, final info or None)."""
    envs = [EndingEnv(obs_kind) for _ in range(N)]
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
    out = []
    for act in actions:
        finals = []
        for env, a in zip(envs, act):
            obs, _, terminated, truncated, info = env.step(a)
            finals.append((obs, info) if terminated or truncated else (None, None))
            if terminated or truncated:
                env.reset()
        out.append(finals)
    return out


VECTORISERS = {
    "SyncVectorEnv": lambda fns: gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP),
    "AsyncVectorEnv": lambda fns: gym.vector.AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP),
    "shmpool.VectorEnv": lambda fns: shmpool.VectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP, num_workers=2),
}


@pytest.mark.parametrize("obs_kind", ["box", "dict", "float64", "int"])
@pytest.mark.parametrize("vectoriser", list(VECTORISERS))
def test_same_step_layout_is_gymnasiums(vectoriser, obs_kind, no_leaks):
    """obs, rewards, flags and infos (final_obs, final_info and their masks included) exactly as
    SyncVectorEnv gives them, and final observations/infos as the envs themselves returned them."""
    fns = [lambda: EndingEnv(obs_kind)] * N
    space = gym.vector.utils.batch_space(spaces.Discrete(3), N)
    space.seed(7)
    actions = [space.sample() for _ in range(STEPS)]
    expected = reference_loop(obs_kind, actions, seed=11)
    ref = gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    envs = VECTORISERS[vectoriser](fns)
    try:
        same(ref.reset(seed=11), envs.reset(seed=11), "reset")
        ends = set()
        for t, act in enumerate(actions):
            r, got = ref.step(act), envs.step(act)
            for name, x, y in zip(("obs", "rewards", "terminated", "truncated", "infos"), r, got):
                same(x, y, f"{name} at step {t}")
            infos, done = got[4], got[2] | got[3]
            if not done.any():
                assert not any(k in infos for k in ("final_obs", "_final_obs", "final_info", "_final_info"))
                continue
            for key in ("_final_obs", "_final_info"):
                same(infos[key], done, f"{key} at step {t}")
            for i, (final_obs, final_info) in enumerate(expected[t]):
                same(infos["final_obs"][i], final_obs, f"final_obs[{i}] at step {t}")
                if final_info is not None:
                    ends.add((t, len(final_info)))
                    for key, value in final_info.items():
                        mask, batch = infos["final_info"][f"_{key}"], infos["final_info"][key]
                        assert mask[i], f"final_info[{key!r}] missing for env {i} at step {t}"
                        if not isinstance(value, dict):
                            assert batch[i] == value, f"final_info[{key!r}][{i}] at step {t}"
        assert len({t for t, _ in ends}) > 5, "episodes must end at many different steps"
        assert any(k == 0 for _, k in ends), "some episode must end with an empty final info"
    finally:
        envs.close()
        ref.close()


def test_async_recv_gives_each_env_its_final_obs(no_leaks):
    """Pool.recv (batch_size < N): each received env's final observation and final info, as
    SyncVectorEnv gives them for that env."""
    n = 6
    ref = gym.vector.SyncVectorEnv([EndingEnv] * n, autoreset_mode=AutoresetMode.SAME_STEP)
    ref.reset(seed=3)
    acts = np.array([0, 1, 2, 1, 0, 2])
    ended = 0
    with shmpool.Pool(EndingEnv, n, num_workers=2, batch_size=3, autoreset_mode="same_step") as pool:
        pool.reset(seed=3)
        for t in range(12):
            r = ref.step(acts)
            pool.send(acts)
            got = {}
            while len(got) < n:
                obs, rew, term, trunc, infos = pool.recv()
                for row, env in enumerate(infos["env_id"].tolist()):
                    got[env] = (obs[row], infos, row)
            for env, (obs, infos, row) in got.items():
                np.testing.assert_array_equal(obs, r[0][env])
                if r[4].get("_final_obs", np.zeros(n, bool))[env]:
                    ended += 1
                    assert infos["_final_obs"][row] and infos["_final_info"][row]
                    same(infos["final_obs"][row], r[4]["final_obs"][env], f"final_obs of env {env} at step {t}")
                    for key in ("t", "score"):
                        if r[4]["final_info"].get(f"_{key}", np.zeros(n, bool))[env]:
                            assert infos["final_info"][key][row] == r[4]["final_info"][key][env]
                else:
                    assert "_final_obs" not in infos or not infos["_final_obs"][row]
                    assert "final_obs" not in infos or infos["final_obs"][row] is None
    ref.close()
    assert ended > 3


def _in_process_shard(obs_kind: str):
    """A SAME_STEP shard of one EndingEnv over a region in this process (no workers)."""
    env = EndingEnv(obs_kind)
    lay = L.Layout.build(1, [1], env.observation_space, env.action_space, final_obs=True)
    buf = mmap.mmap(-1, lay.size)
    views = L.Views(lay, buf)
    shard = Shard([env], 0, views, buf, env.observation_space, env.action_space, SAME_STEP)
    env.reset(seed=0)
    return env, views, shard, InfoReader(views, buf, env.observation_space)


@pytest.mark.parametrize("obs_kind", ["box", "dict"])
def test_final_obs_and_numeric_final_infos_need_no_side_channel(obs_kind):
    """An ending step whose observation has the space's exact dtypes and whose final info is
    numbers (nested dicts too) writes everything into the region: nothing is left for the side
    channel, and the parent reads gymnasium's layout back."""
    env, views, shard, reader = _in_process_shard(obs_kind)
    env.length = 3   # ends on the third step, with the nested "episode" dict
    for _ in range(2):
        shard.infos.write(0, shard.step(0))
    info = shard.step(0)
    final_obs_value = info["final_obs"]
    extra = shard.infos.write(0, info)
    assert extra == {"final_info": {"tag": "odd3"}}, "only the string may need the side channel"
    infos = reader.read(None)
    assert repr(final_obs_value) == "IN_SLOT"
    assert infos["_final_obs"].tolist() == [True] and infos["_final_info"].tolist() == [True]
    final_info = infos["final_info"]
    assert final_info["t"].tolist() == [3] and final_info["t"].dtype == np.int64
    assert final_info["score"].dtype == np.float32
    episode = final_info["episode"]
    assert final_info["_episode"].tolist() == [True]
    assert episode["r"].tolist() == [3.0] and episode["l"].tolist() == [3]
    assert episode["more"]["a"].dtype == np.int32 and episode["_more"].tolist() == [True]
    assert infos["start"].dtype == np.float64 and infos["_length"].tolist() == [True]   # the reset's info
    got = infos["final_obs"][0]
    if obs_kind == "box":
        assert type(got) is np.ndarray and got.dtype == np.float32 and got.shape == (3,)
        assert not np.array_equal(got, views.obs[0][0]), "the final obs, not the reset's"
    else:
        assert set(got) == {"pos", "bits", "pair"} and type(got["pair"]) is tuple
        assert got["bits"].dtype == np.int8
    # The parent's copy is its own: the next ending steps do not change it.
    snapshot = copy.deepcopy(got)
    for _ in range(12):
        shard.infos.write(0, shard.step(0))
    same(got, snapshot, "the final obs read earlier")


def test_final_obs_that_do_not_fit_the_slot_travel_as_the_env_gave_them():
    """A final observation of another dtype (float64 for a float32 space) keeps its type:
    it goes on the side channel, and the result's status says so."""
    env, views, shard, reader = _in_process_shard("float64")
    env.length = 2
    shard.step(0)
    info = shard.step(0)
    assert type(info["final_obs"]) is np.ndarray and info["final_obs"].dtype == np.float64
    extra = shard.infos.write(0, info)
    assert extra["final_obs"] is info["final_obs"] and extra["final_info"] == {}
    assert "_final_obs" not in reader.read(None)


@pytest.mark.heavy_imports
def test_sb3_terminal_observation_matches_dummy_vec_env(no_leaks):
    sb3 = pytest.importorskip("stable_baselines3")
    from shmpool.sb3 import ShmVecEnv
    fns = [EndingEnv] * N
    ref = sb3.common.vec_env.DummyVecEnv(fns)
    venv = ShmVecEnv(fns, num_workers=2)
    try:
        ref.seed(5)
        venv.seed(5)
        np.testing.assert_array_equal(ref.reset(), venv.reset())
        ended = 0
        for t in range(20):
            acts = np.arange(N) % 3
            r_obs, r_rew, r_done, r_infos = ref.step(acts)
            obs, rew, done, infos = venv.step(acts)
            np.testing.assert_array_equal(r_obs, obs)
            np.testing.assert_array_equal(r_done, done)
            for i in range(N):
                assert set(r_infos[i]) == set(infos[i]), f"keys of env {i} at step {t}"
                if r_done[i]:
                    ended += 1
                    same(infos[i]["terminal_observation"], r_infos[i]["terminal_observation"], "terminal_obs")
                    assert infos[i]["TimeLimit.truncated"] == r_infos[i]["TimeLimit.truncated"]
                    if "episode" in r_infos[i]:
                        assert infos[i]["episode"] == r_infos[i]["episode"]
        assert ended > 5
    finally:
        venv.close()
        ref.close()


def test_a_replacement_worker_keeps_final_obs_in_shared_memory(no_leaks):
    """on_worker_error="restart": the replacement finds the reserved _final_obs column again;
    after its restart result, its envs' final observations are right again."""
    ref = gym.vector.SyncVectorEnv([EndingEnv] * 4, autoreset_mode=AutoresetMode.SAME_STEP)
    with shmpool.Pool(EndingEnv, 4, num_workers=2, autoreset_mode="same_step", on_worker_error="restart") as pool:
        pool.reset(seed=0)
        os.kill(pool.worker_pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pool.restarts == 0 and time.monotonic() < deadline:
            pool.step(np.zeros(4, dtype=np.int64))
        assert pool.restarts == 1
        # Same state on both sides from here: seeded resets, then step and compare.
        ref_obs, _ = ref.reset(seed=20)
        obs, _ = pool.reset(seed=20)
        np.testing.assert_array_equal(ref_obs, obs)
        ended = 0
        for _ in range(15):
            r, got = ref.step(np.ones(4, dtype=np.int64)), pool.step(np.ones(4, dtype=np.int64))
            same(r[4], got[4], "infos after the restart")
            ended += int((got[2] | got[3]).sum())
        assert ended > 4
    ref.close()
