"""RayPool's pure parts without Ray: batch assembly (shmpool.distributed.batches), the async
bookkeeping (.ledger) and the env placement (.placement).  They must run where ray is absent."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import numpy as np
import pytest

from shmpool.distributed.batches import ReadyRows, Rows, concat, merge_infos, take_rows
from shmpool.distributed.ledger import Ledger
from shmpool.distributed.placement import Placement, Slot, apportion


def rows_of(ids, tag: str = "") -> Rows:
    """Rows whose values encode their env id: obs a dict {"x": (n, 2) float32, "y": (n,) int64}."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    obs = {"x": np.stack([ids, -ids], axis=1).astype(np.float32), "y": ids * 10}
    infos = {"tag": np.array([f"{tag}{i}" for i in ids], dtype=object), "_tag": np.ones(n, dtype=bool)}
    return Rows(ids, obs, ids.astype(np.float64) / 2, ids % 2 == 0, ids % 3 == 0, infos)


def assert_rows_encode_ids(rows: Rows) -> None:
    ids = rows.ids
    np.testing.assert_array_equal(rows.obs["x"][:, 0], ids)
    np.testing.assert_array_equal(rows.obs["y"], ids * 10)
    np.testing.assert_array_equal(rows.rew, ids / 2)
    np.testing.assert_array_equal(rows.term, ids % 2 == 0)
    np.testing.assert_array_equal(rows.trunc, ids % 3 == 0)


# --- batches --------------------------------------------------------------------------------


def test_concat_and_take_rows_keep_nested_structure():
    a = {"x": np.zeros((2, 3)), "t": (np.arange(2), np.ones((2, 1), dtype=np.uint8))}
    b = {"x": np.ones((1, 3)), "t": (np.arange(1) + 5, np.zeros((1, 1), dtype=np.uint8))}
    got = concat([a, b])
    assert got["x"].shape == (3, 3) and got["t"][1].dtype == np.uint8
    np.testing.assert_array_equal(got["t"][0], [0, 1, 5])
    picked = take_rows(got, np.array([2, 0]))
    np.testing.assert_array_equal(picked["x"][:, 0], [1, 0])
    np.testing.assert_array_equal(picked["t"][0], [5, 0])


def test_merge_infos_fills_missing_keys_and_masks():
    a = {"score": np.array([1.5, 2.5]), "_score": np.array([True, True]),
         "nested": {"k": np.array([1, 2]), "_k": np.array([True, False])}}
    b = {"other": np.array(["p"], dtype=object), "_other": np.array([True])}
    got = merge_infos([a, b], [2, 1])
    np.testing.assert_array_equal(got["score"], [1.5, 2.5, 0.0])
    np.testing.assert_array_equal(got["_score"], [True, True, False])
    np.testing.assert_array_equal(got["nested"]["k"], [1, 2, 0])
    np.testing.assert_array_equal(got["nested"]["_k"], [True, False, False])
    assert got["other"].tolist() == [None, None, "p"]
    np.testing.assert_array_equal(got["_other"], [False, False, True])


def test_merge_infos_of_differently_shaped_values_is_one_object_per_row():
    a = {"v": np.zeros((2, 3)), "_v": np.ones(2, dtype=bool)}
    b = {"v": np.ones((1, 4)), "_v": np.ones(1, dtype=bool)}
    got = merge_infos([a, b], [2, 1])
    assert got["v"].dtype == object and got["v"].shape == (3,)
    assert got["v"][0].shape == (3,) and got["v"][2].shape == (4,)


def test_pool_answers_join_in_env_order_with_global_ids():
    """Three pools' local rows (ids 0..n_k-1), shifted by their starts, give one batch in env order."""
    sizes, starts = [3, 2, 2], [0, 3, 5]
    parts = [rows_of(np.arange(n)).shifted(s) for n, s in zip(sizes, starts)]
    batch = Rows.join(parts)
    np.testing.assert_array_equal(batch.ids, np.arange(7))
    assert batch.obs["x"][:, 0].tolist() == [0, 1, 2, 0, 1, 0, 1]   # values stay the pools' own
    obs, rew, term, trunc, infos = batch.as_step()
    assert rew.dtype == np.float64 and term.dtype == trunc.dtype == np.bool_ and len(infos["tag"]) == 7


