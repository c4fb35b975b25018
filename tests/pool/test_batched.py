"""Natively batched envs in a worker (shmpool.batched) and BatchPong-v0."""
import functools
import os
import signal

import gymnasium as gym
import numpy as np
import pytest
from shmpool.workers.recipes.batch_pong import BatchPong, PongEnv

import shmpool
from shmpool import WorkerDiedError
from shmpool.batched import Batched, BatchEnv


def own(n, **kw):
    """A BatchPong with arrays of its own, reset with seeds 0..n-1."""
    g = BatchPong(n, **kw).bind_own()
    g.reset(np.arange(n), list(range(n)))
    return g


def step1(g, action=0):
    return g.step(np.arange(g.num_envs), np.full(g.num_envs, action))


def put_ball(g, x, y, vx, vy):
    g.bx[:], g.by[:], g.vx[:], g.vy[:] = x, y, vx, vy
    g.speed[:] = np.hypot(vx, vy)


# --- the rules ---------------------------------------------------------------------


def test_ball_bounces_off_top_and_bottom_walls():
    g = own(2)
    r = g.BALL_RADIUS
    put_ball(g, 0.5, [1 - r - 0.005, r + 0.005], -0.01, [0.02, -0.02])
    step1(g)
    assert g.vy[0] < 0 and g.vy[1] > 0
    assert r <= g.by[0] <= 1 - r and r <= g.by[1] <= 1 - r
    np.testing.assert_allclose(g.by, [1 - r - 0.015, r + 0.015])


def test_paddle_hit_reverses_vx_and_the_angle_follows_the_hit_position():
    g = own(3)
    r = g.BALL_RADIUS
    x = g.RIGHT_FACE - r - 0.005
    g.py[:] = 0.5
    put_ball(g, x, [0.5, 0.55, 0.45], 0.02, 0.0)
    step1(g)
    assert (g.vx < 0).all()
    assert g.reward.tolist() == [0, 0, 0]
    assert abs(g.vy[0]) < 1e-12 and g.vy[1] > 0 > g.vy[2]       # centre straight, edges angled
    assert (g.speed > 0.02).all()                                 # hits speed the ball up
    # The opponent's paddle sends it back the other way.
    g2 = own(1)
    g2.oy[:] = 0.5
    put_ball(g2, g2.LEFT_FACE + r + 0.005, 0.5, -0.02, 0.0)
    step1(g2)
    assert g2.vx[0] > 0


def test_a_miss_scores_and_serves_again():
    g = own(2)
    g.py[:] = 0.1            # the agent's paddle far from the ball
    g.oy[:] = 0.9
    put_ball(g, [0.985, 0.015], 0.5, [0.02, -0.02], 0.0)
    g.aim[:] = 0.0
    step1(g)
    assert g.reward.tolist() == [-1.0, 1.0]
    assert g.opponent_score.tolist() == [1, 0] and g.agent_score.tolist() == [0, 1]
    assert (g.bx == 0.5).all() and (0.25 <= g.by).all() and (g.by <= 0.75).all()
    assert (np.abs(g.vx) > 0).all() and np.allclose(g.speed, g.SERVE_SPEED)
    assert not g.terminated.any()


def test_episode_ends_at_21_points_with_the_scores_in_infos():
    g = own(2)
    g.opponent_score[:] = 20
    g.agent_score[:] = [3, 20]
    g.py[:] = 0.1
    g.oy[:] = 0.9
    put_ball(g, [0.985, 0.015], 0.5, [0.02, -0.02], 0.0)
    g.aim[:] = 0.0
    infos = step1(g)
    assert g.terminated.tolist() == [True, True] and not g.truncated.any()
    assert infos["agent_score"].tolist() == [3, 21] and infos["opponent_score"].tolist() == [21, 20]
    assert infos["_agent_score"].all()
    # NEXT_STEP: the next step resets (reward 0, flags cleared, scores 0).
    infos = step1(g)
    assert infos == {} and g.reward.tolist() == [0, 0] and not g.terminated.any()
    assert g.agent_score.tolist() == [0, 0] and g.t.tolist() == [0, 0]


