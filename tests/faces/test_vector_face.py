"""shmpool.vector.VectorEnv against gymnasium's own vector envs.

Most tests take ``build``, parametrized over gymnasium's reference class and
shmpool's face, and assert the same facts for both: results are compared with
a fresh ``SyncVectorEnv`` run, messages are gymnasium's.  Error tests use
``AsyncVectorEnv`` as the reference (``SyncVectorEnv`` has no async calls).
"""
from __future__ import annotations

import functools
import multiprocessing

import gymnasium as gym
import numpy as np
import pytest
from compare import tree_equal
from envs import DictEnv, FaultyEnv
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space

import shmpool
import shmpool.vector
from shmpool.vector import VectorEnv

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


class RenderEnv(gym.Env):
    """Renders its state into a small rgb frame (CartPole needs pygame, which is not installed)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    observation_space = spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.state = np.zeros(2, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action):
        self.state += np.float32(action - 1) * 0.5
        return self.state.copy(), 1.0, bool(abs(self.state[0]) > 2), False, {}

    def render(self):
        frame = np.zeros((4, 5, 3), np.uint8)
        frame[..., 0] = np.uint8(int((self.state[0] + 10) * 12) % 256)
        frame[..., 1] = np.uint8(int((self.state[1] + 10) * 12) % 256)
        return frame


class HeldEnv(FaultyEnv):
    """Its step waits at the test's gate."""

    def __init__(self, gate):
        super().__init__()
        self.gate = gate

    def step(self, action):
        self.gate.hold()
        return super().step(action)


def cartpole():
    return gym.make("CartPole-v1", max_episode_steps=25)


def pendulum():
    return gym.make("Pendulum-v1", max_episode_steps=15)


def wrapped_dict_env():
    # A wrapper on top: call/get_attr/set_attr must reach DictEnv's attributes through it.
    return gym.wrappers.TimeLimit(DictEnv(max_len=10), 50)


ENVS = {"CartPole": cartpole, "Pendulum": pendulum, "DictEnv": wrapped_dict_env}


def _ours(fns, **kw):
    return VectorEnv(fns, num_workers=min(2, len(fns)), **kw)


BUILDERS = {
    "SyncVectorEnv": SyncVectorEnv,
    "AsyncVectorEnv": gym.vector.AsyncVectorEnv,
    "shmpool": _ours,
}


def _builder(kind, no_leaks):
    built = []

    def build(fns, **kw):
        envs = BUILDERS[kind](fns, **kw)
        built.append(envs)
        return envs

    build.kind = kind
    yield build
    for envs in built:
        envs.close()


@pytest.fixture(params=["SyncVectorEnv", "shmpool"])
def build(request, no_leaks):
    """Builds vector envs with gymnasium's SyncVectorEnv or shmpool's VectorEnv; closes them."""
    yield from _builder(request.param, no_leaks)


@pytest.fixture(params=["AsyncVectorEnv", "shmpool"])
def build_async(request, no_leaks):
    """Builds vector envs with gymnasium's AsyncVectorEnv or shmpool's VectorEnv; closes them."""
    yield from _builder(request.param, no_leaks)


def batched_actions(envs, steps, seed=3, scale=1.0):
    space = batch_space(envs.single_action_space, envs.num_envs)
    space.seed(seed)
    return [space.sample() * scale if isinstance(space, spaces.Box) else space.sample() for _ in range(steps)]


def record(envs, actions, seed=0, partial_reset_at=None):
    """Everything the envs return for ``actions``; ended envs are reset by mask when autoreset is off."""
    out = [envs.reset(seed=seed)]
    disabled = envs.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    for t, act in enumerate(actions):
        obs, rew, term, trunc, infos = envs.step(act)
        assert rew.dtype == np.float64 and term.dtype == np.bool_ and trunc.dtype == np.bool_
        out.append((obs, rew, term, trunc, infos))
        done = term | trunc
        if disabled and done.any():
            out.append(envs.reset(options={"reset_mask": done}))
        if t == partial_reset_at:
            mask = np.zeros(envs.num_envs, bool)
            mask[::2] = True
            out.append(envs.reset(seed=[100 + i for i in range(envs.num_envs)], options={"reset_mask": mask}))
    return out


