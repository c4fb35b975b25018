"""Wrong data must never come back silently (issue 30): every side call gets its own answer,
every info value gymnasium's layout for it, and the shard this process steps follows the
rules of a worker process's shard.  Each case is checked with the shard in a worker process
and with it stepped here (``parent_shard``), against gymnasium's SyncVectorEnv where it has one."""
from __future__ import annotations

import functools
import threading

import gymnasium as gym
import numpy as np
import pytest
from compare import tree_equal
from envs import ScriptEnv
from fork_garbage import CollectingEnv, FinalizerMarker, garbage_at_next_fork
from gymnasium import spaces
from slices import looks_within, record_waits

import shmpool
from shmpool.errors import EnvError, PoolClosedError, WorkerDiedError

PLACEMENTS = [pytest.param(False, id="workers"), pytest.param(True, id="parent_shard")]


def _cartpoles(parent_shard: bool, **kw) -> shmpool.Pool:
    return shmpool.Pool("CartPole-v1", 4, num_workers=2, parent_shard=parent_shard, **kw)


def _not_rebuildable():
    raise RuntimeError("this object cannot be rebuilt here")


class Unreadable:
    """Pickles fine; unpickling it raises (a class the reader cannot import acts the same)."""

    def __reduce__(self):
        return _not_rebuildable, ()


class NoPickle:
    """Copies (SB3's ``set_options`` deep-copies) but cannot be pickled."""

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("NoPickle cannot be pickled")


# --- 1. every call gets its own answer ------------------------------------------------------


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_an_unpicklable_set_attr_value_sends_nothing_and_later_calls_get_their_own_answers(parent_shard, no_leaks):
    with _cartpoles(parent_shard) as pool:
        pool.reset(seed=0)
        with pytest.raises(TypeError, match=r"set_attr 'tag': the value for env 3 cannot be pickled"):
            pool.set_attr("tag", ["a", "b", "c", threading.Lock()])
        assert pool.get_attr("np_random_seed") == (0, 1, 2, 3)
        assert pool.get_attr("render_mode") == (None, None, None, None)
        # All or nothing: no env got its value.
        assert pool.apply(lambda env: hasattr(env, "tag")) == (False,) * 4


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_unpicklable_reset_options_send_nothing_and_the_pool_stays_in_step(parent_shard, no_leaks):
    with _cartpoles(parent_shard) as pool:
        pool.reset(seed=0)
        with pytest.raises(TypeError, match=r"reset: the options for env 3 cannot be pickled"):
            pool.reset(options=[{}, {}, {}, {"lock": threading.Lock()}])
        assert pool.get_attr("np_random_seed") == (0, 1, 2, 3)
        obs, _ = pool.reset(seed=5)
        assert pool.get_attr("np_random_seed") == (5, 6, 7, 8)
        pool.step(np.zeros(4, np.int64))


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_an_answer_the_parent_cannot_read_is_an_env_error_naming_the_env_and_the_call(parent_shard, no_leaks):
    with _cartpoles(parent_shard) as pool:
        pool.reset(seed=0)
        with pytest.raises(EnvError, match=r"env 2 .*apply 'unreadable'.*cannot be read") as info:
            pool.apply(_unreadable_from_env_2)
        assert info.value.env_id == 2
        assert pool.apply(_env_index) == (0, 1, 2, 3)
        assert pool.get_attr("np_random_seed") == (0, 1, 2, 3)
        pool.step(np.zeros(4, np.int64))


def _unreadable_from_env_2(env):
    return Unreadable() if env.unwrapped.np_random_seed == 2 else 0


_unreadable_from_env_2.__name__ = "unreadable"


def _env_index(env):
    return env.unwrapped.np_random_seed


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_a_reset_info_the_parent_cannot_read_is_an_env_error_and_the_next_reset_reads_its_own(parent_shard,
                                                                                                no_leaks):
    fns = [functools.partial(ScriptEnv, reset_info=lambda n: {"n": n, "obj": Unreadable() if n == 1 else "ok"})
           for _ in range(4)]
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard) as pool:
        with pytest.raises(EnvError, match=r"env 0 .*reset.*infos cannot be read"):
            pool.reset()
        _, infos = pool.reset()
        assert infos["n"].tolist() == [2, 2, 2, 2]
        assert infos["obj"].tolist() == ["ok"] * 4
        assert pool.call("double", 4) == (8, 8, 8, 8)