def test_truncation_at_the_step_limit():
    g = own(3, max_episode_steps=5)
    for _ in range(4):
        step1(g)
        assert not g.truncated.any()
    infos = step1(g)
    assert g.truncated.all() and not g.terminated.any()
    assert infos["_agent_score"].all()


def test_observations_stay_inside_the_space():
    g = own(64, max_episode_steps=500)
    space = g.single_observation_space
    rng = np.random.default_rng(0)
    for _ in range(2000):
        g.step(np.arange(64), rng.integers(0, 3, 64))
        assert g.obs.dtype == np.float32
        assert (g.obs >= space.low).all() and (g.obs <= space.high).all()


def test_a_tracking_agent_scores_and_a_still_one_loses():
    g = own(32)
    won = 0.0
    for _ in range(3000):
        a = np.where(g.by > g.py + 0.02, 1, np.where(g.by < g.py - 0.02, 2, 0))
        g.step(np.arange(32), a)
        won += g.reward.sum()
    assert won > 0
    g = own(32)
    lost = 0.0
    for _ in range(3000):
        step1(g)
        lost += g.reward.sum()
    assert lost < -32 * 10


# --- seeding and batch equivalence ---------------------------------------------------


def test_same_seeds_same_start_and_unseeded_envs_differ():
    a, b = own(8), own(8)
    np.testing.assert_array_equal(a.obs, b.obs)
    c = BatchPong(8).bind_own()
    c.reset(np.arange(8), [None] * 8)
    d = BatchPong(8).bind_own()
    d.reset(np.arange(8), [None] * 8)
    assert not np.array_equal(c.obs, d.obs)


def test_one_env_and_a_batch_and_subsets_give_the_same_trajectories():
    n, steps = 6, 600
    rng = np.random.default_rng(1)
    actions = rng.integers(0, 3, (steps, n))
    batch = BatchPong(n, max_episode_steps=150).bind_own()
    batch.reset(np.arange(n), [10 + i for i in range(n)])
    singles = [PongEnv(max_episode_steps=150) for _ in range(n)]
    firsts = [env.reset(seed=10 + i)[0] for i, env in enumerate(singles)]
    np.testing.assert_array_equal(batch.obs, np.stack(firsts))
    ref = gym.vector.SyncVectorEnv([functools.partial(PongEnv, max_episode_steps=150)] * n)
    ref.reset(seed=10)
    odd = BatchPong(n, max_episode_steps=150).bind_own()   # steps odd envs, then even ones
    odd.reset(np.arange(n), [10 + i for i in range(n)])
    for t in range(steps):
        infos = batch.step(np.arange(n), actions[t])
        obs, rew, term, trunc, ref_infos = ref.step(actions[t])
        np.testing.assert_array_equal(batch.obs, obs)
        np.testing.assert_array_equal(batch.reward, rew)
        np.testing.assert_array_equal(batch.terminated, term)
        np.testing.assert_array_equal(batch.truncated, trunc)
        assert infos.keys() == ref_infos.keys()
        for k in infos:
            np.testing.assert_array_equal(infos[k], ref_infos[k])
        for sel in (np.arange(1, n, 2), np.arange(0, n, 2)):
            odd.step(sel, actions[t][sel])
        np.testing.assert_array_equal(odd.obs, batch.obs)


# --- hosted in a pool ----------------------------------------------------------------


def pong_pool(n, **kw):
    limit = kw.pop("max_episode_steps", 120)
    return shmpool.Pool(Batched(functools.partial(BatchPong, max_episode_steps=limit)), num_envs=n, **kw)


def assert_infos_equal(a, b):
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        assert np.asarray(a[k]).dtype == np.asarray(b[k]).dtype, k


