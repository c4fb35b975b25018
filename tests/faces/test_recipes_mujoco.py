"""MuJoCo recipes must reproduce gymnasium's v5 envs: same seed + same actions -> same everything."""
import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("mujoco")

from shmpool.workers.recipes import MUJOCO_TASK_IDS  # noqa: E402
from shmpool.workers.recipes import mujoco as recipes  # noqa: E402

import shmpool  # noqa: E402


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    """gymnasium's own MuJoCo envs (the reference side here) still log MuJoCo's warnings to
    MUJOCO_LOG.TXT in the working directory: keep that file out of the checkout."""
    monkeypatch.chdir(tmp_path)

# task id -> (steps, extra kwargs for both sides): each crosses at least one episode end.
CASES = {
    "Ant-v5": (300, {"max_episode_steps": 120}),                       # truncation
    "Ant-v5-unhealthy": (300, {"healthy_z_range": (0.45, 1.0)}),       # termination
    "HalfCheetah-v5": (300, {"max_episode_steps": 100}),
    "Hopper-v5": (300, {}),
    "Walker2d-v5": (300, {}),
    "Swimmer-v5": (300, {"max_episode_steps": 100}),
    "InvertedPendulum-v5": (300, {}),
    "InvertedDoublePendulum-v5": (300, {}),
    "Reacher-v5": (300, {}),                                           # 50-step limit
    "Humanoid-v5": (300, {}),
    "HumanoidStandup-v5": (300, {"max_episode_steps": 100}),
}


def _same(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} vs {b.shape}"
    # Bit-exact today (same model, same mj_step, same reduction order); the tolerance is
    # only the brief's guard against a future mujoco/numpy changing summation order.
    np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64), rtol=1e-12, atol=1e-12, err_msg=what)


def _same_info(ref: dict, got: dict, what: str) -> None:
    assert ref.keys() == got.keys(), f"{what}: keys differ {set(ref) ^ set(got)}"
    for k in ref:
        _same(ref[k], got[k], f"{what}[{k!r}]")


@pytest.mark.parametrize("case", list(CASES))
def test_matches_gymnasium(case):
    task_id = case.removesuffix("-unhealthy")
    steps, kwargs = CASES[case]
    ref, env = gym.make(task_id, **kwargs), recipes.TASKS[task_id](**kwargs)
    assert env.observation_space == ref.observation_space
    assert env.action_space == ref.action_space
    rng = np.random.default_rng(1)
    low, high = ref.action_space.low, ref.action_space.high
    episode = 0
    o_ref, i_ref = ref.reset(seed=7)
    o, i = env.reset(seed=7)
    _same(o_ref, o, "reset obs")
    _same_info(i_ref, i, "reset info")
    ends = 0
    for t in range(steps):
        action = rng.uniform(low, high).astype(np.float32)
        r_ref, r = ref.step(action), env.step(action)
        for name, a, b in zip(("obs", "reward", "terminated", "truncated"), r_ref[:4], r[:4]):
            _same(a, b, f"{name} at step {t}")
        assert np.asarray(r[1]).dtype == np.asarray(r_ref[1]).dtype, f"reward dtype at step {t}"
        assert r[2] == r_ref[2] and r[3] == r_ref[3]
        _same_info(r_ref[4], r[4], f"info at step {t}")
        if r_ref[2] or r_ref[3]:
            ends += 1
            episode += 1
            o_ref, i_ref = ref.reset(seed=100 + episode)
            o, i = env.reset(seed=100 + episode)
            _same(o_ref, o, "reset obs")
            _same_info(i_ref, i, "reset info")
    assert ends >= 1, f"{case}: no episode ended, the test does not cover termination/truncation"
    env.close()
    ref.close()


def test_tasks_are_registered():
    tasks = recipes.tasks()
    assert set(tasks) == set(recipes.TASKS) and set(tasks) <= set(shmpool.list_tasks())
    # The ids the registry lists without importing mujoco are exactly the recipes.
    assert sorted(MUJOCO_TASK_IDS) == sorted(recipes.TASKS)
    assert {f"shmpool-recipe/{t}" for t in recipes.TASKS} <= set(gym.registry)
    fns = tasks["Ant-v5"](num_envs=3, max_episode_steps=10)
    assert len(fns) == 3 and isinstance(fns[0](), recipes.Ant)


def test_in_pool_matches_sync_vector_env():
    n, steps = 2, 150
    kwargs = {"max_episode_steps": 60}
    fns = [lambda: recipes.Ant(**kwargs)] * n
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("Ant-v5", **kwargs)] * n)
    rng = np.random.default_rng(2)
    pool = shmpool.Pool(fns, num_workers=1)
    try:
        o_ref, _ = ref.reset(seed=5)
        o, _ = pool.reset(seed=5)
        _same(o_ref, o, "reset obs")
        for t in range(steps):
            actions = rng.uniform(-1, 1, size=(n, 8)).astype(np.float32)
            r_ref, r = ref.step(actions), pool.step(actions)
            for name, a, b in zip(("obs", "reward", "terminated", "truncated"), r_ref[:4], r[:4]):
                _same(a, b, f"{name} at step {t}")
            info_ref, info = r_ref[4], r[4]
            for k in info_ref:   # after an autoreset step only the reset keys are present
                if k.startswith("_"):
                    continue
                mask = info_ref["_" + k]
                np.testing.assert_array_equal(info["_" + k], mask, err_msg=f"info mask {k!r} at step {t}")
                _same(info_ref[k][mask], info[k][mask], f"info[{k!r}] at step {t}")
    finally:
        pool.close()
        ref.close()


