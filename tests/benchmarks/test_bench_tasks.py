"""The task benchmark runs end to end and writes what it promises (not a timing test)."""
import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow   # bench tasks run end to end

pytest.importorskip("rich")
pytest.importorskip("mujoco")
ATARI = all(importlib.util.find_spec(m) is not None for m in ("ale_py", "cv2"))


def test_quick_run_prints_tables_and_writes_json(tmp_path):
    out = tmp_path / "tasks.json"
    proc = subprocess.run([sys.executable, "-m", "bench.tasks", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "| Ant-v5 | 8 |" in proc.stdout and "### Targets" in proc.stdout
    if ATARI:
        assert "| Pong-v5 | 8 |" in proc.stdout
    else:
        assert "Pong-v5: skipped" in proc.stdout
    data = json.loads(out.read_text())
    assert {"environment", "config", "throughput", "step_cost_us", "targets"} <= set(data)
    assert "### BatchPong-v0" in proc.stdout and "| 8 |" in proc.stdout
    (bp,) = [c for c in data["throughput"] if c["task"] == "BatchPong-v0"]
    assert bp["num_envs"] == 8
    for system in ("shmpool BatchPong", "BatchPong in-process", "SyncVectorEnv(PongEnv)", "loop PongEnv"):
        assert bp["systems"][system]["median_rate"] > 0, system
    systems = next(c for c in data["throughput"] if c["task"] != "BatchPong-v0")["systems"]
    assert {"SyncVectorEnv", "shmpool sync", "shmpool async"} <= set(systems)
    assert ("Pong-v5" in data["step_cost_us"]) == ATARI
    if data["environment"]["envpool"] is None:
        assert "EnvPool rows unavailable" in proc.stdout
    else:
        assert {"EnvPool sync", "EnvPool async"} <= set(systems)
        assert all(s["samples"] and "error" not in s["samples"][0] for s in systems.values())


def test_without_envpool_rows(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.tasks", "--quick", "--no-envpool", "--seconds", "0.05",
                           "--cost-steps", "20", "--tasks", "Ant-v5"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "EnvPool rows unavailable — not run (--no-envpool)" in proc.stdout
