"""Six mistakes a new user made (issue 68), each answered with its cause and its fix, on every face it reaches.

Where a face's behaviour is the subject, gymnasium's vector envs stand beside it in the same parametrized test:
they refuse the same mistakes with the same exception type, only in other words."""
from __future__ import annotations

import importlib.util
import multiprocessing
import os
import subprocess
import sys
import warnings

import gymnasium as gym
import heavy_imports
import numpy as np
import pytest
from envs import CounterEnv
from gymnasium import spaces
from gymnasium.error import ClosedEnvironmentError

import shmpool
from shmpool.errors import PoolClosedError

HAVE_SB3 = importlib.util.find_spec("stable_baselines3") is not None
sb3_face = heavy_imports.names(ShmVecEnv="shmpool.sb3")
# The SB3 face's cases import SB3 and torch: they carry the heavy_imports mark (run last) and need the extra.
SB3 = (pytest.mark.heavy_imports, pytest.mark.skipif(not HAVE_SB3, reason="needs stable-baselines3 ([sb3] extra)"))


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


# --- an env instance where a constructor is needed --------------------------------------------------------


@pytest.mark.parametrize("face", ["AsyncVectorEnv", "Pool", "VectorEnv", pytest.param("ShmVecEnv", marks=SB3)])
@pytest.mark.parametrize("given", ["one", "list"])
def test_an_env_instance_is_refused_naming_a_constructor_as_the_fix(face, given, no_leaks):
    """``Pool(gym.make("CartPole-v1"), 4)`` said ``'TimeLimit' object is not iterable``.  Every face raises the
    reference's TypeError, saying that an env instance was given and what to give instead."""
    env = gym.make("CartPole-v1")
    arg = env if given == "one" else [env, env]
    build = {"AsyncVectorEnv": lambda: gym.vector.AsyncVectorEnv(arg),
             "Pool": lambda: shmpool.Pool(arg, 2),
             "VectorEnv": lambda: shmpool.VectorEnv(arg, 2 if given == "one" else None),
             "ShmVecEnv": lambda: sb3_face.ShmVecEnv(arg)}[face]
    if face == "AsyncVectorEnv":   # the reference: a TypeError, whatever its words
        with pytest.raises(TypeError):
            build()
        return
    with pytest.raises(TypeError, match=r"an env instance \(TimeLimit\) was given where .*constructor.*"
                                        r"lambda: gym\.make\('CartPole-v1'\).*the id 'CartPole-v1'"):
        build()
    env.close()


# --- Dict actions as a list of per-env dicts --------------------------------------------------------------


