"""Errors cross process boundaries with their fields (issue 12, bug 4): a training function
run in a ProcessPoolExecutor (or a Ray task) re-raises the env's error, not a PicklingError."""
import concurrent.futures
import multiprocessing
import pickle

import gymnasium as gym
import pytest
from envs import FaultyEnv

import shmpool
from shmpool.errors import EnvError, PoolClosedError, PoolResourceError, WorkerDiedError, WorkerRestartedError

FIELDS = {
    EnvError: dict(env_id=3, worker=1, phase="step", remote_type="ValueError",
                   remote_traceback="Traceback ...\nValueError: boom", remote_exception=ValueError("boom")),
    WorkerDiedError: dict(worker=1, pid=1234, exitcode=-9),
    WorkerRestartedError: dict(worker=0, pid=99, exitcode=3),
    PoolResourceError: dict(errno_=24, resource="file descriptors", size=None, limit=64),
}


def _raise(cls):
    raise cls(f"{cls.__name__} message", **FIELDS[cls])


def _vector_env_error():
    """A real VectorEnv whose env raises ValueError in step, run in the executor's process."""
    with shmpool.VectorEnv([lambda: FaultyEnv(fail_in="step", at=1)] * 2, num_workers=1) as envs:
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())


def _executor():
    return concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))


def _same(a, b):
    assert type(a) is type(b) and str(a) == str(b) and a.args == b.args
    for name, value in FIELDS.get(type(a), {}).items():
        got = getattr(b, name.rstrip("_"))   # errno_= is read back as errno
        if isinstance(value, BaseException):
            assert type(got) is type(value) and got.args == value.args
        else:
            assert got == value


@pytest.mark.parametrize("cls", [EnvError, WorkerDiedError, WorkerRestartedError, PoolResourceError])
def test_pool_errors_round_trip_through_a_process_pool(cls):
    local = cls(f"{cls.__name__} message", **FIELDS[cls])
    _same(local, pickle.loads(pickle.dumps(local)))
    with _executor() as ex, pytest.raises(cls) as err:
        ex.submit(_raise, cls).result()
    _same(local, err.value)


def test_closed_error_round_trips():
    err = pickle.loads(pickle.dumps(PoolClosedError("the pool is closed")))
    assert type(err) is PoolClosedError and str(err) == "the pool is closed"


def test_vector_env_error_keeps_its_builtin_type_across_processes(monkeypatch):
    monkeypatch.setattr(gym.logger, "min_level", 40)   # for this test only: later tests read gymnasium's warnings
    with _executor() as ex, pytest.raises(ValueError) as err:
        ex.submit(_vector_env_error).result()
    exc = err.value
    assert isinstance(exc, EnvError) and type(exc).__name__ == "EnvError[ValueError]"
    assert exc.env_id in (0, 1) and exc.phase == "step" and exc.remote_type == "ValueError"
    assert "ValueError" in exc.remote_traceback and isinstance(exc.remote_exception, ValueError)
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is type(exc) and str(again) == str(exc) and again.env_id == exc.env_id


def test_spaces_differ_error_round_trips_with_the_spaces():
    from gymnasium import spaces

    from shmpool import SpacesDifferError
    err = pickle.loads(pickle.dumps(SpacesDifferError("env 1 differs", (spaces.Discrete(2), spaces.Discrete(3)))))
    assert type(err) is SpacesDifferError and isinstance(err, ValueError) and str(err) == "env 1 differs"
    assert err.observation_spaces == (spaces.Discrete(2), spaces.Discrete(3))