def test_restarted_and_autoreset_rows():
    obs = np.arange(6, dtype=np.float32).reshape(3, 2)
    r = Rows.restarted(np.array([4, 5, 6]), obs, {"x": np.ones(3), "_x": np.ones(3, dtype=bool)})
    assert r.trunc.all() and not r.term.any() and (r.rew == 0).all()
    assert r.infos["worker_restarted"].all() and r.infos["_worker_restarted"].all()
    one = r.select(slice(1, 2))
    assert one.ids.tolist() == [5] and one.obs.tolist() == [[2.0, 3.0]]
    a = Rows.autoreset(np.array([5]), one.obs)
    assert not (a.term | a.trunc).any() and a.rew.tolist() == [0.0] and a.infos == {}


def test_ready_rows_take_splits_blocks_and_keeps_the_tail_first():
    ready = ReadyRows()
    ready.add(rows_of([4, 5, 6]))
    ready.add(rows_of([]))          # empty blocks are not kept
    ready.add(rows_of([0, 1]))
    assert ready.count == 5
    first = ready.take(2)
    assert first.ids.tolist() == [4, 5]
    second = ready.take(3)
    assert second.ids.tolist() == [6, 0, 1] and ready.count == 0
    assert_rows_encode_ids(second)
    assert second.infos["tag"].tolist() == ["6", "0", "1"]
    with pytest.raises(ValueError, match="1 rows asked for, 0 ready"):
        ready.take(1)


def test_ready_rows_drop_envs_of_one_pool():
    ready = ReadyRows()
    ready.add(rows_of([0, 3, 4]))
    ready.add(rows_of([2]))
    ready.drop_envs(range(2, 4))
    assert ready.count == 2
    got = ready.take(2)
    assert got.ids.tolist() == [0, 4]
    assert_rows_encode_ids(got)


def test_as_recv_adds_int32_env_ids_without_touching_the_rows_infos():
    r = rows_of([7, 2])
    *_, infos = r.as_recv()
    assert infos["env_id"].dtype == np.int32 and infos["env_id"].tolist() == [7, 2]
    assert "env_id" not in r.infos


# --- placement ------------------------------------------------------------------------------


def slots(n: int) -> list[Slot]:
    return [Slot(f"node{k}", 0, 1) for k in range(n)]


def test_placement_contiguous_ranges_and_owners():
    p = Placement(slots(3), 10, None, 4, None)
    assert p.sizes == [4, 3, 3] and p.starts.tolist() == [0, 4, 7]
    assert [p.env_range(k) for k in range(3)] == [range(0, 4), range(4, 7), range(7, 10)]
    assert p.owner.tolist() == [0] * 4 + [1] * 3 + [2] * 3
    assert sum(p.sub_batch_sizes) == 4 and all(1 <= b <= s for b, s in zip(p.sub_batch_sizes, p.sizes))
    got = p.by_pool(np.array([9, 0, 5, 1]))
    assert list(got) == [0, 1, 2] and got[0].tolist() == [1, 3] and got[2].tolist() == [0]
    got = p.by_pool(np.array([6, 4, 5]))   # one pool's envs only
    assert list(got) == [1] and got[1].tolist() == [0, 1, 2] and got[1].dtype == np.intp
    got = p.by_pool(np.array([6, 4, 7]))   # the last one another pool's
    assert list(got) == [1, 2] and got[1].tolist() == [0, 1] and got[2].tolist() == [2]
    assert p.by_pool(np.array([], dtype=np.int64)) == {}


