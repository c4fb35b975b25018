"""A RayPool's direct connections run across two network namespaces of one machine: the setting ``bench latency
--netem`` measures its data plane in (bench/README, "Over a link with delay"), while Ray's own traffic (placement,
describe, restarts, kills) stays where Ray put it.

A socket belongs to the network namespace of the thread that made it, and keeps it: a short-lived thread enters the
namespace (``setns(2)``, which needs root), makes the socket and ends, so no other thread ever leaves its own
namespace.  :func:`route` gives the library's neutral seam (:class:`shmpool.distributed.channel.Route`, set around a
RayPool's build through ``shmpool.distributed.fleet.ROUTE``) the socket makers of both namespaces; the actor's
travels to it as a constructor argument (this module goes to the nodes by value: :class:`bench.latency.RayCluster`).
"""
from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable

from shmpool.distributed.channel import Route

NETNS_DIR = "/var/run/netns"   # where `ip netns add` names its namespaces
CLONE_NEWNET = 0x40000000


def route(value: str) -> Route:
    """The route ``"host,server_netns,client_netns"`` names (:attr:`bench.netem.Link.route`): each actor listens on
    ``host`` inside namespace ``server_netns``; the driver connects from inside ``client_netns`` (names as ``ip
    netns`` gives them)."""
    parts = value.split(",")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"a route is 'host,server_netns,client_netns', got {value!r}")
    host, server, client = parts
    return Route(host, socket_maker(server), socket_maker(client))


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
