"""The core benchmark runs end to end and writes what it promises (not a timing test)."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("rich")


def test_quick_run_prints_tables_and_writes_json(tmp_path):
    out = tmp_path / "core.json"
    proc = subprocess.run([sys.executable, "-m", "bench.core", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "| CartPole-v1 | 8 |" in proc.stdout
    assert "spin ping-pong" in proc.stdout and "### Targets" in proc.stdout
    data = json.loads(out.read_text())
    assert {"environment", "config", "throughput", "round_trip", "targets"} <= set(data)
