"""The gymnasium face against the installed gymnasium's own vector envs, 1.x or 0.29 alike.

Every test runs one scenario on gymnasium's reference class (``AsyncVectorEnv``, or
``SyncVectorEnv`` where a whole run is compared) and on ``shmpool.VectorEnv`` and asserts the two
give the same: observations, rewards, flags and infos (their layout, dtypes and python/numpy types,
autoreset's final keys included), what an env's ``reset`` receives and ``call``/``get_attr``/``set_attr``
(the errors of calls out of order are tests/faces/test_face_call_order.py's, under both versions too).
Under gymnasium 0.29 the reference is 0.29's ``AsyncVectorEnv`` (one same-step autoreset,
``final_observation``/``final_info``, 0.29's info layout); under 1.x, 1.x's.  The literal checks
beside the comparisons only pin down which of the two contracts the reference showed
(``shmpool.gym_compat`` explains them).
"""
from __future__ import annotations

import functools
import multiprocessing
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from envs import same
from gymnasium import spaces

import shmpool
from shmpool.gym_compat import LEGACY

N = 3


class InfoEnv(gym.Env):
    """Every kind of info value the two layouts treat apart (python and numpy numbers, np.bool_,
    strings, arrays, nested dicts, keys some steps lack); its episode ends after ``length`` steps,
    terminated unless the last action is 2 (then truncated)."""

    observation_space = spaces.Box(-1e3, 1e3, (2,), np.float32)
    action_space = spaces.Discrete(3)
    value = 7

    def __init__(self, length=3):
        self.length, self.t = length, 0

    def _obs(self):
        return np.array([self.t, self.length], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {"resets": 1, "phase": "start"}

    def step(self, action):
        self.t += 1
        info = {"step": self.t, "half": np.float32(self.t / 2), "flag": np.bool_(action == 1), "name": f"t{self.t}",
                "vec": np.arange(2) * self.t, "nested": {"a": self.t, "b": {"c": 0.5 * self.t}}}
        if self.t % 2:
            info["odd"] = True
        done = self.t >= self.length
        return self._obs(), float(action), done and action != 2, done and action == 2, info

    def get_value(self, k=1):
        return self.value * k


class KwargsEnv(InfoEnv):
    """Reports which keywords its ``reset`` was given."""

    def reset(self, **kwargs):
        super().reset(seed=kwargs.get("seed"))
        return self._obs(), {"keys": ",".join(sorted(kwargs))}


class HeldResetEnv(InfoEnv):
    """A reset with options waits at the test's gate."""

    def __init__(self, gate, length=3):
        super().__init__(length)
        self.gate = gate

    def reset(self, *, seed=None, options=None):
        if options:
            self.gate.hold()
        return super().reset(seed=seed)


class FailingEnv(InfoEnv):
    def step(self, action):
        if self.t == 1:
            raise ValueError("the env's own error")
        return super().step(action)


def info_envs():
    return [functools.partial(InfoEnv, length) for length in (2, 3, 4)]


def build(kind, fns, **kwargs):
    if kind == "shmpool":
        return shmpool.VectorEnv(fns, num_workers=2, **kwargs)
    return getattr(gym.vector, kind)(fns, **kwargs)


def run(kind, fns, steps=9, **kwargs):
    """Everything a seeded reset and ``steps`` steps return."""
    envs = build(kind, fns, **kwargs)
    try:
        out = [envs.reset(seed=0)]
        for t in range(steps):
            n = envs.single_action_space.n
            out.append(envs.step(np.array([(t + i) % n for i in range(envs.num_envs)])))
        return out, dict(envs.metadata)
    finally:
        envs.close()


@pytest.mark.parametrize("reference", ["SyncVectorEnv", "AsyncVectorEnv"])
def test_a_run_with_every_kind_of_info_equals_the_reference(no_leaks, reference):
    want, want_metadata = run(reference, info_envs())
    got, got_metadata = run("shmpool", info_envs())
    same(got, want, "run")
    assert got_metadata == want_metadata
    ended = [step[4] for step in want[1:] if (step[2] | step[3]).any()]
    assert ended, "the scenario must end episodes"
    # Which contract the reference showed: 0.29's same-step final keys, or 1.x's next step.
    assert all(("final_observation" in infos) == LEGACY for infos in ended)


def test_cartpole_runs_equal_the_reference(no_leaks):
    fns = [functools.partial(gym.make, "CartPole-v1", max_episode_steps=20)] * 4
    same(run("shmpool", fns, steps=45)[0], run("AsyncVectorEnv", fns, steps=45)[0], "run")


def reset_keywords(kind):
    envs = build(kind, [KwargsEnv] * 2)
    try:
        return [envs.reset()[1]["keys"].tolist(), envs.reset(seed=3)[1]["keys"].tolist(),
                envs.reset(options={"x": 1})[1]["keys"].tolist()]
    finally:
        envs.close()


def test_reset_passes_the_env_what_the_reference_passes(no_leaks):
    want = reset_keywords("AsyncVectorEnv")
    assert reset_keywords("shmpool") == want
    assert want[0] == ([""] * 2 if LEGACY else ["options,seed"] * 2)


def outcome(fn):
    """``fn()``'s result, or its error's type and message."""
    try:
        return ("returned", fn())
    except Exception as exc:  # noqa: BLE001 - the error is the result being compared
        return (type(exc).__name__, str(exc))


def calls(kind, wrapped):
    fns = [(lambda: gym.wrappers.TimeLimit(InfoEnv(), 50)) if wrapped else InfoEnv] * N
    envs = build(kind, fns)
    try:
        envs.reset(seed=0)
        out = [outcome(lambda: envs.call("get_value", 2)), outcome(lambda: envs.call("value")),
               outcome(lambda: envs.get_attr("length"))]
        out.append(outcome(lambda: envs.set_attr("value", [1, 2, 3])))
        out += [outcome(lambda: envs.call("get_value")), outcome(lambda: envs.get_attr("value"))]
        out.append(outcome(lambda: envs.set_attr("value", 5)))
        out.append(outcome(lambda: envs.get_attr("value")))
        out.append(outcome(lambda: envs.set_attr("value", [1, 2])))
        return out
    finally:
        envs.close()


@pytest.mark.filterwarnings("ignore::UserWarning")   # 0.29 warns on attributes read through a wrapper
@pytest.mark.parametrize("wrapped", [False, True], ids=["env", "wrapped env"])
def test_call_get_attr_set_attr_as_the_reference(no_leaks, wrapped):
    assert calls("shmpool", wrapped) == calls("AsyncVectorEnv", wrapped)


def call_error(kind, name):
    envs = build(kind, [InfoEnv] * 2)
    try:
        envs.reset(seed=0)
        with pytest.raises(Exception) as info:   # noqa: PT011 - the reference's type is the expectation
            envs.call(name)
        return info.value
    finally:
        envs.close(terminate=True)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ["reset", "step", "close", "seed", "_setattr", "_check_spaces"])
