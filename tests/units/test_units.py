"""Logic that needs no worker: cpu lists, shard sizes, layout, info columns (the wire's own: test_wire.py)."""
import math
import mmap
import multiprocessing as mp

import numpy as np
import pytest
from gymnasium import spaces
from shmpool.workers._rows import ResultRows

from shmpool import Pool, _core, _spin, parse_cpu_list
from shmpool import layout as L
from shmpool.arguments import POOL_KEYWORDS, shard_sizes
from shmpool.infos import IN_SLOT, InfoReader, InfoWriter, add_info
from shmpool.topology import oversubscribed, resolve_wait_policy


@pytest.mark.parametrize("spec,cpus", [
    ("0", [0]), ("0-3", [0, 1, 2, 3]), ("0-3,8", [0, 1, 2, 3, 8]), ("8,0-1", [0, 1, 8]),
    ("0-7:2", [0, 2, 4, 6]), (" 1 , 3 ", [1, 3]), ("2,2", [2]),
])
def test_parse_cpu_list(spec, cpus):
    assert parse_cpu_list(spec) == cpus


@pytest.mark.parametrize("spec,msg", [
    ("", "no cpus"), ("a", "'a' is not a cpu number"), ("3-1", "reversed"), ("0-4:0", "stride"),
    ("-1", "is not a cpu number"),
])
def test_parse_cpu_list_errors(spec, msg):
    with pytest.raises(ValueError, match=msg):
        parse_cpu_list(spec)


def test_pool_keywords_are_pools_parameters():
    import inspect

    assert POOL_KEYWORDS == set(inspect.signature(Pool).parameters) - {"env", "num_envs", "env_kwargs"}


def test_shard_sizes_spread_the_remainder():
    assert shard_sizes(7, 2) == [4, 3]
    assert shard_sizes(5, 3) == [2, 2, 1]
    assert shard_sizes(4, 4) == [1, 1, 1, 1]


def test_auto_wait_policy_depends_on_oversubscription():
    assert oversubscribed([0, 1], [0, 1]) and oversubscribed([0, 0], [0, 1, 2])
    assert not oversubscribed([1], [0, 1]) and not oversubscribed([0, 1], [0, 1, 2, 3])
    assert [p.name for p in resolve_wait_policy("auto", True)] == ["block", "adaptive"]
    assert [p.name for p in resolve_wait_policy("auto", False)] == ["hybrid", "adaptive"]
    assert resolve_wait_policy("auto", True)[1].adaptive
    parent, worker = resolve_wait_policy(("block", "spin"), True)
    assert (parent.name, worker.name) == ("block", "spin")


def test_layout_is_aligned_and_disjoint():
    obs = spaces.Dict({"a": spaces.Box(0, 1, (3, 5), np.float32), "b": spaces.Discrete(4),
                       "c": spaces.Tuple((spaces.MultiBinary(3), spaces.MultiDiscrete([2, 2])))})
    lay = L.Layout.build(7, [4, 3], obs, spaces.Discrete(2))
    assert [lf.path for lf in lay.obs_leaves] == [("a",), ("b",), ("c", 0), ("c", 1)]
    offsets = sorted(lay.offsets.values())
    assert all(o % L.ALIGN == 0 for o in offsets)
    assert offsets[0] >= _core.control_size(7, [4, 3])
    assert lay.size > offsets[-1]
    buf = mmap.mmap(-1, lay.size)
    views = L.Views(lay, buf)
    assert views.obs[0].shape == (7, 3, 5) and views.obs[0].dtype == np.float32
    assert views.obs[1].dtype == np.int64 and views.obs[2].dtype == np.int8
    rebuilt = L.assemble(obs, views.obs)
    assert rebuilt["c"][1] is views.obs[3]


def test_unsupported_space_is_named():
    with pytest.raises(TypeError, match="cannot lay out a Text space"):
        L.leaves(spaces.Text(5))


