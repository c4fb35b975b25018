"""The actions' checks in C (shmpool._batch_check) against the numpy checks they shorten: the same batches are
taken (and written alike) or refused with the same message, whole or for env ids.  No processes: milliseconds."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from gymnasium import spaces

from shmpool import layout
from shmpool._batch_check import CHECK_IN_PYTHON, INT_RANGE, NOT_WHOLE, PASSED, SHAPE_ONLY, UNSCANNED, BatchCheck
from shmpool.actions import ActionWriter

N = 4


def writer(space: spaces.Space, strict: bool) -> tuple[ActionWriter, list[np.ndarray]]:
    leaves = layout.leaves(space)
    slots = [np.full((N, *leaf.shape), 7, dtype=leaf.dtype) for leaf in leaves]
    return ActionWriter(space, layout.Layout(N, [N], [], leaves), SimpleNamespace(act=slots), strict), slots


def outcome(space: spaces.Space, strict: bool, actions, ids, numpy_only: bool = False) -> tuple:
    w, slots = writer(space, strict)
    if numpy_only:   # the reference: no value scanned in C, every one judged by numpy
        for slot in w.slots:
            slot.whole = BatchCheck(slot.dtype, slot.dst.shape, UNSCANNED if strict else SHAPE_ONLY)
    try:
        w.write(actions, ids)
    except ValueError as exc:
        return "refused", str(exc)
    return "written", [s.tobytes() for s in slots]


BOX = spaces.Box(-1.0, 1.0, (2,), np.float32)
OPEN_BOX = spaces.Box(-np.inf, np.inf, (2,), np.float64)
OPEN_BOX_32 = spaces.Box(-np.inf, np.inf, (2,), np.float32)
HALF_OPEN_BOX = spaces.Box(np.array([-np.inf, -1]), np.array([np.inf, 1]), (2,), np.float32)   # element 1 bounded
CASES = [
    (spaces.Discrete(3), [np.array([0, 1, 2, 1]), np.array([0, 3, 2, -1]), np.array([0, 1, 2, 1], np.int32),
                          np.array([0, 0, 1, 0, 2, 0, 1, 0])[::2], np.array([0.0, 1, 2, 1]),
                          [0, 1, 2, 1], np.array([0, 1, 2, 1]).astype(">i8"), np.array([[0, 1, 2, 1]])]),
    (spaces.Discrete(3, start=-1), [np.array([-1, 0, 1, 1]), np.array([-2, 0, 1, 1]), np.array([-1, 0, 1, 2])]),
    *[(spaces.Discrete(200, dtype=t), [np.array([0, 1, 199, 1], t), np.array([0, 200, 2, 1], t)])
      for t in (np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.uint64)],
    (spaces.MultiBinary(3), [np.zeros((N, 3), np.int8), np.full((N, 3), 2, np.int8), np.ones((N, 3), np.int64)]),
    (spaces.MultiDiscrete([2, 5]), [np.array([[1, 4]] * N), np.array([[1, 5]] * N), np.array([[2, 0]] * N)]),
    (BOX, [np.zeros((N, 2), np.float32), np.array([[0, np.nan]] * N, np.float32),
           np.array([[0, np.inf]] * N, np.float32), np.full((N, 2), 3.0, np.float32),
           np.zeros((N, 2)), np.zeros((N, 4), np.float32)[:, ::2], np.zeros(N, np.float32)]),
    (OPEN_BOX, [np.array([[0, np.inf]] * N), np.array([[np.nan, 0]] * N), np.zeros((N, 2), np.float32)]),
    (HALF_OPEN_BOX, [np.array([[np.inf, 0]] * N, np.float32), np.array([[-np.inf, 0]] * N, np.float32),
                     np.array([[0, np.inf]] * N, np.float32), np.array([[1e39, 0]] * N),
                     np.array([[1e30, 0]] * N)]),
    (OPEN_BOX_32, [np.array([[np.inf, -np.inf]] * N), np.array([[-1e39, 0]] * N), np.full((N, 2), 3e38)]),
    # an integer Box: values outside its bounds pass (envs clip), a float batch is refused by its dtype
    (spaces.Box(0, 9, (2,), np.int64), [np.full((N, 2), 99), np.zeros((N, 2), np.int32), np.zeros((N, 2))]),
]


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("space, batches", CASES, ids=[str(c[0]) for c in CASES])
def test_a_batch_is_taken_or_refused_as_the_numpy_check_takes_or_refuses_it(space, batches, strict):
    outcomes = []
    for actions in batches:
        want = outcome(space, strict, actions, None, numpy_only=True)
        assert outcome(space, strict, actions, None) == want, (space, actions)          # the whole batch's path
        assert outcome(space, strict, actions, np.arange(N)) == want, (space, actions)  # env ids given: send's path
        outcomes.append(want[0])
    if strict and len(batches) > 1:   # the batches reach both sides of the check
        assert "refused" in outcomes and "written" in outcomes, outcomes


def test_the_check_says_which_batches_it_judged_alone():
    check = BatchCheck(np.dtype(np.int64), (N,), INT_RANGE, 0, 3)
    assert check.check(np.array([0, 1, 2, 0])) == PASSED
    assert check.check(np.array([0, 1, 3, 0])) == CHECK_IN_PYTHON           # refused: Python names the envs
    assert check.check(np.array([0, 0, 1, 0, 2, 0, 1, 0])[::2]) == CHECK_IN_PYTHON   # not contiguous: Python scans
    assert check.check(np.array([0, 1, 2], np.int64)) == NOT_WHOLE          # another shape
    assert check.check(np.array([0, 1, 2, 0], np.int32)) == NOT_WHOLE       # another dtype
    assert check.check(np.array([0, 1, 2, 0]).view(np.ndarray)) == PASSED
    assert check.check(np.ma.array([0, 1, 2, 0])) == NOT_WHOLE              # a subclass
    assert check.check([0, 1, 2, 0]) == NOT_WHOLE


@pytest.mark.parametrize("space, actions, verdict", [
    # inf where that element's bound is infinite is taken, though another element is bounded
    (HALF_OPEN_BOX, np.array([[np.inf, 0], [-np.inf, 1], [0, 0], [2.0, -3.0]], np.float32), None),
    (HALF_OPEN_BOX, np.array([[0, 0], [0, np.inf], [0, 0], [0, 0]], np.float32),
     "actions NaN or infinite where the bound is finite (the space is Box([-inf  -1.], [inf  1.], (2,), float32)) "
     "for env 1: [0.0, inf]"),
    # a finite float64 beyond float32's range would reach the env as inf: refused before the cast
    (spaces.Box(-1.0, 1.0, (2,), np.float32), np.array([[0, 0], [0, 0], [1e39, 0], [0, -1e39]]),
     "actions do not fit the action dtype float32 (they would become infinite) for env 2: [1e+39, 0.0], "
     "env 3: [0.0, -1e+39]"),
    (OPEN_BOX_32, np.array([[0, 0], [0, 0], [0, 0], [0, 1e39]]),
     "actions do not fit the action dtype float32 (they would become infinite) for env 3: [0.0, 1e+39]"),
    (OPEN_BOX_32, np.array([[3e38, -3e38]] * N), None),
])
def test_box_values_are_judged_element_by_element_and_before_the_cast(space, actions, verdict):
    got = outcome(space, True, actions, None)
    if verdict is None:
        assert got == ("written", [actions.astype(np.float32).tobytes()])
    else:
        assert got == ("refused", verdict)
        assert outcome(space, True, actions, np.arange(N)) == ("refused", verdict)
