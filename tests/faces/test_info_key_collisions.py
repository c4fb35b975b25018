"""An env's own info keys named like the vector env's own (``final_obs``, ``_final_obs``, ``final_info``,
``final_observation``, ...) and info arrays whose shape differs between envs, against the installed gymnasium's
``SyncVectorEnv`` and ``AsyncVectorEnv`` in the same parametrized test.

Under gymnasium 0.29 the vector env's keys are ``final_observation``/``final_info`` (ended envs only) and 1.x's
``final_obs``/``_final_obs`` are ordinary keys; under 1.x (SAME_STEP) ``final_obs``/``final_info`` are the vector
env's, and an env's own key of that name is batched as ``VectorEnv._add_info`` batches it (``final_obs`` one object
per env).  shmpool must return what the reference returns, key for key, type for type."""
from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from envs import same
from gymnasium import spaces

import shmpool
from shmpool.gym_compat import HAS_AUTORESET_MODE, LEGACY

REFERENCES = ["SyncVectorEnv", "AsyncVectorEnv"]
LENGTHS = (2, 3, 5)   # the envs end at different steps: steps where none, one or several ended
STEPS = 8

# A value of each colliding key for step ``t`` (reset: t=0) at ``where`` ("reset"/"step").
VALUES = {
    "final_obs": lambda t, where: np.array([t, 9.0], np.float32),
    "_final_obs": lambda t, where: t,
    "final_info": lambda t, where: {"own": t, "where": where},
    "_final_info": lambda t, where: f"mine{t}",
    "final_observation": lambda t, where: f"fo{t}",
    "_final_observation": lambda t, where: 1.5 * t,
}


class OwnKeysEnv(gym.Env):
    """Puts ``keys`` (named like the vector env's own) in every reset's and step's info; its episodes last
    ``length`` steps."""

    observation_space = spaces.Box(-1e3, 1e3, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, keys, length, at=("reset", "step")):
        self.keys, self.length, self.at, self.t = keys, length, at, 0

    def _info(self, where):
        info = {"phase": where}
        if where in self.at:
            info.update({k: VALUES[k](self.t, where) for k in self.keys})
        return info

    def _obs(self):
        return np.array([self.t, self.length], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), self._info("reset")

    def step(self, action):
        self.t += 1
        return self._obs(), float(action), self.t >= self.length, False, self._info("step")


def autoreset_modes():
    """The reference's autoreset modes: 0.29 and 1.0 have one (no keyword), 1.1+ the three."""
    if not HAS_AUTORESET_MODE:
        return [None]
    return [None, gym.vector.AutoresetMode.SAME_STEP, gym.vector.AutoresetMode.DISABLED]


def build(kind, fns, mode):
    kwargs = {} if mode is None else {"autoreset_mode": mode}
    if kind == "shmpool":
        return shmpool.VectorEnv(fns, num_workers=2, **kwargs)
    return getattr(gym.vector, kind)(fns, **kwargs)


def outcome(fn):
    """``fn()``'s result, or its error's type and message."""
    try:
        return ("returned", fn())
    except Exception as exc:  # noqa: BLE001 - the error is the result being compared
        return (type(exc).__name__, str(exc))


def run(kind, fns, mode, steps=STEPS):
    """A seeded reset and ``steps`` steps; an error ends the run as its last item (type and message)."""
    envs = build(kind, fns, mode)
    out = []
    try:
        out.append(outcome(functools.partial(envs.reset, seed=0)))
        for t in range(steps):
            if out[-1][0] != "returned":
                break
            last = out[-1][1]
            if mode is not None and mode.name == "DISABLED" and len(last) == 5:   # its ended envs reset by hand
                ended = last[2] | last[3]
                if ended.any():
                    out.append(outcome(functools.partial(envs.reset, options={"reset_mask": ended})))
                    continue
            out.append(outcome(functools.partial(envs.step, np.array([(t + i) % 2 for i in range(len(fns))]))))
        return out
    finally:
        envs.close(terminate=True)


KEY_SETS = [("final_obs",), ("final_info",), ("final_observation",), ("_final_observation",),
            ("final_obs", "final_info", "final_observation"),
            ("_final_obs",), ("_final_info",)]   # under 0.29 these met the pool's masks beside an ended env