class DictActionEnv(gym.Env):
    """A Dict action space, as a robot arm's (a gripper command and a joint target)."""

    def __init__(self):
        self.action_space = spaces.Dict({"grip": spaces.Discrete(2), "joints": spaces.Box(-1, 1, (3,), np.float32)})
        self.observation_space = spaces.Box(-10, 10, (3,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.asarray(action["joints"], np.float32), float(action["grip"]), False, False, {}


@pytest.mark.parametrize("face", ["SyncVectorEnv", "AsyncVectorEnv", "Pool", "VectorEnv"])
def test_dict_actions_given_per_env_name_the_batched_layout(face, no_leaks):
    """The reference refuses a list of per-env dicts with a TypeError too (``list indices must be integers``);
    the faces say which layout a Dict action takes, and a step in that layout then works."""
    make = {"SyncVectorEnv": lambda: gym.vector.SyncVectorEnv([DictActionEnv] * 2),
            "AsyncVectorEnv": lambda: gym.vector.AsyncVectorEnv([DictActionEnv] * 2),
            "Pool": lambda: shmpool.Pool([DictActionEnv] * 2, num_workers=1),
            "VectorEnv": lambda: shmpool.VectorEnv([DictActionEnv] * 2)}[face]
    per_env = [{"grip": 1, "joints": np.full(3, 0.5, np.float32)}, {"grip": 0, "joints": np.zeros(3, np.float32)}]
    envs = make()
    try:
        envs.reset(seed=0)
        reference = face in ("SyncVectorEnv", "AsyncVectorEnv")
        pattern = (r"list indices must be integers" if reference else
                   r"actions for a Dict action space are one dict of batched arrays, one entry per key .*"
                   r"'grip': shape \(2,\), 'joints': shape \(2, 3\).*got a list of 2 per-env dicts.*np\.stack")
        with pytest.raises(TypeError, match=pattern):
            envs.step(per_env)
        if not reference:   # refused before anything was sent: the batched layout steps
            batched = {"grip": np.array([1, 0]), "joints": np.stack([a["joints"] for a in per_env])}
            obs, reward, *_ = envs.step(batched)
            assert reward.tolist() == [1.0, 0.0] and obs[0].tolist() == [0.5] * 3
    finally:
        envs.close()


# --- shmpool.ShmVecEnv ----------------------------------------------------------------------------------


def test_shmvecenv_at_the_top_level_without_sb3_names_the_extra():
    done = run("import sys; sys.modules['stable_baselines3'] = None\nimport shmpool\nshmpool.ShmVecEnv")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        'ImportError: shmpool.ShmVecEnv (shmpool.sb3.ShmVecEnv) needs the [sb3] extra: pip install "shmpool[sb3]"')


def test_import_shmpool_and_its_star_import_still_load_neither_sb3_nor_torch():
    done = run("import sys\nimport shmpool\nfrom shmpool import *\n"
               "print(sorted(m for m in ('stable_baselines3', 'torch') if m in sys.modules))")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.skipif(not HAVE_SB3, reason="needs stable-baselines3 ([sb3] extra)")
@pytest.mark.slow   # a fresh interpreter imports SB3 and torch: ~5 s on 2 cores
def test_shmvecenv_at_the_top_level_is_the_sb3_face():
    done = run("import shmpool, shmpool.sb3\nprint(shmpool.ShmVecEnv is shmpool.sb3.ShmVecEnv)")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"


# --- make("Pong-v4") --------------------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="needs ale-py ([atari] extra)")
@pytest.mark.parametrize("task_id", ["Pong-v4", "PongNoFrameskip-v4"])
def test_make_of_an_old_ale_id_warns_that_the_recipe_is_v5(task_id, no_leaks):
    """gymnasium's ``Pong-v4`` is built as asked (raw 210x160 RGB frames, a legitimate id), with a UserWarning
    that EnvPool's preprocessed Pong is the ``Pong-v5`` recipe."""
    with pytest.warns(UserWarning, match=rf"{task_id} is gymnasium's ALE env .*shmpool\.make\('Pong-v5'\)"):
        env = shmpool.make(task_id, num_envs=1, num_threads=1)
    try:
        assert env.single_observation_space.shape == (210, 160, 3)
    finally:
        env.close()


def test_make_of_an_id_without_a_v5_recipe_does_not_warn(no_leaks):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*recipe.*")
        env = shmpool.make("CartPole-v1", num_envs=1, num_threads=1)
    env.close()


# --- a forked child (a torch DataLoader worker) -----------------------------------------------------------


def _refusal_in_a_fork(envs) -> str:
    """What stepping ``envs`` in a forked child raises, as ``module.Type: message``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        os.close(read)
        try:
            envs.step(np.zeros(envs.num_envs, np.int64))
            said = "no error"
        except BaseException as exc:   # noqa: BLE001 - whatever it is, the parent reads it
            said = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    return said


@pytest.mark.parametrize("face", ["Pool", "VectorEnv", "make", pytest.param("ShmVecEnv", marks=SB3)])
def test_every_face_used_in_a_forked_child_names_the_fork(face, no_leaks):
    """The gymnasium faces said ``closed by an earlier error``; there was none.  Each face names the fork and the
    fix; the gymnasium faces keep gymnasium's ClosedEnvironmentError, the others the pool's PoolClosedError."""
    build = {"Pool": lambda: shmpool.Pool([CounterEnv] * 2, num_workers=1),
             "VectorEnv": lambda: shmpool.VectorEnv([CounterEnv] * 2, num_workers=1),
             "make": lambda: shmpool.make("CartPole-v1", num_envs=2, num_threads=1),
             "ShmVecEnv": lambda: sb3_face.ShmVecEnv([CounterEnv] * 2, num_workers=1)}[face]
    envs = build()
    try:
        envs.reset()
        said = _refusal_in_a_fork(envs)
        kind = ClosedEnvironmentError if face in ("VectorEnv", "make") else PoolClosedError
        assert said.startswith(f"{kind.__module__}.{kind.__name__}: "), said
        assert "was inherited by fork into process" in said and "create a new pool in the child" in said, said
        assert "earlier error" not in said
        envs.step(np.zeros(2, np.int64))   # the parent's pool is untouched
    finally:
        envs.close()


# --- a pool inside a multiprocessing.Pool worker (a daemonic process) -------------------------------------


def _pool_in_this_process(kwargs: dict) -> str:
    try:
        with shmpool.Pool([CounterEnv] * 2, **kwargs) as pool:
            pool.reset(seed=0)
            obs, *_ = pool.step(np.zeros(2, np.int64))
            return f"stepped {obs.shape}"
    except Exception as exc:   # noqa: BLE001 - the test reads what it was
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_pool_in_a_daemonic_process_names_the_cause_and_the_fix(start_method, no_leaks):
    """Decision: refuse with the cause and the fix rather than change the layout unasked.  A daemonic process (a
    ``multiprocessing.Pool`` worker) may not start children, and a pool's envs step in worker processes.  The
    error (a RuntimeError, before any worker is started) says so and gives both ways out: every env in this
    process (``num_workers=1, parent_shard=True``, which then works there, as the second call shows) or a
    non-daemonic process (``concurrent.futures.ProcessPoolExecutor``'s workers are not daemonic).  Python's own
    words were a bare ``AssertionError: daemonic processes are not allowed to have children``."""
    with multiprocessing.get_context(start_method).Pool(1) as workers:
        refused = workers.apply(_pool_in_this_process, ({"num_workers": 1},))
        in_process = workers.apply(_pool_in_this_process, ({"num_workers": 1, "parent_shard": True},))
    assert refused.startswith("RuntimeError: this process is daemonic (a multiprocessing.Pool worker"), refused
    assert "num_workers=1, parent_shard=True" in refused and "ProcessPoolExecutor" in refused, refused
    assert in_process == "stepped (2, 1)", in_process
