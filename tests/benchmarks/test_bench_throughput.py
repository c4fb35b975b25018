"""bench.throughput: NUMA reading and the table/JSON/PNG output (logic, not timing)."""
from __future__ import annotations

import json
import os

import pytest

from bench import throughput
from bench.throughput import describe_nodes
from shmpool.topology import format_cpu_list, numa_nodes, split_by_node

pytestmark = [pytest.mark.slow,             # bench throughput runs (tiny ones, still seconds each)
              pytest.mark.heavy_imports]    # SB3's vec envs and envpool among the systems, in this process

ALLOWED = sorted(os.sched_getaffinity(0))
WORKERS = "1,2" if len(ALLOWED) >= 2 else "1"
FAST = ["--task", "CartPole-v1", "--seconds", "0.2", "--repeats", "1", "--warmup", "0.05"]


def fake_sysfs(root, nodes: dict[int, str], meminfo: bool = True):
    """``root/nodeN/cpulist`` (taskset syntax) and ``meminfo`` like the kernel writes them."""
    for node, cpulist in nodes.items():
        d = root / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
        if meminfo:
            (d / "meminfo").write_text(f"Node {node} MemTotal:       {1048576 * (node + 1)} kB\n"
                                       f"Node {node} MemFree:        524288 kB\n")
    (root / "online").write_text(f"0-{max(nodes)}\n")   # not a node directory: ignored
    return root


def test_two_nodes(tmp_path):
    nodes = numa_nodes(fake_sysfs(tmp_path, {0: "0-3,8-11", 1: "4-7,12-15"}))
    assert nodes == {0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15]}
    assert split_by_node([0, 1, 4, 5], nodes) == [[0, 1], [4, 5]]
    assert describe_nodes(range(16), nodes).startswith("2 NUMA nodes (node0: cpus 0-3,8-11; node1")


def test_one_node(tmp_path):
    nodes = numa_nodes(fake_sysfs(tmp_path, {0: "0-7"}, meminfo=False))
    assert split_by_node([0, 1], nodes) == [[0, 1]]
    assert describe_nodes([0, 1], nodes).startswith("one NUMA node (node0: cpus 0-1")


def test_cpus_outside_the_allowed_set_are_dropped(tmp_path):
    # node1 keeps only its allowed cpus, node2 has none allowed, node3 is memory-only (empty cpulist).
    nodes = numa_nodes(fake_sysfs(tmp_path, {0: "0-3", 1: "4-7", 2: "8-11", 3: ""}))
    assert nodes[3] == []
    assert describe_nodes([1, 2, 5, 20], nodes) == "2 NUMA nodes (node0: cpus 1-2; node1: cpus 5)"
    assert split_by_node([1, 5, 20], nodes) == [[20], [1], [5]]   # a core of no known node: a group of its own


def test_no_sysfs_is_one_group(tmp_path):
    nodes = numa_nodes(tmp_path / "missing")
    assert nodes == {} and split_by_node([0, 3], nodes) == [[0, 3]]
    assert "no NUMA information" in describe_nodes([0, 3], nodes)


def test_format_cpu_list():
    assert format_cpu_list([5, 0, 1, 2, 8, 9]) == "0-2,5,8-9"
    assert format_cpu_list([3]) == "3"