def test_info_columns_round_trip_and_fall_back():
    lay = L.Layout.build(3, [3], spaces.Discrete(2), spaces.Discrete(2))
    buf = mmap.mmap(-1, lay.size)
    views = L.Views(lay, buf)
    writer, reader = InfoWriter(views, buf), InfoReader(views, buf)
    assert writer.write(0, {"lives": 3, "x": 1.5, "flag": True, "s": np.float32(2)}) is None
    assert writer.write(1, {}) is None
    extra = writer.write(2, {"lives": 2, "name": "b", "nested": {"k": 1}, "lives_f": np.complex64(1)})
    assert set(extra) == {"name", "lives_f"}   # a nested dict's numbers have columns too
    infos = reader.read(None)
    assert infos["lives"].tolist() == [3, 0, 2] and infos["lives"].dtype == np.int64
    assert infos["_lives"].tolist() == [True, False, True]
    assert infos["x"].dtype == np.float64 and infos["_x"].tolist() == [True, False, False]
    assert infos["flag"].dtype == np.bool_ and infos["s"].dtype == np.float32
    sub = reader.read(np.array([2, 0]))
    assert sub["lives"].tolist() == [2, 3]
    assert sub["nested"]["k"].tolist() == [1, 0] and sub["nested"]["_k"].tolist() == [True, False]
    assert sub["_nested"].tolist() == [True, False]
    add_info(sub, extra, 0, 2)
    assert sub["name"].tolist() == ["b", None]


def test_info_columns_keep_their_dtype_rules_after_the_first_value():
    # The writer remembers which python types fit a column; later values must still be
    # checked by kind (a float32 or an np.float64 is not a float's column) and by range (an int too big).
    lay = L.Layout.build(2, [2], spaces.Discrete(2), spaces.Discrete(2))
    buf = mmap.mmap(-1, lay.size)
    views = L.Views(lay, buf)
    writer, reader = InfoWriter(views, buf), InfoReader(views, buf)
    assert writer.write(0, {"x": 1.5, "n": 7}) is None
    # np.float64 is not a python float's column: gymnasium keeps the two apart in an object batch.
    assert writer.write(0, {"x": np.float64(2.5), "n": 8}) == {"x": np.float64(2.5)}
    assert writer.write(0, {"x": 2.5, "n": 8}) is None
    assert writer.write(1, {"x": np.float32(3.5), "n": 2 ** 70}) == {"x": np.float32(3.5), "n": 2 ** 70}
    infos = reader.read(None)
    assert infos["x"].tolist() == [2.5, 0.0] and infos["_x"].tolist() == [True, False]
    assert infos["n"].tolist() == [8, 0] and infos["_n"].tolist() == [True, False]


def test_info_read_of_envs_with_the_same_keys_matches_the_general_read():
    # Every env set the same keys (the common case): values, masks and key order as when
    # they differ, and each key's mask its own array.
    lay = L.Layout.build(4, [4], spaces.Discrete(2), spaces.Discrete(2))
    buf = mmap.mmap(-1, lay.size)
    views = L.Views(lay, buf)
    writer, reader = InfoWriter(views, buf), InfoReader(views, buf)
    for i in range(4):
        writer.write(i, {"a": i * 1.5, "b": i, "c": bool(i % 2)})
    same = reader.read(np.array([3, 1, 2]))
    assert list(same) == ["a", "_a", "b", "_b", "c", "_c"]
    assert same["a"].tolist() == [4.5, 1.5, 3.0] and same["b"].tolist() == [3, 1, 2]
    assert same["c"].tolist() == [True, True, False] and same["c"].dtype == np.bool_
    assert all(same[k].tolist() == [True] * 3 for k in ("_a", "_b", "_c"))
    same["_a"][0] = False
    assert same["_b"][0] and same["_c"][0]
    assert reader.read(None)["b"].tolist() == [0, 1, 2, 3]
    writer.write(2, {"a": 9.0})
    mixed = reader.read(np.array([3, 1, 2]))
    assert list(mixed) == ["a", "_a", "b", "_b", "c", "_c"]
    assert mixed["b"].tolist() == [3, 1, 0] and mixed["_b"].tolist() == [True, True, False]
    assert mixed["a"].tolist() == [4.5, 1.5, 9.0]


