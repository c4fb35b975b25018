"""The BatchPong benchmark runs end to end and writes what it promises (not a timing test)."""
import json
import subprocess
import sys


def test_quick_run_prints_ratios_and_writes_json(tmp_path):
    out = tmp_path / "batch_pong.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "batch-pong", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "| 256 |" in proc.stdout and "× SyncVectorEnv" in proc.stdout
    data = json.loads(out.read_text())
    assert [r["num_envs"] for r in data["results"]] == [64, 256]
    for r in data["results"]:
        assert r["errors"] == 0
        assert r["ratios"]["SyncVectorEnv(PongEnv)"] > 0 and r["ratios"]["loop PongEnv"] > 0
