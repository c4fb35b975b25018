"""``python -m bench latency`` (and its ``--png``): what it writes, not how fast (not a timing test)."""
import json

import heavy_imports
import numpy as np
import pytest

pytest.importorskip("rich")
pytest.importorskip("matplotlib")

from bench import _timing, latency  # noqa: E402

pytestmark = [pytest.mark.slow,             # bench latency runs and their plots
              pytest.mark.heavy_imports]    # --ray and --netem import Ray here

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PCTS = {"p50", "p75", "p90", "p95", "p99"}


def test_tiny_run_writes_json_and_plots(tmp_path, capsys, no_leaks):
    """N=2,4 × batch 1,4 (N=2 batch=4 skipped), 0.2 s a cell: the JSON has every cell, the report and PNG beside it."""
    path, png = tmp_path / "latency.json", tmp_path / "latency.png"
    rc = latency.main(["--quick", "--num-envs", "2,4", "--batch-size", "1,4", "--json", str(path), "--png", str(png)])
    stdout = capsys.readouterr().out
    assert rc == 0
    assert "| sync | 2 | 2 |" in stdout and "| async | 4 | 4 |" in stdout
    assert "Skipped (batch_size > num_envs): N=2 batch=4." in stdout
    report = path.with_suffix(".md").read_text()   # the report beside the JSON, as --json promises
    assert report.startswith("## shmpool latency benchmark") and report.strip() in stdout
    data = json.loads(path.read_text())
    assert data["benchmark"] == "bench.latency"
    assert {"date", "cpu_model", "sched_getaffinity", "gymnasium"} <= set(data["environment"])
    assert data["config"]["num_envs"] == [2, 4] and data["config"]["batch_size"] == [1, 4]
    assert data["x_axis_name"] == "num_envs"
    assert data["skipped"] == [{"num_envs": 2, "batch_size": 4, "reason": "batch_size > num_envs"}]
    got = [(c["mode"], c["num_envs"], c["batch_size"]) for c in data["cells"]]
    assert got == [("sync", 2, 2), ("async", 2, 1), ("sync", 4, 4), ("async", 4, 1), ("async", 4, 4)]
    ordered = sorted(PCTS, key=lambda p: int(p[1:]))
    for c in data["cells"]:
        assert "error" not in c, c.get("error")
        assert c["task"] == "CartPole-v1" and c["calls"] > 0 and c["throughput"] > 0
        assert c["env_steps"] == c["calls"] * c["batch_size"]
        assert c["pool"]["batch_size"] == c["batch_size"]
        for key in ("agent_latency_us", "observer_latency_us"):
            lat = c[key]
            assert set(lat) == PCTS | {"max"}
            values = [lat[p] for p in ordered] + [lat["max"]]
            assert values == sorted(values) and values[0] > 0
        for key in ("agent_throughput", "observer_throughput"):
            values = [c[key][p] for p in ordered]
            assert set(c[key]) == PCTS and values == sorted(values)  # rise as latency percentiles fall
        assert c["agent_throughput"]["p50"] == pytest.approx(c["batch_size"] * 1e6 / c["agent_latency_us"]["p50"])

    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000


def synthetic_cell(mode, n, b, base):
    lat = {f"p{q}": base * (1 + q / 100) for q in (50, 75, 90, 95, 99)} | {"max": base * 10}
    return {"task": "Fake-v0", "mode": mode, "num_envs": n, "batch_size": b, "throughput": b * 1e6 / base,
            "agent_latency_us": lat, "observer_latency_us": lat}


@pytest.mark.parametrize("x", ["num_envs", "batch_size"])
def test_plot_synthetic_json(tmp_path, x):
    cells = [synthetic_cell("sync", n, n, 10.0 * n) for n in (8, 32, 128)]
    cells += [synthetic_cell("async", n, b, 5.0 * b + n) for n in (8, 32, 128) for b in (1, 8, 32) if b <= n]
    cells.append({"task": "Fake-v0", "mode": "async", "num_envs": 8, "batch_size": 4, "error": "Traceback..."})
    out = tmp_path / "synthetic.png"
    latency.plot({"x_axis_name": x, "cells": cells}, str(out))   # no environment: still plots
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 10_000
    groups = latency.series(cells, "num_envs")
    assert list(groups) == ["sync (pool.step, batch = N)", "async, batch=1", "async, batch=8", "async, batch=32"]
    assert [c["num_envs"] for c in groups["async, batch=32"]] == [32, 128]
    assert list(latency.series(cells, "batch_size")) == ["sync (pool.step, batch = N)", "async, N=8", "async, N=32",
                                                         "async, N=128"]


@pytest.mark.parametrize("argv, message", [
    (["--num-envs", "8,x"], "--num-envs must be a comma list of integers, got '8,x'"),
    (["--num-envs", "0,8"], "--num-envs must be a comma list of positive integers"),
    (["--batch-size", "1,-2"], "--batch-size must be a comma list of positive integers"),
    (["--batch-size", ""], "--batch-size must be a comma list of positive integers"),
    (["--num-envs", "4", "--batch-size", "8,16", "--modes", "async"], "nothing to run"),
    (["--modes", "sync,fast"], "--modes takes 'sync' and/or 'async', not 'sync,fast'"),
    (["--seconds", "0"], "--seconds must be > 0"),
    (["--task", "NoSuchTask-v9"], "--task 'NoSuchTask-v9' cannot be made here"),
])
def test_bad_arguments_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        latency.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_plan_skips_batches_larger_than_n():
    cells, skipped = latency.plan_cells([8, 32], [1, 8, 32], ["sync", "async"])
    assert cells == [("sync", 8, 8), ("async", 8, 1), ("async", 8, 8),
                     ("sync", 32, 32), ("async", 32, 1), ("async", 32, 8), ("async", 32, 32)]
    assert skipped == [{"num_envs": 8, "batch_size": 32, "reason": "batch_size > num_envs"}]
    assert latency.plan_cells([4], [1], ["async"]) == ([("async", 4, 1)], [])


