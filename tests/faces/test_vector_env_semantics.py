"""Where gymnasium's ``AsyncVectorEnv`` and shmpool's ``VectorEnv`` could differ, the reference decides.

Every case in the first part runs the same code against ``gymnasium.vector.AsyncVectorEnv`` and
``shmpool.VectorEnv`` (the ``vec`` fixture) and asserts exact values, exception types and messages:
what the env receives (``options=``, out-of-range actions), what the trainer receives (NaN rewards,
cast observations), ``*_wait(timeout)``, ``observation_mode`` and AsyncVectorEnv's keywords.
The second part is shmpool only: ``strict=True`` and the keywords that have no meaning here.
"""
from __future__ import annotations

import functools
import gc
import multiprocessing
import re
import threading
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
from envs import Gate
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv
from gymnasium.vector.utils import batch_differing_spaces
from slices import record_waits

import shmpool
import shmpool.vector
import shmpool.workerset


class RecordingEnv(gym.Env):
    """Returns what it was given: its reset keywords and its actions, in the infos; its reward,
    observation and observation space are chosen by the test.  ``reset_gate``: its resets wait at that
    :class:`envs.Gate`; ``held(gate)`` waits at ``gate``."""

    def __init__(self, obs_space=None, act_space=None, reward=1.0, obs=None, reset_gate=None):
        self.observation_space = obs_space or spaces.Box(-10.0, 10.0, (1,), np.float32)
        self.action_space = act_space or spaces.Discrete(4)
        self.reward, self.obs, self.reset_gate = reward, obs, reset_gate

    def _obs(self):
        return self.observation_space.sample() * 0 if self.obs is None else self.obs

    def reset(self, **kwargs):
        super().reset(seed=kwargs.get("seed"))
        if self.reset_gate is not None:
            self.reset_gate.hold()
        return self._obs(), {"keys": ",".join(sorted(kwargs)), "options": repr(kwargs.get("options"))}

    def step(self, action):
        return self._obs(), self.reward, False, False, {"action": repr(action)}

    def slow(self, seconds):
        time.sleep(seconds)
        return seconds

    def held(self, gate):
        gate.hold()
        return "opened"


def recording(**kwargs):
    return functools.partial(RecordingEnv, **kwargs)


@pytest.fixture(params=["AsyncVectorEnv", "shmpool"])
def vec(request, no_leaks):
    """``vec(env_fns, **kwargs)`` builds gymnasium's AsyncVectorEnv or shmpool's VectorEnv; closed after."""
    built = []

    def build(fns, **kwargs):
        cls = AsyncVectorEnv if request.param == "AsyncVectorEnv" else shmpool.VectorEnv
        envs = cls(fns, **kwargs)
        built.append(envs)
        return envs

    yield build
    for envs in built:
        envs.close(terminate=True)
    # An AsyncVectorEnv whose constructor raised is only closed by its __del__ (its
    # frame and the exception's traceback hold it in a cycle).
    gc.collect()


# --- what the env receives ----------------------------------------------------------------


def test_reset_always_passes_options(vec):
    envs = vec([recording()] * 2)
    _, infos = envs.reset(seed=3)
    assert infos["keys"].tolist() == ["options,seed"] * 2
    assert infos["options"].tolist() == ["None"] * 2
    _, infos = envs.reset(options={"x": 1})
    assert infos["options"].tolist() == ["{'x': 1}"] * 2


def test_out_of_range_discrete_actions_reach_the_env(vec):
    envs = vec([recording()] * 2)
    envs.reset(seed=0)
    *_, infos = envs.step(np.array([4, -1]))
    assert infos["action"].tolist() == ["np.int64(4)", "np.int64(-1)"]


def test_box_actions_of_shape_0_reach_the_env_as_numpy_scalars(vec):
    envs = vec([recording(act_space=spaces.Box(0.0, 1.0, (), np.float32))] * 2)
    envs.reset(seed=0)
    *_, infos = envs.step(np.array([0.25, 3.0], np.float32))   # 3.0: outside the bounds, the env's business
    assert infos["action"].tolist() == ["np.float32(0.25)", "np.float32(3.0)"]


