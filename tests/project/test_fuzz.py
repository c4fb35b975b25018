"""The differential fuzzer (tests/fuzz.py), bounded by a number of cases: shmpool's faces against
gymnasium's SyncVectorEnv (and SB3's DummyVecEnv) on generated envs.

Each case is a generated plan (spaces, info keys whose types change between steps, planned
failures) run through one to three faces (VectorEnv, Pool, EnvPoolEnv, ShmVecEnv, async
send/recv) with parent_shard True/False and 1 or 2 workers.  Any difference from the oracle fails
the test with the case's description and the ``python -m tests.fuzz`` line that replays it.

Case ``i`` is ``fuzz.case_from_seed(SHMPOOL_FUZZ_SEED + i)`` for ``i < SHMPOOL_FUZZ_CASES``: how much a
run checks is a count, never a time budget, so a loaded machine checks as much as a quiet one.  The seed
is random unless set, so successive CI runs cover new cases; it is printed at the start of the run and
in every failure, and ``SHMPOOL_FUZZ_SEED=<it>`` (or ``python -m tests.fuzz --seed <seed + i> -v``)
runs the same cases again.  The long run: ``python -m tests.fuzz --minutes 30``.
"""
from __future__ import annotations

import os
import secrets

import fuzz  # tests/ is on sys.path (conftest.py)
import pytest

# A case may draw the sb3 face (SB3, torch): every case runs after the tests that fork pools.
pytestmark = pytest.mark.heavy_imports
# ~1 s a case on a quiet 2-core machine (2-3 s loaded): 16 cases keep this file near 20 s.
CASES = int(os.environ.get("SHMPOOL_FUZZ_CASES", "16"))
SEED = int(os.environ.get("SHMPOOL_FUZZ_SEED") or secrets.randbelow(10 ** 9))


@pytest.fixture(scope="module", autouse=True)
def _say_the_seed(request):
    """The seed on the terminal before any case runs (outside output capture), so a run that hangs
    or is killed can be replayed too."""
    line = (f"fuzz: {CASES} cases from SHMPOOL_FUZZ_SEED={SEED} "
            f"(again: SHMPOOL_FUZZ_SEED={SEED} SHMPOOL_FUZZ_CASES={CASES} pytest tests/project/test_fuzz.py)")
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print("\n" + line, flush=True)


@pytest.mark.parametrize("index", range(CASES), ids=[f"case{i}" for i in range(CASES)])
def test_faces_agree_with_gymnasium(index):
    seed = SEED + index
    case = fuzz.case_from_seed(seed)
    findings = fuzz.run_case(case)
    if findings:
        groups: dict = {}
        for f in findings:
            groups.setdefault(f.signature(), []).append(f)
        raise AssertionError(
            f"shmpool differs from its oracle on case {index} of SHMPOOL_FUZZ_SEED={SEED} (case seed {seed}):\n"
            f"{fuzz.describe_case(case)}\n\n{fuzz.summary(groups, show=4)}\n\n"
            f"replay it, every op printed: python -m tests.fuzz -v --seed {seed}\n"
            f"this run's cases again: SHMPOOL_FUZZ_SEED={SEED} SHMPOOL_FUZZ_CASES={CASES} "
            "pytest tests/project/test_fuzz.py\n"
            "fuzz further: python -m tests.fuzz --minutes 5")
