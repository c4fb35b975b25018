"""The core benchmark runs end to end and writes what it promises (not a timing test)."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow   # bench core run end to end in subprocesses

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


def test_round_trip_targets_are_informational_never_a_miss():
    from bench import core
    from bench._timing import Case, Record, Sample
    from bench.report import Group, Target
    # A round trip 40× the ping-pong: what Python at both ends costs, which the targets' own text calls
    # unreachable from Python; it must read "informational", not MISS.
    records = [Record(core.PINGPONG, 0, Sample(1000, 0.001), 0.0)]
    records += [Record(name, 0, Sample(1000, 0.04, latency_us={"p50": 30.0, "p99": 60.0}), 0.0)
                for name in core.ROUND_TRIP_POLICIES]
    cases = [Case(r.case, lambda: None) for r in records]
    goals = core.targets([], Group("round trip", 1, cases, records), load=0.0)
    round_trip = [t for t in goals if "round trip" in t.label]
    assert len(round_trip) == 2 and all(t.status == "informational" for t in round_trip)
    assert all("MISS" not in t.line() and "What moves it" in t.line() for t in round_trip)
    assert Target("x", 5.0, 40.0, at_most=True).status == "MISS"   # a plain target still misses


def test_the_pickled_leaf_envs_run_beside_their_box_only_twin(tmp_path):
    # What a Text leaf costs (it travels pickled per env): the bench's own Dict envs as --tasks.
    out = tmp_path / "lane.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "core", "--quick", "--no-roundtrip", "--tasks",
                           "DictObs-v0,DictTextObs-v0", "--json", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "| DictObs-v0 | 8 |" in proc.stdout and "| DictTextObs-v0 | 8 |" in proc.stdout
    cells = {g["task"]: g["systems"] for g in json.loads(out.read_text())["throughput"]}
    assert set(cells) == {"DictObs-v0", "DictTextObs-v0"}
    assert all(s["median_rate"] > 0 for systems in cells.values() for s in systems.values())
    assert "obs['text'] (Text)" in proc.stderr   # the lane's warning: the Text leaf did travel pickled


def test_a_busy_machine_is_named_before_the_table(monkeypatch):
    """Other processes spinning on every allowed core: bench.core's first line says so (issue 59: a
    neighbour's load read as a broken library); a quiet sample says nothing."""
    import os

    from bench import report
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        line = report.busy_machine(sample_s=0.5)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert line is not None and line.startswith("the machine is busy: other processes used ")
    monkeypatch.setattr(report.psutil, "cpu_percent", lambda interval, percpu: [0.0] * (os.cpu_count() or 1))
    assert report.busy_machine(sample_s=0.01) is None
