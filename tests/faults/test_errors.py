"""Every failure raises a named error quickly, and bad input never reaches a worker."""
import functools
import time
import traceback

import numpy as np
import pytest
from envs import DictEnv, FaultyEnv

import shmpool
from shmpool import EnvError, PoolClosedError


def faulty(fail_in, at=2, how="raise"):
    return functools.partial(FaultyEnv, fail_in, at, how)


ZEROS = np.zeros(4, dtype=np.int64)


def step_all(pool, mode):
    """One step of every env: ``step()``, or ``send()`` then ``recv()``."""
    if mode == "sync":
        return pool.step(ZEROS)
    pool.send(ZEROS)
    return pool.recv()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_exception_in_step_names_env_and_keeps_traceback(mode, no_leaks):
    env_fns = [faulty("never")] * 3 + [faulty("step", at=2)]
    with shmpool.Pool(env_fns, num_workers=2) as pool:
        pool.reset(seed=0)
        pool.step(ZEROS)
        with pytest.raises(EnvError) as err:
            step_all(pool, mode)
        # An env error comes back with its step (~6 ms idle, tests/faults/README.md): raised where the step's
        # results are read once the wait is over, never from the wait loop (a look between two slices, which a
        # loaded machine may make while the worker steps, is no way to learn of an env's error).
        raised_in = [frame.name for frame in traceback.extract_tb(err.tb)]
        assert "between_slices" not in raised_in and "in_slices" not in raised_in, raised_in
        e = err.value
        assert e.env_id == 3 and e.worker == 1 and e.phase == "step" and e.remote_type == "ValueError"
        assert "env 3 (worker 1" in str(e) and "injected failure in step" in str(e)
        assert "Traceback" in e.remote_traceback and "envs.py" in e.remote_traceback
        # The pool refuses to step a broken env until reset, then works again.
        with pytest.raises(RuntimeError, match="env 3 raised ValueError in step; call reset()"):
            pool.step(ZEROS)
        pool.reset(seed=1)
        obs, rew, *_ = pool.step(ZEROS)
        assert rew.tolist() == [1.0] * 4


class TestBadInputIsRejectedBeforeTheWorkers:
    @pytest.fixture
    def pool(self, no_leaks):
        with shmpool.Pool("CartPole-v1", 4, num_workers=2, batch_size=2) as pool:
            pool.reset(seed=0)
            yield pool
            # Still usable after every rejection.
            obs, rew, *_ = pool.step(ZEROS)
            assert rew.tolist() == [1.0] * 4

    def test_action_shape(self, pool):
        with pytest.raises(ValueError, match=r"actions have shape \(3,\); expected \(4,\)"):
            pool.step(np.zeros(3, dtype=np.int64))
        with pytest.raises(ValueError, match=r"actions have shape \(4, 1\); expected \(4,\)"):
            pool.step(np.zeros((4, 1), dtype=np.int64))

    def test_action_dtype(self, pool):
        with pytest.raises(ValueError, match="actions have dtype float64, which cannot be cast to the action dtype"):
            pool.step(np.zeros(4))

    def test_discrete_action_out_of_range(self, pool):
        with pytest.raises(ValueError, match=r"actions outside Discrete\(2\) for env 1: 2, env 3: -1"):
            pool.step(np.array([0, 2, 1, -1]))
        with pytest.raises(ValueError, match=r"actions outside Discrete\(2\) for env 2: 5"):
            pool.send(np.array([5], dtype=np.int32), np.array([2]))
        # nothing was sent: env 2 is not in flight and can be sent again
        pool.send(np.array([0], dtype=np.int32), np.array([2]))
        pool.send(np.array([1], dtype=np.int32), np.array([3]))
        pool.recv()

    def test_env_ids(self, pool):
        with pytest.raises(ValueError, match=r"env ids \[4\] are out of range for a pool of 4 envs"):
            pool.send(np.zeros(2, dtype=np.int64), np.array([0, 4]))
        with pytest.raises(ValueError, match=r"env ids \[1\] appear more than once"):
            pool.send(np.zeros(2, dtype=np.int64), np.array([1, 1]))
        pool.send(np.zeros(2, dtype=np.int64), np.array([0, 1]))
        with pytest.raises(RuntimeError, match=r"env ids \[1\] are already in flight"):
            pool.send(np.zeros(2, dtype=np.int64), np.array([1, 2]))
        with pytest.raises(RuntimeError, match="step\\(\\) needs every env idle but 2 are in flight"):
            pool.step(ZEROS)
        pool.recv()

    def test_recv_without_send(self, pool):
        with pytest.raises(RuntimeError, match="recv\\(\\) with nothing in flight"):
            pool.recv()
        pool.send(np.zeros(1, dtype=np.int64), np.array([2]))
        with pytest.raises(RuntimeError, match="waits for batch_size=2 envs but only 1 are in flight"):
            pool.recv()
        pool.send(np.zeros(1, dtype=np.int64), np.array([3]))
        _, _, _, _, infos = pool.recv()
        assert sorted(infos["env_id"].tolist()) == [2, 3]


