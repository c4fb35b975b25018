"""bench.fairness measures what its table says: per-env counts and each worker's CPU share."""
import pytest

from bench import fairness


@pytest.mark.parametrize("pin", [True, False])
def test_measure_reports_every_workers_cpu_share(pin, no_leaks):
    # Enough cycles for a few tenths of a second: CPU times tick every 10 ms.
    r = fairness.measure("shmpool", "CartPole-v1", 8, 4, warmup=5, cycles=3000, policy="auto", pin=pin)
    assert r["num_workers"] >= 1 and len(r["worker_cpu"]) == r["num_workers"], r   # was silently empty
    assert all(0.0 <= c <= 1.5 for c in r["worker_cpu"]), r
    assert r["spread"] == r["max"] / max(r["min"], 1) and r["max"] >= 3000 * 4 / 8


def test_pins_option_rejects_unknown_words(capsys):
    with pytest.raises(SystemExit):
        fairness.main(["--pins", "sometimes", "--out", ""])
    assert "--pins takes 'pinned' and/or 'unpinned'" in capsys.readouterr().err


def test_max_leads_option_adds_a_row_per_value(capsys, no_leaks):
    fairness.main(["--tasks", "CartPole-v1", "--quick", "--reps", "1", "--no-envpool", "--max-leads", "auto,none",
                   "--out", ""])
    out = capsys.readouterr().out
    assert out.count("| shmpool auto |") == 2 and out.count("| shmpool auto, max_lead=none |") == 2, out