@pytest.mark.heavy_imports
def test_sb3_set_options_that_cannot_be_pickled_leave_env_method_answers_in_step(no_leaks):
    pytest.importorskip("stable_baselines3")
    from shmpool.sb3 import ShmVecEnv
    venv = ShmVecEnv([functools.partial(ScriptEnv) for _ in range(4)], num_workers=2, parent_shard=False)
    try:
        venv.set_options([{}, {}, {"x": NoPickle()}, {}])
        with pytest.raises(TypeError, match="env 2 cannot be pickled"):
            venv.reset()
        venv.set_options(None)
        venv.reset()
        assert venv.env_method("double", 3) == [6, 6, 6, 6]
        assert venv.env_method("double", 5, indices=[1, 3]) == [10, 10]
    finally:
        venv.close()


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_call_arguments_travel_cloudpickled_like_dummy_vec_env(parent_shard, no_leaks):
    with _cartpoles(parent_shard) as pool:
        pool.reset(seed=0)
        pool.set_attr("scale", lambda x: 3 * x)
        assert pool.apply(lambda env: env.get_wrapper_attr("scale")(2)) == (6, 6, 6, 6)


# --- 2. infos as gymnasium batches them, whatever the env puts in -----------------------------


CHANGING = {1: {"x": 2.5}, 2: {"x": None}, 3: {"x": "3.5"}, 4: {"x": "abc"}, 5: {"x": [1, 2]},
            6: {"x": np.arange(3)}, 7: {"x": {"a": 1}}, 8: {"x": (1, 2)}, 9: {"x": 7}, 10: {"x": np.float32(1.5)},
            11: {"x": True}, 12: {"x": 2.5}}


def _changing_infos(i: int) -> dict:
    """Env i's script: the values of CHANGING, shifted by i steps (``shift``: envs differ within a step)."""
    return {t: CHANGING[(t + i - 1) % len(CHANGING) + 1] for t in range(1, 40)}


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
@pytest.mark.parametrize("shift", [0, 1, 5], ids=["same-script", "shift-1", "shift-5"])
def test_info_values_that_change_type_batch_as_in_sync_vector_env(parent_shard, shift, no_leaks):
    n, steps = 4, 2 * len(CHANGING)
    fns = [functools.partial(ScriptEnv, infos=_changing_infos(i * shift), by_total=True) for i in range(n)]
    ref = gym.vector.SyncVectorEnv(fns)
    ref.reset(seed=0)
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard) as pool:
        pool.reset(seed=0)
        for t in range(steps):
            acts = np.zeros(n, np.int64)
            try:
                want = ref.step(acts)
            except (ValueError, TypeError, AttributeError):   # gymnasium's own batching refused this step
                # so does ours (the same rules, not always worded by the same line of code)
                with pytest.raises((ValueError, TypeError, AttributeError)):
                    pool.step(acts)
                # SyncVectorEnv stopped at the env whose info it could not batch; ours stepped all.
                ref.set_attr("total", list(pool.get_attr("total")))
                ref.reset(seed=t)
                pool.reset(seed=t)
                continue
            got = pool.step(acts)
            tree_equal(want[0], got[0], f"step {t} obs")
            tree_equal(want[4], got[4], f"step {t} infos")


