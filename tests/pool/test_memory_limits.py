"""A region larger than the memory the process may get is a PoolResourceError at construction,
not an OOM kill: cgroup limits (v2 memory.max, v1 memory.limit_in_bytes) and MemAvailable."""
from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import gymnasium as gym
import pytest

from shmpool.errors import PoolResourceError
from shmpool.memory import check_memory, create_region, memory_limits

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
V1_UNLIMITED = "9223372036854771712\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path: Path, cgroup: str, mem_available: int = 64 * GiB, swap_free: int = 0) -> Path:
    proc = tmp_path / "proc"
    _write(proc / "self" / "cgroup", cgroup)
    _write(proc / "meminfo", f"MemTotal:       {128 * GiB // KiB} kB\nMemFree:        {mem_available // KiB} kB\n"
                             f"MemAvailable:   {mem_available // KiB} kB\nSwapTotal:      {swap_free // KiB} kB\n"
                             f"SwapFree:       {swap_free // KiB} kB\n")
    return proc


def _v2(tmp_path: Path, groups: dict[str, dict[str, str]]) -> Path:
    """A fake cgroup2 mount: {"/a/b": {"memory.max": "...", ...}}."""
    root = tmp_path / "cg"
    _write(root / "cgroup.controllers", "cpu memory\n")
    for group, files in groups.items():
        for name, text in files.items():
            _write(root.joinpath(*[p for p in group.split("/") if p], name), text)
    return root


def _v2_group(limit: str, current: int, stat: str = "anon 0\nfile 0\n") -> dict[str, str]:
    return {"memory.max": limit, "memory.current": f"{current}\n", "memory.stat": stat}


def _refusal(size: int, proc: Path, root: Path) -> PoolResourceError:
    with pytest.raises(PoolResourceError) as info:
        check_memory(size, proc=proc, cgroup_root=root)
    return info.value


def test_v2_limit_smaller_than_the_region_is_refused_naming_size_limit_and_cgroup(tmp_path):
    proc = _proc(tmp_path, "0::/pod/box\n")
    root = _v2(tmp_path, {"/pod/box": _v2_group("536870912\n", 20 * MiB)})
    exc = _refusal(GiB, proc, root)
    message = str(exc)
    assert "needs 1.0 GiB (1073741824 bytes)" in message, message
    assert "memory limit of 512.0 MiB" in message and "492.0 MiB more fits" in message, message
    assert "cgroup /pod/box" in message and str(root / "pod" / "box" / "memory.max") in message, message
    assert "docker run -m" in message and "Kubernetes memory limit" in message, message
    assert isinstance(exc, OSError) and exc.errno == errno.ENOMEM
    assert exc.resource == "memory" and exc.size == GiB and exc.limit == 512 * MiB


def test_a_parent_cgroups_smaller_limit_binds(tmp_path):
    proc = _proc(tmp_path, "0::/pod/box\n")
    root = _v2(tmp_path, {"/pod": _v2_group("536870912\n", 30 * MiB),
                          "/pod/box": _v2_group(f"{4 * GiB}\n", 10 * MiB)})
    exc = _refusal(GiB, proc, root)
    assert exc.limit == 512 * MiB
    assert "cgroup /pod (" in str(exc) and str(root / "pod" / "memory.max") in str(exc), str(exc)
    check_memory(256 * MiB, proc=proc, cgroup_root=root)   # fits under both


