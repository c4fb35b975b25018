"""The differential fuzzer (tests/fuzz.py), bounded: shmpool's faces against gymnasium's SyncVectorEnv
(and SB3's DummyVecEnv) on generated envs, derandomized so every run draws the same cases.

Each case is a generated plan (spaces, info keys whose types change between steps, planned
failures) run through one to three faces (VectorEnv, Pool, EnvPoolEnv, ShmVecEnv, async
send/recv) with parent_shard True/False and 1 or 2 workers.  Any difference from the oracle fails
the test with the case's description and ``python -m tests.fuzz`` lines to look further.

Bounded at ~35 s of cases (the remaining examples pass without running once the budget is spent;
on a machine that fast enough for all of them, every run is the same).  The long run:
``python -m tests.fuzz --minutes 30``.
"""
from __future__ import annotations

import time

import fuzz  # tests/ is on sys.path (conftest.py)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

BUDGET_S = 35.0
EXAMPLES = 60
_spent = {"s": 0.0}


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          phases=[Phase.explicit, Phase.generate],      # no shrinking: every replay builds pools
          suppress_health_check=list(HealthCheck), print_blob=False)
@given(st.data())
def test_faces_agree_with_gymnasium(data):
    case = fuzz.draw_case(fuzz.DataChooser(data))
    if _spent["s"] > BUDGET_S:
        return
    start = time.monotonic()
    try:
        findings = fuzz.run_case(case)
    finally:
        _spent["s"] += time.monotonic() - start
    if findings:
        groups: dict = {}
        for f in findings:
            groups.setdefault(f.signature(), []).append(f)
        raise AssertionError(
            f"shmpool differs from its oracle on this case:\n{fuzz.describe_case(case)}\n\n"
            f"{fuzz.summary(groups, show=4)}\n\n"
            f"replay it, every op printed: python -m tests.fuzz -v --case {repr(repr(case))}\n"
            "fuzz further: python -m tests.fuzz --minutes 5")
