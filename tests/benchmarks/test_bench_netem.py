"""``bench/netem.py``'s links and ``bench/tap_relay.py``: a delay really delays, a relay survives frames its far
device cannot take yet, and nothing (namespace, relay process) outlives a run.  Root only; not a timing test (the
only bound on time is the delay's own lower one, which no load can break)."""
from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from bench import netem

pytestmark = [pytest.mark.skipif(netem.refusal() is not None, reason=str(netem.refusal())),
              pytest.mark.slow]   # bench infrastructure: namespaces, devices, a relay process


def relays_running() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "bench.tap_relay" in " ".join(p.cmdline())]


def test_a_delayed_link_delays_each_way_and_leaves_nothing_behind():
    with netem.links([("0", 0.0), ("1ms", 1e-3)]) as (made, info):
        kinds = {link.label: link.kind for link in made}
        assert kinds["0"] == netem.VETH and kinds["1ms"] in (netem.NETEM, netem.RELAY)
        assert info["1ms"]["link"] == kinds["1ms"]
        # A frame cannot leave before its delay has passed, on any machine: a round trip crosses the link twice.
        assert info["1ms"]["round_trip_us"]["p50"] >= 2000
        assert info["0"]["round_trip_us"]["p50"] < info["1ms"]["round_trip_us"]["p50"]
        assert (kinds["1ms"] == netem.RELAY) == bool(relays_running())
    assert not netem._ours() and not relays_running()


def test_a_relay_drops_frames_for_a_device_not_up_yet_and_keeps_relaying():
    """The first frames (an ARP request here) can come while the far device is still down, where writing them
    fails with EIO: the relay drops them, as a link would, instead of ending (and taking both devices with it)."""
    a, b = f"{netem.PREFIX}relay-a", f"{netem.PREFIX}relay-b"
    for ns in (a, b):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    relay = subprocess.Popen([sys.executable, "-m", "bench.tap_relay", "0", f"{a}:tap-a", f"{b}:tap-b"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert relay.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "-n", a, "addr", "add", "10.213.250.1/30", "dev", "tap-a"], check=True)
        subprocess.run(["ip", "-n", a, "link", "set", "tap-a", "up"], check=True)
        # a datagram from a's side makes its kernel ask for b's address (ARP): that frame is relayed to tap-b, down
        subprocess.run(["ip", "netns", "exec", a, sys.executable, "-c",
                        "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', "
                        "('10.213.250.2', 9))"], check=True)
        time.sleep(0.3)
        assert relay.poll() is None, "the relay ended on a frame for a device that is down"
        subprocess.run(["ip", "-n", b, "addr", "add", "10.213.250.2/30", "dev", "tap-b"], check=True)
        subprocess.run(["ip", "-n", b, "link", "set", "tap-b", "up"], check=True)
        assert netem.round_trip_us(netem.Link("0", 0.0, a, b, "10.213.250.1", "10.213.250.2"), calls=20)["p50"] > 0
    finally:
        relay.stdin.close()
        relay.wait(5)
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert relay.returncode == 0   # it ended because its input did, not on an error