@pytest.mark.parametrize("workers", [1, 2])
def test_sync_pool_matches_sync_vector_env_over_the_one_env_version(workers, no_leaks):
    n, steps = 7, 400
    ref = gym.vector.SyncVectorEnv([functools.partial(PongEnv, max_episode_steps=120)] * n)
    rng = np.random.default_rng(2)
    with pong_pool(n, num_workers=workers) as pool:
        assert pool.single_observation_space == ref.single_observation_space
        assert pool.single_action_space == ref.single_action_space
        obs, infos = pool.reset(seed=3)
        ref_obs, ref_infos = ref.reset(seed=3)
        np.testing.assert_array_equal(obs, ref_obs)
        assert infos == ref_infos == {}
        ended = 0
        for _ in range(steps):
            a = rng.integers(0, 3, n)
            obs, rew, term, trunc, infos = pool.step(a)
            r_obs, r_rew, r_term, r_trunc, r_infos = ref.step(a)
            np.testing.assert_array_equal(obs, r_obs)
            np.testing.assert_array_equal(rew, r_rew)
            np.testing.assert_array_equal(term, r_term)
            np.testing.assert_array_equal(trunc, r_trunc)
            assert_infos_equal(infos, r_infos)
            ended += int(trunc.sum())
        assert ended >= n * 3      # autoresets were exercised
        # A partial reset leaves the other envs alone.
        mask = np.arange(n) % 2 == 0
        before = obs.copy()
        obs, _ = pool.reset(seed=[100 + i for i in range(n)], options={"reset_mask": mask})
        np.testing.assert_array_equal(obs[~mask], before[~mask])
        fresh = PongEnv().reset(seed=100)[0]
        np.testing.assert_array_equal(obs[0], fresh)


@pytest.mark.parametrize("parent_shard", [False, True])   # True: a batched shard served inside recv
def test_pool_seed_seeds_the_first_reset_and_async_subsets_match_one_env(parent_shard, no_leaks):
    n, b = 8, 3
    rng = np.random.default_rng(4)
    rows: dict[int, list] = {i: [] for i in range(n)}
    acts: dict[int, list] = {i: [] for i in range(n)}
    with pong_pool(n, num_workers=2, batch_size=b, seed=50, max_episode_steps=40,
                   parent_shard=parent_shard) as pool:
        assert pool.parent_shard == (1 if parent_shard else None)
        pool.async_reset()
        for _ in range(150):
            obs, rew, term, trunc, infos = pool.recv()
            ids = infos["env_id"]
            assert len(ids) == b and len(set(ids.tolist())) == b
            for k, i in enumerate(ids.tolist()):
                rows[i].append((obs[k].copy(), rew[k], term[k], trunc[k]))
            a = rng.integers(0, 3, len(ids))
            for k, i in enumerate(ids.tolist()):
                acts[i].append(int(a[k]))
            pool.send(a, ids)
    for i in range(n):   # each env, replayed alone through gymnasium's NEXT_STEP autoreset
        ref = gym.vector.SyncVectorEnv([functools.partial(PongEnv, max_episode_steps=40)])
        o, _ = ref.reset(seed=50 + i)
        got = rows[i]
        assert len(got) >= 5
        np.testing.assert_array_equal(got[0][0], o[0])
        for (ob, r, te, tr), a in zip(got[1:], acts[i]):
            o, rr, tte, ttr, _ = ref.step(np.array([a]))
            np.testing.assert_array_equal(ob, o[0])
            assert (r, te, tr) == (rr[0], tte[0], ttr[0])


@pytest.mark.timeout(30)
def test_recv_reports_a_dead_worker_beside_a_batched_parent_shard(no_leaks):
    """Once the parent's batched shard has nothing left to step, recv must wait on the wire (and
    so check the workers) instead of asking that shard again and again."""
    with pong_pool(4, num_workers=2, batch_size=2, parent_shard=True, max_lead=2) as pool:
        pool.async_reset()
        os.kill(pool.worker_pids[0], signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match="worker 0"):
            for _ in range(50):
                ids = pool.recv()[-1]["env_id"]
                pool.send(np.zeros(len(ids), dtype=np.int64), ids)


