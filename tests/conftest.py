import gc
import os
import re
import sys
import time

import psutil
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import heavy_imports  # noqa: E402  (tests/, put on the path above)
import suite_parts  # noqa: E402

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


def mapped_by_others(names: set[str], shm_dir: str = "/dev/shm") -> set[str]:
    """Those of ``names`` (entries of ``shm_dir``) that a process other than this one has mapped: another
    pool's, starting in a neighbouring suite (glibc maps a semaphore before its name appears, and for as long
    as it is open), never one this process left behind (its children are gone when this is asked)."""
    paths = {os.path.join(shm_dir, name): name for name in names}
    found: set[str] = set()
    me = os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/maps") as maps:
                lines = maps.readlines()
        except OSError:   # gone meanwhile, or not ours to read
            continue
        for line in lines:
            fields = line.split(None, 5)   # address perms offset dev inode [path]
            if len(fields) == 6 and fields[5].rstrip("\n") in paths:
                found.add(paths[fields[5].rstrip("\n")])
    return found


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


def pytest_collection_finish(session):
    """Set aside every object collection made (torch, SB3, MuJoCo, hypothesis, ... imported by the test
    modules) from the garbage collector: a full collection over that heap costs 0.1-0.5 s, and the
    fixtures that close AsyncVectorEnvs run one after every test (a minute of the fast run).  Objects the
    tests make later are collected as before."""
    gc.collect()
    gc.freeze()
    session.config.stash[heavy_imports.AT_COLLECTION] = heavy_imports.loaded()


@pytest.fixture(autouse=True)
def _heavy_imports_stay_out(request):
    """Fails a test that loads torch, Ray, SB3 or envpool into this process without the ``heavy_imports``
    mark: every later pool's fork would pay for it (tests/heavy_imports.py)."""
    if request.node.get_closest_marker(heavy_imports.MARK) is not None:
        yield
        return
    before = heavy_imports.loaded()
    yield
    said = heavy_imports.newly_loaded(request.node.nodeid, before)
    if said is not None:
        pytest.fail(said, pytrace=False)


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
    new = shm_entries() - before_shm
    if new:   # a neighbouring suite's pools (pytest -n, another run on this machine) may be starting
        new -= mapped_by_others(new)
        new &= shm_entries()   # one gone meanwhile was a neighbour's, unlinked while this looked
    assert new == set(), f"left in /dev/shm: {sorted(new)}"


@pytest.fixture
def gate(tmp_path):
    """A shut :class:`envs.Gate` for the test's envs to hold a call at; opened at the end whatever happened, so no
    env is left waiting out its cap."""
    from envs import Gate
    shut = Gate(tmp_path)
    yield shut
    shut.open()


# --- gymnasium 0.29 ------------------------------------------------------------------------
# Under gymnasium 0.29 (shmpool.gym_compat.LEGACY) these check 1.x's contracts, so they skip, each
# with its reason; 0.29's contracts are tests/faces/test_gym_compat.py's (its reference is 0.29's own
# AsyncVectorEnv) and the conformance run of 0.29.1's tests/vector.  A key is a file, or a file and
# the start of a test's name.
_REFERENCE_1X = ("its reference is gymnasium 1.x's vector env (autoreset_mode=, observation_mode=, "
                 "max_concurrency=, next-step autoreset)")
_POOL_VS_SYNC = ("it compares the Pool's own NEXT_STEP default with SyncVectorEnv, whose only autoreset under "
                 "0.29 is the same step")
_POOL_INFOS = ("it compares the Pool's own infos (1.x's layout under any gymnasium) with SyncVectorEnv's (0.29's "
               "layout under 0.29)")
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
    "test_random_spaces.py::test_every_leaf_kind_round_trips": _POOL_VS_SYNC,
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
    "test_silent_data.py::test_an_answer_the_parent_cannot_read": "it reads np_random_seed, a gymnasium 1.x attribute",
    "test_silent_data.py::test_a_set_attr_value_the_worker": "it reads np_random_seed, a gymnasium 1.x attribute",
    "test_silent_data.py::test_payloads_larger_than_a_pipe": "it reads np_random_seed, a gymnasium 1.x attribute",
    "test_silent_data.py::test_info_values_that_change_type": _POOL_INFOS,
    "test_silent_data.py::test_a_key_that_is_a_dict_a_number": _POOL_INFOS,
    "test_silent_data.py::test_a_final_info_key_that_is_a_dict": _REFERENCE_1X,
    "test_silent_data.py::test_the_envpool_face_passes_on_info_keys": _REFERENCE_1X,
    "test_silent_data.py::test_nested_numeric_infos_need_no_side": "it reads 1.x's nested info layout",
    "test_parent_shard.py::test_sync_steps_match_sync_vector_env": _POOL_VS_SYNC,
    "test_parent_shard.py::test_send_recv_matches_sync_vector_env": _POOL_VS_SYNC,
    "test_parent_shard.py::test_a_one_cpu_quota_runs_no_worker_process": _POOL_VS_SYNC,
    "test_first_day.py::test_env_keywords_far_from_ours": "sutton_barto_reward is gymnasium 1.x's CartPole keyword",
    "test_envpool_port.py::test_without_the_forwarding_edit": "gymnasium 0.29's wrappers forward attributes: the edit "
                                                              "is not needed there",
    "test_examples.py::test_ppo_cartpole_short_run": "the example uses gymnasium 1.x's vector wrappers",
    "test_recipes_atari.py::test_matches_gymnasium": ("its reference is ale-py's ALE/ ids with gymnasium 1.x's "
                                                      "wrappers; ale-py 0.12 registers no ids under gymnasium 0.29"),
}

