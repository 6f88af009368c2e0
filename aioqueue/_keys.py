"""Every Redis key name aioqueue uses is built here and nowhere else.

All keys of one queue share the hash tag ``{<queue>}``, so every script touches a single cluster
slot::

    <prefix>:{<queue>}:job:<id>     HASH   one job: task, payload, state, attempts, lease, result...
    <prefix>:{<queue>}:ready        LIST   runnable job ids, no group, priority 0 (the fast lane)
    <prefix>:{<queue>}:prio         ZSET   runnable job ids with a non-zero priority
    <prefix>:{<queue>}:scheduled    ZSET   delayed job ids, score = due time (server ms)
    <prefix>:{<queue>}:active       ZSET   leased job ids, score = lease deadline (server ms)
    <prefix>:{<queue>}:dead         ZSET   dead-lettered job ids, score = time of death (server ms)
    <prefix>:{<queue>}:wake         LIST   at most one token: wakes one idle consumer
    <prefix>:{<queue>}:seq          STRING counter for lease tokens and priority FIFO order
    <prefix>:{<queue>}:done         pub/sub channel: ids of awaited jobs as they finish
    <prefix>:{<queue>}:stats        HASH   counters: enqueued, completed, failed, retried, ...
    <prefix>:{<queue>}:tp           HASH   jobs completed / dead-lettered per minute, field
                                           "<c|f>:<minute>" (about two hours kept)
    <prefix>:{<queue>}:reaplock     STRING maintenance lock: one reaper per period
    <prefix>:{<queue>}:idle         ZSET   workers parked idle, waiting for a hand-off, by the
                                           end of their registration (server ms)
    <prefix>:{<queue>}:idlew        HASH   worker -> "want lease_ms dead_ttl_ms" of its parking
    <prefix>:{<queue>}:hand:<wid>   LIST   jobs leased to a parked worker by enqueue, 7 values
                                           each as in claim's reply (expires with the lease)

Quality of service (see lua/lib/lanes.lua and lua/lib/leasing.lua for how claim uses them)::

    <prefix>:{<queue>}:qconf        HASH   queue settings: paused, rate limit, group defaults
    <prefix>:{<queue>}:ring         ZSET   lanes that can be served now ('' = no group), by turn
    <prefix>:{<queue>}:g:<group>    ZSET   a group's runnable job ids, by priority then FIFO
    <prefix>:{<queue>}:gactive      HASH   group -> its jobs active now
    <prefix>:{<queue>}:gconf        HASH   per-group settings: limit:, rate_n:, rate_ms:, paused:
    <prefix>:{<queue>}:gwait        ZSET   groups out of rate, by the time their window opens
    <prefix>:{<queue>}:qrate:<w>    STRING jobs started in queue rate window w (expires)
    <prefix>:{<queue>}:grate:<g>:<w> STRING jobs of group g started in its rate window w

Fan-out / fan-in (see lua/lib/batches.lua)::

    <prefix>:{<queue>}:batch:<id>   HASH   a batch homed on this queue (+ :all :seen :res :err)
    <prefix>:{<queue>}:outbox       LIST   outcomes of this queue's sub-jobs of batches homed on
                                           other queues, waiting to be handed over

Reserved for later capabilities (same hash tag): ``cron:*``, ``unique:*``, ``workers``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._exceptions import ConfigurationError

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")


def check_name(kind: str, value: str) -> str:
    """Validate a queue name or key prefix: no braces, so the hash tag stays intact."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigurationError(
            f"invalid {kind} {value!r}: use 1-200 characters from A-Z a-z 0-9 _ . : -"
        )
    return value


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Key names of one queue."""

    prefix: str
    queue: str

    @property
    def base(self) -> str:
        """The common prefix of every key of this queue, ending in ``:``."""
        return f"{self.prefix}:{{{self.queue}}}:"

    def job(self, job_id: str) -> str:
        return f"{self.base}job:{job_id}"

    @property
    def done_channel(self) -> str:
        """Pub/sub channel on which finished jobs that someone awaits are announced."""
        return self.base + "done"

    @property
    def ready(self) -> str:
        return self.base + "ready"

    @property
    def prio(self) -> str:
        return self.base + "prio"

    @property
    def scheduled(self) -> str:
        return self.base + "scheduled"

    @property
    def active(self) -> str:
        return self.base + "active"

    @property
    def dead(self) -> str:
        return self.base + "dead"

    @property
    def wake(self) -> str:
        return self.base + "wake"

    @property
    def idle(self) -> str:
        return self.base + "idle"

    @property
    def idlew(self) -> str:
        return self.base + "idlew"

    def hand(self, worker_id: str) -> str:
        return f"{self.base}hand:{worker_id}"

    @property
    def seq(self) -> str:
        return self.base + "seq"

    def batch(self, batch_id: str) -> str:
        return f"{self.base}batch:{batch_id}"

    @property
    def outbox(self) -> str:
        return self.base + "outbox"

    def lane(self, group: str) -> str:
        return f"{self.base}g:{group}"

    @property
    def qconf(self) -> str:
        return self.base + "qconf"

    @property
    def ring(self) -> str:
        return self.base + "ring"

    @property
    def gactive(self) -> str:
        return self.base + "gactive"

    @property
    def gconf(self) -> str:
        return self.base + "gconf"

    @property
    def gwait(self) -> str:
        return self.base + "gwait"

    @property
    def reap_lock(self) -> str:
        return self.base + "reaplock"

    @property
    def stats(self) -> str:
        return self.base + "stats"

    @property
    def throughput(self) -> str:
        return self.base + "tp"

    def lanes(self) -> list[str]:
        """KEYS shared by the scripts that move jobs between states, in their fixed order."""
        return [
            self.ready,
            self.prio,
            self.scheduled,
            self.active,
            self.dead,
            self.wake,
            self.seq,
            self.stats,
            self.qconf,
            self.ring,
            self.gactive,
            self.gconf,
            self.gwait,
        ]