def test_observer_latencies_from_the_call_log():
    # 3 envs, batch 1; call k received ids[k] when recv returned at times[k] (ns), then sent it back.
    ids = [np.array([0]), np.array([1]), np.array([0]), np.array([2]), np.array([1])]
    times = [1_000, 3_000, 6_000, 10_000, 15_000]
    # the last 3 calls are timed: env 0 sent at 1000 received 6000; env 2 only sent by async_reset
    # (unknown, skipped); env 1 sent at 3000 received 15000.
    got = _timing.observer_latencies(ids, times, 3, timed=3)
    assert got.tolist() == [5.0, 12.0]
    assert _timing.observer_latencies(ids, times, 3, timed=0).size == 0


def test_percentile_helpers():
    values = np.arange(1, 101, dtype=float)  # 1..100 µs
    pct = _timing.percentiles_of(values, latency.MEASURED)
    assert pct["p50"] == 51 and pct["p99"] == 100 and pct["p1"] == 2 and pct["max"] == 100
    tp = latency.throughput_percentiles(pct, units=4)
    assert tp["p50"] == pytest.approx(4e6 / 51) and tp["p90"] == pytest.approx(4e6 / pct["p10"])
    assert latency.reported(pct).keys() == PCTS | {"max"}


def test_paired_overhead_comes_with_its_interval_from_six_repetitions():
    from math import comb

    def cell(system, reps):
        latencies = _timing.percentiles_of(np.array(reps), latency.MEASURED)
        return {"system": system, "mode": "sync", "num_envs": 16, "batch_size": 16, "throughput": 1.0, "calls": 99,
                "agent_latency_us": latencies, "observer_latency_us": {}, "rep_p50_us": dict(enumerate(reps))}

    local = [1000.0, 1200, 900, 1100, 1000, 950, 1050, 1000, 980, 1020, 990, 1010]
    ray = [v + d for v, d in zip(local, [400, 700, 300, 500, 450, 600, 350, 480, 520, 410, 900, 200])]
    cells = latency.with_overheads([cell("local", local), cell("ray", ray)])
    over = cells[1]["overhead_us"]
    assert over["paired_p50"] == 465 and over["paired_p50_ci95"] == [350, 600]
    row = latency.table_rows(cells, ray=True)[1]
    assert "465 (350 – 600)" in row
    # a negative difference (Ray's p50 below the local one's) is shown as whole µs, as a positive one is
    assert latency.report.fmt_us(-382.06) == "-382" and latency.report.fmt_us(-5.5) == "-5.50"
    few = latency.with_overheads([cell("local", local[:5]), cell("ray", ray[:5])])
    assert few[1]["overhead_us"]["paired_p50_ci95"] is None   # 5: even (min, max) covers only 93.75 %

    def coverage(n, k):   # P(the k-th smallest <= median <= the k-th largest), each value above it with p 1/2
        return 1 - 2 * sum(comb(n, j) for j in range(k)) / 2**n

    for n in range(6, 130):   # the narrowest pair of order statistics that covers 95 %
        pairs = np.arange(n)[::-1] * 10.0
        lo, hi = latency.with_overheads([cell("local", [0.0] * n), cell("ray", list(pairs))])[1]["overhead_us"][
            "paired_p50_ci95"]
        k = int(lo) // 10 + 1
        assert hi == 10 * (n - k) and coverage(n, k) >= 0.95 > coverage(n, k + 1)


@pytest.mark.parametrize("argv, message", [
    (["--netem", "1ms"], "--netem needs --ray: it measures RayPool's connections over a link"),
    (["--ray", "2", "--netem", "100"], "a delay is a number with us, ms or s (e.g. 100us, 1ms) or 0, got '100'"),
    (["--ray", "2", "--netem", "1h"], "--netem: a delay is a number with us, ms or s"),
    (["--ray", "2", "--netem", "1ms,1ms"], "--netem: delays repeat: '1ms,1ms'"),
])
def test_bad_netem_arguments_are_argparse_errors(argv, message, capsys):
    heavy_imports.require("ray")
    with pytest.raises(SystemExit) as exc:
        latency.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_netem_is_refused_without_root_before_anything_is_made(monkeypatch, capsys):
    heavy_imports.require("ray")
    from bench import netem
    made = []
    monkeypatch.setattr(latency.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(netem.subprocess, "run", lambda *a, **k: made.append(a))
    with pytest.raises(SystemExit) as exc:
        latency.parse_args(["--ray", "2", "--netem", "1ms"])
    assert exc.value.code == 2
    assert "--netem creates network namespaces and a veth pair: run it as root" in capsys.readouterr().err
    assert made == []


def test_netem_delays_parse_to_seconds():
    from bench import netem
    got = netem.parse_delays("100us, 1ms,0,0.5ms")
    assert [label for label, _ in got] == ["100us", "1ms", "0", "0.5ms"]
    assert [s for _, s in got] == pytest.approx([1e-4, 1e-3, 0.0, 5e-4])
