"""NUMA reading from sysfs (shmpool.topology) and RayPool's per-node core groups built on it."""
from __future__ import annotations

import os

from shmpool.distributed.placement import numa_cpu_groups
from shmpool.topology import format_cpu_list, numa_nodes, split_by_node

ALLOWED = sorted(os.sched_getaffinity(0))


def fake_sysfs(root, nodes: dict[int, str]):
    """``root/nodeN/cpulist`` as the kernel writes them, beside a file that is not a node."""
    for node, cpulist in nodes.items():
        (root / f"node{node}").mkdir(parents=True)
        (root / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    (root / "online").write_text(f"0-{max(nodes)}\n")
    return root


def test_nodes_in_node_order_unreadable_and_garbage_lists_left_out(tmp_path):
    root = fake_sysfs(tmp_path, {10: "8-9", 2: "0-3,6", 3: "", 4: "not-a-list"})
    (root / "node7").mkdir()                         # no cpulist file
    assert numa_nodes(root) == {2: [0, 1, 2, 3, 6], 3: [], 10: [8, 9]}


def test_split_keeps_cpu_order_and_puts_unknown_cores_first():
    nodes = {0: [0, 1], 1: [2, 3]}
    assert split_by_node([3, 0, 9, 2], nodes) == [[9], [0], [3, 2]]
    assert split_by_node([5], {}) == [[5]]


def test_format_is_the_inverse_of_parse():
    assert format_cpu_list([9, 0, 1, 2, 5, 8]) == "0-2,5,8-9"
    assert format_cpu_list([]) == ""


def test_numa_cpu_groups_keeps_only_allowed_cores_per_node(tmp_path):
    half = len(ALLOWED) // 2 or 1
    first, second = ALLOWED[:half], ALLOWED[half:]
    spec = {0: format_cpu_list(first), 1: "100000", 2: format_cpu_list(second) if second else ""}
    expected = [first, second] if second else [first]
    assert numa_cpu_groups(fake_sysfs(tmp_path / "sys", spec)) == expected


def test_numa_cpu_groups_without_sysfs_is_one_group(tmp_path):
    assert numa_cpu_groups(tmp_path / "missing") == [ALLOWED]
