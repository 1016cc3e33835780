"""Free TCP ports for the test servers, chosen where nothing else takes them.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` lies in the ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 here), the same range every outgoing
connection's local port is drawn from. Between the moment a test picks such a port and the moment
its server binds it, any client connection on the machine (a test's HTTP request, a worker's
database connection) may take it, and the server fails with "address already in use" (SeaweedFS
binds a dozen ports, so it was the one this hit).

So a server's port is drawn at random from below the ephemeral range (:data:`LOW` up to the
range's start), where the kernel never assigns a client's port, and checked free by binding it.
Two pytest-xdist workers may still draw the same port at once; :func:`free_port` makes that
unlikely (random over thousands of ports) and a server start that fails on a bind may be retried
(:func:`shared_service.start_with_retries`).
"""

from __future__ import annotations

import random
import socket

#: the lowest port handed out (above the well-known and the usual service ports)
LOW = 20000


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (32768 if it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` just now, below the ephemeral range (the caller binds it soon
    after). Falls back to a kernel-chosen port if no port below the range is free in 200 draws."""
    high = ephemeral_start()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(LOW, max(high, LOW + 1000))
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
