"""CPU quotas (cgroup v2 cpu.max, v1 cfs quota) are read and size the pool."""
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from shmpool.topology import (
    cpu_quota,
    default_num_workers,
    oversubscribed,
    parse_cfs_quota,
    parse_cpu_max,
    parse_proc_cgroup,
)


def test_parsers():
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("150000 100000\n") == 1.5
    assert parse_cpu_max("50000") == 0.5
    assert parse_cfs_quota("-1\n", "100000\n") is None
    assert parse_cfs_quota("200000\n", "100000\n") == 2.0
    v2, v1 = parse_proc_cgroup("12:cpu,cpuacct:/job/7\n4:memory:/x\n0::/user.slice/a\n")
    assert (v2, v1) == ("/user.slice/a", "/job/7")
    assert parse_proc_cgroup("3:cpuset:/\n") == (None, None)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v2_tree_takes_the_tightest_ancestor(tmp_path):
    root = tmp_path / "cg"
    _write(root / "cgroup.controllers", "cpu\n")
    _write(root / "pod" / "cpu.max", "150000 100000\n")
    _write(root / "pod" / "box" / "cpu.max", "max 100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/pod/box\n")
    assert cpu_quota(proc, root) == 1.5


def test_v1_tree_and_no_quota(tmp_path):
    root = tmp_path / "cg"
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    _write(root / "cpu,cpuacct" / "slurm" / "cpu.cfs_quota_us", "100000\n")
    _write(root / "cpu,cpuacct" / "slurm" / "cpu.cfs_period_us", "100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("5:cpu,cpuacct:/slurm\n")
    assert cpu_quota(proc, root) == 1.0
    proc.write_text("5:cpu,cpuacct:/\n")
    assert cpu_quota(proc, root) is None
    assert cpu_quota(tmp_path / "missing", root) is None


def test_quota_sizes_workers_and_crowding():
    assert default_num_workers([0, 1], None, 32) == 2
    assert default_num_workers([0, 1], 1.0, 32) == 1
    assert default_num_workers([0, 1], 0.5, 32) == 1
    assert default_num_workers([0, 1, 2, 3], 2.5, 32) == 2
    assert not oversubscribed([1], [0, 1])
    assert oversubscribed([1], [0, 1], quota=1.0)  # one worker and the parent on one cpu's worth


def _cpu_cgroup_dir() -> Path | None:
    for name in ("cpu", "cpu,cpuacct"):
        d = Path("/sys/fs/cgroup") / name
        if (d / "cpu.cfs_quota_us").exists():
            return d
    if (Path("/sys/fs/cgroup") / "cgroup.controllers").exists():
        return Path("/sys/fs/cgroup")
    return None


def test_pool_in_a_one_cpu_cgroup_gets_one_worker(no_leaks):
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 visible cpus to show the quota is what limits the workers")
    base = _cpu_cgroup_dir()
    if base is None:
        pytest.skip("no cgroup cpu controller mounted")
    group = base / f"shmpool-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup here: {exc}")
    try:
        if (group / "cpu.cfs_quota_us").exists():
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text("100000")
            procs = group / "tasks"
        else:
            (group / "cpu.max").write_text("100000 100000")
            procs = group / "cgroup.procs"
        code = ("import shmpool, shmpool.topology as t\n"
                "p = shmpool.Pool('CartPole-v1', 8)\n"
                "print(t.cpu_quota(), p.num_workers, p.cpu_quota, 'quota 1' in repr(p))\n"
                "p.close()\n")
        # The child moves itself into the group before Python starts.
        out = subprocess.run(["sh", "-c", f'echo $$ > {procs} && exec "$0" -c "$1"', sys.executable, code],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["1.0", "1", "1.0", "True"]
    finally:
        group.rmdir()