@pytest.mark.parametrize("mode", autoreset_modes(), ids=str)
@pytest.mark.parametrize("keys", KEY_SETS, ids=lambda keys: "+".join(keys))
@pytest.mark.parametrize("reference", REFERENCES)
def test_an_envs_keys_named_like_the_vector_envs_as_the_reference(no_leaks, reference, keys, mode):
    if reference == "SyncVectorEnv" and mode is not None and mode.name == "SAME_STEP":
        # 1.x's SyncVectorEnv batches an ended env's final keys, then its reset info into them (a reset info's
        # final_info dict is merged into the final one); AsyncVectorEnv, the face's reference, lets the reset
        # info's keys replace them.  The two differ here, so AsyncVectorEnv decides.
        pytest.skip("1.x's SyncVectorEnv and AsyncVectorEnv differ on a reset info's final keys")
    fns = [functools.partial(OwnKeysEnv, keys, length) for length in LENGTHS]
    same(run("shmpool", fns, mode), run(reference, fns, mode), "run")


@pytest.mark.parametrize("at", [("step",), ("reset",)], ids=["step infos", "reset infos"])
@pytest.mark.parametrize("reference", REFERENCES)
def test_an_envs_own_final_obs_only_in_step_or_reset_infos(no_leaks, reference, at):
    """An ended env's reset info holds the key, or only the steps that do not end do."""
    keys = ("final_obs", "final_info")
    fns = [functools.partial(OwnKeysEnv, keys, length, at) for length in LENGTHS]
    same(run("shmpool", fns, None), run(reference, fns, None), "run")


@pytest.mark.skipif(not LEGACY, reason="gymnasium 0.29's own keys")
def test_under_0_29_an_envs_final_obs_stays_its_own(no_leaks):
    """The issue's case, literally: an env that did not end keeps its ``final_obs``, no ``final_observation``
    and no empty ``final_info`` appear, an env's ``final_info`` survives a step where no env ended."""
    fns = [functools.partial(OwnKeysEnv, ("final_obs", "final_info"), length) for length in (9, 9)]
    envs = shmpool.VectorEnv(fns, num_workers=2)
    try:
        envs.reset(seed=0)
        infos = envs.step(np.array([0, 1]))[4]
    finally:
        envs.close()
    assert "final_observation" not in infos and "_final_observation" not in infos
    assert infos["final_obs"].dtype == object and infos["final_obs"][1].tolist() == [1.0, 9.0]
    assert infos["final_info"].tolist() == [{"own": 1, "where": "step"}] * 2


class FixedInfoEnv(gym.Env):
    """Gives the same ``info`` at every reset and step; its episodes last ``length`` steps."""

    observation_space = spaces.Box(-1e3, 1e3, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, info, length):
        self.info, self.length, self.t = info, length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), dict(self.info)

    def step(self, action):
        self.t += 1
        return np.full(1, self.t, np.float32), 1.0, self.t >= self.length, False, dict(self.info)


@pytest.mark.parametrize("info", [{"final_info": "step"}, {"_final_obs": False}, {"final_obs": 1.5},
                                  {"final_obs": 2, "final_info": None}, {"_final_info": "x", "a": 1}],
                         ids=["string final_info", "_final_obs", "float final_obs", "int and None", "_final_info"])
@pytest.mark.parametrize("reference", REFERENCES)
def test_an_envs_own_values_of_the_vector_envs_key_names_as_the_reference(no_leaks, reference, info):
    """The second adversarial round under 0.29: a string ``final_info`` beside an ended env raised AttributeError,
    an env's ``_final_obs`` a KeyError, and a float ``final_obs`` in a reset info came back as an object array;
    0.29's vector envs return each as the env gave it.  Two envs end at different steps."""
    fns = [functools.partial(FixedInfoEnv, info, length) for length in (1, 3)]
    same(run("shmpool", fns, None, steps=4), run(reference, fns, None, steps=4), "run")


class ShapesEnv(gym.Env):
    """Env ``k``'s info holds an array of ``k + 1`` elements (another shape in each env); ``nested`` puts it
    inside a dict."""

    observation_space = spaces.Box(-1, 1, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, k, nested=False):
        self.k, self.nested = k, nested

    def _info(self):
        arr = np.arange(self.k + 1, dtype=np.float32)
        return {"d": {"arr": arr}} if self.nested else {"arr": arr, "mat": np.ones((self.k + 1, 2), np.int16)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), self._info()

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, self._info()


@pytest.mark.parametrize("nested", [False, True], ids=["top level", "nested"])
@pytest.mark.parametrize("reference", REFERENCES)
def test_info_arrays_of_differing_shapes_as_the_reference(no_leaks, reference, nested):
    """0.29 keeps one object per env; 1.x raises numpy's broadcast error (so must shmpool, there)."""
    fns = [functools.partial(ShapesEnv, k, nested) for k in range(3)]
    want = run(reference, fns, None, steps=2)
    got = run("shmpool", fns, None, steps=2)
    if want[0][0] != "returned":   # 1.x: numpy's error; its wording names the shapes, which the pool's batch
        assert got[0][0] == want[0][0] and "could not broadcast" in got[0][1]   # may meet in another order
        return
    same(got, want, "run")