def test_placement_refusals():
    with pytest.raises(ValueError, match="fewer than the 3 pools"):
        Placement(slots(3), 2, None, None, None)
    with pytest.raises(ValueError, match=r"env_counts \[1, 1\] must give 3 pools"):
        Placement(slots(3), 2, [1, 1], None, None)
    with pytest.raises(ValueError, match="batch_size=7 is more than num_envs=6"):
        Placement(slots(2), 6, None, 7, None)
    with pytest.raises(ValueError, match=r"sub_batch_sizes\[1\]=4 is more than pool 1's 3 envs"):
        Placement(slots(2), 6, None, 6, [2, 4])
    with pytest.raises(ValueError, match="no Ray node"):
        Placement([], 6, None, None, None)


@pytest.mark.parametrize("total,sizes", [(6, [4, 4, 4]), (4, [3, 3, 3]), (9, [5, 2, 2]), (12, [4, 4, 4])])
def test_apportion_is_proportional_and_sums_to_total(total, sizes):
    got = apportion(total, sizes)
    assert sum(got) == total and all(1 <= b <= s for b, s in zip(got, sizes))
    assert max(abs(b - total * s / sum(sizes)) for b, s in zip(got, sizes)) < 1


# --- ledger ---------------------------------------------------------------------------------


def ledger(sizes=(4, 4, 4), subs=(2, 2, 2), next_step=True) -> Ledger:
    return Ledger(Placement(slots(len(sizes)), sum(sizes), list(sizes), sum(subs), list(subs)), next_step)


def test_send_asks_for_a_sub_batch_only_when_a_whole_one_is_in_flight():
    led = ledger()
    plan = led.plan_send(np.array([0, 5]))   # one env of pools 0 and 1: less than a sub-batch each
    assert [(d.pool, d.with_recv) for d in plan] == [(0, False), (1, False)]
    assert plan[1].local_ids.tolist() == [1] and plan[1].positions.tolist() == [1]
    plan = led.plan_send(np.array([1, 8, 9]))
    assert [(d.pool, d.with_recv) for d in plan] == [(0, True), (2, True)]
    led.requests["f0"], led.requests["f2"] = 0, 2
    assert led.available == [0, 1, 0] and led.in_flight.sum() == 5
    assert led.to_request() == []                      # pool 1 has 1 < 2; pools 0 and 2 are busy
    plan = led.plan_send(np.array([4]))          # pool 1 now has a whole sub-batch: the send carries the recv
    assert [(d.pool, d.with_recv) for d in plan] == [(1, True)] and led.available == [0, 0, 0]
    led.requests["f1"] = 1
    assert [d.with_recv for d in led.plan_send(np.array([2, 3]))] == [False]   # pool 0 is busy
    assert led.to_request() == [] and led.available == [2, 0, 0]
    led.requests.pop("f0")                       # pool 0 answered: now it is asked for the next sub-batch
    assert led.to_request() == [0] and led.available == [0, 0, 0]
    with pytest.raises(RuntimeError, match=r"env ids \[4\] are already in flight"):
        led.check_idle(np.array([6, 4]))


def test_claim_marks_ids_in_flight_in_one_pass_or_words_the_error_and_marks_nothing():
    led = ledger()
    led.claim(np.array([3, 0], dtype=np.int64))
    assert np.flatnonzero(led.in_flight).tolist() == [0, 3]
    cases = [([5, 12, -1], ValueError, r"^env ids \[12, -1\] are out of range for a pool of 12 envs$"),
             ([5, 7, 5], ValueError, r"^env ids \[5\] appear more than once$"),
             ([6, 3, 7], RuntimeError, r"^env ids \[3\] are already in flight; recv\(\) them first$")]
    for ids, kind, message in cases:
        with pytest.raises(kind, match=message):
            led.claim(np.array(ids, dtype=np.int64))
        assert np.flatnonzero(led.in_flight).tolist() == [0, 3], ids   # the ids before the bad one unmarked
    led.unclaim(np.array([3], dtype=np.int64))
    led.claim(np.array([11, 3], dtype=np.int64))
    assert np.flatnonzero(led.in_flight).tolist() == [0, 3, 11]
    led.forget()
    led.claim(np.array([3], dtype=np.int64))   # forget cleared the bytes claim reads
    assert np.flatnonzero(led.in_flight).tolist() == [3]