class ActionValueEnv(RecordingEnv):
    def step(self, action):
        return self._obs(), 0.0, False, False, {"value": float(np.ravel(action)[0])}


def test_one_number_per_env_for_a_one_element_box(vec):
    envs = vec([functools.partial(ActionValueEnv, act_space=spaces.Box(0.0, 1.0, (1,), np.float32))] * 3)
    envs.reset(seed=0)
    *_, infos = envs.step([0, 1, 2])
    assert infos["value"].tolist() == [0.0, 1.0, 2.0]


def test_nan_box_actions_reach_the_env(vec):
    envs = vec([recording(act_space=spaces.Box(-1.0, 1.0, (1,), np.float64))] * 2)
    envs.reset(seed=0)
    *_, infos = envs.step(np.array([[np.nan], [np.inf]]))
    assert infos["action"].tolist() == ["array([nan])", "array([inf])"]


# --- what the trainer receives --------------------------------------------------------------


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), -float("inf"), None])
def test_non_finite_rewards_are_delivered(vec, reward):
    envs = vec([recording(reward=reward)] * 2)
    envs.reset(seed=0)
    _, rewards, *_ = envs.step(np.array([0, 1]))
    expected = np.full(2, np.nan if reward is None else reward)
    assert rewards.dtype == np.float64
    np.testing.assert_array_equal(rewards, expected)


@pytest.mark.parametrize("space,value,expected", [
    (spaces.Box(0, 255, (1,), np.uint8), 3.7, [[3], [3]]),                 # a Python float into uint8
    (spaces.Box(-5.0, 5.0, (1,), np.float32), 2.5, [[2.5], [2.5]]),        # a scalar into shape (1,)
    (spaces.Box(-5.0, 5.0, (1, 2), np.float32), [[1.0], [2.0]], [[[1.0, 2.0]], [[1.0, 2.0]]]),  # same size
    (spaces.Discrete(3), 2.0, [2, 2]),                                      # a float into a Discrete
])
def test_observations_are_cast_as_gymnasium_writes_them(vec, space, value, expected):
    envs = vec([recording(obs_space=space, obs=value)] * 2)
    obs, _ = envs.reset(seed=0)
    assert obs.dtype == space.dtype
    assert obs.tolist() == expected
    obs, *_ = envs.step(np.array([0, 1]))
    assert obs.tolist() == expected


def test_observations_that_do_not_fit_raise_numpys_value_error(vec):
    envs = vec([recording(obs_space=spaces.Box(0.0, 1.0, (3,), np.float32), obs=np.zeros(2))] * 2)
    with pytest.raises(ValueError, match=re.escape("could not broadcast input array from shape (2,) into shape (3,)")):
        envs.reset(seed=0)


# --- *_wait(timeout) ---------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["reset", "call"])
def test_wait_timeout(vec, gate, op):
    envs = vec([recording(reset_gate=gate if op == "reset" else None)] * 2)
    if op == "reset":
        envs.reset_async(seed=0)
    else:
        envs.reset(seed=0)
        envs.call_async("held", gate)
    t0 = time.monotonic()
    with pytest.raises(multiprocessing.TimeoutError) as info:
        getattr(envs, f"{op}_wait")(timeout=0.1)
    # The op cannot end before the gate opens, so the timeout ended the wait (a wait that raised only once
    # the op was done would never raise here), however loaded the machine.  The bound: the wait did wait.
    assert time.monotonic() - t0 >= 0.1
    assert str(info.value) == f"The call to `{op}_wait` has timed out after 0.1 second(s)."


def test_waits_within_their_timeout_return_the_results(vec):
    envs = vec([recording()] * 2)
    envs.reset_async(seed=0, options={"x": 2})
    obs, infos = envs.reset_wait(timeout=30)
    assert obs.tolist() == [[0.0], [0.0]] and infos["options"].tolist() == ["{'x': 2}"] * 2
    envs.call_async("slow", 0.01)
    assert envs.call_wait(timeout=30) == (0.01, 0.01)
    envs.step_async(np.array([1, 2]))
    *_, infos = envs.step_wait(timeout=30)
    assert infos["action"].tolist() == ["np.int64(1)", "np.int64(2)"]