def test_info_read_of_final_observations_alone_matches_the_first_read():
    # SAME_STEP's common case (episodes ended, no env reported an info) has a path of its own
    # once the reader knows the final-obs column; it must give what the general path gave.
    space = spaces.Box(-1, 1, (3,), np.float32)
    lay = L.Layout.build(4, [4], space, spaces.Discrete(2), final_obs=True)
    buf = mmap.mmap(-1, lay.size)
    views = L.Views(lay, buf)
    writer, reader = InfoWriter(views, buf), InfoReader(views, buf, space)
    writer.reserve_final_obs()
    for i in range(4):
        views.final_obs[0][i] = i + 0.5
        writer.write(i, {"final_obs": IN_SLOT, "final_info": {}} if i in (1, 3) else {})
    first, again = reader.read(np.array([3, 0, 1])), reader.read(np.array([3, 0, 1]))
    assert reader._final_obs_bit   # the second read took the final-obs path
    for infos in (first, again):
        assert list(infos) == ["final_obs", "_final_obs", "final_info", "_final_info"]
        assert infos["_final_obs"].tolist() == [True, False, True] == infos["_final_info"].tolist()
        assert infos["final_obs"][1] is None and infos["final_info"] == {}
        assert infos["final_obs"][0].tolist() == [3.5] * 3 and infos["final_obs"][2].tolist() == [1.5] * 3
        assert infos["final_obs"][0].base is None   # a copy: the next step overwrites the slot
    assert again["_final_obs"] is not again["_final_info"]
    whole = reader.read(None)
    assert whole["_final_obs"].tolist() == [False, True, False, True]

def _ping(buf, rounds, q):
    q.put(_spin.spin_pingpong(buf, 0, 1, rounds))


def test_spin_pingpong_between_processes():
    buf = mmap.mmap(-1, 4096)
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_ping, args=(buf, 1000, q))
    p.start()
    ns = _spin.spin_pingpong(buf, 0, 0, 1000)
    p.join(10)
    assert ns > 0 and q.get(timeout=5) > 0
    assert _core.load_word(buf, 0) == 2000


def test_unbatch_info_inverts_add_info():
    """One env's info back from the vector layout (SB3's face and batched shards both use it):
    masked keys only where marked, unmasked keys for every env, python scalars back as such."""
    from shmpool.info_rows import unbatch_info
    infos: dict = {}
    add_info(infos, {"a": 1, "s": "x", "n": {"f": 0.5}}, 0, 3)
    add_info(infos, {"a": 2, "v": np.float32(3)}, 2, 3)
    infos["shared"] = np.array([7, 8, 9], dtype=np.int16)   # a batched env's key without a mask
    zero, one, two = (unbatch_info(infos, i) for i in range(3))
    assert zero == {"a": 1, "s": "x", "n": {"f": 0.5}, "shared": 7}
    assert type(zero["a"]) is int and type(zero["n"]["f"]) is float
    assert one == {"shared": 8}
    assert two == {"a": 2, "v": 3.0, "shared": 9} and type(two["v"]) is np.float32


@pytest.mark.parametrize("same_step,expect", [(False, [1, 2, 3, 0, 1]), (True, [1, 2, 0, 1, 2])])
def test_elapsed_steps_count_episodes_and_refuse_wrong_arrays(same_step, expect):
    from shmpool._elapsed import ElapsedSteps
    clock = ElapsedSteps(2, same_step=same_step)
    clock.restart(None)
    ids = np.array([1], dtype=np.int32)
    ended = [False, False, True, False, False]
    got = [int(clock.advance(ids, np.array([e]), np.array([False]))[0]) for e in ended]
    assert got == expect and clock.count[0] == 0   # env 0 never stepped
    with pytest.raises(TypeError, match="int32 ids and bool flags of the same length"):
        clock.advance(ids.astype(np.int64), np.array([False]), np.array([False]))
    with pytest.raises(TypeError, match="int32 ids and bool flags of the same length"):
        clock.advance(ids, np.array([False, True]), np.array([False]))
    with pytest.raises(IndexError, match="env id 2 is out of range for 2 envs"):
        clock.advance(np.array([2], dtype=np.int32), np.array([False]), np.array([False]))


