"""SB3's own tests/test_vec_envs.py with ShmVecEnv in place of DummyVecEnv and SubprocVecEnv."""
from __future__ import annotations

import heavy_imports
import pytest

from .reference_suite import RegistryUnreachable, extract, patch, run, sdist

heavy_imports.require("stable_baselines3")   # the suite runs in a child pytest: never imported here

# The reference suite runs in a child pytest inside the module fixture (~1 min on 2 cores).
pytestmark = pytest.mark.timeout(900)
pytestmark = [pytestmark, pytest.mark.slow]   # slow: SB3's own VecEnv tests run against shmpool

# Cases of SB3's suite that ShmVecEnv fails, each with the reason. Empty is the goal; an entry that
# passes makes the test fail too, so this list never goes stale.
EXPECTED_FAILURES: dict[str, str] = {}
# Cases SB3's suite skips here, with why: not a gap of ShmVecEnv.
EXPECTED_SKIPS = {
    "test_render[ShmVecEnv]": "SB3 skips it without an X server (no display on CI)",
    "test_video_recorder": "SB3 skips it without moviepy",
}


@pytest.fixture(scope="module")
def sb3_outcome(tmp_path_factory):
    try:
        archive = sdist("stable_baselines3")
    except RegistryUnreachable as exc:
        pytest.skip(f"SB3's suite needs its sdist from the package registry: {exc}")
    folder = tmp_path_factory.mktemp("sb3_suite")
    test_file = extract(archive, "tests/test_vec_envs.py", folder)
    # Every case parametrized over the vec env classes runs with ShmVecEnv instead.
    patch(test_file, "VEC_ENV_CLASSES = [DummyVecEnv, SubprocVecEnv]",
          "from shmpool.sb3 import ShmVecEnv\nVEC_ENV_CLASSES = [ShmVecEnv]")
    return run(test_file, timeout=900)


def test_every_shmvecenv_case_passes(sb3_outcome):
    unexpected = {k: v for k, v in sb3_outcome.failed.items() if k not in EXPECTED_FAILURES}
    assert not unexpected, f"ShmVecEnv fails SB3's own cases: {unexpected}"
    ours = [k for k in sb3_outcome.passed if "ShmVecEnv" in k]
    assert len(ours) >= 10, f"SB3's suite ran only {len(ours)} ShmVecEnv cases: the swap did not take"


def test_only_known_skips(sb3_outcome):
    unknown = {k: v for k, v in sb3_outcome.skipped.items() if k not in EXPECTED_SKIPS}
    assert not unknown, f"SB3's suite skipped cases for reasons not accounted for: {unknown}"


def test_expected_failures_still_fail(sb3_outcome):
    stale = sorted(set(EXPECTED_FAILURES) - set(sb3_outcome.failed))
    assert not stale, f"these SB3 cases pass now: remove them from EXPECTED_FAILURES: {stale}"