def test_call_refuses_the_names_the_reference_refuses(no_leaks, name):
    """Each version refuses its own list with its own message (an AsyncVectorEnv worker that
    refused one is shut down, hence one name per test)."""
    want, got = call_error("AsyncVectorEnv", name), call_error("shmpool", name)
    assert isinstance(got, type(want)), f"{type(got)} is no {type(want)}"
    if str(want).startswith("Trying to call function"):
        assert (type(got), str(got)) == (type(want), str(want))


@pytest.mark.parametrize("kind, placement", [("AsyncVectorEnv", {}), ("shmpool", {"parent_shard": False}),
                                             ("shmpool", {"parent_shard": True})],
                         ids=["AsyncVectorEnv", "shmpool-workers", "shmpool-parent_shard"])
def test_close_terminate_with_a_step_pending_leaves_a_closed_env(no_leaks, kind, placement):
    """``close(terminate=True)`` kills without closing the envs (shmpool's workers; the parent shard's envs are closed
    in place, since a thread cannot be killed): afterwards the env is closed and says so as the reference does,
    and nothing is left behind (``no_leaks``)."""
    envs = build(kind, [lambda: gym.make("CartPole-v1")] * 2, **placement)
    envs.reset(seed=0)
    envs.step_async(np.zeros(2, np.int64))
    with warnings.catch_warnings():   # "Calling `close` while waiting for a pending call ..."
        warnings.simplefilter("ignore")
        envs.close(terminate=True)
    assert envs.closed
    name = "AsyncVectorEnv" if kind == "AsyncVectorEnv" else "VectorEnv"
    with pytest.raises(gym.error.ClosedEnvironmentError,
                       match=re.escape(f"Trying to operate on `{name}`, after a call to `close()`.")):
        envs.step(np.zeros(2, np.int64))


@pytest.mark.parametrize("kind", ["AsyncVectorEnv", "shmpool"])
def test_wait_timeout_raises_the_references_error(no_leaks, gate, kind):
    envs = build(kind, [functools.partial(HeldResetEnv, gate)] * 2)
    try:
        envs.reset_async(options={"slow": True})
        with pytest.raises(multiprocessing.TimeoutError) as info:
            envs.reset_wait(timeout=0.1)
        assert str(info.value) == "The call to `reset_wait` has timed out after 0.1 second(s)."
    finally:
        gate.open()   # an env held in shmpool's parent shard cannot be killed: close(terminate=True) would wait for it
        envs.close(terminate=True)


@pytest.mark.parametrize("kind", ["AsyncVectorEnv", "shmpool"])
def test_an_envs_exception_keeps_its_type(no_leaks, kind):
    envs = build(kind, [FailingEnv] * 2)
    try:
        envs.reset(seed=0)
        envs.step(np.array([0, 0]))
        with pytest.raises(ValueError, match="the env's own error"):
            envs.step(np.array([0, 0]))
    finally:
        envs.close(terminate=True)