def _first_step_infos(fns: list, parent_shard: bool, kind: type = shmpool.Pool) -> tuple[dict, dict]:
    """The infos of the first step of four envs: SyncVectorEnv's, then the pool's (``kind``: Pool, or the VectorEnv
    face, which lays them out as the installed gymnasium does)."""
    ref = gym.vector.SyncVectorEnv(fns)
    ref.reset(seed=0)
    want = ref.step(np.zeros(4, np.int64))[4]
    with kind(fns, num_workers=2, parent_shard=parent_shard) as pool:
        pool.reset(seed=0)
        got = pool.step(np.zeros(4, np.int64))[4]
    return want, got


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_a_key_that_is_a_dict_a_number_and_a_list_in_one_step_batches_as_in_sync_vector_env(parent_shard, no_leaks):
    # Env 0's x nests a number (a column), env 1's x is a number (a column at the same key),
    # env 2's travels aside: gymnasium puts envs 1-3's values into env 0's dict under their index.
    values = [{"x": {"a": 1}}, {"x": 2.5}, {"x": [1, 2]}, {"x": np.float32(1.5)}]
    fns = [functools.partial(ScriptEnv, infos={1: v}) for v in values]
    want, got = _first_step_infos(fns, parent_shard)
    tree_equal(want, got, "infos")
    assert got["x"][1] == 2.5 and type(got["x"][3]) is np.float32


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_a_float_info_later_none_or_a_string_is_not_coerced(parent_shard, no_leaks):
    script = {1: {"x": 2.5}, 2: {"x": None}, 3: {"x": "3.5"}, 4: {"x": "abc"}, 5: {"x": [1]}, 6: {"x": 1.5}}
    with shmpool.Pool([functools.partial(ScriptEnv, infos=script)] * 2, num_workers=2,
                      parent_shard=parent_shard) as pool:
        pool.reset()
        seen = [pool.step(np.zeros(2, np.int64))[4]["x"] for _ in range(6)]
    assert seen[0].dtype == np.float64 and seen[0].tolist() == [2.5, 2.5]
    assert seen[1].dtype == object and seen[1].tolist() == [None, None]
    assert seen[2].dtype == object and seen[2].tolist() == ["3.5", "3.5"]
    assert seen[3].dtype == object and seen[3].tolist() == ["abc", "abc"]
    assert seen[4].dtype == object and seen[4].tolist() == [[1], [1]]
    assert seen[5].dtype == np.float64 and seen[5].tolist() == [1.5, 1.5]


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
@pytest.mark.parametrize("bad, what", [
    (lambda: [("bad", 1)], r"info must be a dict, got list"),
    (lambda: {threading.Lock(): 1}, r"info key <unlocked _thread.lock object at 0x[0-9a-f]+> cannot be pickled"),
    (lambda: {"k": threading.Lock()}, r"info key 'k' cannot be pickled"),
])
def test_an_info_that_cannot_travel_is_an_env_error_and_the_worker_lives(parent_shard, bad, what, no_leaks):
    fns = [ScriptEnv] * 3 + [functools.partial(ScriptEnv, infos={1: bad}, by_total=True)]
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard) as pool:
        pool.reset()
        with pytest.raises(EnvError, match=r"env 3 \(worker 1, pid \d+\) raised in step: .*" + what) as info:
            pool.step(np.zeros(4, np.int64))
        assert info.value.env_id == 3
        with pytest.raises(RuntimeError, match="call reset"):
            pool.step(np.zeros(4, np.int64))
        obs, _ = pool.reset()
        assert obs[:, 0].tolist() == [0, 0, 0, 0]
        for t in (1, 2, 3):   # never a step run twice
            obs = pool.step(np.zeros(4, np.int64))[0]
            assert obs[:, 0].tolist() == [t] * 4


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_info_keys_gymnasium_keeps_apart_stay_apart(parent_shard, no_leaks):
    script = {1: {"a": 1.0, "a\x00": 2.0, "\ud800": 3.0}}
    fns = [functools.partial(ScriptEnv, infos=script)] * 4
    want, got = _first_step_infos(fns, parent_shard)
    tree_equal(want, got, "infos")


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_an_observation_of_none_is_refused_as_sync_vector_env_refuses_it(parent_shard, no_leaks):
    fns = [ScriptEnv] * 3 + [functools.partial(ScriptEnv, obs_none_at=2)]
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard) as pool:
        pool.reset()
        pool.step(np.zeros(4, np.int64))
        with pytest.raises(EnvError, match=r"env 3 .*observation is None"):
            pool.step(np.zeros(4, np.int64))


class TupleEnv(gym.Env):
    """Tuple observations and actions; ``short_obs_at``: from that step on the observation
    lacks its last item."""

    observation_space = spaces.Tuple((spaces.Box(-1, 1, (2,)), spaces.Discrete(3)))
    action_space = spaces.Tuple((spaces.Discrete(2), spaces.Box(-1, 1, (1,))))

    def __init__(self, short_obs_at: int | None = None):
        self.short_obs_at, self.t = short_obs_at, 0

    def _obs(self):
        full = (np.full(2, self.t / 10, np.float32), self.t % 3)
        return full[:1] if self.short_obs_at is not None and self.t >= self.short_obs_at else full

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, False, False, {}


@pytest.mark.parametrize("face", ["SyncVectorEnv", "AsyncVectorEnv", "Pool"])
def test_a_tuple_action_lacking_an_item_is_refused_as_gymnasium_refuses_it(face, no_leaks):
    # Was accepted: the missing leaf's slots kept the previous step's actions.
    short = (np.zeros(2, np.int64),)
    if face == "Pool":
        with shmpool.Pool([TupleEnv] * 2, num_workers=1) as pool:
            pool.reset()
            with pytest.raises(ValueError, match=r"actions: a Tuple of 2 items, got 1"):
                pool.step(short)
            pool.step((np.zeros(2, np.int64), np.zeros((2, 1), np.float32)))   # still usable
        return
    envs = getattr(gym.vector, face)([TupleEnv] * 2)
    try:
        envs.reset()
        with pytest.raises(IndexError):
            envs.step(short)
    finally:
        envs.close()


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_a_tuple_observation_lacking_an_item_is_refused_as_sync_vector_env_refuses_it(parent_shard, no_leaks):
    # Was accepted: the missing leaf kept the previous step's value in shared memory.
    fns = [TupleEnv] * 3 + [functools.partial(TupleEnv, short_obs_at=2)]
    ref = gym.vector.SyncVectorEnv(fns)
    act = (np.zeros(4, np.int64), np.zeros((4, 1), np.float32))
    ref.reset()
    ref.step(act)
    with pytest.raises(IndexError):
        ref.step(act)
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard) as pool:
        pool.reset()
        pool.step(act)
        with pytest.raises(EnvError, match=r"env 3 .*observation: a Tuple of 2 items, got 1"):
            pool.step(act)
        obs, _ = pool.reset()   # usable again, and each env stepped once per step
        obs, *_ = pool.step(act)
        np.testing.assert_allclose(obs[0], np.full((4, 2), 0.1, np.float32))
        assert obs[1].tolist() == [1, 1, 1, 1]


