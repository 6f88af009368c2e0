"""The test servers that pick their ports before they start (the local Cluster's nodes, the
Sentinel group's servers) start again on another port when something took theirs meanwhile:
on a busy machine a client's outgoing connection can land on a port between its pick and the
server's bind, and a test must not fail for that alone."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from .support import cluster as cluster_support
from .support import sentinel as sentinel_support


@pytest.fixture
def taken() -> Iterator[int]:
    """A port on loopback that a listening socket holds."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        yield squatter.getsockname()[1]


def test_a_cluster_whose_port_was_taken_starts_on_new_ports(
    monkeypatch: pytest.MonkeyPatch, taken: int
) -> None:
    real = cluster_support._free_ports
    picks: list[list[int]] = []

    def first_taken(n: int) -> list[int]:
        ports = real(n)
        if not picks:
            ports[0] = taken
        picks.append(ports)
        return ports

    monkeypatch.setattr(cluster_support, "_free_ports", first_taken)
    with cluster_support.LocalCluster(primaries=1, replicas=0) as cluster:
        assert len(picks) == 2  # the second start, on new ports
        assert cluster.nodes[0].port != taken
        with redis.Redis(port=cluster.nodes[0].port, socket_timeout=10) as r:
            assert r.ping()


def test_a_sentinel_groups_server_whose_port_was_taken_starts_on_another(
    monkeypatch: pytest.MonkeyPatch, taken: int, tmp_path: Path
) -> None:
    real = sentinel_support.free_port
    picks: list[int] = []

    def first_taken() -> int:
        port = taken if not picks else real()
        picks.append(port)
        return port

    monkeypatch.setattr(sentinel_support, "free_port", first_taken)
    group = sentinel_support.SentinelGroup(tmp_path, replicas=0)
    try:
        assert picks[0] == taken
        assert group.primary.port == picks[1] != taken
        assert group.primary.ping()
        assert [n.name for n in group.nodes].count("primary") == 1
    finally:
        group.close()