# Where shmpool is not yet exactly 0.29's AsyncVectorEnv: expected to fail (strict, so a fix shows).
GYMNASIUM_0_29_GAPS: dict[str, str] = {}


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


@pytest.hookimpl(tryfirst=True)   # before -m, -k and --deselect take items away: each part is counted whole
def pytest_collection_modifyitems(config, items):
    _count_the_parts(config, items)
    _leave_out_the_slow_part(config, items)
    heavy_imports.run_last(items)
    from shmpool.gym_compat import LEGACY
    if not LEGACY:
        return
    for item in items:
        for key, reason in GYMNASIUM_1_ONLY.items():
            file, _, test = key.partition("::")
            if test and item.path.name == file and item.name.startswith(test):
                item.add_marker(pytest.mark.skip(reason=f"gymnasium 1.x only: {reason}"))
        for key, reason in GYMNASIUM_0_29_GAPS.items():
            file, _, test = key.partition("::")
            if item.path.name == file and item.name.startswith(test):
                item.add_marker(pytest.mark.xfail(reason=f"not yet 0.29's: {reason}", strict=True))


# --- the suite's parts, against README.md's test table (tests/suite_parts.py) --------------------
# What kept a run from collecting every test file (a module skipped for a missing extra, an import error).
_NOT_COLLECTED: list[str] = []


def pytest_collectreport(report):
    if (report.failed or report.skipped) and report.nodeid.endswith(".py"):
        _NOT_COLLECTED.append(report.nodeid)


def _collects_every_file(config) -> bool:
    """Whether this run collects from the whole of ``testpaths`` (no file named, none ignored, no --lf)."""
    return (config.args_source is pytest.Config.ArgsSource.TESTPATHS and not config.getoption("lf", False)
            and not config.getoption("ignore", None) and not config.getoption("ignore_glob", None))


def _count_the_parts(config, items) -> None:
    slow = sum(1 for item in items if item.get_closest_marker("slow") is not None)
    found = suite_parts.Collection(suite_parts.Counted(fast=len(items) - slow, slow=slow),
                                   whole=_collects_every_file(config), not_collected=tuple(_NOT_COLLECTED))
    config.stash[suite_parts.COLLECTION] = found
    if os.environ.get(suite_parts.WRITE_COLLECTION_TO):   # suite_parts.collect_in_a_subprocess asks
        suite_parts.write(found, os.environ[suite_parts.WRITE_COLLECTION_TO])


# --- the fast part by default (issue 70) ------------------------------------------------------
# `python -m pytest` runs the fast part (~2 minutes); `--all` runs the whole suite.  An option rather than
# `addopts = -m "not slow"`: with that, the whole suite would be `-m "slow or not slow"` (no one types it),
# and a slow test named by its node id would be deselected without a word.  Any `-m` given chooses by
# itself (`-m slow`, `-m distributed`, `-m "not slow"`), and a test named by its node id always runs.
WHOLE_SUITE = "whole_suite"
_SLOW_LEFT_OUT = pytest.StashKey[int]()


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", dest=WHOLE_SUITE,
                     help="run the whole suite, slow tests too (without it and without -m, the fast part runs)")


def _named_by_node_id(config) -> list[str]:
    """The node ids (``file::test...``) named on the command line, relative to the rootdir like an item's."""
    named = []
    for arg in config.args:
        path, sep, rest = arg.partition("::")
        if sep:
            where = os.path.join(str(config.invocation_params.dir), path)
            named.append(os.path.relpath(where, config.rootpath).replace(os.sep, "/") + "::" + rest)
    return named


def _leave_out_the_slow_part(config, items) -> None:
    if config.getoption(WHOLE_SUITE) or config.getoption("markexpr", "").strip():
        return
    named = _named_by_node_id(config)
    keep, slow = [], []
    for item in items:
        asked = any(item.nodeid == n or item.nodeid.startswith((n + "[", n + "::")) for n in named)
        (slow if item.get_closest_marker("slow") is not None and not asked else keep).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = keep
        config.stash[_SLOW_LEFT_OUT] = len(slow)


def pytest_sessionstart(session):
    session.config.stash[suite_parts.STARTED] = (time.monotonic(), os.getloadavg()[0])


def _readme_command(config) -> str | None:
    """The part of the suite (``suite_parts.COMMANDS``) this run is README.md's command for, if it is one."""
    part = suite_parts.part_run(config.getoption("markexpr", "").strip(), config.getoption(WHOLE_SUITE))
    if (part is not None and _collects_every_file(config) and not config.getoption("keyword", "")
            and not config.getoption("deselect", None) and not config.getoption("stepwise", False)
            and not config.getoption("collectonly", False)):
        return part
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    left_out = config.stash.get(_SLOW_LEFT_OUT, 0)
    if left_out:
        terminalreporter.write_line(f"{left_out} slow tests left out (the fast part is pytest's default): "
                                    f"--all runs the whole suite, -m slow the slow part")
    markexpr = _readme_command(config)
    if markexpr is None or hasattr(config, "workerinput") or suite_parts.STARTED not in config.stash:
        return
    started, load = config.stash[suite_parts.STARTED]
    found = config.stash.get(suite_parts.COLLECTION, None)
    counted = found.counted if found is not None and found.whole and not found.not_collected else None
    terminalreporter.write_sep("-", "README.md's test table")
    terminalreporter.write_line(suite_parts.compare(markexpr, time.monotonic() - started, counted,
                                                    len(os.sched_getaffinity(0)), (load, os.getloadavg()[0])))
