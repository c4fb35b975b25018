"""A RayPool's direct connections run across two network namespaces of one machine: the setting ``bench latency
--netem`` measures its data plane in (bench/README, "Over a link with delay"), while Ray's own traffic (placement,
describe, restarts, kills) stays where Ray put it.

A socket belongs to the network namespace of the thread that made it, and keeps it: a short-lived thread enters the
namespace (``setns(2)``, which needs root), makes the socket and ends, so no other thread ever leaves its own
namespace.  The route comes from :data:`ENV` in the driver's environment (the bench sets it around a run; nothing
else does) and travels to each actor as a constructor argument.
"""
from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

ENV = "SHMPOOL_LINK_NETNS"   # "host,server_netns,client_netns"
NETNS_DIR = "/var/run/netns"   # where `ip netns add` names its namespaces
CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class Route:
    """Each actor listens on ``host`` inside namespace ``server_netns``; the driver connects from inside
    ``client_netns`` (names as ``ip netns`` gives them)."""

    host: str
    server_netns: str
    client_netns: str

    @classmethod
    def from_environment(cls) -> Route | None:
        """The route :data:`ENV` names, or None when it is unset (the usual case: the node's own address)."""
        value = os.environ.get(ENV)
        if not value:
            return None
        parts = value.split(",")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"{ENV} must be 'host,server_netns,client_netns', got {value!r}")
        return cls(*parts)


def enter(netns: str) -> None:
    """Move the calling thread into network namespace ``netns`` (``setns(2)``, root only); what it creates from then
    on (a socket, a TAP device) belongs to that namespace."""
    with open(os.path.join(NETNS_DIR, netns)) as handle:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {netns!r}: {os.strerror(err)}")


def socket_maker(netns: str) -> Callable[..., socket.socket]:
    """``socket.socket``'s signature, making the socket inside namespace ``netns``."""
    def make(*args: object) -> socket.socket:
        made: list = []

        def inside() -> None:
            try:
                enter(netns)
                made.append(socket.socket(*args))
            except BaseException as exc:   # handed to the caller's thread
                made.append(exc)

        thread = threading.Thread(target=inside, name=f"shmpool-netns-{netns}")
        thread.start()
        thread.join()
        if isinstance(made[0], BaseException):
            raise made[0]
        return made[0]
    return make
