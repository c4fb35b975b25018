"""The argument rules every face shares (shmpool/arguments.py), without starting a pool."""
import numpy as np
import pytest

from shmpool.arguments import (
    check_env_ids,
    check_on_worker_error,
    check_options_list,
    check_seed,
    check_step_timeout,
    env_id_array,
    env_id_list,
)


@pytest.mark.parametrize("value", ["raise", "restart"])
def test_on_worker_error_accepts_both_policies(value):
    assert check_on_worker_error(value) == value


@pytest.mark.parametrize("value", ["ignore", "", None, "RAISE"])
def test_on_worker_error_names_the_bad_value(value):
    with pytest.raises(ValueError, match=rf"on_worker_error must be 'raise' or 'restart', got {value!r}"):
        check_on_worker_error(value)


@pytest.mark.parametrize("value", [None, 0.5, 3, 1e-9])
def test_step_timeout_accepts_positive_or_none(value):
    assert check_step_timeout(value) == value


@pytest.mark.parametrize("value", [0, -1, -0.5, float("nan")])
def test_step_timeout_refuses_non_positive(value):
    with pytest.raises(ValueError, match=rf"step_timeout must be positive seconds or None, got {value}"):
        check_step_timeout(value)


def test_seed_is_a_python_int_or_none():
    assert check_seed(None) is None
    assert check_seed(7) == 7
    got = check_seed(np.int64(2**40))
    assert got == 2**40 and type(got) is int


@pytest.mark.parametrize("value,name", [(1.5, "float"), ("3", "str"), ([1], "list")])
def test_seed_refuses_other_types(value, name):
    with pytest.raises(TypeError, match=f"seed must be an int or None, got {name}"):
        check_seed(value)


def test_options_list_is_one_per_env():
    given = ({"a": 1}, None, {})
    got = check_options_list(given, 3)
    assert got == [{"a": 1}, None, {}] and isinstance(got, list)
    with pytest.raises(ValueError, match="options list has 2 entries, the pool has 3 envs"):
        check_options_list([{}, {}], 3)


def test_env_id_array_passes_an_int64_array_through():
    ids = np.array([3, 1], dtype=np.int64)
    assert env_id_array(ids) is ids


def test_env_id_array_converts_lists_and_other_int_dtypes():
    for given in ([2, 0], np.array([2, 0], dtype=np.uint8), np.array([9, 2, 8, 0])[1::2]):
        got = env_id_array(given)
        assert got.dtype == np.int64 and got.flags.c_contiguous and got.tolist() == [2, 0]


@pytest.mark.parametrize("given", [np.zeros((2, 2), dtype=np.int64), np.array([0.0, 1.0]), 3])
def test_env_id_array_refuses_non_int_vectors(given):
    with pytest.raises(ValueError, match="env_ids must be a 1-d array of ints"):
        env_id_array(given)


def test_env_id_array_refuses_empty():
    with pytest.raises(ValueError, match="env_ids is empty"):
        env_id_array(np.array([], dtype=np.int64))


def test_check_env_ids():
    check_env_ids(np.array([3, 0, 1]), 4)
    with pytest.raises(ValueError, match=r"env ids \[4, -1\] are out of range for a pool of 4 envs"):
        check_env_ids(np.array([0, 4, -1]), 4)
    with pytest.raises(ValueError, match=r"env ids \[1, 2\] appear more than once"):
        check_env_ids(np.array([2, 1, 0, 1, 2]), 4)


def test_env_id_list():
    assert env_id_list(None, 3) == [0, 1, 2]
    assert env_id_list(np.int32(2), 3) == [2]
    got = env_id_list(np.array([2, 2, 0]), 3)
    assert got == [2, 2, 0] and all(type(i) is int for i in got)
    with pytest.raises(ValueError, match=r"env ids \[3, 'a'\] are out of range for a pool of 3 envs"):
        env_id_list([0, 3, "a"], 3)