def test_step_before_reset_and_after_close(no_leaks):
    pool = shmpool.Pool("CartPole-v1", 2, num_workers=1)
    with pytest.raises(RuntimeError, match="call reset\\(\\) or async_reset\\(\\) before stepping"):
        pool.step(np.zeros(2, dtype=np.int64))
    pool.close()
    for call in (lambda: pool.step(np.zeros(2, dtype=np.int64)), pool.reset, pool.recv,
                 lambda: pool.send(np.zeros(2, dtype=np.int64))):
        with pytest.raises(PoolClosedError, match="the pool is closed"):
            call()


@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(num_envs=0), ValueError, "num_envs must be >= 1, got 0"),
    (dict(num_envs=2, num_workers=3), ValueError, "num_workers=3 is more than num_envs=2"),
    (dict(num_envs=2, batch_size=3), ValueError, "batch_size=3 is more than num_envs=2"),
    (dict(num_envs=2, cpus="0-1,99"), ValueError, r"cpus \[99\] are outside this process's allowed set"),
    (dict(num_envs=2, cpus="3-1"), ValueError, "range 3-1 is reversed"),
    (dict(num_envs=2, wait_policy="fast"), ValueError, "unknown wait_policy 'fast'"),
    (dict(num_envs=2.0), TypeError, "num_envs must be an int, got float"),
])
def test_constructor_arguments(kwargs, exc, msg, no_leaks):
    with pytest.raises(exc, match=msg):
        shmpool.Pool("CartPole-v1", **kwargs)


def test_unknown_env_id_suggests_a_close_match(no_leaks):
    import gymnasium
    with pytest.raises(gymnasium.error.Error, match="CartPole"):
        shmpool.Pool("CartPol-v1", 2)


def test_mismatched_spaces_are_refused(no_leaks):
    import gymnasium as gym
    with pytest.raises(EnvError, match="all envs of a pool must share their spaces"):
        shmpool.Pool([lambda: gym.make("CartPole-v1"), lambda: gym.make("Acrobot-v1")], num_workers=1)
    with pytest.raises(ValueError, match="all envs of a pool must share their spaces"):
        shmpool.Pool([lambda: gym.make("CartPole-v1"), lambda: gym.make("Acrobot-v1")], num_workers=2)


def test_failed_call_names_env(no_leaks):
    with shmpool.Pool(DictEnv, 3, num_workers=2) as pool:
        with pytest.raises(EnvError, match=r"env 0 \(worker 0.*raised in call 'nope': AttributeError"):
            pool.call("nope")
        assert pool.get_attr("marker") == ("fresh",) * 3