def test_a_ledger_is_idle_only_when_forget_has_nothing_to_drop():
    led = ledger()
    assert led.idle
    led.plan_send(np.array([0]))
    assert not led.idle
    led.forget()
    assert led.idle
    led.all_sent()
    led.received(1, rows_of([3]))
    assert not led.idle
    led.forget()
    led.sends["f"] = 0
    assert not led.idle
    led.forget()
    led.held[2][9] = rows_of([1])
    assert not led.idle
    led.forget()
    assert led.idle


def test_received_rows_come_back_global_and_leave_flight():
    led = ledger()
    led.all_sent()
    assert led.in_flight.all() and led.available == [4, 4, 4]
    led.received(1, rows_of([3, 0]))          # local ids of pool 1 (envs 4..7)
    got = led.take(2)
    assert got.ids.tolist() == [7, 4]
    assert not led.in_flight[[4, 7]].any() and led.in_flight.sum() == 10


def test_rebuilt_pool_owes_each_env_one_restart_row_then_one_autoreset_row():
    led = ledger()
    led.all_sent()
    led.requests["f1"] = 1
    led.sends["s1"] = 1
    led.sends["s0"] = 0
    led.received(1, rows_of([0]))             # env 4 finished before the death: replaced by its restart row
    # the caller holds env 5 (returned earlier): make it not in flight
    led.in_flight[5] = False
    obs = np.arange(8, dtype=np.float32).reshape(4, 2) + 100
    led.pool_rebuilt(1, obs, {})
    assert led.requests == {} and led.sends == {"s0": 0} and led.available[1] == 0
    first = led.take(3)                        # envs 4, 6, 7 were in flight: their restart rows at once
    assert first.ids.tolist() == [4, 6, 7]
    assert first.trunc.all() and first.infos["worker_restarted"].all()
    np.testing.assert_array_equal(first.obs, obs[[0, 2, 3]])
    # env 5, held by the caller, answers its next send with its restart row, without a dispatch
    assert led.plan_send(np.array([5])) == []
    held = led.take(1)
    assert held.ids.tolist() == [5] and held.trunc.all()
    np.testing.assert_array_equal(held.obs, obs[[1]])
    # then the NEXT_STEP autoreset row: same observation, reward 0, no flags, again without a dispatch
    assert led.plan_send(np.array([5])) == []
    auto = led.take(1)
    assert not (auto.term | auto.trunc).any() and auto.rew.tolist() == [0.0]
    np.testing.assert_array_equal(auto.obs, obs[[1]])
    # and after that env 5 goes to its pool again
    assert [d.pool for d in led.plan_send(np.array([5]))] == [1]


def test_same_step_mode_has_no_autoreset_rows():
    led = ledger(next_step=False)
    led.all_sent()
    led.pool_rebuilt(0, np.zeros((4, 2)), {})
    led.take(4)
    plan = led.plan_send(np.array([0, 1]))
    assert [d.pool for d in plan] == [0] and led.ready.count == 0


def _fresh_interpreter(code: str) -> str:
    """Run ``code`` in a new Python (this process may have imported Ray); its stdout, failing on its failure."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_pure_modules_import_where_ray_is_absent():
    """Where ray is not installed: these modules import, and RayPool says what to install."""
    out = _fresh_interpreter(
        "import sys; sys.modules['ray'] = None\n"   # `import ray` now fails as if it were not installed
        "import shmpool.distributed as sd\n"
        "from shmpool.distributed import batches, ledger, placement\n"
        "from shmpool.surface import PoolSurface\n"   # what the faces test a pool against: no Ray needed
        "assert not isinstance(object(), PoolSurface)\n"
        "try:\n"
        "    sd.RayPool\n"
        "except ImportError as e:\n"
        "    print('refused:', e)\n"
    )
    assert "refused: shmpool.distributed needs ray: pip install 'shmpool[ray]'" in out


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_the_pure_modules_leave_ray_unloaded_and_a_ray_pool_is_still_recognised():
    """Where ray is installed: importing the pure rooms does not load it (each later fork of the process
    would copy its mappings), and a RayPool made from ``shmpool.distributed.api`` directly, before the
    package's own ``RayPool`` was ever looked up, is still known as one by the faces."""
    _fresh_interpreter(
        "import sys\n"
        "from shmpool.distributed import batches, ledger, placement\n"
        "assert 'ray' not in sys.modules, 'the pure rooms loaded ray'\n"
        "from shmpool.distributed.api import RayPool\n"
        "from shmpool.surface import PoolSurface\n"
        "assert isinstance(RayPool.__new__(RayPool), PoolSurface), 'a RayPool was not recognised'\n"
        "assert not isinstance(object(), PoolSurface)\n"
    )