# --- 3. the shard stepped here follows a worker's rules ---------------------------------------


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
@pytest.mark.parametrize("exc_type", [SystemExit, GeneratorExit])
def test_a_base_exception_from_an_env_ends_the_pool_as_a_dead_worker_does(parent_shard, exc_type, no_leaks):
    fns = [ScriptEnv] * 3 + [functools.partial(ScriptEnv, raise_at={2: exc_type()})]
    pool = shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard)
    pool.reset()
    pool.step(np.zeros(4, np.int64))
    with pytest.raises(WorkerDiedError, match=r"worker 1 .*envs 2\.\.3"):
        pool.step(np.zeros(4, np.int64))
    assert pool.closed
    with pytest.raises(PoolClosedError):
        pool.step(np.zeros(4, np.int64))
    pool.close()


def test_seed_true_is_an_int_as_in_gymnasium(no_leaks):
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    want, _ = ref.reset(seed=True)
    with shmpool.Pool("CartPole-v1", 2, num_workers=1) as pool:
        got, _ = pool.reset(seed=True)
        np.testing.assert_array_equal(want, got)


# --- 4. workers hold only what they need --------------------------------------------------------


def _region_mappings(pid: int) -> int:
    with open(f"/proc/{pid}/maps") as f:
        return sum("/memfd:shmpool-region" in line for line in f)


def _region_fds(pid: int) -> int:
    import os
    count = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{name}").startswith("/memfd:shmpool-region")
        except OSError:
            pass
    return count


@pytest.mark.parametrize("restart", [False, True], ids=["raise", "restart"])
def test_a_forked_worker_holds_no_other_pool_s_region(restart, no_leaks):
    kw = {"on_worker_error": "restart"} if restart else {}
    a = shmpool.Pool("CartPole-v1", 2, num_workers=1, parent_shard=False, start_method="fork", **kw)
    b = shmpool.Pool("CartPole-v1", 2, num_workers=1, parent_shard=False, start_method="fork")
    try:
        (worker,) = b.worker_pids
        assert _region_mappings(worker) == 1     # its own pool's, not a's too
        assert _region_fds(worker) <= 1          # at most its own mapping's dup (Python's mmap), never a's
        a.reset(seed=0)
        b.reset(seed=0)
        a.close()
        b.step(np.zeros(2, np.int64))
        assert _region_mappings(worker) == 1
    finally:
        a.close()
        b.close()


def test_a_forked_worker_holds_none_of_the_trainer_s_sockets(no_leaks):
    import os
    import socket
    import stat
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    pool = shmpool.Pool("CartPole-v1", 2, num_workers=1, parent_shard=False, start_method="fork")
    try:
        (worker,) = pool.worker_pids
        sockets = [n for n in os.listdir(f"/proc/{worker}/fd")
                   if stat.S_ISSOCK(os.stat(f"/proc/{worker}/fd/{n}").st_mode)]
        assert len(sockets) == 1, sockets      # its pipe to the pool, nothing of the trainer's
        listener.close()
        again = socket.socket()
        again.bind(("127.0.0.1", port))       # the port is free once the trainer closed it
        again.listen()
        again.close()
        pool.reset(seed=0)
        pool.step(np.zeros(2, np.int64))
    finally:
        listener.close()
        pool.close()


def test_a_forked_worker_never_collects_the_trainer_s_garbage(tmp_path, no_leaks):
    import gc
    import os
    path = tmp_path / "finalized_by"
    garbage_at_next_fork(FinalizerMarker(str(path)))
    pool = shmpool.Pool([CollectingEnv] * 2, num_workers=1, parent_shard=False, start_method="fork")
    try:
        pool.reset(seed=0)
        assert pool.step(np.zeros(2, np.int64))[0].tolist() == [[1.0], [1.0]]
    finally:
        pool.close()
    gc.collect()
    assert path.read_text().split() == [str(os.getpid())]   # once, here: never in the worker


