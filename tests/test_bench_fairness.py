"""bench.fairness measures what its table says: per-env counts and each worker's CPU share."""
import psutil
import pytest

from bench import fairness


@pytest.mark.parametrize("pin", [True, False])
def test_measure_reports_every_workers_cpu_share(pin, no_leaks):
    # Enough cycles for a few tenths of a second: CPU times tick every 10 ms.
    r = fairness.measure("shmpool", "CartPole-v1", 8, 4, warmup=5, cycles=3000, policy="auto", pin=pin,
                         parent_shard=False)   # every shard a process (the parent's shard: see the layouts test)
    assert r["num_workers"] >= 1 and len(r["worker_cpu"]) == r["num_workers"], r   # was silently empty
    assert all(0.0 <= c <= 1.5 for c in r["worker_cpu"]), r
    assert r["spread"] == r["max"] / max(r["min"], 1) and r["max"] >= 3000 * 4 / 8
    assert len(r["worker_runqueue"]) == r["num_workers"] and all(0.0 <= d <= 1.5 for d in r["worker_runqueue"]), r
    assert 0.0 < r["parent_cpu"] <= 1.5 and r["parent_core"] in range(psutil.cpu_count()), r
    assert r["worker_cores"] is None if not pin else len(r["worker_cores"]) == r["num_workers"], r


def test_sync_mode_steps_every_env_each_cycle(no_leaks):
    r = fairness.measure("shmpool", "CartPole-v1", 8, 4, warmup=5, cycles=200, policy="auto", mode="sync")
    assert r["min"] == r["max"] == 200 and r["spread"] == 1.0, r   # all 8 envs, not a batch of 4
    assert r["sps"] > 0 and len(r["worker_cpu"]) == len(r["worker_runqueue"]) == r["num_workers"], r


def test_run_queue_wait_reads_schedstat():
    import os
    me = fairness._run_queue_wait(os.getpid())
    assert me >= 0.0 or me != me   # seconds, or NaN where the kernel keeps no schedstats
    assert fairness._run_queue_wait(2**22 + 7) != fairness._run_queue_wait(2**22 + 7)   # no such pid: NaN


def test_pins_option_rejects_unknown_words(capsys):
    with pytest.raises(SystemExit):
        fairness.main(["--pins", "sometimes", "--out", ""])
    assert "--pins takes 'pinned' and/or 'unpinned'" in capsys.readouterr().err


def test_modes_option_adds_one_sync_row_per_task_and_size(capsys, no_leaks):
    fairness.main(["--tasks", "CartPole-v1", "--quick", "--reps", "1", "--no-envpool", "--modes", "async,sync",
                   "--out", ""])
    out = capsys.readouterr().out
    assert out.count("| CartPole-v1 | 12 / sync |") == 1 and out.count("| CartPole-v1 | 32 / sync |") == 1, out
    assert out.count("| CartPole-v1 | 12 / 4 |") == 1 and out.count("| CartPole-v1 | 32 / 16 |") == 1, out


def test_max_leads_option_adds_a_row_per_value(capsys, no_leaks):
    fairness.main(["--tasks", "CartPole-v1", "--quick", "--reps", "1", "--no-envpool", "--max-leads", "auto,none",
                   "--out", ""])
    out = capsys.readouterr().out
    assert out.count("| shmpool auto |") == 2 and out.count("| shmpool auto, max_lead=none |") == 2, out


def test_layouts_option_adds_rows_with_a_parent_shard_and_with_processes_only(capsys, no_leaks):
    fairness.main(["--tasks", "CartPole-v1", "--quick", "--reps", "1", "--layouts", "auto,parent,processes",
                   "--out", ""])
    out = capsys.readouterr().out
    envpool_rows = [line for line in out.splitlines() if line.startswith("| CartPole-v1 | 12 / 4 | envpool |")]
    assert len(envpool_rows) == 1 and "Error" not in envpool_rows[0], out   # EnvPool has no layout
    assert out.count("| shmpool auto |") == 2 and out.count("| shmpool auto, parent shard |") == 2, out
    assert out.count("| shmpool auto, processes |") == 2, out
    # processes: both worker columns are real processes' CPU shares (no NaN for a parent's shard)
    row = next(line for line in out.splitlines() if "| shmpool auto, processes |" in line)
    assert "nan" not in row, row
    r = fairness.measure("shmpool", "CartPole-v1", 8, 4, warmup=5, cycles=200, policy="auto", parent_shard=True)
    assert r["num_workers"] == 2 and r["spread"] <= 1.25, r
    assert r["worker_cpu"][1] != r["worker_cpu"][1], r   # the parent's shard: its CPU is the parent's (NaN)
    with pytest.raises(SystemExit):
        fairness.main(["--layouts", "sideways", "--out", ""])
    assert "--layouts takes 'auto', 'parent' and/or 'processes', not 'sideways'" in capsys.readouterr().err