def assert_same_run(got, want):
    assert len(got) == len(want)
    for t, (g, w) in enumerate(zip(got, want)):
        tree_equal(w, g, f"call {t}")


# --- attributes ---------------------------------------------------------------


def test_attributes(build):
    envs = build([lambda: RenderEnv("rgb_array")] * 3)
    assert envs.num_envs == 3
    assert envs.single_observation_space == RenderEnv.observation_space
    assert envs.single_action_space == RenderEnv.action_space
    assert envs.observation_space == batch_space(RenderEnv.observation_space, 3)
    assert envs.action_space == spaces.MultiDiscrete([3, 3, 3])
    assert envs.metadata == {"render_modes": ["rgb_array"], "render_fps": 10, "autoreset_mode": AutoresetMode.NEXT_STEP}
    assert type(envs.metadata["autoreset_mode"]) is AutoresetMode
    assert "autoreset_mode" not in RenderEnv.metadata, "the env's class-level metadata must stay untouched"
    assert envs.render_mode == "rgb_array"
    assert envs.spec is None
    assert envs.unwrapped is envs
    # gymnasium's repr; shmpool's goes on with its pool's plan (" over Pool(...)", tests/faces/test_faces_repr.py)
    want = f"{type(envs).__name__}(num_envs=3)"
    if isinstance(envs, gym.vector.SyncVectorEnv):
        assert repr(envs) == want
    else:
        assert repr(envs).startswith(want + " over Pool(")
    assert envs.closed is False
    envs.close()
    assert envs.closed is True
    envs.close()  # idempotent


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_metadata_autoreset_mode(build, mode):
    envs = build([cartpole] * 2, autoreset_mode=mode)
    assert envs.metadata["autoreset_mode"] is mode
    assert envs.autoreset_mode is mode


# --- trajectories ---------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("env", ["CartPole", "DictEnv"])
def test_trajectory_matches_sync_vector_env(build, env, mode):
    fns = [ENVS[env]] * 3
    envs = build(fns, autoreset_mode=mode)
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    actions = batched_actions(envs, 45)
    got = record(envs, actions, seed=11, partial_reset_at=20)
    want = record(ref, actions, seed=11, partial_reset_at=20)
    ref.close()
    assert_same_run(got, want)
    ended = sum(int(np.sum(step[2] | step[3])) for step in got if len(step) == 5)
    assert ended >= 2, "the run must cross episode ends to test autoreset"
    if mode == AutoresetMode.SAME_STEP:
        assert any("final_obs" in step[4] for step in got if len(step) == 5)


def test_box_actions_match(build):
    envs = build([pendulum] * 2)
    ref = SyncVectorEnv([pendulum] * 2)
    actions = batched_actions(envs, 20)
    assert_same_run(record(envs, actions, seed=4), record(ref, actions, seed=4))
    ref.close()


@pytest.mark.parametrize("copy", [True, False])
def test_copy_semantics(build, copy):
    envs = build([cartpole] * 2, copy=copy)
    obs0, _ = envs.reset(seed=0)
    saved = obs0.copy()
    obs1, rew1, term1, trunc1, _ = envs.step(np.array([0, 1]))
    obs2, rew2, term2, trunc2, _ = envs.step(np.array([1, 0]))
    if copy:
        assert obs1 is not obs0 and obs2 is not obs1
        np.testing.assert_array_equal(obs0, saved)  # an earlier result is never overwritten
    else:
        assert obs2 is obs1 is obs0  # gymnasium's copy=False hands out its one buffer
    assert rew2 is not rew1 and term2 is not term1 and trunc2 is not trunc1  # always fresh


# --- reset: seeds and masks ---------------------------------------------------------


def test_seeding(build):
    envs = build([cartpole] * 3)
    ref = SyncVectorEnv([cartpole] * 3)
    tree_equal(ref.reset(seed=5), envs.reset(seed=5))
    assert envs.np_random_seed == (5, 6, 7)
    tree_equal(ref.reset(seed=[10, 30, 20]), envs.reset(seed=[10, 30, 20]))
    assert envs.np_random_seed == (10, 30, 20)
    gens = envs.np_random
    assert len(gens) == 3 and all(isinstance(g, np.random.Generator) for g in gens)
    with pytest.raises(ValueError, match=r"^If seeds are passed as a list the length must match num_envs=3 but got "
                                         r"length=2\.$"):
        envs.reset(seed=[1, 2])
    ref.close()