# --- observation_mode and AsyncVectorEnv's keywords ------------------------------------------


def test_invalid_observation_mode(vec):
    with pytest.raises(ValueError) as info:
        vec([recording()] * 2, observation_mode="invalid")
    assert str(info.value) == ("Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and "
                               "batch observation space, actual got invalid")


def test_observation_mode_different_with_equal_spaces(vec):
    space = spaces.Box(0.0, 1.0, (2,), np.float32)
    envs = vec([recording(obs_space=space)] * 3, observation_mode="different")
    assert envs.observation_space == batch_differing_spaces([space] * 3)
    assert envs.single_observation_space == space
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (3, 2)


def test_observation_mode_different_with_spaces_that_differ_in_bounds(vec):
    boxes = [spaces.Box(0.0, float(i), (5,), np.float32) for i in range(1, 4)]
    envs = vec([recording(obs_space=box) for box in boxes], observation_mode="different")
    assert envs.observation_space == batch_differing_spaces(boxes)
    assert envs.single_observation_space == boxes[0]
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (3, 5) and obs.dtype == np.float32
    *_, infos = envs.step(np.array([0, 1, 2]))
    assert infos["action"].tolist() == ["np.int64(0)", "np.int64(1)", "np.int64(2)"]


def test_observation_mode_same_with_spaces_that_differ(vec):
    boxes = [spaces.Box(0.0, float(i), (2,), np.float32) for i in range(1, 4)]
    with pytest.raises(RuntimeError) as info:
        vec([recording(obs_space=box) for box in boxes], observation_mode="same")
    assert str(info.value) == (
        "AsyncVectorEnv(..., observation_mode='same') however some of the sub-environments observation spaces are "
        "not equivalent. If this is intentional, use `observation_mode='different'` instead.")


def test_observation_mode_as_spaces_that_do_not_fit(vec):
    with pytest.raises(RuntimeError) as info:
        vec([recording(obs_space=spaces.Box(0.0, 1.0, (2,), np.float32))] * 2,
            observation_mode=(spaces.Box(0.0, 1.0, (2, 3), np.float32), spaces.Box(0.0, 1.0, (3,), np.float32)))
    assert str(info.value) == ("AsyncVectorEnv(..., observation_mode='different' or custom space) however the "
                               "sub-environment's observation spaces do not share a common shape and dtype.")


def test_observation_mode_as_spaces(vec):
    single = spaces.Box(0.0, 4.0, (2,), np.float32)
    batched = spaces.Box(0.0, 4.0, (3, 2), np.float32)
    envs = vec([recording(obs_space=spaces.Box(0.0, 1.0, (2,), np.float32))] * 3,
               observation_mode=(batched, single))
    assert envs.observation_space == batched and envs.single_observation_space == single
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (3, 2)


BOX2, BOX3, DISCRETE = (spaces.Box(0.0, 1.0, (2,), np.float32), spaces.Box(0.0, 1.0, (3,), np.float32),
                         spaces.Discrete(3))
CUSTOM_MODE = (spaces.Box(0.0, 1.0, (3, 2), np.float32), BOX2)


@pytest.mark.parametrize("order", ["within a worker", "across workers"])
@pytest.mark.parametrize("other", [BOX3, DISCRETE], ids=["shape", "type"])
@pytest.mark.parametrize("mode", ["same", "different", "custom"])
def test_observation_spaces_of_other_layouts(vec, mode, other, order):
    """Spaces no observation_mode can batch into one array: AsyncVectorEnv's error for each mode,
    whichever worker holds the odd env."""
    obs_spaces = [BOX2, other, BOX2] if order == "within a worker" else [BOX2, BOX2, other]
    if mode == "different":
        with pytest.raises((ValueError, TypeError)) as expected:
            batch_differing_spaces(obs_spaces)
        error, message = type(expected.value), str(expected.value)
    elif mode == "same":
        error, message = RuntimeError, shmpool.gymnasium_face.SAME_MODE_DIFFERS
    else:
        error, message = RuntimeError, shmpool.gymnasium_face.CUSTOM_MODE_DIFFERS
    with pytest.raises(Exception) as info:
        vec([recording(obs_space=s) for s in obs_spaces], observation_mode=CUSTOM_MODE if mode == "custom" else mode)
    assert type(info.value) is error and str(info.value) == message