def test_tiny_run_writes_markdown_and_json(tmp_path, capsys, no_leaks):
    md, js = tmp_path / "t.md", tmp_path / "t.json"
    before = os.sched_getaffinity(0)
    rc = throughput.main([*FAST, "--workers", WORKERS, "--systems", "shmpool-sync,for-loop",
                          "--json", str(js)])
    assert rc == 0
    assert os.sched_getaffinity(0) == before            # the cells' affinity was given back
    workers = [int(w) for w in WORKERS.split(",")]

    text = md.read_text()
    assert text in capsys.readouterr().out
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| CartPole-v1 - "))
    assert "(FPS, frame_skip 1)" in header
    assert header.endswith(" | ".join(map(str, workers)) + f" | ÷ For-loop (at {workers[-1]}) |")
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ") and line is not header}
    assert set(rows) == {"---", "For-loop", "shmpool (sync)"}
    for system in ("For-loop", "shmpool (sync)"):
        cells = rows[system].strip("| ").split(" | ")[1:]
        assert len(cells) == len(workers) + 1 and all(int(c.replace(",", "")) > 0 for c in cells[:-1])

    data = json.loads(js.read_text())
    assert data["task"] == "CartPole-v1" and data["frame_skip"] == 1
    assert data["systems"] == ["For-loop", "shmpool (sync)"]
    assert data["config"]["envs_per_worker"] == throughput.DEFAULT_ENVS_PER_WORKER
    assert data["environment"]["cpu_model"] in header
    assert [c["workers"] for c in data["cells"]] == workers
    for cell in data["cells"]:
        w = cell["workers"]
        assert cell["cpus"] == ALLOWED[:w] and cell["num_envs"] == throughput.DEFAULT_ENVS_PER_WORKER * w
        (sample,) = cell["systems"]["shmpool (sync)"]["samples"]
        assert sample["count"] > 0 and sample["seconds"] > 0 and "error" not in sample
        (pool,) = sample["info"]["pools"]
        assert pool["num_workers"] == w and pool["worker_cpus"] == ALLOWED[:w]
        assert sample["info"]["affinity"] == ALLOWED[:w]
        assert cell["systems"]["For-loop"]["median_fps"] > 0



def test_numa_on_one_node_says_so(tmp_path, capsys, no_leaks):
    root = fake_sysfs(tmp_path / "sys", {0: format_cpu_list(ALLOWED)})
    js = tmp_path / "t.json"
    rc = throughput.main([*FAST, "--workers", "1", "--numa", "--numa-root", str(root),
                          "--systems", "shmpool-numa", "--json", str(js)])
    assert rc == 0
    captured = capsys.readouterr()
    assert "one NUMA node" in captured.err and "runs one pool" in captured.err
    assert "one NUMA node" in captured.out                      # and in the markdown notes
    data = json.loads(js.read_text())
    assert data["numa"]["single"] is True
    (sample,) = data["cells"][0]["systems"]["shmpool (numa+async)"]["samples"]
    assert len(sample["info"]["pools"]) == 1


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two cpus")
def test_numa_two_fake_nodes_run_one_pool_each(tmp_path, capsys, no_leaks):
    root = fake_sysfs(tmp_path / "sys", {0: str(ALLOWED[0]), 1: str(ALLOWED[1])})
    js = tmp_path / "t.json"
    rc = throughput.main([*FAST, "--workers", "2", "--numa", "--numa-root", str(root),
                          "--systems", "shmpool-numa", "--json", str(js)])
    assert rc == 0
    assert "2 NUMA nodes" in capsys.readouterr().err
    cell = json.loads(js.read_text())["cells"][0]
    assert cell["numa_groups"] == [[ALLOWED[0]], [ALLOWED[1]]]
    (sample,) = cell["systems"]["shmpool (numa+async)"]["samples"]
    assert [p["worker_cpus"] for p in sample["info"]["pools"]] == [[ALLOWED[0]], [ALLOWED[1]]]
    assert sample["count"] > 0


def test_bad_options():
    with pytest.raises(SystemExit):
        throughput.parse_args(["--systems", "nonsense"])
    with pytest.raises(SystemExit):
        throughput.parse_args(["--workers", "0"])
    with pytest.raises(SystemExit):
        throughput.parse_args(["--task", "NoSuchTask-v0"])
    assert throughput.parse_args(["--task", "Pong-v5", "--quick"]).frame_skip == 4


