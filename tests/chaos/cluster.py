"""The chaos soak's server when it runs on a local cluster (``--cluster``): the cluster, its
failover (the soak's server crash), the clients of every node, and the replication
checkpoint that bounds what a failover may lose.

A failover here: a write on the queue's primary, ``WAIT`` until its replica has it (every
write acknowledged before it is then on the replica: one ordered stream), SIGKILL the primary
at once, promote the replica (``CLUSTER FAILOVER TAKEOVER``); the killed node stays down.
What was acknowledged between the checkpoint and the kill is the window asynchronous
replication may lose.
"""

from __future__ import annotations

import time
from typing import Any

import redis
import redis.exceptions as rexc
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from ..support.cluster import LocalCluster


class ClusterServer:
    """The soak's view of a local cluster, with the queue whose slot it fails over."""

    def __init__(self, queue_key: str) -> None:
        self.cluster = LocalCluster()
        self.queue_key = queue_key
        #: (checkpoint ms, kill ms) of each failover: acknowledged writes in it may be lost
        self.windows: list[tuple[int, int]] = []

    @property
    def url(self) -> str:
        return self.cluster.url

    def start(self) -> None:
        self.cluster.start()

    def stop(self) -> None:
        self.cluster.stop()

    def failover(self) -> None:
        """Kill the queue's primary after a replication checkpoint; promote its replica."""
        primary = self.cluster.primary_for(self.queue_key)
        replica = self.cluster.replica_of(primary)
        with redis.Redis(port=primary.port, socket_timeout=10) as r:
            r.set(self.queue_key.replace("stats", "checkpoint"), time.time())
            r.execute_command("WAIT", 1, 5000)
        checkpoint_ms = time.time_ns() // 1_000_000
        self.cluster.kill(primary)
        self.windows.append((checkpoint_ms, time.time_ns() // 1_000_000))
        # the killed node stays down: restarted, it would claim its old slots (on empty data)
        # until gossip told it otherwise, which is a fault of its own
        self.cluster.promote(replica)

    # the soak calls these for a server restart and a server crash
    restart = failover
    kill_and_restart = failover

    def client_list(self) -> list[dict[str, Any]]:
        """``CLIENT LIST`` of every running node, each entry with its node's port."""
        out = []
        for node in self.cluster.running():
            with node.client() as r:
                for c in r.client_list():
                    out.append({**c, "port": node.port})
        return out

    def client_kill(self, port: int, cid: str) -> None:
        with redis.Redis(port=port, socket_timeout=10) as r:
            r.execute_command("CLIENT", "KILL", "ID", cid)

    def admin(self) -> Redis:
        """The soak's own client on the cluster: retries through killed connections and the
        failover."""
        seed = self.cluster.nodes[0].port
        client = RedisCluster(
            host="127.0.0.1",
            port=seed,
            client_name="chaos-admin",
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), 100),
            retry_on_error=[rexc.ConnectionError, rexc.TimeoutError],
        )
        return client  # type: ignore[return-value]
