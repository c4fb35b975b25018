"""shmpool.surface: one pool surface over any backend (issue 70).  A fake in-process backend (no processes, no
memory) drives it: every refusal comes from the surface whatever the backend, the backend's verbs are asked only
for the work, and a face takes any surface subclass.  The structure checks pin that RayPool writes none of the
pool's calls again and that no face branches on the pool's kind."""
from __future__ import annotations

import ast
import copy
import pathlib
import pickle
import re

import gymnasium
import numpy as np
import pytest

from shmpool.errors import PoolClosedError
from shmpool.state import (
    NO_PENDING_STEP,
    NOTHING_IN_FLIGHT,
    RESET_FIRST,
    STEP_PENDING_OTHER,
    CallPendingError,
    Lifecycle,
    NoCallPendingError,
    PoolState,
)
from shmpool.surface import PoolSurface

ROOT = pathlib.Path(__file__).resolve().parents[2]
N = 3
OBS = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACT = gymnasium.spaces.Discrete(2)


class FakeBackend:
    """Every verb of shmpool.backend.PoolBackend in process: env i's observation is its step count."""

    interrupted = "the fake was closed"

    def __init__(self, entry_check=None) -> None:
        self.life = Lifecycle()
        self.num_envs = N
        self.batch_size = 2
        self.entry_check = entry_check
        self.calls: list[str] = []
        self.steps = np.zeros(N, dtype=np.float32)
        self.out: list[int] = []
        self.interrupt_in: str | None = None   # the verb that raises KeyboardInterrupt
        self.restarts, self.restart_log = 0, []
        self.single_observation_space, self.single_action_space = OBS, ACT
        self.observation_spaces = [OBS] * N
        self.metadata, self.render_mode, self.spec = {"render_modes": []}, None, None

    def _did(self, verb: str) -> None:
        self.calls.append(verb)
        if verb == self.interrupt_in:
            raise KeyboardInterrupt

    def _obs(self, ids=None):
        rows = self.steps if ids is None else self.steps[ids]
        return np.repeat(rows[:, None], 2, axis=1)

    def reset_request(self, seed, options):
        self._did("reset_request")
        if isinstance(seed, str):
            raise TypeError("seed must be an int or a list of them")
        return seed

    def reset(self, request) -> None:
        self._did("reset")
        self.steps[:] = 0
        self.out.clear()
        self.life.in_flight = 0

    def reset_result(self):
        self._did("reset_result")
        return self._obs(), {}

    def post_step(self, actions) -> None:
        self._did("post_step")
        if len(actions) != N:
            raise ValueError(f"actions have {len(actions)} rows")
        self.steps += 1

    def wait_step(self, timeout) -> None:
        self._did("wait_step")
        if timeout == 0:
            raise TimeoutError("not yet")

    def step_result(self):
        self._did("step_result")
        return self._obs(), np.ones(N), np.zeros(N, bool), np.zeros(N, bool), {}

    def async_reset(self) -> None:
        self._did("async_reset")
        self.steps[:] = 0
        self.out = list(range(N))
        self.life.in_flight = N

    def send(self, actions, env_ids) -> None:
        self._did("send")
        ids = list(range(N)) if env_ids is None else [int(i) for i in env_ids]
        self.steps[ids] += 1
        self.out += ids
        self.life.in_flight += len(ids)

    def recv(self):
        self._did("recv")
        ids, self.out = np.array(self.out[:self.batch_size]), self.out[self.batch_size:]
        self.life.in_flight -= len(ids)
        b = len(ids)
        return self._obs(ids), np.ones(b), np.zeros(b, bool), np.zeros(b, bool), {"env_id": ids.astype(np.int32)}

    def per_env(self, op, name, ids, payloads):
        self._did("per_env")
        return tuple((op, name, i, p) for i, p in zip(ids, payloads))

    def close(self) -> None:
        self._did("close")

    def kill(self) -> None:
        self._did("kill")

    def forgotten(self) -> bool:
        return True