@pytest.mark.parametrize("keywords", [
    dict(shared_memory=False),
    dict(shared_memory=True, context="fork", daemon=True, worker=None),
])
def test_async_vector_env_keywords_that_mean_something(vec, keywords):
    envs = vec([recording()] * 2, **keywords)
    obs, infos = envs.reset(seed=0)
    assert obs.tolist() == [[0.0], [0.0]] and infos["keys"].tolist() == ["options,seed"] * 2
    *_, infos = envs.step(np.array([1, 3]))
    assert infos["action"].tolist() == ["np.int64(1)", "np.int64(3)"]


class TimedStepEnv(RecordingEnv):
    """Each step sleeps 50 ms and reports when it ran (CLOCK_MONOTONIC: one clock for every process)."""

    def step(self, action):
        start = time.monotonic()
        time.sleep(0.05)
        return self._obs(), 0.0, False, False, {"ran": (start, time.monotonic())}


def most_at_once(intervals) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    running = peak = 0
    for _, delta in edges:
        running += delta
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("limit", [1, 2])
def test_max_concurrency_bounds_the_envs_stepping_at_once(vec, limit):
    envs = vec([TimedStepEnv] * 4, max_concurrency=limit)
    assert envs.max_concurrency == limit
    envs.reset(seed=0)
    *_, infos = envs.step(np.array([0, 1, 2, 3]))
    assert most_at_once(infos["ran"]) == limit   # reached, and never passed


@pytest.mark.parametrize("value,message", [
    (2.5, "`max_concurrency` must be an integer or None, got <class 'float'>."),
    ("2", "`max_concurrency` must be an integer or None, got <class 'str'>."),
    (2.0, "`max_concurrency` must be an integer or None, got <class 'float'>."),
    (0, "`max_concurrency` must be a positive or None, got 0."),
    (-10, "`max_concurrency` must be a positive or None, got -10."),
])
def test_max_concurrency_refused_values(vec, value, message):
    with pytest.raises(ValueError) as info:
        vec([recording()] * 2, max_concurrency=value)
    assert str(info.value) == message


# --- shmpool only ----------------------------------------------------------------------------


class TestStrict:
    """``strict=True``: shmpool's checks, with their errors (AsyncVectorEnv has none of them)."""

    def test_action_shape_is_exact(self, no_leaks):
        one_element = functools.partial(ActionValueEnv, act_space=spaces.Box(0.0, 1.0, (1,), np.float32))
        with shmpool.VectorEnv([one_element] * 3, strict=True) as envs:
            envs.reset(seed=0)
            with pytest.raises(ValueError, match=re.escape("actions have shape (3,); expected (3, 1)")):
                envs.step([0, 1, 2])

    def test_actions_outside_the_space(self, no_leaks):
        with shmpool.VectorEnv([recording()] * 2, strict=True) as envs:
            envs.reset(seed=0)
            with pytest.raises(ValueError, match=re.escape("actions outside Discrete(4) for env 0: 4, env 1: -1")):
                envs.step(np.array([4, -1]))
            *_, infos = envs.step(np.array([3, 0]))   # nothing was sent; the envs still step
            assert infos["action"].tolist() == ["np.int64(3)", "np.int64(0)"]

    def test_non_finite_reward(self, no_leaks):
        with shmpool.VectorEnv([recording(reward=float("nan"))] * 2, strict=True) as envs:
            envs.reset(seed=0)
            with pytest.raises(shmpool.EnvError, match="ResultError: reward is nan: rewards must be finite"):
                envs.step(np.array([0, 1]))

    def test_observation_that_needs_a_cast(self, no_leaks):
        with shmpool.VectorEnv([recording(obs_space=spaces.Box(0, 255, (1,), np.uint8), obs=3.7)] * 2,
                               strict=True) as envs:
            with pytest.raises(shmpool.EnvError, match=re.escape("observation has shape (), the space says (1,)")):
                envs.reset(seed=0)

    def test_strict_must_match_a_given_pool(self, no_leaks):
        pool = shmpool.Pool(recording(), 2, num_workers=1)
        with pytest.raises(ValueError, match="strict=False but the pool was built with strict=True"):
            shmpool.VectorEnv(pool, strict=False)
        with shmpool.VectorEnv(pool) as envs:
            assert envs.strict is True


