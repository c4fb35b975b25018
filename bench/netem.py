"""``bench latency --ray N --netem 100us,1ms``: RayPool's data plane over a veth pair between two network
namespaces of this machine, with ``tc netem`` delay on both ends of it, beside the same cells over loopback.

Root only.  For each delay it creates two namespaces, ``shmpool-bench-d<k>`` (the driver's end) and
``shmpool-bench-w<k>`` (the actors' end), joined by one veth pair created straight inside them, with the addresses
``10.213.<k>.1`` and ``10.213.<k>.2`` that exist only there: the root namespace gets no interface, no address and no
route, and the run talks only to those two addresses.  ``delay`` is added on each end's egress, so a round trip
crosses it twice.  Ray itself stays on loopback: only the RayPool's direct connections cross the link (each actor's
listening socket is made in the actors' namespace, the driver's socket in the driver's: shmpool.distributed.netns),
so this measures the data plane over a link, not Ray's control plane.  The namespaces (and with them the veth
pairs) are deleted when the run ends, on Ctrl-C and on SIGTERM; ones left by a killed run are deleted by the next
run before it creates its own.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ._timing import percentiles_of

PREFIX = "shmpool-bench-"
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class Link:
    """One delay's link: its label (``"100us"``), the namespaces of its two ends and their addresses."""

    label: str
    seconds: float
    driver_netns: str
    worker_netns: str
    driver_host: str
    worker_host: str

    @property
    def route(self) -> str:
        """The value of ``shmpool.distributed.netns.ENV`` that sends a RayPool's connections over this link."""
        return f"{self.worker_host},{self.worker_netns},{self.driver_netns}"


def parse_delays(text: str) -> list[tuple[str, float]]:
    """``"100us,1ms"`` → ``[("100us", 1e-4), ("1ms", 1e-3)]``; ``0`` is the veth link without delay.
    ValueError on anything else."""
    out = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(us|ms|s)?", part)
        if not m or (m.group(2) is None and float(m.group(1)) != 0):
            raise ValueError(f"a delay is a number with us, ms or s (e.g. 100us, 1ms) or 0, got {part!r}")
        out.append((part, float(m.group(1)) * UNITS[m.group(2) or "s"]))
    if len({label for label, _ in out}) != len(out):
        raise ValueError(f"delays repeat: {text!r}")
    return out


def refusal() -> str | None:
    """Why this process cannot build the links (not root, no ``ip``/``tc``), or None."""
    if os.geteuid() != 0:
        return "--netem creates network namespaces and a veth pair: run it as root (it is refused otherwise)"
    missing = [tool for tool in ("ip", "tc") if subprocess.run(["which", tool], capture_output=True).returncode]
    if missing:
        return f"--netem needs {' and '.join(missing)} (iproute2)"
    return None


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise NetemError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}")


class NetemError(RuntimeError):
    """A link could not be built (the message says which command and why)."""


def _ours() -> list[str]:
    """The namespaces a run of this bench created (left by one that was killed, or this run's)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(PREFIX)]


def delete_all() -> None:
    """Delete every namespace of this bench (deleting one deletes its end of a veth pair, and so the pair)."""
    for name in _ours():
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def build(k: int, label: str, seconds: float) -> Link:
    """Link ``k``: two namespaces, one veth pair inside them, addresses, and ``seconds`` of netem delay each way."""
    link = Link(label, seconds, f"{PREFIX}d{k}", f"{PREFIX}w{k}", f"10.213.{k}.1", f"10.213.{k}.2")
    d, w = link.driver_netns, link.worker_netns
    _run("ip", "netns", "add", d)
    _run("ip", "netns", "add", w)
    # both ends made inside the namespaces: the root namespace never holds the pair
    _run("ip", "-n", d, "link", "add", "veth-d", "type", "veth", "peer", "name", "veth-w", "netns", w)
    for ns, dev, host in ((d, "veth-d", link.driver_host), (w, "veth-w", link.worker_host)):
        _run("ip", "-n", ns, "addr", "add", f"{host}/30", "dev", dev)
        _run("ip", "-n", ns, "link", "set", dev, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        if seconds:
            try:
                _run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "delay", f"{seconds * 1e6:g}us")
            except NetemError as exc:
                if "kind is unknown" in str(exc):
                    raise NetemError("this kernel has no netem qdisc (module sch_netem): `tc qdisc add ... netem` "
                                     "is refused, so no delay can be added; --netem 0 measures the veth link "
                                     "without delay") from exc
                raise
    return link


def round_trip_us(link: Link, calls: int = 300, payload: int = 64) -> dict[str, float]:
    """p50/p95 µs of a TCP ping-pong of ``payload`` bytes across ``link`` (from its driver end to its worker end):
    the floor any call over it pays."""
    from shmpool.distributed.netns import socket_maker

    listener = socket_maker(link.worker_netns)(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((link.worker_host, 0))
    listener.listen(1)

    def echo() -> None:
        conn, _ = listener.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    client = socket_maker(link.driver_netns)(socket.AF_INET, socket.SOCK_STREAM)
    lat = []
    try:
        client.settimeout(10)
        client.connect(listener.getsockname())
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        message = b"x" * payload
        for k in range(20 + calls):   # the first 20: warm-up
            t = time.perf_counter_ns()
            client.sendall(message)
            got = 0
            while got < payload:
                got += len(client.recv(payload - got))
            if k >= 20:
                lat.append((time.perf_counter_ns() - t) / 1e3)
    finally:
        client.close()
        listener.close()
        thread.join(5)
    return percentiles_of(lat, (50, 95))


@contextmanager
def links(delays: Sequence[tuple[str, float]]) -> Iterator[tuple[list[Link], dict[str, Any]]]:
    """The links of ``delays`` and what was measured of them (``{label: {"delay_s", "round_trip_us"}}``), deleted
    on the way out, on Ctrl-C and on SIGTERM (turned into SystemExit for as long as they exist)."""
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    delete_all()
    try:
        made = [build(k, label, seconds) for k, (label, seconds) in enumerate(delays)]
        info = {link.label: {"delay_s": link.seconds, "round_trip_us": round_trip_us(link)} for link in made}
        yield made, info
    finally:
        delete_all()
        signal.signal(signal.SIGTERM, previous)


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
