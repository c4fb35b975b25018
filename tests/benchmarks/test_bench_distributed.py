"""``python -m bench latency --ray``: RayPool beside a local Pool, what it writes, not how fast (not a timing test)."""
import json

import heavy_imports
import psutil
import pytest

from bench import latency

heavy_imports.require("ray")
pytestmark = [pytest.mark.distributed, pytest.mark.slow,   # slow: a Ray cluster and a bench run
              pytest.mark.heavy_imports]                   # the bench's driver imports Ray here


def test_quick_ray_run_writes_every_cell(tmp_path, capsys):
    path = tmp_path / "ray.json"
    rc = latency.main(["--quick", "--ray", "2", "--num-envs", "16", "--batch-size", "8", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "| sync | 16 | 16 |" in out and "| ray |" in out and "Ray's floor" in out
    data = json.loads(path.read_text())
    assert data["ray"]["nodes"] == 2 and data["ray"]["round_trip_us"]["empty"]["p50"] > 0
    got = [(c["mode"], c["system"], c["num_envs"], c["batch_size"]) for c in data["cells"]]
    assert got == [("sync", "local", 16, 16), ("sync", "ray", 16, 16),
                   ("async", "local", 16, 8), ("async", "ray", 16, 8)]
    for c in data["cells"]:
        assert "error" not in c, c.get("error")
        assert c["throughput"] > 0 and c["reps"] == 1 and c["driver_cpu_us_per_call"] > 0
        lat = c["agent_latency_us"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
        if c["system"] == "ray":
            assert "p50" in c["overhead_us"] and c["throughput_ratio"] > 0
            # one repetition: the paired difference is that repetition's, which is the medians' difference
            assert c["overhead_us"]["paired_p50"] == c["overhead_us"]["p50"]
            assert c["pool"]["pools"] == 2
        else:
            assert c["pool"]["num_workers"] == 2
        if c["mode"] == "async":
            assert c["observer_latency_us"]["p50"] > 0
    assert data["cells"][3]["pool"]["sub_batch_sizes"] == [4, 4]
    # the bench's cluster is gone
    names = {p.name() for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    assert not names & {"raylet", "gcs_server"}


def test_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exc:
        latency.parse_args(["--ray", "0"])
    assert exc.value.code == 2
    assert "--ray must be >= 1" in capsys.readouterr().err


def test_a_run_over_links_between_two_namespaces_writes_its_cells_and_leaves_no_namespace(tmp_path, capsys):
    """``--netem 0,1ms``: the RayPool cells again with their direct connections over a veth pair without delay and
    over a link with 1 ms each way (netem, or the TAP relay where the kernel lacks netem), each link's round trip in
    the JSON, and the namespaces deleted afterwards."""
    import os
    import subprocess

    from bench import netem
    if netem.refusal() is not None:
        pytest.skip(netem.refusal())
    path = tmp_path / "netem.json"
    rc = latency.main(["--quick", "--ray", "2", "--num-envs", "4", "--modes", "sync", "--netem", "0,1ms",
                       "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads(path.read_text())
    assert [(c["system"], c["num_envs"]) for c in data["cells"]] == [("local", 4), ("ray", 4), ("ray 0", 4),
                                                                      ("ray 1ms", 4)]
    for c in data["cells"]:
        assert "error" not in c, c.get("error")
    assert data["cells"][2]["throughput_ratio"] > 0
    assert data["ray"]["netem"]["0"]["round_trip_us"]["p50"] > 0 and "Over a link" in out
    slow = data["ray"]["netem"]["1ms"]
    assert slow["round_trip_us"]["p50"] >= 2000 and slow["link"] in (netem.NETEM, netem.RELAY)
    assert data["cells"][3]["agent_latency_us"]["p50"] >= 2000   # every step's calls crossed the link both ways
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert netem.PREFIX not in left
    assert "SHMPOOL_LINK_NETNS" not in os.environ