def test_collection_is_paused_for_a_fork_and_left_as_it_was():
    import gc

    from shmpool.workerset import collection_paused
    was = gc.isenabled()
    try:
        for before in (True, False):
            (gc.enable if before else gc.disable)()
            with collection_paused():
                assert not gc.isenabled()
            assert gc.isenabled() is before
        gc.enable()
        with pytest.raises(KeyError), collection_paused():
            raise KeyError("the block failed")
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


class HangEnv(ScriptEnv):
    def __init__(self, hang_in: str = ""):
        import time
        if hang_in == "make":
            time.sleep(60)
        super().__init__()
        self.hang_in = hang_in

    def close(self):
        import time
        if self.hang_in == "close":
            time.sleep(60)


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_a_constructor_that_hangs_is_a_timeout_error_within_startup_timeout(parent_shard, no_leaks, monkeypatch):
    import time

    import shmpool.workerset
    waits = record_waits(monkeypatch, shmpool.workerset)
    fns = [HangEnv] * 3 + [functools.partial(HangEnv, "make")]
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"worker 1 \(envs 2\.\.3.*did not finish building its envs within "
                                           r"startup_timeout"):
        shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard, startup_timeout=0.5)
    # The constructor sleeps 60 s: the TimeoutError shows startup_timeout fired.  In a worker process, the
    # count says it fired at its 0.5 s: the wait for the worker's first message ended at its deadline, after no
    # more looks than 0.5 s of slices holds.  In this process a SIGALRM timer interrupts the constructor (no
    # slices to count): that it fired near its 0.5 s is a bound in seconds (then the kill and the other
    # worker's start-up: ~1 s idle, 5x for a loaded CI).
    if parent_shard:
        assert time.monotonic() - start < 5
    else:
        ended = [w for w in waits if w.met is False]
        assert len(ended) == 1 and 1 <= ended[0].looks <= looks_within(0.5), waits


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_an_env_close_that_hangs_lets_close_return(parent_shard, no_leaks, monkeypatch):
    import time

    import shmpool.workerset
    # What is checked is that close() gives up on the env and kills; 1 s of grace instead of 5 s checks that
    # as well, in 8 s less (the suite's fast part, issue 60).
    monkeypatch.setattr(shmpool.workerset, "CLOSE_GRACE_S", 1.0)
    fns = [HangEnv] * 3 + [functools.partial(HangEnv, "close")]
    pool = shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard)
    pool.reset()
    waits = record_waits(monkeypatch, shmpool.workerset)
    start = time.monotonic()
    try:
        pool.close()
    except EnvError as exc:   # the parent's shard can say which env hung; a killed worker cannot
        assert exc.env_id == 3 and "close() did not return within" in str(exc)
    # The env's close sleeps 60 s.  In a worker process: close() read the hung worker's words until
    # CLOSE_GRACE_S (1 s here) and no slice longer, the other worker's at once, then killed it.  In this
    # process a SIGALRM timer interrupts the env's close (no slices to count): CLOSE_GRACE_S and 2 s more for
    # the worker to exit (~3 s idle), 4 s above that for a loaded CI; a close that waited the env out fails.
    if parent_shard:
        assert time.monotonic() - start < 1.0 + 2.0 + 4.0
    else:
        assert [w.met for w in waits] == [True, False] and waits[1].looks <= looks_within(1.0), waits
    assert pool.closed


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_a_set_attr_value_the_worker_cannot_rebuild_is_that_env_s_error(parent_shard, no_leaks):
    with _cartpoles(parent_shard) as pool:
        pool.reset(seed=0)
        with pytest.raises(EnvError, match=r"env 0 .*set_attr 'x'.*cannot be rebuilt here") as info:
            pool.set_attr("x", Unreadable())
        assert info.value.env_id == 0
        assert pool.get_attr("np_random_seed") == (0, 1, 2, 3)
        pool.step(np.zeros(4, np.int64))


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_a_reset_info_that_is_not_a_dict_names_the_env(parent_shard, no_leaks):
    fns = [ScriptEnv] * 3 + [functools.partial(ScriptEnv, reset_info=lambda n: [("bad", n)] if n == 1 else {})]
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard) as pool:
        with pytest.raises(EnvError, match=r"env 3 \(worker 1, pid \d+\) raised in reset: .*info must be a dict") \
                as info:
            pool.reset()
        assert info.value.env_id == 3
        obs, _ = pool.reset()
        assert obs[:, 0].tolist() == [0, 0, 0, 0]


# --- found by tests/fuzz.py --------------------------------------------------------------------


class ResetInfoEnv(gym.Env):
    observation_space = spaces.Discrete(2)
    action_space = spaces.Discrete(2)

    def __init__(self, i, reset_info=None, step_info=None):
        self.i, self.reset_info, self.step_info = i, reset_info, step_info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, self.reset_info(self.i) if self.reset_info else {}

    def step(self, action):
        return 0, 0.0, False, False, self.step_info(self.i) if self.step_info else {}


