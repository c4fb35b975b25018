"""Issue 59: gymnasium's ALE ids (``ALE/Pong-v5``, ``BreakoutNoFrameskip-v4``) are known to every
face on its first call in a fresh process, whatever was (or was not) called before."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import gymnasium as gym
import pytest

GYMNASIUM_1 = int(gym.__version__.split(".")[0]) >= 1
# Each face's first call in a fresh interpreter, which imports ale-py (and SB3 with torch) again: 1.5-5 s a face.
pytestmark = pytest.mark.slow
needs_ale = pytest.mark.skipif(importlib.util.find_spec("ale_py") is None or not GYMNASIUM_1,
                               reason="needs ale-py with gymnasium 1.x (ale-py's envs need gymnasium >= 1.0)")


# --- 2. ALE ids whatever is called first -----------------------------------------------------------


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import shmpool\n" + code], capture_output=True, text=True,
                          timeout=180)


FIRST_CALLS = {
    "Pool": "env = shmpool.Pool('ALE/Pong-v5', 2)\nprint(env.single_observation_space.shape)",
    "VectorEnv": "env = shmpool.VectorEnv('ALE/Pong-v5', 2)\nprint(env.single_observation_space.shape)",
    "make_vec": "env = shmpool.make_vec('BreakoutNoFrameskip-v4', 2)\nprint(env.single_observation_space.shape)",
    "make": "env = shmpool.make('ALE/Pong-v5', num_envs=2)\nprint(env.observation_space.shape)",
    "gymnasium.make_vec": ("import gymnasium\nenv = gymnasium.make_vec('shmpool-ALE/Pong-v5', 2)\n"
                           "print(type(env).__name__, env.single_observation_space.shape)"),
    "ShmVecEnv": ("from shmpool.sb3 import ShmVecEnv\nenv = ShmVecEnv('ALE/Pong-v5', num_envs=2)\n"
                  "print(env.observation_space.shape)"),
}


@needs_ale
@pytest.mark.parametrize("face", sorted(FIRST_CALLS))
def test_ale_ids_on_a_face_s_first_call(face):
    if face == "ShmVecEnv" and importlib.util.find_spec("stable_baselines3") is None:
        pytest.skip("needs stable-baselines3")
    done = _fresh(FIRST_CALLS[face] + "\nenv.close()")
    assert done.returncode == 0, done.stderr[-1500:]
    want = "VectorEnv (210, 160, 3)" if face == "gymnasium.make_vec" else "(210, 160, 3)"
    assert done.stdout.strip() == want