def test_make_vec_equals_the_references_async_vector_env(no_leaks):
    if LEGACY:
        reference = gym.vector.make("CartPole-v1", num_envs=2, asynchronous=True)
    else:
        reference = gym.make_vec("CartPole-v1", 2, vectorization_mode="async")
    ours = shmpool.make_vec("CartPole-v1", 2)
    try:
        runs = []
        for envs in (reference, ours):
            out = [envs.reset(seed=1)]
            out += [envs.step(np.array([t % 2, 1])) for t in range(30)]
            runs.append(out)
        same(runs[1], runs[0], "run")
    finally:
        reference.close()
        ours.close()


# --- gymnasium 0.29 only: the keyword 0.29 does not have ------------------------------------

legacy_only = pytest.mark.skipif(not LEGACY, reason="autoreset_mode's mapping under gymnasium 0.29")


@legacy_only
def test_under_0_29_same_step_is_the_default(no_leaks):
    same(run("shmpool", info_envs(), autoreset_mode="same_step")[0], run("shmpool", info_envs())[0], "run")


@legacy_only
def test_under_0_29_next_step_is_the_pools_next_step_in_0_29s_layout(no_leaks):
    got, metadata = run("shmpool", info_envs(), steps=4, autoreset_mode="next_step")
    assert "autoreset_mode" not in metadata
    _, _, term, trunc, infos = got[2]            # the second step: env 0 (length 2) ends
    assert (term | trunc).tolist() == [True, False, False] and "final_observation" not in infos
    obs, reward, *_ = got[3]                     # the next step resets it, reward 0
    assert obs[0].tolist() == [0.0, 2.0] and reward[0] == 0.0
    assert got[2][4]["nested"].dtype == object   # 0.29's layout: a dict per env


@pytest.mark.skipif(not LEGACY, reason="the EnvPool face's autoreset under gymnasium 0.29")
def test_under_0_29_the_envpool_face_autoresets_on_the_same_step_when_asked(no_leaks):
    # Its default is EnvPool's next step (tests/faces/test_porting_cleanrl.py); same_step is 0.29's.
    env = shmpool.make("CartPole-v1", num_envs=2, seed=0, max_episode_steps=5, autoreset_mode="same_step")
    try:
        env.reset()
        for _ in range(5):
            obs, _, term, trunc, info = env.step(np.array([0, 1]))
        assert trunc.all() and "final_observation" in info
        assert info["elapsed_step"].tolist() == [0, 0]   # the rows are the new episodes'
        assert not np.array_equal(obs[0], info["final_observation"][0])
    finally:
        env.close()


def test_wrapped_envs_are_built_and_set_without_gymnasiums_wrapper_warnings(no_leaks):
    """shmpool's own lookups (``bind_obs``, ``set_wrapper_attr``) never go through gymnasium 0.29's
    forwarding ``Wrapper.__getattr__``, which warns on every read and would find an inner env's."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs = shmpool.VectorEnv([lambda: gym.wrappers.TimeLimit(InfoEnv(), 50)] * 2, parent_shard=True)
        try:
            envs.reset(seed=0)
            envs.set_attr("value", 3)
            assert envs.get_attr("value") == (3, 3)
        finally:
            envs.close()
    assert not [str(w.message) for w in caught if "deprecated" in str(w.message)]


class DictObsEnv(InfoEnv):
    """Dict observations (OrderedDicts under gymnasium 0.29, dicts under 1.x, as its Dict space samples)."""

    observation_space = spaces.Dict({"pos": spaces.Box(-1e3, 1e3, (2,), np.float32), "t": spaces.Discrete(10)})

    def _obs(self):
        sample = self.observation_space.sample()   # the mapping type this gymnasium's Dict gives
        sample["pos"][:] = (self.t, self.length)
        sample["t"] = self.t
        return sample


def test_dict_observations_equal_the_reference(no_leaks):
    fns = [functools.partial(DictObsEnv, length) for length in (2, 3, 4)]
    same(run("shmpool", fns, steps=6)[0], run("AsyncVectorEnv", fns, steps=6)[0], "run")


def sync_vector_env(num_envs, start=0):
    return gym.vector.SyncVectorEnv([InfoEnv] * num_envs)


@legacy_only
def test_under_0_29_hosting_a_vector_env_is_refused_with_the_reason(no_leaks):
    with pytest.raises(Exception, match="hosting a gymnasium VectorEnv .* needs gymnasium>=1.0"):
        shmpool.Pool(shmpool.Batched(sync_vector_env), 2, num_workers=1)


def episode_statistics(kind):
    """The version's own episode-statistics vector wrapper over ``kind``: its infos, times left out."""
    wrapper = gym.wrappers.RecordEpisodeStatistics if LEGACY else gym.wrappers.vector.RecordEpisodeStatistics
    envs = wrapper(build(kind, info_envs()))
    try:
        out = [envs.reset(seed=0)[1]]
        for t in range(9):
            infos = envs.step(np.array([(t + i) % 3 for i in range(3)]))[4]
            infos.get("episode", {}).pop("t", None)
            out.append(infos)
        return out
    finally:
        envs.close()


def test_the_versions_episode_statistics_wrapper_works_on_top(no_leaks):
    want = episode_statistics("AsyncVectorEnv")
    assert any("episode" in infos for infos in want)
    same(episode_statistics("shmpool"), want, "infos")