def _flag_infos(i):
    return {"flag": np.bool_(True), "mixed": None if i == 0 else np.int64(5)}


def _k_reset(i):
    return {"k": np.int64(1)}


def _k_step(i):
    return {"k": np.uint8(5) if i == 0 else np.int64(865)}


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_numpy_scalar_infos_batch_as_gymnasium_batches_them(parent_shard, no_leaks):
    fns = [functools.partial(ResetInfoEnv, i, _flag_infos) for i in range(2)]
    want = gym.vector.SyncVectorEnv(fns).reset(seed=0)[1]
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard) as pool:
        tree_equal(want, pool.reset(seed=0)[1], "infos")
    fns = [functools.partial(ResetInfoEnv, i, _k_reset, _k_step) for i in range(2)]
    ref = gym.vector.SyncVectorEnv(fns)
    ref.reset(seed=0)
    want = ref.step(np.zeros(2, np.int64))[4]   # np.int64(865) wraps into env 0's uint8 batch: 97
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard) as pool:
        pool.reset(seed=0)
        tree_equal(want, pool.step(np.zeros(2, np.int64))[4], "infos")


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_payloads_larger_than_a_pipe_reach_the_env(parent_shard, no_leaks):
    big = np.arange(400_000, dtype=np.uint8)
    with _cartpoles(parent_shard) as pool:
        pool.reset(seed=0)
        assert pool.apply(lambda env, x: int(x.sum()), big) == (int(big.sum()),) * 4
        pool.set_attr("big", big)
        assert pool.apply(lambda env: env.get_wrapper_attr("big").nbytes) == (400_000,) * 4
        assert pool.call("np_random_seed") == (0, 1, 2, 3)


FINAL_K = {(1, 0): 5, (2, 1): {"a": 1.5}, (3, 0): {"a": 1.5}, (3, 1): 5}


class FinalInfoEnv(gym.Env):
    observation_space = spaces.Box(-1, 1, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, i):
        self.i, self.t = i, 0

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        end = (self.t, self.i) in FINAL_K
        info = {"s": f"step{self.t}", **({"k": FINAL_K[self.t, self.i]} if end else {})}
        return np.zeros(1, np.float32), 0.0, False, end, info


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_final_infos_that_nest_differently_leave_no_side_message_for_the_next_step(parent_shard, no_leaks):
    fns = [functools.partial(FinalInfoEnv, i) for i in range(2)]
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard, autoreset_mode="same_step") as pool:
        pool.reset()
        pool.step(np.zeros(2, np.int64))
        pool.step(np.zeros(2, np.int64))
        # Step 3's final infos hold "k" as a dict for one env and a number for the other: batched in
        # env order as gymnasium does (they made the reader raise before), and then nothing is left
        # over for step 4.
        infos = pool.step(np.zeros(2, np.int64))[4]
        assert infos["final_info"]["s"].tolist() == ["step3", "step3"]   # both ended: their step info is final
        infos = pool.step(np.zeros(2, np.int64))[4]
        assert infos["s"].tolist() == ["step4", "step4"]


class NestedOrFlatEnv(ResetInfoEnv):
    def step(self, action):
        return 0, 0.0, False, False, {"k": {"a": 1} if self.i != 1 else 1.0}


def test_reset_drops_in_flight_results_whatever_their_infos(no_leaks):
    fns = [functools.partial(NestedOrFlatEnv, i) for i in range(3)]
    with shmpool.Pool(fns, batch_size=1, num_workers=1, parent_shard=False) as pool:
        pool.reset(seed=0)
        pool.send(np.zeros(3, np.int64), np.arange(3, dtype=np.int32))
        pool.recv()
        obs, _ = pool.reset(seed=0)
        assert obs.tolist() == [0, 0, 0]