@pytest.mark.parametrize("mask,typ,message", [
    ([True, False, True], TypeError, "`options['reset_mask']` must be a numpy array, got <class 'list'>"),
    (np.array([True, False]), ValueError, "`options['reset_mask']` must have shape `(3,)`, got (2,)"),
    (np.array([1, 0, 1]), TypeError, "`options['reset_mask']` must have `dtype=np.bool_`, got int64"),
    (np.zeros(3, bool), ValueError,
     "`options['reset_mask']` must contain a boolean array with at least one True value, "
     "got reset_mask=[False False False]"),
])
def test_reset_mask_errors(build, mask, typ, message):
    envs = build([cartpole] * 3, autoreset_mode=AutoresetMode.DISABLED)
    envs.reset(seed=0)
    with pytest.raises(typ) as info:
        envs.reset(options={"reset_mask": mask})
    assert str(info.value) == message
    envs.step(np.zeros(3, np.int64))  # the failed reset left the envs usable


# --- call / get_attr / set_attr / render ------------------------------------------------


def test_call_get_attr_set_attr(build):
    envs = build([wrapped_dict_env] * 3)
    envs.reset(seed=0)
    assert envs.get_attr("marker") == ("fresh",) * 3          # an attribute of the env under the wrapper
    assert envs.get_attr("max_len") == (10,) * 3
    assert envs.get_attr("_max_episode_steps") == (50,) * 3   # an attribute of the wrapper itself
    assert envs.call("get_marker", "!") == ("fresh!",) * 3
    assert envs.get_attr("get_marker") == ("fresh",) * 3       # gymnasium's get_attr calls methods
    envs.set_attr("marker", ["a", "b", "c"])
    # set_wrapper_attr semantics: the value lands on the env that has the attribute,
    # so the env's own method sees it.
    assert envs.call("get_marker", suffix="?") == ("a?", "b?", "c?")
    envs.set_attr("marker", "z")
    assert envs.get_attr("marker") == ("z",) * 3
    envs.set_attr("brand_new", (1, 2, 3))
    assert envs.get_attr("brand_new") == (1, 2, 3)
    with pytest.raises(ValueError) as info:
        envs.set_attr("marker", ["a"])
    assert str(info.value) == ("Values must be a list or tuple with length equal to the number of environments. "
                               "Got `1` values for 3 environments.")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        envs.get_attr("nope")
    envs.step(np.zeros((3, 2), np.float32))  # still usable after a failed call


def test_render(build):
    envs = build([lambda: RenderEnv("rgb_array")] * 3)
    ref = SyncVectorEnv([lambda: RenderEnv("rgb_array")] * 3)
    envs.reset(seed=1)
    ref.reset(seed=1)
    frames = envs.render()
    assert isinstance(frames, tuple) and len(frames) == 3
    assert all(f.shape == (4, 5, 3) and f.dtype == np.uint8 for f in frames)
    tree_equal(ref.render(), frames, "frames")
    envs.step(np.array([0, 1, 2]))
    ref.step(np.array([0, 1, 2]))
    tree_equal(ref.render(), envs.render(), "frames after a step")
    assert not np.array_equal(frames[0], envs.render()[0])
    ref.close()


# --- wrappers on top --------------------------------------------------------------------


def _without_time(infos):
    if "episode" in infos:
        infos = {**infos, "episode": {k: v for k, v in infos["episode"].items() if k != "t"}}
    return infos


def _stack_discrete(envs):
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs = gym.wrappers.vector.NormalizeObservation(envs)
    return gym.wrappers.vector.NormalizeReward(envs)


def _stack_box(envs):
    envs = gym.wrappers.vector.ClipAction(envs)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    return gym.wrappers.vector.NormalizeObservation(envs)


