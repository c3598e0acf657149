"""Two "machines" on one host: two network namespaces joined by a veth pair (needs root and ``ip``).

Used by the node tests (tests/integration/test_nodes.py) and the benchmarks that measure a link between nodes
(benchmarks/scaling_model.py, benchmarks/sampler_nodes.py).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def netns_available() -> str | None:
    """Why network namespaces cannot be made here (``ip netns add``'s message), or None: they can."""
    name = f"msfprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return (r.stderr or r.stdout).strip() or "ip netns add failed"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


@dataclass(frozen=True)
class VethPair:
    """Namespace ``ns[i]`` holds interface ``veth[i]`` with address ``addrs[i]`` (a /24), and its loopback."""

    ns: tuple[str, str]
    veth: tuple[str, str]
    addrs: tuple[str, str]

    def prefix(self, i: int) -> list[str]:
        """The command prefix that runs a command in namespace ``i``."""
        return ["ip", "netns", "exec", self.ns[i]]


@contextmanager
def veth_pair(name: str, subnet: str) -> Iterator[VethPair]:
    """Make two namespaces ``{name}{pid}a`` / ``b`` joined by a veth pair with addresses ``{subnet}.1`` and
    ``{subnet}.2`` (``subnet``: the first three octets); delete them (and so the pair) on exit.

    Raises:
        subprocess.CalledProcessError: an ``ip`` command failed (not root, no ``ip``, a name in use).
    """
    tag = f"{name}{os.getpid() % 100000}"[-10:]  # interface names: at most 15 characters
    pair = VethPair((f"{tag}a", f"{tag}b"), (f"v{tag}a", f"v{tag}b"), (f"{subnet}.1", f"{subnet}.2"))

    def ip(*a: str) -> None:
        subprocess.run(["ip", *a], check=True, capture_output=True)

    try:
        for n in pair.ns:
            ip("netns", "add", n)
        ip("link", "add", pair.veth[0], "type", "veth", "peer", "name", pair.veth[1])
        for n, v, a in zip(pair.ns, pair.veth, pair.addrs):
            ip("link", "set", v, "netns", n)
            ip("-n", n, "addr", "add", f"{a}/24", "dev", v)
            ip("-n", n, "link", "set", v, "up")
            ip("-n", n, "link", "set", "lo", "up")
        yield pair
    finally:
        for n in pair.ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
