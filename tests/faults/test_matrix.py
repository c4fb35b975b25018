"""Every cell of the fault matrix (tests/faults/matrix.py): the exact error, a message that names
the env and worker, the look between two wait slices at which the fault was learnt (a count, not
seconds), and the pool's state afterwards."""
import re

import pytest
from matrix import cells, detected_in_time, expected, run_case


@pytest.mark.parametrize("name,mode", cells(), ids=[f"{n}-{m}" for n, m in cells()])
def test_fault(name, mode, no_leaks):
    want = expected(name, mode)
    got = run_case(name, mode)
    assert got.error == want.error, got
    # An empty expectation means "no message at all" (KeyboardInterrupt, the parent's SIGKILL):
    # matched whole, since an empty pattern would be found in any message.
    assert re.fullmatch(want.message, got.message) if not want.message else re.search(want.message, got.message), \
        f"{got.message!r} does not match {want.message!r}"
    assert detected_in_time(want, got.timing), (want.detection, got.timing)
    assert got.seconds >= want.at_least, got   # a timeout did wait (a lower bound: no load makes it flaky)
    assert got.state == want.state, got