class FakePool(PoolSurface):
    """A surface subclass as Pool and RayPool are: it builds its backend and hands it over."""

    _copy_refused = "a FakePool cannot be pickled or copied"

    def __init__(self, backend: FakeBackend | None = None) -> None:
        super().__init__()
        backend = backend or FakeBackend()
        self.num_envs, self.batch_size = backend.num_envs, backend.batch_size
        self.autoreset_mode = "next_step"
        self._open(backend)
        self.fake = backend


def test_refusals_come_from_the_surface_and_no_verb_runs_for_them():
    pool = FakePool()
    with pytest.raises(RuntimeError, match=re.escape(RESET_FIRST)):
        pool.step(np.zeros(N, np.int64))
    with pytest.raises(RuntimeError, match=re.escape(RESET_FIRST)):
        pool.send(np.zeros(1, np.int64), [0])
    with pytest.raises(NoCallPendingError, match=re.escape(NO_PENDING_STEP)):
        pool.step_wait()
    with pytest.raises(RuntimeError, match=re.escape(NOTHING_IN_FLIGHT)):
        pool.recv()
    assert pool.fake.calls == []
    obs, _ = pool.reset(seed=0)
    assert pool.state is PoolState.READY and obs.shape == (N, 2)
    assert pool.fake.calls == ["reset_request", "reset", "reset_result"]
    pool.step_async(np.zeros(N, np.int64))
    del pool.fake.calls[:]
    with pytest.raises(CallPendingError, match=re.escape(STEP_PENDING_OTHER)):
        pool.reset()
    with pytest.raises(CallPendingError, match=re.escape(STEP_PENDING_OTHER)):
        pool.call("anything")
    assert pool.fake.calls == ["reset_request"]   # arguments checked first, then the state refused the reset
    obs, rewards, *_ = pool.step_wait()
    np.testing.assert_array_equal(obs[:, 0], [1, 1, 1])
    pool.close()
    assert pool.fake.calls[-1] == "close" and pool.closed
    del pool.fake.calls[:]
    for call in (lambda: pool.reset(), lambda: pool.step(np.zeros(N, np.int64)), pool.async_reset, pool.recv,
                 lambda: pool.get_attr("x"), lambda: pool.send(np.zeros(1, np.int64), [0])):
        with pytest.raises(PoolClosedError, match="the pool is closed"):
            call()
    pool.close()   # idempotent: the backend is not asked again
    assert pool.fake.calls == []


def test_a_step_wait_that_times_out_leaves_the_step_pending():
    pool = FakePool()
    pool.reset()
    pool.step_async(np.zeros(N, np.int64))
    with pytest.raises(TimeoutError):
        pool.step_wait(timeout=0)
    assert pool.state is PoolState.STEP_PENDING
    pool.step_wait()
    assert pool.state is PoolState.READY


def test_the_surface_keeps_the_async_order_and_the_backend_the_count():
    pool = FakePool()
    pool.async_reset()
    assert pool.state is PoolState.READY and pool.in_flight == N
    _, _, _, _, infos = pool.recv()
    assert infos["env_id"].tolist() == [0, 1] and pool.in_flight == 1
    with pytest.raises(RuntimeError, match="1 are in flight from send"):
        pool.step(np.zeros(N, np.int64))
    _, _, _, _, infos = pool.step(np.zeros(1, np.int64), env_ids=[0])   # send + recv in one call
    assert infos["env_id"].tolist() == [2, 0] and pool.in_flight == 0


def test_per_env_calls_check_ids_and_values_on_the_surface():
    pool = FakePool()
    assert pool.call("f", 1, env_ids=[2, 0], k=3) == (("call", "f", 2, ((1,), {"k": 3})),
                                                      ("call", "f", 0, ((1,), {"k": 3})))
    assert pool.set_attr("x", [5, 6, 7]) is None
    assert [p for *_, p in pool.get_attr("x", env_ids=1)] == [None]
    with pytest.raises(ValueError, match=r"env ids \[3\] are out of range for a pool of 3 envs"):
        pool.get_attr("x", env_ids=[3])
    with pytest.raises(ValueError, match="set_attr needs 3 values, got 2"):
        pool.set_attr("x", [1, 2])
    assert pool.fake.calls == ["per_env"] * 3