def test_merge_infos_takes_keys_that_are_not_strings_and_values_that_are_all_none():
    # gymnasium's SAME_STEP batching makes {1: None} of a None final info beside an empty one
    a = {"final_info": {1: None}, "_final_info": np.array([True, True]), 7: np.array([1.5, 2.5])}
    b = {"final_info": {}, "_final_info": np.array([True])}
    got = merge_infos([a, b], [2, 1])
    assert got["final_info"] == {1: None}
    np.testing.assert_array_equal(got["_final_info"], [True, True, True])
    np.testing.assert_array_equal(got[7], [1.5, 2.5, 0.0])


@pytest.mark.parametrize("masks", [(np.array([True, False]), np.array([True])), (np.array([1, 0]), np.array([1]))])
@pytest.mark.parametrize("other", [np.array([7]), np.array([0.5])])
def test_merge_infos_of_blocks_with_the_same_keys(masks, other):
    """Blocks alike (every key, dtype and row shape: each step of a homogeneous pool) merge as the general
    case does: masks as bool, object columns kept, a dtype that differs between blocks promoted."""
    a = {"lives": np.array([3, 2]), "_lives": masks[0], "tag": np.array(["a", "b"], dtype=object),
         "xy": np.zeros((2, 2), dtype=np.float32), "other": np.array([1, 2])}
    b = {"lives": np.array([1]), "_lives": masks[1], "tag": np.array(["c"], dtype=object),
         "xy": np.ones((1, 2), dtype=np.float32), "other": other}
    got = merge_infos([a, b], [2, 1])
    assert list(got) == list(a)
    np.testing.assert_array_equal(got["lives"], [3, 2, 1])
    assert got["_lives"].dtype == np.bool_ and got["_lives"].tolist() == [True, False, True]
    assert got["tag"].dtype == object and got["tag"].tolist() == ["a", "b", "c"]
    assert got["xy"].dtype == np.float32 and got["xy"].tolist() == [[0, 0], [0, 0], [1, 1]]
    assert got["other"].dtype == other.dtype and got["other"].tolist() == [1, 2, other[0]]


def _plain_rows(n, seed, mask_dtype=bool):
    rng = np.random.default_rng(seed)
    infos = {"lives": rng.integers(0, 5, n), "_lives": (rng.random(n) < 0.5).astype(mask_dtype),
             "xy": rng.random((n, 2)).astype(np.float32)}
    return Rows(rng.integers(0, 9, n), rng.integers(0, 255, (n, 2, 3), dtype=np.uint8), rng.random(n),
                rng.random(n) < 0.3, rng.random(n) < 0.3, infos)


