"""The library knows nothing of the bench: no module under shmpool/ imports bench/ or handles network namespaces
(setns, CLONE_NEWNET, a netns module); the bench's --netem link reaches a RayPool's connections through a neutral
seam, ``channel.Route``."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_no_library_module_imports_the_bench_or_knows_network_namespaces():
    offenders = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
                 for path in sorted((ROOT / "shmpool").rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"^\s*(from|import)\s+bench\b|netns|setns|CLONE_NEWNET", line)]
    assert offenders == []


def test_the_bench_s_route_names_a_host_and_two_socket_makers():
    from bench import netns
    from shmpool.distributed.channel import Route

    route = netns.route("10.213.0.2,shmpool-w,shmpool-d")
    assert isinstance(route, Route) and route.host == "10.213.0.2"
    assert callable(route.listen_socket) and callable(route.connect_socket)
    with pytest.raises(ValueError, match=r"a route is 'host,server_netns,client_netns', got 'h,a'"):
        netns.route("h,a")