@pytest.mark.parametrize("env,stack", [("CartPole", _stack_discrete), ("Pendulum", _stack_box)])
def test_wrappers_on_top(build, env, stack):
    fns = [ENVS[env]] * 2
    envs = stack(build(fns))
    ref = stack(SyncVectorEnv(fns))
    actions = batched_actions(envs, 40, scale=3.0)   # Box actions beyond the bounds: ClipAction must clip
    got, want = [envs.reset(seed=2)], [ref.reset(seed=2)]
    episodes = 0
    for act in actions:
        g, w = envs.step(act), ref.step(act)
        got.append((*g[:4], _without_time(g[4])))
        want.append((*w[:4], _without_time(w[4])))
        episodes += int(np.sum(w[4].get("_episode", 0)))
    assert episodes >= 1, "RecordEpisodeStatistics must report an episode"
    assert_same_run(got, want)
    ref.close()


# --- errors: AsyncVectorEnv's types and messages -------------------------------------------
# Calls out of order (each async call pending, closed) are tests/faces/test_face_call_order.py's, which
# runs under gymnasium 0.29 too.


def test_step_wait_timeout(build_async, gate):
    envs = build_async([functools.partial(HeldEnv, gate)] * 2)
    envs.reset(seed=0)
    envs.step_async(np.array([0, 1]))
    with pytest.raises(multiprocessing.TimeoutError) as info:
        envs.step_wait(timeout=0.05)
    assert str(info.value) == "The call to `step_wait` has timed out after 0.05 second(s)."
    gate.open()   # the held step ends, so both references close as usual (gate's teardown does it on a failure)


@pytest.mark.parametrize("actions,typ,message", [
    (np.zeros(2, np.int64), ValueError, None),
    (np.zeros(4, np.int64), ValueError, None),
    ([0, 1], ValueError, None),
    (0, TypeError, "Unable to iterate over the following elements: 0"),
])
def test_wrong_actions(build_async, actions, typ, message):
    envs = build_async([cartpole] * 3)
    envs.reset(seed=0)
    with pytest.raises(typ) as info:
        envs.step(actions)
    if message is not None:
        assert str(info.value) == message


def test_call_refuses_reset_and_step(build_async):
    envs = build_async([cartpole] * 2)
    envs.reset(seed=0)
    with pytest.raises(ValueError) as info:
        envs.call("reset")
    assert str(info.value) == "Trying to call function `reset` with `call`, use `reset` directly instead."


def test_env_exception_keeps_its_type(build_async):
    envs = build_async([lambda: FaultyEnv("step", at=2)] * 2)
    envs.reset(seed=0)
    envs.step(np.array([0, 1]))
    with pytest.raises(ValueError, match="injected failure in step"):
        envs.step(np.array([0, 1]))


# --- shmpool only: what the face adds or does differently ------------------------------------


def test_env_error_is_both_env_error_and_env_type(no_leaks):
    with VectorEnv([lambda: FaultyEnv("step", at=1)] * 2, num_workers=1) as envs:
        envs.reset(seed=0)
        with pytest.raises(shmpool.EnvError) as info:
            envs.step(np.array([0, 1]))
        err = info.value
        assert isinstance(err, ValueError) and err.remote_type == "ValueError" and err.env_id == 0
        assert "injected failure in step" in err.remote_traceback
        envs.reset(seed=0)  # a reset makes the envs usable again
        with pytest.raises(AttributeError) as info:
            envs.get_attr("nope")
        # The message names the attribute, not the helper that looked it up.
        assert "raised in call 'nope'" in str(info.value) and info.value.phase == "call 'nope'"


def test_retyped_message_stays_readable():
    from shmpool.gymnasium_face import _retyped

    err = shmpool.EnvError("env 1 raised in step: KeyError: 'k'\nmore", env_id=1, worker=0, phase="step",
                           remote_type="KeyError", remote_traceback="tb")
    new = _retyped(err)
    assert isinstance(new, KeyError) and isinstance(new, shmpool.EnvError)
    assert str(new) == str(err)  # KeyError would quote it
    alien = shmpool.EnvError("x", env_id=1, worker=0, phase="step", remote_type="ResetNeeded", remote_traceback="")
    assert _retyped(alien) is alien  # not a builtin: stays a plain EnvError


def test_invalid_construction(no_leaks):
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['max_episode_steps'\]"):
        VectorEnv([cartpole] * 2, max_episode_steps=3)
    with pytest.raises(ValueError, match="num_envs is required"):
        VectorEnv("CartPole-v1")
    with shmpool.Pool("CartPole-v1", 2, num_workers=1) as pool:
        with pytest.raises(TypeError, match="cannot be given with an already built Pool"):
            VectorEnv(pool, num_workers=2)
        with pytest.raises(ValueError, match="built with 'next_step'"):
            VectorEnv(pool, autoreset_mode="same_step")