def test_lenient_actions_still_refuse_what_the_slots_cannot_hold(no_leaks):
    with shmpool.VectorEnv([recording(act_space=spaces.MultiBinary(2))] * 2) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=re.escape("actions do not fit the action dtype int8 for env 1: [1, 300]")):
            envs.step(np.array([[0, 1], [1, 300]]))
        with pytest.raises(ValueError, match="cannot be cast to the action dtype"):
            envs.step(np.zeros((2, 2)))
        *_, infos = envs.step(np.array([[0, 2], [1, -1]]))   # outside MultiBinary but an int8: the env decides
        assert infos["action"].tolist() == ["array([0, 2], dtype=int8)", "array([ 1, -1], dtype=int8)"]


@pytest.mark.parametrize("num_workers", [1, 3])
def test_pool_observation_mode(no_leaks, num_workers):
    boxes = [spaces.Box(0.0, float(i), (2,), np.float32) for i in range(1, 4)]
    fns = [recording(obs_space=box) for box in boxes]
    with pytest.raises(ValueError, match="all envs of a pool must share their spaces"):
        shmpool.Pool(fns, num_workers=num_workers)
    with shmpool.Pool(fns, num_workers=num_workers, observation_mode="different") as pool:
        assert pool.observation_spaces == tuple(boxes) and pool.single_observation_space == boxes[0]
    for workers in (1, 2):   # the same error wherever the odd env runs
        with pytest.raises(shmpool.SpacesDifferError) as info:
            shmpool.Pool([recording(), recording(obs_space=spaces.Box(0.0, 1.0, (3,), np.float32))],
                         num_workers=workers, observation_mode="different")
        assert str(info.value) == (
            "env 1 has observation space Box(0.0, 1.0, (3,), float32); env 0 has Box(-10.0, 10.0, (1,), float32): all "
            "envs of a pool must share their spaces: spaces of one type, shape and dtype")
        assert info.value.observation_spaces[1].shape == (3,)


def test_context_is_the_start_method(no_leaks):
    with shmpool.VectorEnv([recording()] * 2, context="spawn", num_workers=1) as envs:
        assert envs.context == "spawn"
        assert envs.pool.apply(lambda env: multiprocessing.current_process().authkey is not None) == (True, True)
        assert envs.reset(seed=0)[0].tolist() == [[0.0], [0.0]]


def test_timed_out_reset_and_call_stay_pending(no_leaks, gate, tmp_path):
    with shmpool.VectorEnv([recording(reset_gate=gate)] * 2, num_workers=2) as envs:
        envs.reset_async(seed=5)
        with pytest.raises(TimeoutError):  # the builtin too: WaitTimeoutError is both
            envs.reset_wait(timeout=0.05)
        with pytest.raises(gym.error.AlreadyPendingCallError):
            envs.step_async(np.array([0, 1]))
        gate.open()
        _, infos = envs.reset_wait(timeout=30)
        assert infos["keys"].tolist() == ["options,seed"] * 2
        assert envs.np_random_seed == (5, 6)
        call_gate = Gate(tmp_path)
        envs.call_async("held", call_gate)
        with pytest.raises(shmpool.vector.WaitTimeoutError):
            envs.call_wait(timeout=0.05)
        call_gate.open()
        assert envs.call_wait() == ("opened", "opened")


def test_close_ends_a_pending_reset(no_leaks, gate, monkeypatch):
    envs = shmpool.VectorEnv([recording(reset_gate=gate)] * 2, num_workers=1)
    envs.reset_async()
    with pytest.raises(multiprocessing.TimeoutError):
        envs.reset_wait(timeout=0.05)
    threading.Timer(0.2, gate.open).start()   # the reset ends while close() waits for it
    waits = record_waits(monkeypatch, shmpool.workerset)
    with warnings.catch_warnings():   # gymnasium's "Calling `close` while waiting ..." (if its logger warns)
        warnings.simplefilter("ignore")
        envs.close()
    assert envs.pool.closed and envs.closed and gate.is_open
    # The reset ends at 0.2 s, then the worker closes its envs and says so: close() read its words (met), it did
    # not wait out CLOSE_GRACE_S (5 s) for a worker it then had to kill.
    assert [w.met for w in waits] == [True], waits