@pytest.mark.parametrize("mask_dtype", [bool, np.int64])
def test_joining_plain_blocks_gives_numpy_s_concatenations_and_merge_infos(mask_dtype):
    """Blocks of plain arrays (every sync step, most recv calls) join to the batch numpy's concatenations and
    merge_infos give; masks that are not bool are made bool."""
    parts = [_plain_rows(n, seed, mask_dtype) for seed, n in enumerate([3, 1, 4])]
    batch = Rows.join(parts)
    for got, want in [(batch.ids, np.concatenate([p.ids for p in parts])), (batch.obs, concat([p.obs for p in parts])),
                      (batch.rew, np.concatenate([p.rew for p in parts])),
                      (batch.term, np.concatenate([p.term for p in parts])),
                      (batch.trunc, np.concatenate([p.trunc for p in parts]))]:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    want_infos = merge_infos([p.infos for p in parts], [3, 1, 4])
    assert list(batch.infos) == list(want_infos)
    for key, want in want_infos.items():
        assert batch.infos[key].dtype == want.dtype
        np.testing.assert_array_equal(batch.infos[key], want)
    assert batch.infos["_lives"].dtype == np.bool_
    parts[1].infos["extra"] = np.ones(1)   # keys that differ between blocks: filled where a block lacks them
    assert Rows.join(parts).infos["extra"].tolist() == [0, 0, 0, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("actions, message", [
    (np.array([0, 1, 2, 0]), "actions outside Discrete(2) for env 2: 2"),
    (np.array([-1, 1, 0, 5]), "actions outside Discrete(2) for env 0: -1, env 3: 5"),
    (np.zeros(4, np.float32), "actions have dtype float32, which cannot be cast to the action dtype int64"),
    (np.zeros(3, np.int64), "actions have shape (3,); expected (4,) (4 envs x action shape ())"),
    ([0, 1, 1, 2], "actions outside Discrete(2) for env 3: 2"),
    (np.zeros(4, np.int64), None), ([1, 0, 1, 0], None),
])
def test_the_driver_checks_a_whole_batch_of_actions_as_a_local_pool_does(actions, message):
    """``ActionCheck`` (RayPool's check before anything is sent), for a whole batch: the fast path of a plain array
    of the action dtype and the general path of anything else refuse alike, with the local pool's messages."""
    from gymnasium import spaces

    from shmpool.distributed.action_check import ActionCheck
    check = ActionCheck(spaces.Discrete(2), 4)
    if message is None:
        check.check(actions)
        return
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        check.check(actions)


BIG_ENDIAN = {"box": ">f4", "dict": {"a": ">f4", "b": ">i4", "c": ">f8"}}


def _big_endian_env(kind: str):
    import gymnasium as gym

    def box(dtype: str):
        return gym.spaces.Box(-5, 5, (3,), np.dtype(dtype))

    class BigEndian(gym.Env):
        observation_space = (box(BIG_ENDIAN["box"]) if kind == "box" else
                             gym.spaces.Dict({k: box(d) for k, d in BIG_ENDIAN["dict"].items()}))
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {"seen": np.asarray(1.5, ">f4")}

        def step(self, action):
            return self.observation_space.sample(), 1.0, False, False, {}
    return BigEndian


def _dtypes(x):
    return {k: v.dtype for k, v in x.items()} if isinstance(x, dict) else x.dtype


@pytest.mark.parametrize("kind", list(BIG_ENDIAN))
def test_pools_answers_join_in_the_dtype_a_local_pool_returns_byte_order_included(kind, no_leaks):
    """Issue 69: a RayPool of several pools returned a Box of '>f4' as native float32 (numpy 2's concatenate makes a
    byte-swapped dtype native), where a local Pool keeps the space's dtype.  Two pools' answers, each a local Pool's
    rows, join in that dtype."""
    import shmpool
    with shmpool.Pool(_big_endian_env(kind), 4, seed=0, num_workers=1) as pool:
        obs, infos = pool.reset()
        want = _dtypes(obs)
        assert want == ({k: np.dtype(d) for k, d in BIG_ENDIAN["dict"].items()} if kind == "dict"
                        else np.dtype(BIG_ENDIAN["box"]))   # the local Pool keeps the space's dtype
        halves = [Rows(np.arange(a, b), take_rows(obs, slice(a, b)), np.zeros(b - a), np.zeros(b - a, bool),
                       np.zeros(b - a, bool), take_rows(infos, slice(a, b))) for a, b in [(0, 2), (2, 4)]]
        joined = Rows.join(halves)
        assert _dtypes(joined.obs) == want and _dtypes(concat([h.obs for h in halves])) == want
        assert joined.infos["seen"].dtype == infos["seen"].dtype   # an info column too
        ready = ReadyRows()
        for h in halves:
            ready.add(h)
        assert _dtypes(ready.take(3).obs) == want   # recv's batches, taken across blocks
