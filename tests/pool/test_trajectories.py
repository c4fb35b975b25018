"""The pool must produce exactly what gymnasium's SyncVectorEnv produces."""
import gymnasium as gym
import numpy as np
import pytest
from compare import actions_for, env_row, gather_async, tree_equal
from envs import DictEnv
from gymnasium.spaces import Dict, Tuple

import shmpool


def make_pair(env_fn, n, **pool_kw):
    ref = gym.vector.SyncVectorEnv([env_fn] * n)
    pool = shmpool.Pool(env_fn, n, **pool_kw)
    return ref, pool


CASES = [
    ("CartPole-v1", lambda: gym.make("CartPole-v1")),
    ("Acrobot-v1", lambda: gym.make("Acrobot-v1", max_episode_steps=60)),
    ("Pendulum-v1", lambda: gym.make("Pendulum-v1", max_episode_steps=25)),
    ("DictEnv", lambda: DictEnv()),
]


@pytest.mark.parametrize("name,env_fn", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("n,workers", [(5, 2), (4, 1)])
def test_sync_step_matches_sync_vector_env(name, env_fn, n, workers, no_leaks):
    ref, pool = make_pair(env_fn, n, num_workers=workers)
    with pool:
        assert pool.single_observation_space == ref.single_observation_space
        assert pool.single_action_space == ref.single_action_space
        obs_r, info_r = ref.reset(seed=7)
        obs_p, info_p = pool.reset(seed=7)
        tree_equal(obs_r, obs_p)
        tree_equal(info_r, info_p, "reset infos")
        steps = 220 if name != "DictEnv" else 60
        dones = 0
        for t, act in enumerate(actions_for(ref.single_action_space, n, steps)):
            r = ref.step(act)
            p = pool.step(act)
            tree_equal(r[0], p[0], f"obs at step {t}")
            for field, x, y in zip(("reward", "terminated", "truncated"), r[1:4], p[1:4]):
                tree_equal(x, y, f"{field} at step {t}")
            tree_equal(r[4], p[4], f"infos at step {t}")
            dones += int(np.sum(r[2] | r[3]))
        assert dones > 0, "the trajectory must cross an autoreset to test it"
    ref.close()


@pytest.mark.parametrize("name,env_fn", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("n,workers,batch", [(6, 2, 3), (5, 2, 5), (6, 2, 1)])
def test_send_recv_matches_sync_vector_env(name, env_fn, n, workers, batch, no_leaks):
    ref, pool = make_pair(env_fn, n, num_workers=workers, batch_size=batch, seed=11)
    with pool:
        obs_r, _ = ref.reset(seed=11)
        pool.async_reset()  # seed=11 at construction: env i gets 11 + i, as in EnvPool
        first = {}
        for _ in range(n // batch):
            obs, rew, term, trunc, infos = pool.recv()
            assert not rew.any() and not term.any() and not trunc.any()
            for row, env_id in enumerate(infos["env_id"]):
                first[int(env_id)] = env_row(obs, row)
        assert sorted(first) == list(range(n))
        for i in range(n):
            tree_equal(env_row(obs_r, i), first[i], f"reset obs of env {i}")
        for t, act in enumerate(actions_for(ref.single_action_space, n, 40)):
            r = ref.step(act)
            got = gather_async(pool, n, act, batch)
            for i in range(n):
                o, rew, term, trunc, info = got[i]
                tree_equal(env_row(r[0], i), o, f"obs of env {i} at step {t}")
                assert rew == r[1][i] and term == r[2][i] and trunc == r[3][i], f"env {i} step {t}"
                for key, val in r[4].items():
                    if not key.startswith("_") and r[4]["_" + key][i]:
                        assert info["_" + key], f"info {key!r} missing for env {i} at step {t}"
                        tree_equal(np.asarray(val[i]), np.asarray(info[key]), f"info {key} env {i}")
    ref.close()


def test_step_with_env_ids_is_send_then_recv(no_leaks):
    with shmpool.Pool("CartPole-v1", 4, num_workers=2, batch_size=2, seed=3) as pool:
        pool.async_reset()
        pool.recv()
        pool.recv()
        obs, rew, term, trunc, infos = pool.step(np.array([0, 1]), np.array([3, 1]))
        assert sorted(infos["env_id"].tolist()) == [1, 3]
        assert rew.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("n,workers", [(7, 2), (5, 3), (3, 3)])
def test_any_num_envs_splits_into_contiguous_shards(n, workers, no_leaks):
    with shmpool.Pool("CartPole-v1", n, num_workers=workers) as pool:
        shards = [list(pool.shard_of(w)) for w in range(workers)]
        assert sum(shards, []) == list(range(n))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        pool.reset(seed=0)
        obs, *_ = pool.step(np.ones(n, dtype=np.int64))
        assert obs.shape == (n, 4)


def test_seed_list_and_options_reach_each_env(no_leaks):
    with shmpool.Pool(DictEnv, 3, num_workers=2) as pool:
        ref = gym.vector.SyncVectorEnv([DictEnv] * 3)
        obs_p, info_p = pool.reset(seed=[5, None, 9], options={"note": "hi"})
        obs_r, info_r = ref.reset(seed=[5, None, 9], options={"note": "hi"})
        tree_equal(env_row(obs_p, 0), env_row(obs_r, 0))
        tree_equal(env_row(obs_p, 2), env_row(obs_r, 2))
        assert info_p["note"].tolist() == ["hi"] * 3
        assert info_p["_note"].all()


def test_views_change_under_the_caller_unless_copy(no_leaks):
    for copy in (False, True):
        with shmpool.Pool("CartPole-v1", 2, num_workers=1, copy=copy) as pool:
            obs0, _ = pool.reset(seed=0)
            snapshot = np.array(obs0)
            obs1, *_ = pool.step(np.array([1, 1]))
            if copy:
                np.testing.assert_array_equal(obs0, snapshot)
            else:
                assert obs0 is obs1 or np.shares_memory(obs0, obs1)
                assert not np.array_equal(obs0, snapshot)


def test_call_get_attr_set_attr(no_leaks):
    with shmpool.Pool(DictEnv, 3, num_workers=2) as pool:
        assert pool.get_attr("marker") == ("fresh",) * 3
        pool.set_attr("marker", ["a", "b", "c"])
        assert pool.call("get_marker", "!") == ("a!", "b!", "c!")
        methods = pool.get_attr("get_marker")  # returned, not called
        assert all(callable(m) for m in methods)
        pool.set_attr("marker", "z")
        assert pool.get_attr("marker") == ("z",) * 3
        # a subset, in the caller's order, touching only the envs named
        pool.set_attr("marker", ["q", "p"], env_ids=[2, 0])
        assert pool.get_attr("marker") == ("p", "z", "q")
        assert pool.call("get_marker", "?", env_ids=[1, 2]) == ("z?", "q?")
        assert pool.get_attr("marker", env_ids=2) == ("q",)
        with pytest.raises(ValueError, match=r"env ids \[3\] are out of range"):
            pool.get_attr("marker", env_ids=[3])
        with pytest.raises(ValueError, match="set_attr needs 2 values, got 3"):
            pool.set_attr("marker", [1, 2, 3], env_ids=[0, 1])


def test_dict_and_tuple_actions_round_trip(no_leaks):
    class DictActionEnv(gym.Env):
        observation_space = gym.spaces.Box(-10, 10, (3,), np.float64)
        action_space = Dict({"move": gym.spaces.Discrete(3), "aim": Tuple((gym.spaces.Box(-1, 1, (2,)),))})

        def reset(self, *, seed=None, options=None):
            return np.zeros(3), {}

        def step(self, action):
            obs = np.array([action["move"], *action["aim"][0]], dtype=np.float64)
            return obs, 0.0, False, False, {}

    with shmpool.Pool(DictActionEnv, 4, num_workers=2) as pool:
        pool.reset()
        act = {"move": np.array([0, 1, 2, 1]),
               "aim": (np.array([[0.5, -0.5], [0.25, 0], [0, 0], [1, 1]], dtype=np.float32),)}
        obs, *_ = pool.step(act)
        np.testing.assert_allclose(obs[:, 0], [0, 1, 2, 1])
        np.testing.assert_allclose(obs[:, 1:], act["aim"][0])


@pytest.mark.parametrize("name,env_fn", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("mode", ["same_step", "disabled"])
def test_other_autoreset_modes_match_sync_vector_env(name, env_fn, mode, no_leaks):
    gym_mode = gym.vector.AutoresetMode.SAME_STEP if mode == "same_step" else gym.vector.AutoresetMode.DISABLED
    n = 5
    ref = gym.vector.SyncVectorEnv([env_fn] * n, autoreset_mode=gym_mode)
    with shmpool.Pool(env_fn, n, num_workers=2, autoreset_mode=gym_mode) as pool:
        assert pool.autoreset_mode == mode
        tree_equal(ref.reset(seed=3)[0], pool.reset(seed=3)[0])
        ends = 0
        for t, act in enumerate(actions_for(ref.single_action_space, n, 150 if name != "DictEnv" else 60)):
            r, p = ref.step(act), pool.step(act)
            for field, x, y in zip(("obs", "reward", "terminated", "truncated", "infos"), r, p):
                tree_equal(x, y, f"{field} at step {t}")
            done = r[2] | r[3]
            ends += int(done.sum())
            if mode == "disabled" and done.any():
                with pytest.raises(ValueError, match=r"ended their episodes and autoreset is disabled"):
                    pool.step(act)
                seeds = [100 + t + i for i in range(n)]
                r_obs, r_info = ref.reset(seed=seeds, options={"reset_mask": done})
                p_obs, p_info = pool.reset(seed=seeds, options={"reset_mask": done})
                tree_equal(r_obs, p_obs, f"obs after partial reset at step {t}")
                tree_equal(r_info, p_info, f"infos after partial reset at step {t}")
        assert ends > 0, "the trajectory must end episodes to test the mode"
    ref.close()


@pytest.mark.parametrize("mask,exc,msg", [
    ([True, False], TypeError, "must be a numpy array"),
    (np.array([True]), ValueError, r"must have shape `\(2,\)`"),
    (np.array([1, 0]), TypeError, "must have `dtype=np.bool_`"),
    (np.array([False, False]), ValueError, "at least one True value"),
])
def test_reset_mask_is_checked_like_gymnasium(mask, exc, msg, no_leaks):
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    ref.reset()
    with pytest.raises(exc, match=msg):
        ref.reset(options={"reset_mask": mask})
    with shmpool.Pool("CartPole-v1", 2, num_workers=1) as pool:
        pool.reset()
        with pytest.raises(exc, match=msg):
            pool.reset(options={"reset_mask": mask})
        pool.step(np.zeros(2, dtype=np.int64))  # still usable


def test_unknown_autoreset_mode():
    with pytest.raises(ValueError, match="unknown autoreset_mode 'later'"):
        shmpool.Pool("CartPole-v1", 2, autoreset_mode="later")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_side_messages_larger_than_a_pipe_do_not_stall(mode, no_leaks):
    """16 envs end at once, each sending ~32 kB of final_obs and info arrays: far more than a pipe holds."""
    from envs import BigObsEnv
    n = 16
    ref = gym.vector.SyncVectorEnv([BigObsEnv] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with shmpool.Pool(BigObsEnv, n, num_workers=2, autoreset_mode="same_step", step_timeout=20,
                      batch_size=n // 2 if mode == "async" else None, seed=0) as pool:
        ref.reset(seed=0)
        pool.reset(seed=0)
        acts = np.zeros(n, dtype=np.int64)
        for t in range(7):
            r = ref.step(acts)
            if mode == "sync":
                p = pool.step(acts)
                tree_equal(r[4], p[4], f"infos at step {t}")
                tree_equal(r[0], p[0], f"obs at step {t}")
            else:
                got = gather_async(pool, n, acts, n // 2)
                for i in range(n):
                    tree_equal(r[0][i], got[i][0], f"obs of env {i} at step {t}")
                    if r[4].get("_final_obs", np.zeros(n, bool))[i]:
                        tree_equal(r[4]["final_obs"][i], got[i][4]["final_obs"], f"final_obs of env {i}")
    ref.close()


def test_attributes_are_looked_up_through_wrappers_like_gymnasium(no_leaks):
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    with shmpool.Pool("CartPole-v1", 2, num_workers=2) as pool:
        assert pool.get_attr("gravity") == ref.get_attr("gravity") == (9.8, 9.8)
        pool.set_attr("gravity", [1.0, 2.0])
        ref.set_attr("gravity", [1.0, 2.0])
        assert pool.call("gravity") == ref.call("gravity") == (1.0, 2.0)
        # apply: any function of the env, run in its worker
        assert pool.apply(lambda env, k: env.unwrapped.gravity * k, 10, env_ids=[1]) == (20.0,)
        assert pool.apply(lambda env: type(env).__name__) == ("TimeLimit", "TimeLimit")
    ref.close()


def test_env_error_carries_the_original_exception(no_leaks):
    with shmpool.Pool("CartPole-v1", 2, num_workers=1) as pool:
        with pytest.raises(shmpool.EnvError) as err:
            pool.get_attr("no_such_attribute")
        assert isinstance(err.value.remote_exception, AttributeError)
        assert "no_such_attribute" in str(err.value.remote_exception)


def test_reset_options_per_env(no_leaks):
    with shmpool.Pool(DictEnv, 3, num_workers=2) as pool:
        _, infos = pool.reset(seed=0, options=[{"note": "a"}, None, {"note": "c"}])
        assert infos["note"].tolist() == ["a", None, "c"]
        assert infos["_note"].tolist() == [True, False, True]
        with pytest.raises(ValueError, match="options list has 2 entries, the pool has 3 envs"):
            pool.reset(options=[None, None])


def test_calls_while_envs_are_in_flight_keep_them(no_leaks):
    # Many rounds: a call posted right behind a send races the worker's read of its command.
    with shmpool.Pool("CartPole-v1", 4, num_workers=2, batch_size=2, seed=0, step_timeout=10) as pool:
        pool.async_reset()
        pool.recv()
        pool.recv()
        for _ in range(100):
            pool.send(np.zeros(4, dtype=np.int64))
            assert pool.get_attr("gravity") == (9.8,) * 4   # envs in flight are served first, not dropped
            got = sorted(pool.recv()[4]["env_id"].tolist() + pool.recv()[4]["env_id"].tolist())
            assert got == [0, 1, 2, 3]