def test_episode_end_infos_reach_recv(no_leaks):
    with pong_pool(4, num_workers=2, batch_size=4, max_episode_steps=3) as pool:
        pool.async_reset()
        pool.recv()
        for _ in range(2):
            pool.send(np.zeros(4, dtype=np.int64), np.arange(4))
            _, _, _, trunc, infos = pool.recv()
        pool.send(np.zeros(4, dtype=np.int64), np.arange(4))
        _, _, _, trunc, infos = pool.recv()
        assert trunc.all()
        order = np.argsort(infos["env_id"])
        assert infos["_agent_score"].all() and infos["agent_score"].dtype == np.int64
        assert infos["opponent_score"][order].tolist() == [0, 0, 0, 0]


class NotesEnv(BatchEnv):
    """A batched env whose infos need the side channel (strings) and one that fails on demand."""

    def __init__(self, n, start):
        self.num_envs, self.start = n, start
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.single_action_space = gym.spaces.Discrete(4)

    def reset(self, env_ids, seeds, options=None):
        self.obs[env_ids] = 0.0
        return {}

    def step(self, env_ids, actions):
        if (actions == 3).any():
            raise RuntimeError("action 3 breaks the batch")
        self.obs[env_ids, 0] = env_ids + self.start
        self.obs[env_ids, 1] = actions
        self.reward[env_ids] = np.where(actions == 2, np.nan, 1.0)
        self.terminated[env_ids] = False
        self.truncated[env_ids] = False
        odd = (env_ids + self.start) % 2 == 1
        return {"note": np.array(["odd" if o else "" for o in odd], dtype=object), "_note": odd,
                "x": (env_ids + self.start).astype(np.float32), "_x": np.ones(len(env_ids), bool)}


def test_side_channel_infos_errors_and_no_per_env_calls(no_leaks):
    n = 6
    with shmpool.Pool(Batched(NotesEnv), n, num_workers=2) as pool:
        pool.reset()
        obs, rew, _, _, infos = pool.step(np.zeros(n, dtype=np.int64))
        assert obs[:, 0].tolist() == list(range(n)) and rew.tolist() == [1.0] * n
        assert infos["note"].tolist() == [None, "odd", None, "odd", None, "odd"]
        assert infos["_note"].tolist() == [False, True] * 3
        assert infos["x"].dtype == np.float32 and infos["x"].tolist() == list(range(n))
        with pytest.raises(shmpool.EnvError, match="rewards must be finite"):
            pool.step(np.array([0, 0, 2, 0, 0, 0]))
        pool.reset()
        with pytest.raises(shmpool.EnvError, match="action 3 breaks the batch"):
            pool.step(np.array([0, 0, 0, 3, 0, 0]))
        pool.reset()
        with pytest.raises(shmpool.EnvError, match="per-env call/get_attr"):
            pool.get_attr("start")
        pool.step(np.ones(n, dtype=np.int64))


def cartpole_vec(n, start):
    return gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")


@pytest.mark.parametrize("workers", [1, 2])
def test_hosting_gymnasium_vector_cartpole(workers, no_leaks):
    n = 8
    with shmpool.Pool(Batched(cartpole_vec), n, num_workers=workers) as pool:
        obs, _ = pool.reset(seed=0)
        ranges = [pool.shard_of(k) for k in range(workers)]
        shards = [(cartpole_vec(len(r), r.start), r.start) for r in ranges]
        refs = []
        for env, a in shards:
            o, _ = env.reset(seed=a)
            refs.append(o)
        np.testing.assert_array_equal(obs, np.concatenate(refs))
        rng = np.random.default_rng(0)
        for _ in range(300):
            act = rng.integers(0, 2, n)
            obs, rew, term, trunc, _ = pool.step(act)
            outs = [env.step(act[a:a + env.num_envs]) for env, a in shards]
            np.testing.assert_array_equal(obs, np.concatenate([o[0] for o in outs]))
            np.testing.assert_array_equal(rew, np.concatenate([o[1] for o in outs]))
            np.testing.assert_array_equal(term, np.concatenate([o[2] for o in outs]))
        for env, _ in shards:
            env.close()


