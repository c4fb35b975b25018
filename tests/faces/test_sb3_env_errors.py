"""SB3's VecEnvs let an env's exception through as itself: ``ShmVecEnv`` does too.

``DummyVecEnv`` runs the envs in the caller, so ``except KeyError`` around ``step()`` works;
``ShmVecEnv`` re-raises the env's exception (chained to the pool's ``EnvError``, which names
the env and holds the worker's traceback).  ``SubprocVecEnv`` is not the reference here: its
worker dies with the exception and the parent gets ``EOFError``."""
from __future__ import annotations

import gymnasium as gym
import heavy_imports
import numpy as np
import pytest

from shmpool import EnvError

heavy_imports.require("stable_baselines3")
pytestmark = pytest.mark.heavy_imports   # SB3 (and torch) in the test process
sb3 = heavy_imports.names(DummyVecEnv="stable_baselines3.common.vec_env", ShmVecEnv="shmpool.sb3")


class EnvSpecificError(Exception):
    """An exception type of the env's own, not a builtin."""


class Failing(gym.Env):
    """Raises ``error`` in ``phase`` ("reset", "step" or "method")."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, phase: str, error: type[Exception]) -> None:
        self.phase, self.error = phase, error

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.phase == "reset":
            raise self.error("failed in reset")
        return np.zeros(2, np.float32), {}

    def step(self, action):
        if self.phase == "step":
            raise self.error("failed in step")
        return np.zeros(2, np.float32), 0.0, False, False, {}

    def method(self):
        raise self.error("failed in method")


def _venv(cls, phase, error):
    fns = [lambda: Failing(phase, error)] * 2
    return cls(fns) if cls is sb3.DummyVecEnv else cls(fns, num_workers=1)


@pytest.mark.parametrize("error", [KeyError, ValueError, EnvSpecificError])
@pytest.mark.parametrize("phase", ["reset", "step", "method"])
@pytest.mark.parametrize("cls_name", ["DummyVecEnv", "ShmVecEnv"])
def test_env_exception_is_raised_as_its_own_type(cls_name, phase, error, no_leaks):
    cls = getattr(sb3, cls_name)
    venv = _venv(cls, phase, error)
    try:
        with pytest.raises(error, match=f"failed in {phase}") as caught:
            if phase != "reset":
                venv.reset()
            if phase == "step":
                venv.step(np.zeros(2, dtype=np.int64))
            elif phase == "method":
                venv.env_method("method")
            else:
                venv.reset()
        assert type(caught.value) is error
        if cls is sb3.ShmVecEnv:  # the pool's account of where it happened stays reachable
            assert isinstance(caught.value.__cause__, EnvError) and caught.value.__cause__.env_id == 0
    finally:
        venv.close()