class NestedFinalEnv(gym.Env):
    """Ends at its first step; its final info's key "k" is a dict for env ``dict_env``, a number otherwise."""

    observation_space = spaces.Box(-1, 1, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, i, dict_env):
        self.i, self.dict_env = i, dict_env

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        k = {"a": 1.5, "b": 2} if self.i == self.dict_env else np.int64(111)
        return np.zeros(1, np.float32), 0.0, True, False, {"k": k}


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
@pytest.mark.parametrize("dict_env", [0, 1])
def test_a_final_info_key_that_is_a_dict_in_one_env_and_a_number_in_another(parent_shard, dict_env, no_leaks):
    fns = [functools.partial(NestedFinalEnv, i, dict_env) for i in range(3)]
    ref = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    ref.reset(seed=0)
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard, autoreset_mode="same_step") as pool:
        pool.reset(seed=0)
        for _ in range(2):   # the second time, every column already exists
            try:
                want = ref.step(np.zeros(3, np.int64))[4]
            except AttributeError:   # gymnasium cannot batch a number first and a dict after it
                with pytest.raises(AttributeError):
                    pool.step(np.zeros(3, np.int64))
                continue
            got = pool.step(np.zeros(3, np.int64))[4]
            # gymnasium keeps env 0's dict and stores the others' numbers in it by env index: so do we
            assert set(got["final_info"]["k"]) == set(want["final_info"]["k"])
            tree_equal({k: v for k, v in want["final_info"]["k"].items() if isinstance(k, str)},
                       {k: v for k, v in got["final_info"]["k"].items() if isinstance(k, str)}, "k")
            assert [got["final_info"]["k"][i] for i in (1, 2)] == [want["final_info"]["k"][i] for i in (1, 2)]
            assert type(got["final_info"]["k"][1]) is type(want["final_info"]["k"][1])


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_an_env_s_own_exception_is_named_before_a_result_the_pool_refused(parent_shard, no_leaks):
    fns = [functools.partial(ScriptEnv, obs_none_at=1), functools.partial(ScriptEnv, raise_at={1: ValueError("own")})]
    ref = gym.vector.SyncVectorEnv(fns)
    ref.reset(seed=0)
    with pytest.raises(ValueError, match="own"):
        ref.step(np.zeros(2, np.int64))
    with shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard) as pool:
        pool.reset(seed=0)
        with pytest.raises(EnvError, match=r"env 1 .*ValueError: own.*\(1 more envs failed too\)") as info:
            pool.step(np.zeros(2, np.int64))
        assert info.value.remote_type == "ValueError"