def test_a_backend_s_entry_check_runs_first_in_every_call():
    """Ray's check (Ray shut down under the pool) is a backend's: the surface runs it before the call."""
    backend = FakeBackend()

    def gone() -> None:
        backend.life.close("the cluster went away")
        raise PoolClosedError("the cluster went away")
    backend.entry_check = gone
    pool = FakePool(backend)
    with pytest.raises(PoolClosedError, match="the cluster went away"):
        pool.reset()
    assert backend.calls == [] and pool.closed
    with pytest.raises(PoolClosedError, match="the cluster went away"):
        pool.step(np.zeros(N, np.int64))


@pytest.mark.parametrize("verb", ["wait_step", "recv"])
def test_ctrl_c_inside_any_backend_kills_it_and_says_so(verb):
    pool = FakePool()
    pool.reset()
    if verb == "recv":
        pool.async_reset()
    pool.fake.interrupt_in = verb
    with pytest.raises(KeyboardInterrupt) as info:
        pool.step(np.zeros(N, np.int64)) if verb == "wait_step" else pool.recv()
    op = "step" if verb == "wait_step" else "recv"
    assert info.value.__notes__ == [f"shmpool: the fake was closed ({op} was interrupted)"]
    assert pool.fake.calls[-1] == "kill" and pool.closed


def test_context_manager_len_and_copies_refused():
    with FakePool() as pool:
        assert len(pool) == N
        for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="a FakePool cannot be pickled or copied"):
                attempt(pool)
    assert pool.closed and pool.fake.calls == ["close"]


def test_a_pool_dropped_unclosed_is_closed():
    backend = FakeBackend()
    pool = FakePool(backend)
    del pool
    assert backend.calls == ["close"] and backend.life.closed


def test_a_face_takes_any_surface_subclass():
    """The gymnasium face (and the EnvPool one over it) test the surface, not the pool's kind."""
    from shmpool.envpool_env import EnvPoolEnv
    from shmpool.gymnasium_face import VectorEnv

    venv = VectorEnv(FakePool())
    obs, _ = venv.reset(seed=0)
    assert obs.shape == (N, 2)
    obs, rewards, *_ = venv.step(np.zeros(N, np.int64))
    np.testing.assert_array_equal(obs[:, 0], [1, 1, 1])
    np.testing.assert_array_equal(rewards, np.ones(N))
    venv.close()
    assert venv.pool.closed
    env = EnvPoolEnv(FakePool())
    assert env.num_envs == N
    env.close()


# --- structure ------------------------------------------------------------------------------------

def _class_methods(path: pathlib.Path) -> dict[str, set[str]]:
    tree = ast.parse(path.read_text())
    return {node.name: {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def test_no_pool_class_under_distributed_writes_the_pool_s_calls_again():
    surface_calls = {name for name in _class_methods(ROOT / "shmpool/surface.py")["PoolSurface"]
                     if not name.startswith("_") or name in ("__enter__", "__exit__", "__len__", "__reduce_ex__",
                                                             "__reduce__", "__copy__", "__deepcopy__", "__del__")}
    assert {"reset", "step", "send", "recv", "call", "close", "__len__"} <= surface_calls
    written_again = {}
    for path in (ROOT / "shmpool/distributed").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "PoolSurface" for b in node.bases):
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                # close keeps RayPool's own signature (timeout, terminate) and hands the rest to the surface
                extra = (methods & surface_calls) - {"close"}
                if extra:
                    written_again[f"{path.name}:{node.name}"] = sorted(extra)
    assert not written_again, f"pool calls written again beside the surface: {written_again}"


@pytest.mark.parametrize("face", ["gymnasium_face.py", "sb3.py", "envpool_env.py"])
def test_no_face_branches_on_the_pool_s_kind(face):
    tree = ast.parse((ROOT / "shmpool" / face).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & {"RayPool", "is_ray_pool"}
    tests = [ast.unparse(n) for n in ast.walk(tree)
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "isinstance"
             and "env_fns" in ast.unparse(n.args[0])]
    assert "isinstance(env_fns, PoolSurface)" in tests
