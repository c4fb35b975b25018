"""bench deploy: both loops measured, the workers' CPU share read from the real worker processes."""
import json
import os
import subprocess
import sys

import pytest

from bench import deploy
from bench._timing import DeviceShape

pytestmark = pytest.mark.slow   # bench deploy's loops run end to end


def measured(system: str, n: int, seconds: float, trainer: bool, wait_policy="auto") -> tuple:
    loop = deploy.DeployLoop(system, n, trainer, wait_policy)
    try:
        return loop.measure(seconds, 0.05), loop.info
    finally:
        loop.close()


def test_trainer_shaped_loop_reports_the_workers_cpu_share(monkeypatch, no_leaks):
    import shmpool.plan
    from shmpool.topology import TrainerThreads
    # No torch in the loop (as in `bench deploy`): CartPole keeps its worker (with torch imported by
    # another test it would be stepped here, shmpool.costs, and there would be no worker to measure).
    monkeypatch.setattr(shmpool.plan, "trainer_threads", lambda: TrainerThreads(None, None, None))
    sample, info = measured("shmpool sync", 8, seconds=0.3, trainer=True)
    assert info["worker_cpu_share"] is not None and 0.0 <= info["worker_cpu_share"] < 2.0
    ms_per_iter = 1e3 * sample.seconds / (sample.count / 8)
    device = DeviceShape()
    assert ms_per_iter > 1e3 * (device.wait_s + device.cpu_s)   # the trainer's time is in it
    assert info["described"].startswith("Pool(8 envs")
    sample, info = measured("SyncVectorEnv", 8, seconds=0.3, trainer=False)
    assert info["worker_cpu_share"] is None and sample.rate > 0


def test_wait_policy_option_reaches_the_pool():
    assert deploy.parse_wait_policy("block/block") == ("block", "block")
    assert deploy.parse_wait_policy("auto") == "auto"
    _, info = measured("shmpool sync", 4, seconds=0.1, trainer=False, wait_policy=("block", "yield"))
    assert "parent block, workers yield" in info["described"], info["described"]


def test_quick_run_prints_both_loops_and_writes_json(tmp_path):
    out = tmp_path / "deploy.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "deploy", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for loop in deploy.LOOPS:
        for system in deploy.SYSTEMS:
            assert f"| {loop} | {system} |" in proc.stdout
    assert "pool: Pool(8 envs" in proc.stdout
    assert [g["task"] for g in json.loads(out.read_text())["loops"]] == list(deploy.LOOPS)


def test_cpu_quota_group_holds_the_process_and_goes_away():
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    try:
        with deploy.cpu_quota_group(1.0) as group:
            assert str(os.getpid()) in (group / "cgroup.procs").read_text().split()
            from shmpool.topology import cpu_quota
            assert cpu_quota() == 1.0
    except (SystemExit, PermissionError, OSError) as exc:
        pytest.skip(f"no cgroup to make here: {exc}")
    assert not group.exists()