def test_from_id_and_from_pool(no_leaks):
    with VectorEnv("CartPole-v1", 2, num_workers=1, max_episode_steps=4) as envs:
        envs.reset(seed=0)
        truncated = [envs.step(np.array([0, 1]))[3] for _ in range(4)]
        assert truncated[-1].all() and not truncated[-2].any()   # max_episode_steps reached gymnasium.make
    pool = shmpool.Pool("CartPole-v1", 2, num_workers=1, autoreset_mode="same_step")
    envs = VectorEnv(pool)
    assert envs.pool is pool and envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    envs.reset(seed=0)
    assert envs.get_attr("spec")[0].id == "CartPole-v1"
    envs.close()
    assert pool.closed  # the face owns the pool


def test_envpool_path_on_vector_env(no_leaks):
    with VectorEnv([cartpole] * 4, num_workers=2, batch_size=2) as envs:
        envs.async_reset()
        seen = set()
        # Completion order: a fast worker may serve many batches before the other
        # one's first results arrive, so loop until every env has come back.
        for _ in range(5000):
            if seen == {0, 1, 2, 3}:
                break
            obs, rew, term, trunc, infos = envs.recv()
            ids = infos["env_id"]
            assert obs.shape == (2, 4) and ids.dtype == np.int32 and len(ids) == 2
            seen.update(ids.tolist())
            envs.send(np.zeros(2, np.int64), ids)
        assert seen == {0, 1, 2, 3}
        ids = envs.recv()[4]["env_id"]
        obs, rew, term, trunc, infos = envs.step(np.ones(2, np.int64), ids)  # EnvPool's step(a, env_id)
        assert len(infos["env_id"]) == 2 and obs.shape == (2, 4)
        envs.reset(seed=0)  # drains what is in flight
        envs.step_async(np.zeros(4, np.int64))
        with pytest.raises(AlreadyPendingCallError, match="Calling `send` while waiting for a pending call to `step`"):
            envs.send(np.zeros(2, np.int64), np.array([0, 1]))
        envs.step_wait()


# --- gymnasium.make_vec, shmpool make_vec, EnvPool make ------------------------------------------


def test_gymnasium_make_vec_builds_shmpool_twins(no_leaks):
    envs = gym.make_vec("shmpool/CartPole-v1", 3, num_workers=2)
    ref = gym.make_vec("shmpool/CartPole-v1", 3, vectorization_mode="sync")
    try:
        assert isinstance(envs, VectorEnv) and isinstance(ref, SyncVectorEnv)
        assert envs.spec.id == "shmpool/CartPole-v1"
        assert envs.spec.kwargs == {"num_workers": 2, "max_episode_steps": 500, "num_envs": 3,
                                    "vectorization_mode": "vector_entry_point"}
        actions = batched_actions(envs, 30)
        assert_same_run(record(envs, actions, seed=9), record(ref, actions, seed=9))
        with pytest.raises(gym.error.Error, match="only through kwargs"):
            gym.make_vec("shmpool/CartPole-v1", 2, vector_kwargs={"num_workers": 1})
        assert gym.make("shmpool/CartPole-v1").spec.max_episode_steps == 500
    finally:
        envs.close()
        ref.close()
    with gym.make_vec("shmpool.vector:shmpool/Pendulum-v1", 2, vectorization_mode="vector_entry_point",
                      num_workers=1, autoreset_mode="same_step") as envs:
        assert isinstance(envs, VectorEnv) and envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP


def test_make_vec_mirrors_gymnasium(no_leaks):
    kwargs = dict(wrappers=[gym.wrappers.TimeAwareObservation], max_episode_steps=20)
    envs = shmpool.vector.make_vec("CartPole-v1", 3, vector_kwargs={"num_workers": 2}, **kwargs)
    ref = gym.make_vec("CartPole-v1", 3, vectorization_mode="sync", **kwargs)
    try:
        assert isinstance(envs, VectorEnv)
        assert envs.single_observation_space == ref.single_observation_space  # the wrapper ran in each env
        assert envs.spec.id == "CartPole-v1"
        assert envs.spec.kwargs == {"max_episode_steps": 20, "num_workers": 2, "num_envs": 3,
                                    "vectorization_mode": "vector_entry_point",
                                    "wrappers": (gym.wrappers.TimeAwareObservation,)}
        actions = batched_actions(envs, 30)
        assert_same_run(record(envs, actions, seed=1), record(ref, actions, seed=1))
    finally:
        envs.close()
        ref.close()
    with shmpool.vector.make_vec("CartPole-v1", 2, num_workers=1, copy=False) as envs:
        assert envs.copy is False and envs.pool.num_workers == 1  # VectorEnv keywords among the kwargs
        with gym.make_vec(envs.spec) as again:                    # gymnasium rebuilds a shmpool env
            assert isinstance(again, VectorEnv) and again.num_envs == 2 and again.pool.num_workers == 1


def test_envpool_make(no_leaks):
    allowed = shmpool.allowed_cpus()
    with shmpool.vector.make("CartPole-v1", env_type="gymnasium", num_envs=4, batch_size=2, num_threads=2,
                             seed=3, thread_affinity_offset=0) as env:
        assert isinstance(env, VectorEnv)
        assert env.pool.num_workers == 2 and env.pool.worker_cpus == [allowed[0], allowed[1 % len(allowed)]]
        assert env.action_space == spaces.Discrete(2)       # EnvPool exposes single-env spaces
        assert env.observation_space.shape == (4,)
        assert env.config["num_envs"] == 4 and env.config["batch_size"] == 2
        first = {}
        env.async_reset()
        for _ in range(5000):  # until every env has come back (completion order, see above)
            if len(first) == 4:
                break
            obs, rew, term, trunc, info = env.recv()
            for i, o in zip(info["env_id"], obs):
                first.setdefault(int(i), o)
            env.send(np.random.randint(env.action_space.n, size=len(info["env_id"])), info["env_id"])
        for i in range(4):  # seed=3: env i's first reset used seed 3 + i
            np.testing.assert_array_equal(first[i], gym.make("CartPole-v1").reset(seed=3 + i)[0])
    if len(allowed) > 1:
        with shmpool.vector.make("CartPole-v1", num_envs=2, num_threads=1, thread_affinity_offset=1) as env:
            assert env.pool.worker_cpus == [allowed[1]]
    with pytest.raises(NotImplementedError, match="env_type='dm'"):
        shmpool.vector.make("CartPole-v1", env_type="dm")
    with pytest.raises(ValueError, match="env_type must be"):
        shmpool.vector.make("CartPole-v1", env_type="jax")
    with pytest.raises(ValueError, match="thread_affinity_offset=99"):
        shmpool.vector.make("CartPole-v1", thread_affinity_offset=99)


def test_envpool_make_takes_the_pools_own_names_for_threads_and_cores(no_leaks):
    """``num_workers`` and ``cpus`` are the Pool's names of EnvPool's ``num_threads`` and
    ``thread_affinity_offset``: either name works, both at once must agree."""
    allowed = shmpool.allowed_cpus()
    with shmpool.vector.make("CartPole-v1", num_envs=4, num_workers=2, cpus=[allowed[-1]]) as env:
        assert env.pool.num_workers == 2 and env.config["num_threads"] == 2
        assert env.pool.worker_cpus == [allowed[-1], allowed[-1]]
    with shmpool.vector.make("CartPole-v1", num_envs=4, num_threads=2, num_workers=2) as env:
        assert env.pool.num_workers == 2
    with pytest.raises(ValueError, match=r"^num_workers=1 and num_threads=2 both set the number of worker "
                                         r"processes: give one$"):
        shmpool.vector.make("CartPole-v1", num_envs=4, num_threads=2, num_workers=1)
    with pytest.raises(ValueError, match=r"^cpus=\[0\] and thread_affinity_offset=0 both choose the workers' "
                                         r"cores: give one$"):
        shmpool.vector.make("CartPole-v1", num_envs=4, cpus=[0], thread_affinity_offset=0)
    with pytest.raises(ValueError, match=r"^num_workers must be >= 1, got 0$"):
        shmpool.vector.make("CartPole-v1", num_envs=4, num_workers=0)
