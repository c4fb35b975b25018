"""``python -m bench distributed --quick``: what it writes, not how fast (not a timing test)."""
import json

import psutil
import pytest

pytest.importorskip("ray")

from bench import distributed  # noqa: E402

pytestmark = pytest.mark.distributed


def test_quick_run_writes_every_cell(tmp_path, capsys):
    path = tmp_path / "distributed.json"
    rc = distributed.main(["--quick", "--tasks", "CartPole-v1", "--nodes", "2", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "| CartPole-v1 | sync | ray | 16 | 16 |" in out and "| CartPole-v1 | async | local | 16 | 8 |" in out
    data = json.loads(path.read_text())
    assert data["benchmark"] == "bench.distributed" and data["config"]["nodes"] == 2
    got = [(c["mode"], c["system"], c["num_envs"], c["batch_size"]) for c in data["cells"]]
    assert got == [("sync", "local", 16, 16), ("sync", "ray", 16, 16),
                   ("async", "local", 16, 8), ("async", "ray", 16, 8)]
    for c in data["cells"]:
        assert "error" not in c, c.get("error")
        assert c["env_steps_per_s"] > 0 and c["reps"] == 1
        lat = c["agent_latency_us"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
        if c["system"] == "ray":
            assert "p50" in c["overhead_us"] and c["throughput_ratio"] > 0
            assert c["pool"]["pools"] == 2
        if c["mode"] == "async":
            assert c["observer_latency_us"]["p50"] > 0
    assert data["cells"][3]["pool"]["sub_batch_sizes"] == [4, 4]
    # the bench's cluster is gone
    names = {p.name() for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    assert not names & {"raylet", "gcs_server"}


def test_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exc:
        distributed.parse_args(["--modes", "sync,fast"])
    assert exc.value.code == 2
    assert "--modes must be a comma list of sync, async" in capsys.readouterr().err
