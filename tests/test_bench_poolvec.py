"""bench.poolvec: the efficiency-model fit and the JSON/markdown/PNG output (logic, not timing)."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from bench import poolvec  # noqa: E402

NS = [1, 2, 4, 8, 16]


@pytest.mark.parametrize("t_env, t_os", [(30e-6, 200e-6), (30e-6, 15e-6), (400e-6, 80e-6)])
@pytest.mark.parametrize("cores", [1.0, "min"])
def test_fit_recovers_t_os(t_env, t_os, cores):
    rng = np.random.default_rng(0)
    ns = np.repeat(NS, 3)
    p = 1.0 if cores == 1.0 else np.minimum(ns, 2)
    ratio = poolvec.model(ns, t_env, t_os, p) * (1 + 0.01 * rng.standard_normal(ns.size))
    got, rms = poolvec.fit_t_os(ns, ratio, t_env, p)
    assert got == pytest.approx(t_os, rel=0.08)
    assert rms < 0.05


def test_fit_exact_and_clamped():
    ns = np.array(NS)
    got, rms = poolvec.fit_t_os(ns, poolvec.model(ns, 20e-6, 50e-6), 20e-6)
    assert got == pytest.approx(50e-6, rel=1e-3) and rms < 1e-4
    # A system faster than DummyVecEnv everywhere: the literal model saturates, t_os clamps to 0.
    got, _ = poolvec.fit_t_os(ns, np.full(ns.size, 1.5), 20e-6)
    assert got == 0.0


def test_fit_task_from_synthetic_rates():
    """t_env comes from DummyVecEnv at N=1; t_os per system from the samples' ratios."""
    from bench._timing import Record, Sample

    t_env, t_os = {"CartPole-v1": 25e-6}, {poolvec.SUBPROC: 300e-6, poolvec.SHM: 20e-6}
    run = poolvec.TaskRun("CartPole-v1", NS)
    for n in NS:
        dummy = 1 / t_env["CartPole-v1"]
        recs = [Record(poolvec.DUMMY, 0, Sample(int(dummy), 1.0), 0.0)]
        for s in poolvec.PARALLEL:
            rate = dummy * float(poolvec.model(n, t_env["CartPole-v1"], t_os[s]))
            recs.append(Record(s, 0, Sample(int(rate), 1.0), 0.0))
        run.records[n] = recs
    poolvec.fit(run, cores=2)
    assert run.t_env == pytest.approx(25e-6, rel=1e-3)
    for s in poolvec.PARALLEL:
        assert run.fits[s]["t_os_s"] == pytest.approx(t_os[s], rel=0.01)
    assert poolvec.fit_rows([run])[0][5] == poolvec.SHM   # smallest t_os


def test_quick_run_writes_outputs(tmp_path, capsys, no_leaks):
    js, md, png = tmp_path / "p.json", tmp_path / "p.md", tmp_path / "p.png"
    rc = poolvec.main(["--quick", "--seconds", "0.2", "--warmup", "0.05", "--json", str(js), "--md", str(md),
                       "--png", str(png)])
    assert rc == 0
    data = json.loads(js.read_text())
    assert data["benchmark"] == "bench.poolvec"
    assert "cpu_model" in data["environment"] and data["environment"]["stable_baselines3"]
    (task,) = data["tasks"]
    assert task["task"] == "CartPole-v1" and task["num_envs"] == [1, 2] and task["t_env_s"] > 0
    assert [c["num_envs"] for c in task["cells"]] == [1, 2]
    for cell in task["cells"]:
        assert set(cell["systems"]) == set(poolvec.SYSTEMS)
        for s in poolvec.SYSTEMS:
            (sample,) = cell["systems"][s]["samples"]
            assert sample["count"] > 0 and "error" not in sample
    assert set(task["fits"]) == set(poolvec.PARALLEL)
    assert all(f["t_os_us"] >= 0 for f in task["fits"].values())
    text = md.read_text()
    assert "| CartPole-v1 | 2 |" in text and "t_os µs" in text
    assert "| CartPole-v1 | 2 |" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv", [["--num-envs", "1,x"], ["--num-envs", "0"], ["--seconds", "0"],
                                  ["--repeats", "0"], ["--tasks", "NoSuchTask-v9"], ["--cpus", "zz"],
                                  ["--bogus"]])
def test_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        poolvec.parse_args(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_default_plan():
    args = poolvec.parse_args(["--cpus", "0"])
    assert args.num_envs == [1, 2, 4, 8] and args.tasks == list(poolvec.DEFAULT_TASKS)
    quick = poolvec.parse_args(["--quick"])
    assert quick.tasks == ["CartPole-v1"] and quick.num_envs == [1, 2]
    assert (quick.seconds, quick.repeats) == (0.2, 1)
