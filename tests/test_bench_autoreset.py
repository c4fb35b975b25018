"""bench.autoreset: a quick run writes its table and JSON; transitions leave out NEXT_STEP's reset slots."""
from __future__ import annotations

import json

import pytest

from bench import autoreset


def test_quick_run_counts_transitions(tmp_path, capsys, no_leaks):
    pytest.importorskip("stable_baselines3")
    js = tmp_path / "a.json"
    rc = autoreset.main(["--quick", "--seconds", "0.3", "--warmup", "0.05", "--json", str(js)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "ShmVecEnv ≥ 0.95× the NEXT_STEP pool" in out
    data = json.loads(js.read_text())
    (group,) = data["throughput"]
    systems = group["systems"]
    assert set(systems) == set(autoreset.SYSTEMS)
    for name, system in systems.items():
        (sample,) = system["samples"]
        info = sample["info"]
        assert info["ended"] > 0, f"{name}: episodes must end in the run"
        if name == autoreset.POOL_NEXT:
            # every ended episode costs NEXT_STEP one reset slot (the last one may fall after the timing)
            assert info["ended"] - 8 <= info["reset_slots"] <= info["ended"] + 8
            assert info["transitions"] == sample["count"] - info["reset_slots"] < sample["count"]
        else:
            assert info["reset_slots"] == 0 and info["transitions"] == sample["count"]
    assert (tmp_path / "a.md").read_text().count("|") > 20
