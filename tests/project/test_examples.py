"""The examples run end to end (short versions; the full runs are in examples/README.md)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow   # the examples train (torch PPO) end to end in subprocesses

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_example(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.heavy_imports
def test_ppo_cartpole_short_run(no_leaks):
    pytest.importorskip("torch")
    out = run_example("ppo_cartpole.py", "--total-timesteps", "3072", "--num-envs", "4", "--num-steps", "128",
                      "--log-every", "2")
    progress = re.findall(r"^step=(\d+) episodes=(\d+) mean_return=([\d.]+)", out, re.M)
    assert [int(p[0]) for p in progress] == [1024, 2048, 3072]
    final = re.search(r"^final: steps=3072 episodes=(\d+) mean_return_last_\d+=([\d.]+) wall_time=", out, re.M)
    assert final, out
    # A random CartPole policy ends an episode every ~20 steps: 3072 steps end well over 50.
    assert int(final.group(1)) > 50 and float(final.group(2)) > 8


def test_envpool_style_short_run(no_leaks):
    out = run_example("envpool_style.py", "--num-envs", "8", "--batch-size", "4", "--steps", "2000")
    m = re.search(r"CartPole-v1: 2000 recv/send rounds of 4 envs out of 8, (\d+) episodes ended, ([\d,]+) env "
                  r"steps/s", out)
    assert m, out
    assert int(m.group(1)) > 100  # 8000 random-policy steps end hundreds of episodes
