"""bench.fallback runs end to end and writes what it promises (not a timing test)."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("rich")


def test_quick_run_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "fallback.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "fallback", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for system in ("SyncVectorEnv", "AsyncVectorEnv", "shmpool sync", "shmpool async"):
        assert f"| 8 | {system} |" in proc.stdout
    data = json.loads(out.read_text())
    systems = data["throughput"][0]["systems"]
    assert {"shmpool sync · Box only", "shmpool sync · Box+Text"} <= set(systems)
    assert all(s["median_rate"] > 0 for s in systems.values())
    assert "| N | system |" in out.with_suffix(".md").read_text()
