"""bench deploy: both loops measured, the workers' CPU share read from the real worker processes."""
import os

import pytest

from bench import deploy


def test_trainer_shaped_loop_reports_the_workers_cpu_share(monkeypatch, no_leaks):
    import shmpool.plan
    from shmpool.topology import TrainerThreads
    # No torch in the loop (as in `bench deploy`): CartPole keeps its worker (with torch imported by
    # another test it would be stepped here, shmpool.costs, and there would be no worker to measure).
    monkeypatch.setattr(shmpool.plan, "trainer_threads", lambda: TrainerThreads(None, None, None))
    r = deploy.measure("shmpool sync", 8, seconds=0.3, trainer=True)
    assert r["worker_cpu_share"] is not None and 0.0 <= r["worker_cpu_share"] < 2.0
    assert r["ms_per_iter"] > 1e3 * (deploy.GPU_WAIT_S + deploy.HOST_CPU_S)   # the trainer's time is in it
    assert r["described"].startswith("Pool(8 envs")
    s = deploy.measure("SyncVectorEnv", 8, seconds=0.3, trainer=False)
    assert s["worker_cpu_share"] is None and s["steps_per_s"] > 0


def test_wait_policy_option_reaches_the_pool():
    assert deploy.parse_wait_policy("block/block") == ("block", "block")
    assert deploy.parse_wait_policy("auto") == "auto"
    r = deploy.measure("shmpool sync", 4, seconds=0.1, trainer=False, wait_policy=("block", "yield"))
    assert "parent block, workers yield" in r["described"], r["described"]


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