def test_v1_memory_controller_tree(tmp_path):
    proc = _proc(tmp_path, "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    root = tmp_path / "cg"
    _write(root / "memory" / "memory.limit_in_bytes", V1_UNLIMITED)
    box = root / "memory" / "docker" / "abc"
    _write(box / "memory.limit_in_bytes", "536870912\n")
    _write(box / "memory.usage_in_bytes", f"{300 * MiB}\n")
    _write(box / "memory.stat", f"cache {200 * MiB}\ntotal_inactive_file {150 * MiB}\n"
                                f"total_active_file {50 * MiB}\ntotal_rss {100 * MiB}\n")
    _write(box / "memory.memsw.limit_in_bytes", V1_UNLIMITED)
    exc = _refusal(GiB, proc, root)
    assert "needs 1.0 GiB" in str(exc) and "memory limit of 512.0 MiB" in str(exc), str(exc)
    assert "cgroup /docker/abc" in str(exc) and str(box / "memory.limit_in_bytes") in str(exc), str(exc)
    assert "100.0 MiB of it in use" in str(exc), str(exc)   # the 200 MiB of page cache is not counted
    assert exc.limit == 512 * MiB
    check_memory(400 * MiB, proc=proc, cgroup_root=root)   # fits once the cache is reclaimed


def test_v1_memsw_limit_without_swap_room(tmp_path):
    proc = _proc(tmp_path, "4:memory:/job\n", swap_free=8 * GiB)
    box = tmp_path / "cg" / "memory" / "job"
    _write(box / "memory.limit_in_bytes", "536870912\n")
    _write(box / "memory.usage_in_bytes", "0\n")
    _write(box / "memory.stat", "total_inactive_file 0\n")
    _write(box / "memory.memsw.limit_in_bytes", "536870912\n")   # docker -m 512m --memory-swap 512m
    _write(box / "memory.memsw.usage_in_bytes", "0\n")
    assert _refusal(GiB, proc, tmp_path / "cg").limit == 512 * MiB
    (box / "memory.memsw.limit_in_bytes").write_text(f"{2 * GiB}\n")   # docker -m 512m: swap allowed
    check_memory(GiB, proc=proc, cgroup_root=tmp_path / "cg")


@pytest.mark.parametrize("limit", ["max\n", V1_UNLIMITED])
def test_unlimited_cgroups_refuse_nothing(tmp_path, limit):
    proc = _proc(tmp_path, "4:memory:/job\n0::/job\n")
    root = _v2(tmp_path, {"/job": _v2_group(limit, 10 * GiB)})
    _write(root / "memory" / "job" / "memory.limit_in_bytes", limit)
    assert [b.cgroup for b in memory_limits(proc, root)] == [None]   # only MemAvailable
    check_memory(32 * GiB, proc=proc, cgroup_root=root)


def test_reclaimable_page_cache_is_not_used_but_shmem_is(tmp_path):
    proc = _proc(tmp_path, "0::/box\n")
    cache = "anon 10485760\nfile 419430400\nshmem 0\nactive_file 209715200\ninactive_file 209715200\n"
    root = _v2(tmp_path, {"/box": _v2_group("536870912\n", 410 * MiB, cache)})
    check_memory(400 * MiB, proc=proc, cgroup_root=root)   # 400 MiB of cache gives way
    # The same 400 MiB of "file" as shmem (tmpfs, another pool's memfd) is not reclaimable.
    shmem = "anon 10485760\nfile 419430400\nshmem 419430400\nactive_file 0\ninactive_file 0\n"
    (root / "box" / "memory.stat").write_text(shmem)
    exc = _refusal(400 * MiB, proc, root)
    assert "410.0 MiB of it in use" in str(exc), str(exc)


def test_a_region_just_over_the_room_passes_within_the_slack(tmp_path):
    proc = _proc(tmp_path, "0::/box\n")
    root = _v2(tmp_path, {"/box": _v2_group("536870912\n", 0)})
    check_memory(512 * MiB, proc=proc, cgroup_root=root)
    check_memory(520 * MiB, proc=proc, cgroup_root=root)    # a snapshot's error, left to posix_fallocate
    _refusal(560 * MiB, proc, root)


def test_mem_available_on_the_bare_host(tmp_path):
    proc = _proc(tmp_path, "0::/\n", mem_available=2 * GiB)
    root = _v2(tmp_path, {})
    exc = _refusal(4 * GiB, proc, root)
    message = str(exc)
    assert "needs 4.0 GiB" in message and "this host has only 2.0 GiB available" in message, message
    assert f"MemAvailable in {proc / 'meminfo'}" in message and "free memory on this host" in message, message
    assert exc.resource == "memory" and exc.limit == 2 * GiB and exc.size == 4 * GiB
    check_memory(GiB, proc=proc, cgroup_root=root)


def test_free_swap_counts_unless_the_cgroup_forbids_it(tmp_path):
    proc = _proc(tmp_path, "0::/box\n", mem_available=GiB, swap_free=4 * GiB)
    root = _v2(tmp_path, {"/box": {**_v2_group(f"{GiB}\n", 0), "memory.swap.max": "max\n"}})
    check_memory(3 * GiB, proc=proc, cgroup_root=root)
    exc = _refusal(6 * GiB, proc, root)
    assert "plus 4.0 GiB of free swap" in str(exc), str(exc)
    (root / "box" / "memory.swap.max").write_text("0\n")
    exc = _refusal(3 * GiB, proc, root)
    assert exc.limit == GiB and "cgroup /box" in str(exc), str(exc)


def test_a_small_request_passes(tmp_path):
    proc = _proc(tmp_path, "0::/pod/box\n", mem_available=4 * GiB)
    root = _v2(tmp_path, {"/pod/box": _v2_group("536870912\n", 100 * MiB)})
    check_memory(64 * MiB, proc=proc, cgroup_root=root)
    check_memory(1, proc=proc, cgroup_root=root)


def test_unreadable_sources_give_no_limit(tmp_path):
    check_memory(1 << 50, proc=tmp_path / "nothing", cgroup_root=tmp_path / "none")
    proc = tmp_path / "proc"
    (proc / "meminfo").mkdir(parents=True)              # reading a directory: IsADirectoryError
    _write(proc / "self" / "cgroup", "garbage\n0::/box\n")
    root = _v2(tmp_path, {"/box": {"memory.max": "nonsense\n", "memory.current": "\xff\n"}})
    (root / "box" / "memory.stat").mkdir()
    assert memory_limits(proc, root) == []
    check_memory(1 << 50, proc=proc, cgroup_root=root)
    # A limit whose usage cannot be read still binds, with nothing counted as used.
    (root / "box" / "memory.max").write_text("536870912\n")
    assert _refusal(GiB, proc, root).limit == 512 * MiB


def test_this_hosts_limits_read_in_a_few_milliseconds():
    t0 = time.perf_counter()
    for _ in range(10):
        memory_limits()
    # A few small /proc and cgroup reads each (~1 ms): a walk of /proc or a blocking read would take far
    # longer.  0.5 s for ten is 50x the idle time, room for a loaded CI.
    assert time.perf_counter() - t0 < 0.5


@pytest.fixture
def no_real_reservation(monkeypatch):
    """Should the check ever be skipped, a terabyte region must fail the test, not reserve the host's
    memory until the OOM killer ends some other process: posix_fallocate refuses anything larger
    than this machine's RAM with an AssertionError."""
    import psutil
    real, ram = os.posix_fallocate, psutil.virtual_memory().total

    def guarded(fd, offset, length):
        if length > ram:
            raise AssertionError(f"posix_fallocate of {length} bytes reached: the region was not checked first")
        return real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", guarded)


def test_a_terabyte_region_is_refused_at_once_not_reserved(no_real_reservation):
    t0 = time.monotonic()
    with pytest.raises(PoolResourceError) as info:
        create_region(1 << 40)
    # Refused before anything is reserved (no_real_reservation fails a reservation outright); the time says
    # nothing was zeroed or faulted in on the way either: a few reads, 1 s is ample on a loaded CI.
    assert time.monotonic() - t0 < 1.0
    assert "needs 1.0 TiB (1099511627776 bytes)" in str(info.value), str(info.value)


def _env_declaring(obs_space):
    """An env declaring ``obs_space``: the region is sized from it before any observation exists."""
    import numpy as np

    class Declaring(gym.Env):
        observation_space = obs_space
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.zeros(1, np.int8), {}

    return Declaring()


# MultiBinary holds no bounds arrays, so declaring these costs nothing until the region.
_huge_env = functools.partial(_env_declaring, gym.spaces.MultiBinary(1 << 40))
# 2**32 x 2**32 elements: a count int64 cannot hold (it wrapped to 0 and failed in a reshape).
_overflowing_env = functools.partial(_env_declaring, gym.spaces.MultiBinary([1 << 32, 1 << 32]))


def test_a_pool_declaring_a_terabyte_per_env_raises_at_construction(no_leaks, no_real_reservation):
    import shmpool
    t0 = time.monotonic()
    with pytest.raises(shmpool.PoolResourceError) as info:
        shmpool.Pool(_huge_env, 2, num_workers=1)
    assert "needs 2.0 TiB (" in str(info.value), str(info.value)
    # The refusal comes at the worker's first message, before anything is reserved (~0.3 s idle, worker start-up
    # included; the check itself is the test above's); 30 s is far past a loaded CI's start-up and fails a pool
    # that began to touch the terabyte first.
    assert time.monotonic() - t0 < 30


def test_a_shape_whose_element_count_overflows_int64_is_refused_by_size(no_leaks, no_real_reservation):
    import shmpool
    with pytest.raises(shmpool.PoolResourceError) as info:
        shmpool.Pool(_overflowing_env, 2, num_workers=1)
    # The whole region: 2 envs x 2**64 bytes of observations, plus the flags and control words.
    size = int(re.search(r"needs 33554432\.0 TiB \((\d+) bytes\)", str(info.value)).group(1))
    assert 2 * (1 << 64) <= size < 2 * (1 << 64) + (1 << 20), str(info.value)


# --- a real memory cgroup -------------------------------------------------------------------

# 16 envs of 64 MiB observations: a region of 1 GiB (plus a few KiB of flags and the control
# words, Layout.build) in a 512 MiB cgroup.  MultiBinary, not Box: a Box of 64 Mi elements holds
# 256 MiB of bounds (low, high, bounded_below/above) in every process that has it, and would OOM
# the worker before the region is asked for.  Then a pool of 16 x 4 MiB (64 MiB) that does fit.
CGROUP_CHILD = textwrap.dedent("""
    import sys, time
    import gymnasium as gym, numpy as np
    import shmpool
    from shmpool import memory

    def make(n):
        obs = np.zeros(n, np.int8)
        class Obs(gym.Env):
            observation_space = gym.spaces.MultiBinary(n)
            action_space = gym.spaces.Discrete(2)
            def reset(self, *, seed=None, options=None):
                return obs, {}
            def step(self, action):
                return obs, 0.0, False, False, {}
        return Obs

    t0 = time.monotonic()
    try:
        memory.create_region(1 << 30)
    except shmpool.PoolResourceError:
        print("direct", f"{time.monotonic() - t0:.3f}")
    try:
        shmpool.Pool(make(64 << 20), 16, num_workers=1)
    except shmpool.PoolResourceError as exc:
        print("refused", exc.resource, exc.size, exc.limit)
        print(exc)
    else:
        print("built")
    with shmpool.Pool(make(4 << 20), 16, num_workers=1) as pool:
        pool.reset()
        pool.step(np.zeros(16, np.int64))
    print("small ok")
""")


def _memory_cgroup_parent() -> tuple[Path, str] | tuple[None, str]:
    """Where to make a memory cgroup: (directory, "v2" or "v1"), or (None, why not)."""
    for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        controllers = mount / "cgroup.controllers"
        if controllers.exists():
            try:
                if "memory" in controllers.read_text().split():
                    return mount, "v2"
            except OSError:
                pass
    if (Path("/sys/fs/cgroup/memory") / "memory.limit_in_bytes").exists():
        return Path("/sys/fs/cgroup/memory"), "v1"
    return None, "no cgroup memory controller available (neither cgroup2 with memory nor v1 memory)"


def _remove_cgroup(group: Path, parent: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
        try:   # a straggler still inside: move it out to the parent
            for pid in (group / "cgroup.procs").read_text().split():
                (parent / "cgroup.procs").write_text(pid)
        except OSError:
            pass
        time.sleep(0.1)


@contextlib.contextmanager
def _memory_cgroup(limit: int):
    """A fresh memory cgroup of ``limit`` bytes (no swap): yields its ``cgroup.procs``; skips
    where one cannot be made (not root, no memory controller)."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    parent, kind = _memory_cgroup_parent()
    if parent is None:
        pytest.skip(kind)
    if kind == "v2":
        try:
            (parent / "cgroup.subtree_control").write_text("+memory")
        except OSError as exc:
            pytest.skip(f"cannot enable the memory controller in {parent}: {exc}")
    group = parent / f"shmpool-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup in {parent}: {exc}")
    try:
        if kind == "v2":
            (group / "memory.max").write_text(str(limit))
            if (group / "memory.swap.max").exists():
                (group / "memory.swap.max").write_text("0")
        else:
            (group / "memory.limit_in_bytes").write_text(str(limit))
            if (group / "memory.memsw.limit_in_bytes").exists():
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
        yield group / "cgroup.procs"
    finally:
        _remove_cgroup(group, parent)


def _stdout_in_a_512_mib_cgroup(tmp_path: Path, child: str) -> tuple[str, str]:
    """Run the script ``child`` in a fresh 512 MiB memory cgroup (it moves itself in before Python
    starts); its stdout and the cgroup's name, once it has exited 0 (not killed)."""
    with _memory_cgroup(512 * MiB) as procs:
        script = tmp_path / "child.py"
        script.write_text(child)
        done = subprocess.run(["sh", "-c", f'echo $$ > {procs} && exec "$0" "$1"', sys.executable, str(script)],
                              capture_output=True, text=True, timeout=180)
        killed = f"exit {done.returncode} (137 or -9: the OOM killer)"
        assert done.returncode == 0, f"{killed}\n{done.stdout}{done.stderr[-3000:]}"
        return done.stdout, procs.parent.name


def test_real_512_mib_cgroup_refuses_a_1_gib_region_instead_of_an_oom_kill(tmp_path):
    stdout, group = _stdout_in_a_512_mib_cgroup(tmp_path, CGROUP_CHILD)
    print(stdout)
    lines = stdout.splitlines()
    assert lines[0].startswith("direct ") and float(lines[0].split()[1]) < 1.0, stdout
    assert lines[1].split()[:2] == ["refused", "memory"], stdout
    size, limit = int(lines[1].split()[2]), int(lines[1].split()[3])
    assert 16 * 64 * MiB <= size < 16 * 64 * MiB + MiB and limit == 512 * MiB, stdout
    message = lines[2]
    assert "needs 1.0 GiB (" in message and "memory limit of 512.0 MiB" in message, message
    assert f"cgroup /{group}" in message, message
    assert lines[-1] == "small ok", stdout


# --- spaces with large bounds ------------------------------------------------------------------
# A Box of N elements holds 4N bytes of bounds (low, high, bounded_below, bounded_above) in every
# process that has it.  The trainer used to decode every worker's copy and compare them with
# allclose (~25 bytes of float temporaries per element) before the region's size was checked.

def _box_space(megabytes: int):
    import numpy as np
    return gym.spaces.Box(0, 255, (megabytes, 1024, 1024), np.uint8)


def _box_env_class(megabytes: int):
    """An env class whose instances each build an (equal) uint8 Box of ``megabytes`` MiB, as most
    envs do.  Nothing large on the class itself: its constructor travels pickled."""
    import numpy as np

    class BigBox(gym.Env):
        action_space = gym.spaces.Discrete(2)

        def __init__(self):
            self.observation_space = _box_space(megabytes)

        def reset(self, *, seed=None, options=None):
            return np.zeros(self.observation_space.shape, np.uint8), {}

        def step(self, action):
            return np.zeros(self.observation_space.shape, np.uint8), 0.0, False, False, {}

    return BigBox


def _space_bytes(space) -> int:
    return space.low.nbytes + space.high.nbytes + space.bounded_below.nbytes + space.bounded_above.nbytes


def _spaces_decoded(monkeypatch) -> list:
    """Every ``Spaces`` message the trainer decodes from here on."""
    from shmpool import protocol as P
    decoded, real = [], P.decode_from_worker

    def counting(data):
        msg = real(data)
        if type(msg) is P.Spaces:
            decoded.append(msg)
        return msg

    monkeypatch.setattr(P, "decode_from_worker", counting)
    return decoded


def test_a_region_too_large_is_refused_from_worker_0s_spaces_before_the_others_are_read(monkeypatch, no_leaks):
    import shmpool
    from shmpool import memory
    decoded = _spaces_decoded(monkeypatch)
    seen_at_refusal = []

    def refuse(size, *args, **kwargs):
        seen_at_refusal.append(len(decoded))
        raise PoolResourceError(f"refused {size}", errno_=errno.ENOMEM, resource="memory", size=size, limit=1)

    monkeypatch.setattr(memory, "check_memory", refuse)
    with pytest.raises(PoolResourceError, match=r"^refused \d+$"):
        shmpool.Pool(_box_env_class(1), 6, num_workers=3)
    assert seen_at_refusal[:1] == [1], seen_at_refusal   # was [3]: every worker's spaces decoded first


def test_workers_equal_spaces_are_decoded_once_in_the_trainer(monkeypatch, no_leaks):
    import tracemalloc

    import shmpool
    decoded = _spaces_decoded(monkeypatch)
    cls = _box_env_class(4)
    one = _space_bytes(_box_space(4))   # 16 MiB
    tracemalloc.start()
    try:
        pool = shmpool.Pool(cls, 6, num_workers=3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    with pool:
        assert len(decoded) == 1, len(decoded)
        assert all(space is pool.single_observation_space for space in pool.observation_spaces)
        assert pool.single_observation_space == _box_space(4)
        obs, _ = pool.reset()
        assert obs.shape == (6, 4, 1024, 1024)
    # One decoded copy plus one message's bytes at a time (2 x 16 MiB), and room for the rest of
    # start-up; it was 3 decoded copies, their bytes and allclose's temporaries (> 10 x 16 MiB).
    assert peak < 3 * one, f"peak {peak / MiB:.0f} MiB for spaces of {one / MiB:.0f} MiB"


def test_a_shards_equal_spaces_are_compared_without_allclose_temporaries(no_leaks):
    import tracemalloc

    import shmpool
    cls = _box_env_class(4)
    one = _space_bytes(_box_space(4))
    tracemalloc.start()
    try:   # what building the two envs' spaces costs alone (the installed gymnasium's Box)
        spaces = [_box_space(4) for _ in range(2)]
        building = tracemalloc.get_traced_memory()[1]
        del spaces
    finally:
        tracemalloc.stop()
    tracemalloc.start()
    try:   # both envs in this process: the shard's own comparison is traced too
        pool = shmpool.Pool(cls, 2, num_workers=1, parent_shard=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    with pool:
        assert pool.observation_spaces[0] is pool.observation_spaces[1]
    # Building the envs, then the message's bytes and its decoded copy (2 x 16 MiB), and room for
    # the rest.  Box equality's allclose over 4 Mi elements made ~100 MiB of float temporaries.
    assert peak < building + 2.5 * one, f"peak {peak / MiB:.0f} MiB, building {building / MiB:.0f} MiB"


def test_same_space_judges_as_gymnasium_does():
    import numpy as np

    from shmpool.layout import same_space
    box = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
    cases = [
        (box, box),
        (box, gym.spaces.Box(0.0, 1.0, (3,), np.float32)),
        (box, gym.spaces.Box(1e-9, 1.0, (3,), np.float32)),       # allclose, not equal: gymnasium says equal
        (box, gym.spaces.Box(0.0, 2.0, (3,), np.float32)),
        (box, gym.spaces.Box(0.0, 1.0, (4,), np.float32)),
        (box, gym.spaces.Box(0.0, 1.0, (3,), np.float64)),
        (box, gym.spaces.Discrete(3)),
        (gym.spaces.Dict(a=box), gym.spaces.Dict(a=gym.spaces.Box(0.0, 1.0, (3,), np.float32))),
        (gym.spaces.Discrete(3), gym.spaces.Discrete(3, start=1)),
    ]
    judged = [a == b for a, b in cases]   # gymnasium 0.29's Box equality ignores the dtype; 1.x's does not
    assert [same_space(a, b) for a, b in cases] == judged
    assert judged[:5] == [True, True, True, False, False] and judged[6:] == [False, True, False]


# 72 envs of 10 MiB observations: a 720 MiB region, refused in a 512 MiB cgroup.  Each worker holds
# the class's Box (40 MiB of bounds) and its message's bytes; the trainer one decoded copy.  Before,
# the trainer decoded both workers' copies and ran allclose over them: the OOM killer, at once.
CGROUP_BIG_BOUNDS_CHILD = textwrap.dedent("""
    import gymnasium as gym, numpy as np
    import shmpool

    class BigBox(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (10, 1024, 1024), np.uint8)
        action_space = gym.spaces.Discrete(2)
        def reset(self, *, seed=None, options=None):
            return np.zeros((10, 1024, 1024), np.uint8), {}

    try:
        shmpool.Pool(BigBox, 72, num_workers=2)
    except shmpool.PoolResourceError as exc:
        print("refused", exc.resource, exc.size, exc.limit)
    else:
        print("built")
""")


def test_real_512_mib_cgroup_refuses_a_large_bounds_pool_instead_of_an_oom_kill(tmp_path):
    stdout, _ = _stdout_in_a_512_mib_cgroup(tmp_path, CGROUP_BIG_BOUNDS_CHILD)
    words = stdout.split()
    assert words[:2] == ["refused", "memory"], stdout
    assert 720 * MiB <= int(words[2]) < 721 * MiB and int(words[3]) == 512 * MiB, stdout