def test_num_envs_sweeps_n_on_the_whole_budget_with_the_poolvec_rows(tmp_path, no_leaks):
    pytest.importorskip("stable_baselines3")
    js = tmp_path / "t.json"
    rc = throughput.main([*FAST, "--num-envs", "1,4", "--systems", "sb3-dummy,shmvecenv", "--json", str(js)])
    assert rc == 0
    data = json.loads(js.read_text())
    assert data["systems"] == ["SB3 DummyVecEnv", "ShmVecEnv"]
    assert [c["num_envs"] for c in data["cells"]] == [1, 4]
    for cell in data["cells"]:
        (sample,) = cell["systems"]["ShmVecEnv"]["samples"]
        assert sample["info"]["affinity"] == ALLOWED and sample["count"] > 0
        (pool,) = sample["info"]["pools"]   # ShmVecEnv(cpus=the first min(N, cores) cpus): the pool sizes itself
        assert pool["num_envs"] == cell["num_envs"] and 1 <= pool["num_workers"] <= min(cell["num_envs"], 2)


def test_a_run_with_nothing_to_measure_says_why_and_fails(capsys, no_leaks):
    """Issue 68: under ``taskset -c 0``, ``--workers 2`` skipped its only column and printed an empty table with
    rc 0.  Here one allowed cpu stands for the taskset: nothing runs, stderr says why, the exit status is 2."""
    rc = throughput.main([*FAST, "--cpus", str(ALLOWED[0]), "--workers", "2", "--systems", "for-loop"])
    captured = capsys.readouterr()
    assert rc == 2
    assert f"2 workers skipped: only 1 cpus {ALLOWED[0]}" in captured.err
    assert "nothing to measure: every column was skipped (--workers 2 on 1 cpu: use --workers 1)" in captured.err
    assert "| CartPole-v1" not in captured.out    # no empty table


def _fake_plan(medians: dict[str, list[float | None]]) -> throughput.Plan:
    """A plan whose cells' FPS medians are ``medians`` (None: the system failed there), for the table alone."""
    from bench._timing import Summary

    cells = [throughput.Cell(w, ALLOWED[:1], [ALLOWED[:1]], 8 * w, w) for w in (1, 2)]
    for k, cell in enumerate(cells):
        cell.fps = lambda system, frame_skip, k=k: (None if medians[system][k] is None
                                                    else Summary(medians[system][k], 0.0, 0.0, 1))
    return throughput.Plan("CartPole-v1", 1, ALLOWED[:1], {}, list(medians), {}, cells, [])


def test_the_table_has_integer_fps_and_each_row_over_a_named_baseline():
    """EnvPool's table: whole frames per second, and a column of each row's FPS over the baseline row measured in
    the same run (For-loop when it ran), at the last column (the most cores)."""
    args = throughput.parse_args([*FAST, "--workers", "1"])
    env = {"cpu_model": "cpu", "date": "today", "python": "3", "gymnasium": "1", "shmpool": "0"}
    plan = _fake_plan({"For-loop": [10234.56, 10100.4], "shmpool (sync)": [40938.2, 80801.9],
                       "shmpool (async)": [45000.0, None]})
    lines = throughput.markdown(plan, args, env).splitlines()
    header = next(line for line in lines if line.startswith("| CartPole-v1"))
    assert header.endswith("| 1 | 2 | ÷ For-loop (at 2) |")
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ") and line != header}
    assert rows["For-loop"] == "| For-loop | 10,235 | 10,100 | 1.00 |"
    assert rows["shmpool (sync)"] == "| shmpool (sync) | 40,938 | 80,802 | 8.00 |"
    assert rows["shmpool (async)"] == "| shmpool (async) | 45,000 | error | — |"
    assert any("÷ For-loop: each row's FPS over For-loop's in the same run" in line for line in lines)

    plan = _fake_plan({"shmpool (sync)": [1.0, 2.0], "shmpool (async)": [3.0, 5.0]})   # no For-loop row
    header = next(line for line in throughput.markdown(plan, args, env).splitlines() if line.startswith("| Cart"))
    assert header.endswith("| ÷ shmpool (sync) (at 2) |")
