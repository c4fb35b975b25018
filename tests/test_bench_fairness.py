"""bench.fairness measures what its table says: per-env counts and each worker's CPU share."""
import pytest

from bench import fairness


@pytest.mark.parametrize("pin", [True, False])
def test_measure_reports_every_workers_cpu_share(pin, no_leaks):
    r = fairness.measure("shmpool", "CartPole-v1", 8, 4, warmup=5, cycles=50, policy="auto", pin=pin)
    assert len(r["worker_cpu"]) == 2, r      # one share per worker (was silently empty)
    assert all(0.0 <= c <= 1.5 for c in r["worker_cpu"]), r
    assert r["min"] >= 1 and r["spread"] == r["max"] / r["min"]


def test_pins_option_rejects_unknown_words(capsys):
    with pytest.raises(SystemExit):
        fairness.main(["--pins", "sometimes", "--out", ""])
    assert "--pins takes 'pinned' and/or 'unpinned'" in capsys.readouterr().err