class OldApiGridEnv(gym.Env):
    """gym < 0.26: reset returns the observation alone; a 2-row observation then unpacks as ``obs, info``."""

    observation_space = spaces.Box(-1.0, 1.0, (2, 3), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return np.zeros((2, 3), np.float32)

    def step(self, action):
        return np.zeros((2, 3), np.float32), 0.0, False, {}


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
@pytest.mark.parametrize("face", ["pool", "vector"])
def test_an_old_api_env_with_two_row_observations_names_the_env(face, parent_shard, no_leaks):
    fns = [OldApiGridEnv, OldApiGridEnv]
    if face == "pool":
        vec = shmpool.Pool(fns, num_workers=2, parent_shard=parent_shard)
    else:
        vec = shmpool.VectorEnv(fns, num_workers=2, parent_shard=parent_shard)
    try:
        with pytest.raises(EnvError, match=r"^env 0 \(worker 0, pid \d+\) raised in reset: ") as info:
            vec.reset(seed=0)
        assert info.value.env_id == 0
    finally:
        vec.close()


def _ending_at_two(infos=None):
    return gym.wrappers.TimeLimit(ScriptEnv(infos), 2)


@pytest.mark.parametrize("infos, steps, key, want", [
    # gymnasium's SAME_STEP batching stores env 1's None final info inside env 0's empty dict, under
    # the index: {1: None}.  The VectorEnv copies that; the EnvPool face must pass it on, not crash.
    ([{}, {2: None}], 2, "final_info", {1: None}),
    ([{1: {7: 1.5}}] * 2, 1, 7, [1.5, 1.5]),   # an env's own info key that is not a string
])
@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_the_envpool_face_passes_on_info_keys_that_are_not_strings(infos, steps, key, want, parent_shard, no_leaks):
    from shmpool.envpool_env import EnvPoolEnv
    fns = [functools.partial(_ending_at_two, i) for i in infos]
    ref = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    ref.reset(seed=0)
    env = EnvPoolEnv(fns, env_type="gymnasium", autoreset_mode="same_step", num_workers=2,
                     parent_shard=parent_shard)
    try:
        env.reset()
        for _ in range(steps):
            expected, got = ref.step(np.zeros(2, np.int64))[4], env.step(np.zeros(2, np.int64))[4]
        assert {k: v for k, v in expected.items() if not (isinstance(k, str) and k.startswith("_"))}.keys() \
            <= got.keys()
        value = got[key]
        assert (value if isinstance(value, dict) else value.tolist()) == want
        # Still in step with the reference afterwards: nothing stepped twice, nothing left pending.
        np.testing.assert_array_equal(env.step(np.zeros(2, np.int64))[0], ref.step(np.zeros(2, np.int64))[0])
        env.reset()
    finally:
        env.close()


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_nested_numeric_infos_match_sync_vector_env_whatever_travels_where(parent_shard, no_leaks):
    # RecordEpisodeStatistics' shape ({"episode": {"r", "l", "t"}}) in some envs and steps, a leaf that
    # changes type, a non-numeric leaf beside numeric ones, a dict inside, an empty dict: the
    # numbers take shared-memory columns, the rest the side channel, and the batch is gymnasium's.
    def by_env(k):
        return {1: {"episode": {"r": 1.5 * k, "l": k, "t": 0.25}},
                2: {"episode": {"r": 2.0, "l": 2, "note": "x"}} if k % 2 else {},
                3: {"episode": {"r": None if k == 1 else 3.0, "l": np.int32(3)}, "stats": {}},
                4: {"episode": {"r": 4.0, "deep": {"a": True, "b": np.float32(0.5)}}}}
    fns = [functools.partial(ScriptEnv, infos=by_env(k)) for k in range(4)]
    ref = gym.vector.SyncVectorEnv(fns)
    ref.reset(seed=0)
    want = [ref.step(np.zeros(4, np.int64))[4] for _ in range(4)]
    with shmpool.VectorEnv(fns, num_workers=2, parent_shard=parent_shard) as envs:
        envs.reset(seed=0)
        got = [envs.step(np.zeros(4, np.int64))[4] for _ in range(4)]
    tree_equal(want, got, "infos")


@pytest.mark.parametrize("parent_shard", PLACEMENTS)
def test_a_nested_leaf_that_changes_type_between_envs_is_what_sync_vector_env_gives(parent_shard, no_leaks):
    """gymnasium 0.29 keeps an env's nested dict whole, so each env's own value comes back: an int, a None or a
    float32 among floats, a None among bools.  1.x batches them into the first env's array (a float, NaN, False).
    Against the installed gymnasium's SyncVectorEnv, so each pin checks its own rule; under 0.29 the None was NaN."""
    leaves = [(0.5, True), (1, None), (None, False), (np.float32(2.5), True)]
    fns = [functools.partial(ScriptEnv, infos={1: {"episode": {"r": r, "done": done, "l": 3}}}) for r, done in leaves]
    want, got = _first_step_infos(fns, parent_shard, shmpool.VectorEnv)
    tree_equal(want, got, "infos")


def test_nested_numeric_infos_need_no_side_message(monkeypatch, no_leaks):
    from shmpool.workers import loop
    handed = []
    monkeypatch.setattr(loop.P, "handed_over", lambda msg: handed.append(msg) or msg)
    fns = [functools.partial(ScriptEnv, infos={1: {"episode": {"r": 1.0, "l": 1, "t": 0.5}}})] * 2
    with shmpool.VectorEnv(fns, num_workers=1, parent_shard=True) as envs:
        envs.reset(seed=0)
        infos = envs.step(np.zeros(2, np.int64))[4]
    assert infos["episode"]["l"].tolist() == [1, 1] and infos["_episode"].tolist() == [True, True]
    assert handed == []


class ForksInStep(gym.Env):
    """Counts its steps; every step (and ``spawn``) forks a child that returns from the env's call, as a
    careless ``os.fork()`` does (the child ends itself 0.3 s later, wherever it is by then)."""

    observation_space = spaces.Box(0, 1e9, (1,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self):
        self.n = 0

    def _fork(self):
        import os
        if os.fork() == 0:
            threading.Timer(0.3, os._exit, (0,)).start()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return np.zeros(1), {}

    def step(self, action):
        self.n += 1
        self._fork()
        return np.array([float(self.n)]), 1.0, False, False, {}

    def spawn(self):
        self._fork()
        return self.n


def test_a_child_an_env_forks_never_writes_the_worker_s_rows(no_leaks):
    """A bare ``os.fork()`` inside ``step`` or a ``call``: its child returned into the worker's loop and
    served the shard beside the worker, so 28 steps of 29 came back a count behind.  It now ends where
    the env's call returns; the rows and answers are SyncVectorEnv's."""
    fns = [ForksInStep] * 4
    ref = gym.vector.SyncVectorEnv([CounterOnly] * 4)
    ref.reset(seed=0)
    with shmpool.Pool(fns, num_workers=2, parent_shard=False) as pool:
        pool.reset(seed=0)
        for t in range(1, 12):
            obs, rew, term, trunc, infos = pool.step(np.zeros(4, np.int64))
            want = ref.step(np.zeros(4, np.int64))
            assert obs[:, 0].tolist() == [float(t)] * 4 == want[0][:, 0].tolist(), t
            assert infos == {} and rew.tolist() == [1.0] * 4
            if t % 4 == 0:
                assert list(pool.call("spawn")) == [t] * 4
                assert list(pool.get_attr("n")) == [t] * 4


class CounterOnly(ForksInStep):
    """ForksInStep without the forks: the reference."""

    def _fork(self):
        pass
