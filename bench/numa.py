"""NUMA topology for the benchmarks: which allowed cores sit on which node.

Read from ``/sys/devices/system/node`` (``nodeN/cpulist`` in taskset syntax,
``nodeN/meminfo`` for the node's memory) and intersected with the cores this
process may use (``os.sched_getaffinity(0)``: taskset, numactl and cgroup
limits respected); psutil fills in what sysfs does not say (physical cores,
total memory).  Where sysfs has no node directory (no NUMA support, some
containers) the allowed cores are reported as one node.

    python -m bench.numa        # print the topology this process sees
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shmpool import parse_cpu_list

SYSFS_NODES = "/sys/devices/system/node"


@dataclass(frozen=True)
class Node:
    """One NUMA node: its id, the allowed cores on it, all its cores, its memory (bytes, if known)."""

    id: int
    cpus: list[int]
    all_cpus: list[int]
    mem_total: int | None = None
    mem_free: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "cpus": self.cpus, "all_cpus": self.all_cpus,
                "mem_total": self.mem_total, "mem_free": self.mem_free}


@dataclass(frozen=True)
class Topology:
    """The nodes that hold at least one allowed core, in node order."""

    nodes: list[Node]
    allowed: list[int]
    source: str                       # the sysfs directory read, or "none"
    other: dict[str, Any] = field(default_factory=dict)   # psutil: physical cores, total memory

    @property
    def single(self) -> bool:
        return len(self.nodes) <= 1

    def node_of(self, cpu: int) -> int | None:
        return next((n.id for n in self.nodes if cpu in n.cpus), None)

    def split(self, cpus: Iterable[int]) -> list[tuple[int, list[int]]]:
        """``cpus`` grouped by node, in node order: ``[(node id, cpus on it), ...]``; cores of no
        known node form a group of their own (node id -1)."""
        groups: dict[int, list[int]] = {}
        for c in cpus:
            node = self.node_of(c)
            groups.setdefault(-1 if node is None else node, []).append(c)
        return sorted(groups.items())

    def describe(self) -> str:
        """One line: how many nodes, and which allowed cores each has."""
        parts = [f"node{n.id}: cpus {format_cpu_list(n.cpus)}"
                 + (f", {n.mem_total / 2**30:.1f} GiB" if n.mem_total else "") for n in self.nodes]
        if self.single:
            head = "one NUMA node" if self.source != "none" else "no NUMA information (sysfs has no nodes)"
        else:
            head = f"{len(self.nodes)} NUMA nodes"
        return f"{head} ({'; '.join(parts)})"

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "allowed": self.allowed, "single": self.single,
                "nodes": [n.to_json() for n in self.nodes], "other": self.other}


def format_cpu_list(cpus: Sequence[int]) -> str:
    """The inverse of ``parse_cpu_list`` (without strides): ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def _meminfo(path: Path) -> tuple[int | None, int | None]:
    """MemTotal and MemFree of a node's ``meminfo`` ("Node 0 MemTotal:  10315988 kB"), in bytes."""
    try:
        text = path.read_text()
    except OSError:
        return None, None
    found = {}
    for key in ("MemTotal", "MemFree"):
        m = re.search(rf"{key}:\s+(\d+)\s*kB", text)
        found[key] = int(m.group(1)) * 1024 if m else None
    return found["MemTotal"], found["MemFree"]


def _psutil_facts() -> dict[str, Any]:
    try:
        import psutil
    except ImportError:
        return {}
    return {"physical_cores": psutil.cpu_count(logical=False), "logical_cores": psutil.cpu_count(logical=True),
            "mem_total": psutil.virtual_memory().total}


def read_topology(root: str | os.PathLike = SYSFS_NODES, allowed: Iterable[int] | None = None) -> Topology:
    """The NUMA nodes under ``root`` restricted to ``allowed`` (default: this process's cores).

    Nodes left with no allowed core are dropped; without any ``nodeN`` directory
    the allowed cores are one node (id 0, memory from psutil)."""
    allowed = sorted(os.sched_getaffinity(0) if allowed is None else set(allowed))
    root = Path(root)
    other = _psutil_facts()
    nodes = []
    dirs = sorted((d for d in root.glob("node*") if re.fullmatch(r"node\d+", d.name)),
                  key=lambda d: int(d.name[4:])) if root.is_dir() else []
    for d in dirs:
        try:
            text = (d / "cpulist").read_text().strip()
        except OSError:
            continue
        all_cpus = parse_cpu_list(text) if text else []   # a memory-only node has an empty cpulist
        cpus = [c for c in all_cpus if c in set(allowed)]
        if cpus:
            nodes.append(Node(int(d.name[4:]), cpus, all_cpus, *_meminfo(d / "meminfo")))
    if not dirs:
        mem = other.get("mem_total")
        return Topology([Node(0, allowed, allowed, mem)], allowed, "none", other)
    return Topology(nodes, allowed, str(root), other)


def main(argv: Sequence[str] | None = None) -> int:
    topo = read_topology()
    print(topo.describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