@pytest.mark.parametrize("task_id", ["Ant-v5", "Humanoid-v5", "Hopper-v5"])
def test_bind_obs_writes_in_place(task_id):
    plain, bound = recipes.TASKS[task_id](), recipes.TASKS[task_id]()
    slots = np.zeros((3, *bound.observation_space.shape))   # stand-in for a shared-memory batch
    assert bound.bind_obs(slots[1]) is not None
    o, _ = plain.reset(seed=0)
    ob, _ = bound.reset(seed=0)
    assert ob is slots[1] or np.shares_memory(ob, slots)
    _same(o, slots[1], "reset obs")
    rng = np.random.default_rng(0)
    for t in range(50):
        a = rng.uniform(-0.4, 0.4, size=plain.action_space.shape).astype(np.float32)
        r, rb = plain.step(a), bound.step(a)
        _same(r[0], slots[1], f"obs at step {t}")
        _same(r[1], rb[1], f"reward at step {t}")
    assert not slots[0].any() and not slots[2].any()
    with pytest.raises(ValueError):
        bound.bind_obs(np.zeros(3))


def test_make_builds_recipes_for_listed_tasks(no_leaks):
    from shmpool.workers.recipes.mujoco import MujocoRecipe

    assert {"Ant-v5", "HalfCheetah-v5", "Humanoid-v5"} <= set(shmpool.list_tasks())
    env = shmpool.make("Ant-v5", num_envs=2, num_threads=1, seed=0)
    try:
        assert env.pool.apply(lambda e: isinstance(e, MujocoRecipe)) == (True, True)
        env.reset()
        obs, rew, term, trunc, info = env.step(np.zeros((2, 8), np.float32))
        assert obs.shape == (2, 105) and obs.dtype == np.float64
    finally:
        env.close()


def test_pool_binds_recipe_obs_to_shared_rows_and_same_step_keeps_final_obs(no_leaks):
    """In a pool a recipe assembles its observation in its shared row (no copy); under
    SAME_STEP the final observation is copied out before the reset overwrites that row."""
    n, steps = 2, 40
    kwargs = {"max_episode_steps": 15}
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("Hopper-v5", **kwargs)] * n,
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    rng = np.random.default_rng(4)
    with shmpool.Pool([lambda: recipes.Hopper(**kwargs)] * n, num_workers=1, autoreset_mode="same_step") as pool:
        assert pool.apply(lambda env: env._copy_obs) == (False, False)
        o_ref, _ = ref.reset(seed=1)
        o, _ = pool.reset(seed=1)
        _same(o_ref, o, "reset obs")
        ended = 0
        for t in range(steps):
            actions = rng.uniform(-1, 1, size=(n, 3)).astype(np.float32)
            o_ref, *_, info_ref = ref.step(actions)
            o, *_, info = pool.step(actions)
            _same(o_ref, o, f"obs at step {t}")
            if "final_obs" in info_ref:
                mask = info_ref["_final_obs"]
                np.testing.assert_array_equal(info["_final_obs"], mask)
                for k in np.flatnonzero(mask):
                    _same(info_ref["final_obs"][k], info["final_obs"][k], f"final_obs at step {t}")
                    assert not np.array_equal(info["final_obs"][k], o[k])
                ended += int(mask.sum())
        assert ended >= n   # every env hit the time limit at least once
    ref.close()


@pytest.mark.parametrize("task_id", ["Ant-v5", "Humanoid-v5", "Hopper-v5", "HalfCheetah-v5"])
def test_skipped_island_discovery_is_bit_identical(task_id):
    """The recipes turn off MuJoCo's constraint-island discovery on single-tree models (a
    native saving); gymnasium keeps it on.  Observations and rewards must still agree bit for
    bit, across episode ends (flailing random actions: many floor contacts and terminations)."""
    import mujoco
    flag = getattr(mujoco.mjtDisableBit, "mjDSBL_ISLAND", None)
    if flag is None:
        pytest.skip("this MuJoCo has no island discovery")
    ref, env = gym.make(task_id), recipes.TASKS[task_id]()
    assert env.model.opt.disableflags & int(flag)
    assert not ref.unwrapped.model.opt.disableflags & int(flag)
    rng = np.random.default_rng(11)
    low, high = ref.action_space.low, ref.action_space.high
    ends = 0
    for seed in (0, 1):
        o_ref, _ = ref.reset(seed=seed)
        o, _ = env.reset(seed=seed)
        assert np.array_equal(o_ref, o)
        for _ in range(400):
            action = rng.uniform(low, high).astype(np.float32)
            o_ref, r_ref, te_ref, tr_ref, _ = ref.step(action)
            o, r, te, tr, _ = env.step(action)
            assert np.array_equal(o_ref, o) and r_ref == r and (te_ref, tr_ref) == (te, tr)
            if te or tr:
                ends += 1
                assert np.array_equal(ref.reset()[0], env.reset()[0])
    if task_id != "HalfCheetah-v5":   # HalfCheetah never terminates
        assert ends >= 1


def test_mujoco_warnings_become_python_warnings_not_a_log_file(tmp_path, monkeypatch):
    """gymnasium's half_cheetah.xml uses MuJoCo's deprecated 'settotalmass': MuJoCo's default
    handler wrote the warning into MUJOCO_LOG.TXT in the working directory (the repo root in tests)."""
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match="MuJoCo: compiler attribute 'settotalmass' is deprecated"):
        env = recipes.TASKS["HalfCheetah-v5"]()
    env.close()
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