def test_vector_env_refuses_async_subsets_and_other_autoreset_modes(no_leaks):
    with pytest.raises(ValueError, match="steps all its envs at once.*batch_size=num_envs or a shmpool"):
        shmpool.Pool(Batched(cartpole_vec), 8, num_workers=2, batch_size=4)
    with pytest.raises(ValueError, match="autoreset_mode is 'same_step'.*must match"):
        shmpool.Pool(Batched(cartpole_vec), 8, num_workers=2, autoreset_mode="same_step")
    with shmpool.Pool(Batched(cartpole_vec), 4, num_workers=1) as pool:   # batch_size = num_envs: fine
        pool.async_reset()
        _, _, _, _, infos = pool.recv()
        pool.send(np.zeros(4, dtype=np.int64), infos["env_id"])
        assert len(pool.recv()[0]) == 4


def test_batch_env_without_a_mode_says_so(no_leaks):
    with pytest.raises(NotImplementedError, match="NotesEnv does not implement autoreset_mode 'disabled'"):
        shmpool.Pool(Batched(NotesEnv), 4, num_workers=1, autoreset_mode="disabled")


def test_same_step_and_disabled_modes_match_sync_vector_env(no_leaks):
    n = 4
    for mode in (gym.vector.AutoresetMode.SAME_STEP, gym.vector.AutoresetMode.DISABLED):
        ref = gym.vector.SyncVectorEnv([functools.partial(PongEnv, max_episode_steps=30)] * n, autoreset_mode=mode)
        with pong_pool(n, num_workers=2, max_episode_steps=30, autoreset_mode=mode) as pool:
            pool.reset(seed=1)
            ref.reset(seed=1)
            for t in range(70):
                a = np.full(n, t % 3)
                if mode == gym.vector.AutoresetMode.DISABLED and t and t % 30 == 0:
                    obs, _ = pool.reset(seed=t)
                    np.testing.assert_array_equal(obs, ref.reset(seed=t)[0])
                got, want = pool.step(a), ref.step(a)
                for x, y in zip(got[:4], want[:4]):
                    np.testing.assert_array_equal(x, y)
                infos, ref_infos = got[4], want[4]
                assert infos.keys() == ref_infos.keys()
                if "final_obs" in infos:
                    for x, y in zip(infos["final_obs"], ref_infos["final_obs"]):
                        np.testing.assert_array_equal(x, y)
                    assert_infos_equal(infos["final_info"], ref_infos["final_info"])


def test_make_batch_pong_v0(no_leaks):
    assert "BatchPong-v0" in shmpool.list_tasks()
    env = shmpool.make("BatchPong-v0", num_envs=1024, num_threads=2, seed=0)
    try:
        obs, _ = env.reset()
        assert obs.shape == (1024, 6) and obs.dtype == np.float32
        np.testing.assert_array_equal(obs[5], PongEnv().reset(seed=5)[0])
        obs, rew, term, trunc, _ = env.step(np.ones(1024, dtype=np.int64))
        assert obs.shape == (1024, 6) and rew.shape == (1024,)
        assert env.single_observation_space.contains(obs[0])
    finally:
        env.close()
    env = shmpool.make("BatchPong-v0", num_envs=64, batch_size=16, max_episode_steps=10)
    try:
        env.async_reset()
        obs, rew, term, trunc, infos = env.recv()
        assert obs.shape == (16, 6) and len(infos["env_id"]) == 16
    finally:
        env.close()