# --- a shard's result writes in C (workers/_rows.pyx) against numpy's own stores ---------------


def _rows(strict, obs_rows):
    cols = np.zeros(3, np.float64), np.zeros(3, np.bool_), np.zeros(3, np.bool_)
    return (*cols, ResultRows(*cols, obs_rows, strict))


@pytest.mark.parametrize("reward", [1.5, 2, True, np.float32(0.1), np.float64(-3.25), np.int8(-4), np.array(7.5),
                                    2**70])
@pytest.mark.parametrize("flags", [(True, False), (np.True_, np.False_), (1, 0), ([0], np.array([True])),
                                   (2.5, ""), (None, np.array([[0]]))])
def test_result_rows_store_what_numpy_stores(reward, flags):
    reward_col, term, trunc, rows = _rows(True, None)
    assert rows.put_status(1, reward, *flags) is True
    want = np.zeros(3, np.float64), np.zeros(3, np.bool_), np.zeros(3, np.bool_)
    want[0][1], want[1][1], want[2][1] = reward, *flags   # numpy's own stores
    for got, ref in zip((reward_col, term, trunc), want):
        assert got.tolist() == ref.tolist() and got.dtype == ref.dtype


def test_result_rows_raise_numpys_error_for_a_flag_numpy_cannot_store():
    with pytest.raises(ValueError) as want:
        np.zeros(3, np.bool_)[1] = np.array([1, 2])
    with pytest.raises(ValueError) as got:
        _rows(True, None)[3].put_status(1, 1.0, False, np.array([1, 2]))
    assert str(got.value) == str(want.value)


def test_result_rows_refuse_what_the_python_check_refused():
    reward_col, _, _, rows = _rows(True, None)
    for bad in (float("nan"), float("inf"), np.float32("-inf")):
        assert rows.put_status(0, bad, False, False) is False
    assert reward_col.tolist() == [0.0, 0.0, 0.0]   # nothing stored
    for bad in ("1.5", None, 1j):
        with pytest.raises(TypeError) as want:
            math.isfinite(bad)
        with pytest.raises(TypeError) as got:
            rows.put_status(0, bad, False, False)
        assert str(got.value) == str(want.value)
    with pytest.raises(IndexError, match="env 3 is not in this region of 3 envs"):
        rows.put_status(3, 1.0, False, False)
    # strict=False: what numpy converts is stored as numpy converts it
    reward_col, _, _, lenient = _rows(False, None)
    assert lenient.put_status(2, "1.5", False, False) is True and lenient.put_status(1, float("nan"), 0, 0) is True
    assert reward_col[2] == 1.5 and math.isnan(reward_col[1])


def test_result_rows_copy_only_an_exact_row_and_leave_the_rest_to_numpy():
    obs = np.zeros((3, 2, 2), np.float32)
    rows = _rows(True, obs)[3]
    row = np.arange(4, dtype=np.float32).reshape(2, 2)
    assert rows.put_obs(2, row) is True
    assert obs[2].tolist() == row.tolist() and not obs[:2].any()
    for other in (row.astype(np.float64), row.reshape(4), row.T, row.astype(">f4"), row.tolist(), None, np.float32(1),
                  np.ma.masked_array(row)):
        assert rows.put_obs(0, other) is False
    assert not obs[:2].any()
    with pytest.raises(IndexError):
        rows.put_obs(-1, row)
    # Observations that are not one plain leaf: every row goes to the Python writers.
    for no_fast_path in (None, np.zeros((3, 2), dtype=object), np.zeros((3, 2), np.float32)[:, ::-1]):
        assert _rows(True, no_fast_path)[3].put_obs(0, np.zeros(2, np.float32)) is False
    scalar = np.zeros(3, np.int64)   # a () space: rows of one value
    assert _rows(True, scalar)[3].put_obs(1, np.array(9)) is True and scalar.tolist() == [0, 9, 0]