def test_step_async_wait_and_a_timeout_that_keeps_the_step_pending(no_leaks, gate):
    class Held(FaultyEnv):
        def step(self, action):
            gate.hold()   # until the test has seen its timeouts, however loaded the machine
            return super().step(action)

    with shmpool.Pool([Held] * 2, num_workers=2) as pool:
        pool.reset()
        with pytest.raises(RuntimeError, match="step_wait\\(\\) without a pending step_async\\(\\)"):
            pool.step_wait()
        pool.step_async(np.zeros(2, dtype=np.int64))
        with pytest.raises(RuntimeError, match="step_async\\(\\) while a step is pending"):
            pool.step_async(np.zeros(2, dtype=np.int64))
        for call in (pool.reset, lambda: pool.send(np.zeros(2, dtype=np.int64)), lambda: pool.call("steps")):
            with pytest.raises(RuntimeError, match="a step_async\\(\\) is pending"):
                call()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="step did not finish within 0.05 s; it is still pending"):
            pool.step_wait(timeout=0.05)
        assert time.monotonic() - t0 >= 0.05
        # The gate, not a time: the step cannot end before the test opens it, so the wait above ended at its
        # timeout (a wait that raised only once the step was done would never have raised).
        with pytest.raises(TimeoutError, match="it is still pending"):
            pool.step_wait(timeout=0.01)
        gate.open()
        obs, rew, *_ = pool.step_wait(timeout=30)
        assert rew.tolist() == [1.0, 1.0] and obs[:, 0].tolist() == [1.0, 1.0]
        assert not pool.closed


def test_continuous_and_multi_discrete_action_policy(no_leaks):
    import gymnasium as gym
    from gymnasium import spaces

    class MultiEnv(gym.Env):
        observation_space = spaces.Box(-1, 1, (1,), np.float32)
        action_space = spaces.Dict({"md": spaces.MultiDiscrete([2, 3]), "mb": spaces.MultiBinary(2),
                                    "free": spaces.Box(-np.inf, np.inf, (1,), np.float64)})

        def reset(self, *, seed=None, options=None):
            return np.zeros(1, np.float32), {}

        def step(self, action):
            return np.zeros(1, np.float32), 0.0, False, False, {}

    with shmpool.Pool("Pendulum-v1", 2, num_workers=1) as pool:
        pool.reset(seed=0)
        refusal = r"actions NaN or infinite where the bound is finite \(the space is Box.*\) for env 1: \[nan\]"
        with pytest.raises(ValueError, match=refusal):
            pool.step(np.array([[0.5], [np.nan]], dtype=np.float32))
        with pytest.raises(ValueError, match=r"for env 0: \[inf\]"):
            pool.step(np.array([[np.inf], [0.0]]))
        pool.step(np.array([[5.0], [-5.0]]))  # finite values outside the bounds: the env clips them

    with shmpool.Pool(MultiEnv, 2, num_workers=1) as pool:
        pool.reset()
        ok = {"md": np.array([[1, 2], [0, 0]]), "mb": np.array([[0, 1], [1, 1]], np.int8),
              "free": np.array([[np.inf], [-np.inf]])}
        pool.step(ok)  # inf is fine where the bound is infinite
        with pytest.raises(ValueError, match=r"actions\['md'\] outside MultiDiscrete\(\[2 3\]\) for env 0: \[2, 0\]"):
            pool.step({**ok, "md": np.array([[2, 0], [0, 0]])})
        with pytest.raises(ValueError, match=r"actions\['mb'\] outside MultiBinary\(2\) for env 1: \[1, 2\]"):
            pool.step({**ok, "mb": np.array([[0, 0], [1, 2]], np.int8)})
        with pytest.raises(ValueError, match=r"actions\['free'\] NaN for env 1"):
            pool.step({**ok, "free": np.array([[0.0], [np.nan]])})
        pool.step(ok)


def test_a_worker_that_fails_setting_itself_up_says_why(monkeypatch, no_leaks):
    """A worker's set-up (pinning, dropping the trainer's sockets) ran outside the loop's error report: its
    traceback went only to the worker's stderr (under a progress display, nowhere) and the pool said
    "exited with code 1 during starting".  Forked workers inherit the patch."""
    import shmpool.workers.inherited as inherited

    def boom(keep, fd_dir="/proc/self/fd"):
        raise RuntimeError("boom while shedding sockets")

    monkeypatch.setattr(inherited, "shed_sockets", boom)
    with pytest.raises(EnvError, match="worker 0 raised in worker loop: RuntimeError: boom while shedding sockets"):
        shmpool.Pool("CartPole-v1", 2, num_workers=1, parent_shard=False, start_method="fork")
