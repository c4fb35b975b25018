"""A link with delay on a kernel without the netem qdisc: two TAP devices, one in each of two network namespaces,
joined by this process, which hands each Ethernet frame that leaves one device to the other ``delay`` seconds after
it left (a round trip crosses it twice, as with netem on both ends of a veth pair).

Run as ``python -m bench.tap_relay DELAY NETNS_A:DEVICE_A NETNS_B:DEVICE_B`` (root): it creates both devices, prints
``ready`` and relays until its standard input ends (its parent, :mod:`bench.netem`, holds the other end, so the relay
and with it both devices go when the parent does, however it ends).  The devices are the relay's own (not
persistent): the kernel deletes them when it exits.

Timing: one thread waits in ``select`` for a frame or for the next frame's due time, with the timer slack set to
1 ns, so a frame leaves within some tens of µs of its due time on an idle core; frames keep their order.  The relay
is a process of its own so the bench's driver never shares its GIL; it costs a few µs of CPU per frame (each device's
MTU is 65,000, so one frame carries what TCP would otherwise cut into ~45).  Whatever it adds is in the link's
measured round trip, which the report prints beside the RayPool's overhead.
"""
from __future__ import annotations

import collections
import ctypes
import fcntl
import os
import select
import struct
import sys
import time

from bench.netns import enter

TUN = "/dev/net/tun"
TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
PR_SET_TIMERSLACK = 29
MTU = 65000


def open_tap(netns: str, device: str) -> int:
    """A non-blocking descriptor of a new TAP device ``device`` (no packet-info header) in namespace ``netns``, which
    this (single-threaded) process enters."""
    enter(netns)
    fd = os.open(TUN, os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", device.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def relay(a: int, b: int, delay: float, stop: int) -> None:
    """Hand every frame read from ``a`` to ``b`` and from ``b`` to ``a``, ``delay`` seconds after it was read, until
    ``stop`` is readable (its writer closed it)."""
    owed: dict[int, collections.deque] = {a: collections.deque(), b: collections.deque()}   # to write: (due, frame)
    other = {a: b, b: a}
    watched = [a, b, stop]
    while True:
        now = time.monotonic()
        due = None
        for out, queue in owed.items():
            while queue and queue[0][0] <= now:
                try:
                    os.write(out, queue.popleft()[1])
                except OSError:   # the device is not up yet (EIO) or its queue is full: lost, as on a real link
                    pass
            if queue and (due is None or queue[0][0] < due):
                due = queue[0][0]
        ready, _, _ = select.select(watched, [], [], None if due is None else max(0.0, due - now))
        if stop in ready:
            return
        came = time.monotonic()
        for fd in ready:
            while True:
                try:
                    frame = os.read(fd, MTU + 64)
                except BlockingIOError:
                    break
                owed[other[fd]].append((came + delay, frame))


def main(argv: list[str]) -> int:
    delay = float(argv[0])
    (ns_a, dev_a), (ns_b, dev_b) = (spec.split(":") for spec in argv[1:3])
    ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    a = open_tap(ns_a, dev_a)
    b = open_tap(ns_b, dev_b)
    print("ready", flush=True)
    relay(a, b, delay, sys.stdin.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
