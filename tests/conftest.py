import os
import re
import sys
import time

import psutil
import pytest

sys.path.insert(0, os.path.dirname(__file__))


# What a pool can leave in /dev/shm: posix_ipc's objects made with a random name (``name=None``), which are
# a run of lowercase letters, semaphores with glibc's ``sem.`` prefix (shmpool.region, shmpool.memory off
# Linux).  Anything else there (Intel OpenMP's ``__KMP_REGISTERED_LIB_*``, torch's, another user's) is not
# a pool's: on a shared machine a neighbour's file must not fail the suite.
POOL_SHM_NAME = re.compile(r"(sem\.)?[a-z]+")


def shm_entries(shm_dir: str = "/dev/shm") -> set[str]:
    """The entries of ``shm_dir`` a pool of this user could have made (see ``POOL_SHM_NAME``)."""
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return set()
    out = set()
    for name in names:
        if not POOL_SHM_NAME.fullmatch(name):
            continue
        try:
            if os.stat(os.path.join(shm_dir, name)).st_uid != os.getuid():
                continue
        except OSError:   # gone meanwhile
            continue
        out.add(name)
    return out


def our_children() -> list:
    """Child processes, minus multiprocessing's own per-interpreter helpers
    (the spawn resource tracker and the forkserver live until exit by design)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "resource_tracker" in cmd or "forkserver" in cmd:
            continue
        out.append(child)
    return out


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a child process or a /dev/shm entry behind."""
    before_shm = shm_entries()
    yield
    deadline = time.monotonic() + 5
    while our_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    children = our_children()
    assert not children, f"leaked processes: {children}"
    assert shm_entries() - before_shm == set()


# --- gymnasium 0.29 ------------------------------------------------------------------------
# Under gymnasium 0.29 (shmpool.gym_compat.LEGACY) these check 1.x's contracts, so they skip, each
# with its reason; 0.29's contracts are tests/test_gym_compat.py's (its reference is 0.29's own
# AsyncVectorEnv) and the conformance run of 0.29.1's tests/vector.  A key is a file, or a file and
# the start of a test's name.
_REFERENCE_1X = ("its reference is gymnasium 1.x's vector env (autoreset_mode=, observation_mode=, "
                 "max_concurrency=, next-step autoreset)")
_POOL_VS_SYNC = ("it compares the Pool's own NEXT_STEP default with SyncVectorEnv, whose only autoreset under "
                 "0.29 is the same step")
_HAS_ATTR = "VecEnv.has_attr is SB3 2.4's (0.29's pins carry SB3 2.3.2)"
GYMNASIUM_1_ONLY = {
    "test_action_check.py": "its spaces use Discrete(dtype=), gymnasium 1.x's",
    "test_envpool_parity.py": "envpool 1.2 and its reference need gymnasium 1.x",
    "test_fuzz.py": _REFERENCE_1X,
    "test_pickled_leaves.py": _REFERENCE_1X,
    "test_same_step.py": _REFERENCE_1X,
    "test_vector_env_semantics.py": _REFERENCE_1X + "; its expected reprs are numpy 2's",
    "test_vector_face.py": _REFERENCE_1X,
    "test_trajectories.py": _POOL_VS_SYNC + "; attributes are set with 1.x's set_wrapper_attr",
    "test_batched.py": _POOL_VS_SYNC + "; gymnasium 1.x vector envs are hosted",
    "test_lifecycle.py::test_every_wait_policy_and_wake_mechanism_gives_the_same_results": _POOL_VS_SYNC,
    "test_random_spaces.py::test_random_spaces_round_trip": _REFERENCE_1X,
    "test_silent_data.py::test_an_unpicklable_set_attr_value": "it reads np_random_seed, a gymnasium 1.x attribute",
    "test_silent_data.py::test_unpicklable_reset_options": "it reads np_random_seed, a gymnasium 1.x attribute",
    "test_spacetree.py::test_assemble_is_splits_inverse": "gymnasium 0.29's Dict spaces sample OrderedDicts",
    "test_spacetree.py::test_empty_branches": "gymnasium 0.29's Dict spaces sample OrderedDicts",
    "test_spacetree.py::test_random_nested_spaces": "gymnasium 0.29's Dict spaces sample OrderedDicts",
    "test_spacetree.py::test_a_custom_space_is_one_leaf": "it expects plain dicts; 0.29's Dict values are OrderedDicts",
    "test_spacetree.py::test_split_exact_only_for_plain": "under 0.29 an OrderedDict is a Dict's own value",
    "test_sb3_adapter.py::test_errors_keep_their_type": _HAS_ATTR,
    "test_sb3_adapter.py::test_a_plain_pool_gets_every_method": _HAS_ATTR,
    "test_recipes_mujoco.py::test_matches_gymnasium": "gymnasium 0.29 has no -v5 MuJoCo envs to compare with",
    "test_recipes_mujoco.py::test_in_pool_matches_sync_vector_env": "gymnasium 0.29 has no -v5 MuJoCo envs",
    "test_recipes_mujoco.py::test_pool_binds_recipe_obs": _REFERENCE_1X,
    "test_recipes_mujoco.py::test_mujoco_warnings": "the MuJoCo of 0.29's pins (2.3.3) does not deprecate settotalmass",
    "test_recipes_atari.py::test_matches_gymnasium": ("its reference is ale-py's ALE/ ids with gymnasium 1.x's "
                                                      "wrappers; ale-py 0.12 registers no ids under gymnasium 0.29"),
}


def _gymnasium_1_only(path) -> str | None:
    from shmpool.gym_compat import LEGACY
    if not LEGACY:
        return None
    return GYMNASIUM_1_ONLY.get(os.path.basename(str(path)))


class _SkippedFile(pytest.File):
    """A test file that cannot even be imported under gymnasium 0.29: one skipped item saying why."""

    def collect(self):
        yield _SkippedItem.from_parent(self, name=self.path.name)


class _SkippedItem(pytest.Item):
    def runtest(self):
        pytest.skip(f"gymnasium 1.x only: {_gymnasium_1_only(self.path)}")

    def reportinfo(self):
        return self.path, None, self.name


def pytest_pycollect_makemodule(module_path, parent):
    if _gymnasium_1_only(module_path) is not None:
        return _SkippedFile.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(config, items):
    from shmpool.gym_compat import LEGACY
    if not LEGACY:
        return
    for item in items:
        for key, reason in GYMNASIUM_1_ONLY.items():
            file, _, test = key.partition("::")
            if test and item.path.name == file and item.name.startswith(test):
                item.add_marker(pytest.mark.skip(reason=f"gymnasium 1.x only: {reason}"))