@pytest.mark.parametrize("kind", ["AsyncVectorEnv", "shmpool"])
def test_close_terminate_ends_a_held_call_at_once(no_leaks, gate, kind, monkeypatch):
    """AsyncVectorEnv's ``close(terminate=True)`` kills its workers at once, without waiting for the call they are
    in.  shmpool's waited the call out, up to ``CLOSE_GRACE_S`` (1 s here), then killed.  Every env runs in a worker
    (``parent_shard=False``): an env held in the trainer's own process cannot be ended by any close."""
    monkeypatch.setattr(shmpool.workerset, "CLOSE_GRACE_S", 1.0)
    fns = [recording(reset_gate=gate)] * 2
    envs = AsyncVectorEnv(fns) if kind == "AsyncVectorEnv" else shmpool.VectorEnv(fns, parent_shard=False)
    envs.reset_async(seed=0)
    waits = record_waits(monkeypatch, shmpool.workerset)
    t0 = time.monotonic()
    with warnings.catch_warnings():   # "Calling `close` while waiting for a pending call ..."
        warnings.simplefilter("ignore")
        envs.close(terminate=True)
    took = time.monotonic() - t0
    assert envs.closed and not gate.is_open
    # The held reset never ends by itself, so a close that waited for it would take the whole grace (1 s).
    # shmpool's: not one slice waited for the workers (killed at once).  AsyncVectorEnv's has no slices to
    # count: killing two processes takes milliseconds, 0.9 s leaves a loaded machine ~20x.
    if kind == "shmpool":
        assert waits == [], waits
    else:
        assert took < 0.9, f"close(terminate=True) took {took:.2f} s"


@pytest.mark.parametrize("keywords,error,message", [
    (dict(daemon=False), ValueError, "daemon=False is not supported by shmpool.VectorEnv: its workers are always "
     "daemonic processes"),
    (dict(worker=print), TypeError, "has no meaning for shmpool.VectorEnv: AsyncVectorEnv's worker functions "
     "speak its pipe protocol"),
    (dict(context="spawn", start_method="fork"), ValueError, "context='spawn' and start_method='fork' disagree"),
])
def test_async_vector_env_keywords_without_meaning_here(no_leaks, keywords, error, message):
    with pytest.raises(error, match=re.escape(message)):
        shmpool.VectorEnv([recording()] * 2, **keywords)


def test_max_concurrency_caps_the_default_workers_and_refuses_more(no_leaks):
    with shmpool.VectorEnv([recording()] * 4, max_concurrency=1) as envs:
        assert envs.pool.num_workers == 1
    with pytest.raises(ValueError, match=re.escape("num_workers=2 is more than max_concurrency=1: each worker steps "
                                                   "one env at a time")):
        shmpool.VectorEnv([recording()] * 4, max_concurrency=1, num_workers=2)


def test_make_vec_async_style(no_leaks):
    reference = gym.make_vec("CartPole-v1", 2, vectorization_mode="async", vector_kwargs={"shared_memory": True})
    ours = shmpool.make_vec("CartPole-v1", 2, vectorization_mode="async", vector_kwargs={"shared_memory": True})
    try:
        np.testing.assert_array_equal(ours.reset(seed=1)[0], reference.reset(seed=1)[0])
    finally:
        reference.close()
        ours.close()
    for mode in ("sync", "vector_entry_point"):
        with pytest.raises(ValueError, match=f"vectorization_mode='{mode}' has no meaning for shmpool.make_vec"):
            shmpool.make_vec("CartPole-v1", 2, vectorization_mode=mode)
    with pytest.raises(ValueError, match=re.escape("Invalid vectorization mode: 'fast'")):
        shmpool.make_vec("CartPole-v1", 2, vectorization_mode="fast")
