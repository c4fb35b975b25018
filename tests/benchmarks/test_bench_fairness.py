"""bench.fairness measures what its table says: per-env counts and each worker's CPU share."""
import psutil
import pytest

from bench import fairness

pytestmark = pytest.mark.slow   # bench fairness runs, each pool stepped for its measuring window


def evenness(*args, seconds: float = 0.3, **kwargs) -> tuple:
    subject = fairness.Evenness(*args, **kwargs)
    try:
        return subject.measure(seconds, 0.05), dict(subject.info), subject.counts.copy()
    finally:
        subject.close()


@pytest.mark.parametrize("pin", [True, False])
def test_measure_reports_every_workers_cpu_share(pin, no_leaks):
    # A few tenths of a second: CPU times tick every 10 ms.
    # every shard a process (the parent's shard: see the layouts test)
    sample, r, counts = evenness("shmpool", "CartPole-v1", 8, 4, pin=pin, parent_shard=False)
    assert r["num_workers"] >= 1 and len(r["worker_cpu"]) == r["num_workers"], r   # was silently empty
    assert all(0.0 <= c <= 1.5 for c in r["worker_cpu"]), r
    assert counts.sum() == sample.count and r["min"] == counts.min() and r["max"] == counts.max() > 0
    assert r["spread"] == r["max"] / max(r["min"], 1)
    assert len(r["worker_runqueue"]) == r["num_workers"] and all(0.0 <= d <= 1.5 for d in r["worker_runqueue"]), r
    assert 0.0 < r["parent_cpu"] <= 1.5 and r["parent_core"] in range(psutil.cpu_count()), r
    assert r["worker_cores"] is None if not pin else len(r["worker_cores"]) == r["num_workers"], r


def test_sync_mode_steps_every_env_each_cycle(no_leaks):
    sample, r, counts = evenness("shmpool", "CartPole-v1", 8, 4, mode="sync", seconds=0.1)
    assert r["min"] == r["max"] == sample.count // 8 > 0 and r["spread"] == 1.0, r   # all 8 envs, not a batch of 4
    assert sample.rate > 0 and len(r["worker_cpu"]) == len(r["worker_runqueue"]) == r["num_workers"], r


def test_run_queue_wait_reads_schedstat():
    import os
    me = fairness._run_queue_wait(os.getpid())
    assert me >= 0.0 or me != me   # seconds, or NaN where the kernel keeps no schedstats
    assert fairness._run_queue_wait(2**22 + 7) != fairness._run_queue_wait(2**22 + 7)   # no such pid: NaN


def test_pins_option_rejects_unknown_words(capsys):
    with pytest.raises(SystemExit):
        fairness.main(["--pins", "sometimes"])
    assert "--pins takes 'pinned' and/or 'unpinned'" in capsys.readouterr().err


def test_modes_option_adds_one_sync_row_per_task_and_size(capsys, no_leaks):
    assert fairness.main(["--tasks", "CartPole-v1", "--quick", "--no-envpool", "--modes", "async,sync"]) == 0
    out = capsys.readouterr().out
    assert out.count("| CartPole-v1 | 12 / sync |") == 1 and out.count("| CartPole-v1 | 32 / sync |") == 1, out
    assert out.count("| CartPole-v1 | 12 / 4 |") == 1 and out.count("| CartPole-v1 | 32 / 16 |") == 1, out


def test_max_leads_option_adds_a_row_per_value(capsys, no_leaks):
    assert fairness.main(["--tasks", "CartPole-v1", "--quick", "--no-envpool", "--max-leads", "auto,none"]) == 0
    out = capsys.readouterr().out
    assert out.count("| shmpool auto |") == 2 and out.count("| shmpool auto, max_lead=none |") == 2, out


@pytest.mark.heavy_imports
def test_layouts_option_adds_rows_with_a_parent_shard_and_with_processes_only(capsys, tmp_path, no_leaks):
    pytest.importorskip("envpool")
    path = tmp_path / "fairness.json"
    assert fairness.main(["--tasks", "CartPole-v1", "--quick", "--layouts", "auto,parent,processes",
                          "--json", str(path)]) == 0
    out = capsys.readouterr().out
    envpool_rows = [line for line in out.splitlines() if line.startswith("| CartPole-v1 | 12 / 4 | envpool |")]
    assert len(envpool_rows) == 1 and "error" not in envpool_rows[0], out   # EnvPool has no layout
    assert out.count("| shmpool auto |") == 2 and out.count("| shmpool auto, parent shard |") == 2, out
    assert out.count("| shmpool auto, processes |") == 2, out
    # processes: both worker columns are real processes' CPU shares (no NaN for a parent's shard)
    row = next(line for line in out.splitlines() if "| shmpool auto, processes |" in line)
    assert "nan" not in row, row
    assert path.with_suffix(".md").read_text().count("| CartPole-v1 |") == 8
    _, r, _ = evenness("shmpool", "CartPole-v1", 8, 4, parent_shard=True, seconds=0.1)
    assert r["num_workers"] == 2 and r["spread"] <= 1.25, r
    assert r["worker_cpu"][1] != r["worker_cpu"][1], r   # the parent's shard: its CPU is the parent's (NaN)
    with pytest.raises(SystemExit):
        fairness.main(["--layouts", "sideways"])
    assert "--layouts takes 'auto', 'parent' and/or 'processes', not 'sideways'" in capsys.readouterr().err
