"""``bench latency --ray N --netem 100us,1ms``: RayPool's data plane over a link with delay between two network
namespaces of this machine, beside the same cells over loopback.

Root only.  For each delay it creates two namespaces, ``shmpool-bench-d<k>`` (the driver's end) and
``shmpool-bench-w<k>`` (the actors' end), joined by a link whose two ends have the addresses ``10.213.<k>.1`` and
``10.213.<k>.2``, which exist only there: the root namespace gets no interface, no address and no route, and the run
talks only to those two addresses.  The link is a veth pair with ``tc netem`` delay on each end's egress, so a round
trip crosses it twice; on a kernel without the netem qdisc, two TAP devices joined by :mod:`bench.tap_relay`, a
process of the run's that hands each frame across after the delay (its own cost is in the link's measured round
trip).  ``0`` is the veth pair without delay.  Ray itself stays on loopback: only the RayPool's direct connections
cross the link (each actor's listening socket is made in the actors' namespace, the driver's socket in the driver's:
bench.netns), so this measures the data plane over a link, not Ray's control plane.  The namespaces
(and with them the veth pairs) are deleted and the relays stopped when the run ends, on Ctrl-C and on SIGTERM; a
relay ends with its run however the run ends (it reads the run's end of a pipe), and namespaces left by a killed
run are deleted by the next run before it creates its own.
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ._timing import percentiles_of
from .tap_relay import MTU as TAP_MTU

PREFIX = "shmpool-bench-"
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
VETH, NETEM, RELAY = "veth", "veth + tc netem", "TAP devices + bench/tap_relay.py"   # what a link is made of
_RELAYS: list[subprocess.Popen] = []   # this run's relay processes, stopped by delete_all()


@dataclass(frozen=True)
class Link:
    """One delay's link: its label (``"100us"``), the namespaces of its two ends and their addresses, and what it is
    made of (:data:`VETH`, :data:`NETEM` or :data:`RELAY`)."""

    label: str
    seconds: float
    driver_netns: str
    worker_netns: str
    driver_host: str
    worker_host: str
    kind: str = VETH

    @property
    def driver_device(self) -> str:
        return "tap-d" if self.kind == RELAY else "veth-d"

    @property
    def worker_device(self) -> str:
        return "tap-w" if self.kind == RELAY else "veth-w"

    @property
    def route(self) -> str:
        """The route (``bench.netns.route``'s argument) that sends a RayPool's connections over this link."""
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
    """Stop this run's relays (their TAP devices go with them) and delete every namespace of this bench (deleting one
    deletes its end of a veth pair, and so the pair)."""
    while _RELAYS:
        relay = _RELAYS.pop()
        relay.stdin.close()   # the relay's signal to end
        try:
            relay.wait(5)
        except subprocess.TimeoutExpired:
            relay.kill()
            relay.wait()
    for name in _ours():
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def build(k: int, label: str, seconds: float) -> Link:
    """Link ``k``: two namespaces, a link between them with ``seconds`` of delay each way (:func:`_veth`, else, on a
    kernel without netem, :func:`_relayed`), and addresses."""
    link = Link(label, seconds, f"{PREFIX}d{k}", f"{PREFIX}w{k}", f"10.213.{k}.1", f"10.213.{k}.2")
    d, w = link.driver_netns, link.worker_netns
    _run("ip", "netns", "add", d)
    _run("ip", "netns", "add", w)
    try:
        link = _veth(link)
    except NoNetem:
        _run("ip", "-n", d, "link", "del", "veth-d")   # its peer goes with it
        link = _relayed(link)
    for ns, dev, host in ((d, link.driver_device, link.driver_host), (w, link.worker_device, link.worker_host)):
        _run("ip", "-n", ns, "addr", "add", f"{host}/30", "dev", dev)
        _run("ip", "-n", ns, "link", "set", dev, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
    return link


class NoNetem(NetemError):
    """The kernel has no netem qdisc (module ``sch_netem``): ``tc qdisc add ... netem`` is refused."""


def _veth(link: Link) -> Link:
    """A veth pair made straight inside the two namespaces (the root namespace never holds it), with netem delay on
    each end when the link has one; :class:`NoNetem` when the kernel cannot add it."""
    d, w = link.driver_netns, link.worker_netns
    _run("ip", "-n", d, "link", "add", "veth-d", "type", "veth", "peer", "name", "veth-w", "netns", w)
    if not link.seconds:
        return link
    for ns, dev in ((d, "veth-d"), (w, "veth-w")):
        try:
            _run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "delay", f"{link.seconds * 1e6:g}us")
        except NetemError as exc:
            if "kind is unknown" in str(exc):
                raise NoNetem(str(exc)) from exc
            raise
    return dataclasses.replace(link, kind=NETEM)


def _relayed(link: Link) -> Link:
    """Two TAP devices, one in each namespace, joined by a :mod:`bench.tap_relay` process that delays each frame."""
    relay = subprocess.Popen([sys.executable, "-m", "bench.tap_relay", repr(link.seconds),
                              f"{link.driver_netns}:tap-d", f"{link.worker_netns}:tap-w"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    _RELAYS.append(relay)
    said = relay.stdout.readline().strip()
    if said != "ready":
        raise NetemError(f"bench/tap_relay.py did not start (it said {said!r}; exit code {relay.poll()})")
    for ns, dev in ((link.driver_netns, "tap-d"), (link.worker_netns, "tap-w")):
        _run("ip", "-n", ns, "link", "set", dev, "mtu", str(TAP_MTU))
    return dataclasses.replace(link, kind=RELAY)


def round_trip_us(link: Link, calls: int = 300, payload: int = 64) -> dict[str, float]:
    """p50/p95 µs of a TCP ping-pong of ``payload`` bytes across ``link`` (from its driver end to its worker end):
    the floor any call over it pays."""
    from .netns import socket_maker

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
        info = {link.label: {"delay_s": link.seconds, "link": link.kind, "round_trip_us": round_trip_us(link)}
                for link in made}
        yield made, info
    finally:
        delete_all()
        signal.signal(signal.SIGTERM, previous)


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
