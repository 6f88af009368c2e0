"""Every Redis key name aioqueue uses is built here and nowhere else.

All keys of one queue share the hash tag ``{<queue>}``, so every script touches a single cluster
slot::

    <prefix>:{<queue>}:job:<id>     HASH   one job: task, payload, state, attempts, lease, result...
    <prefix>:{<queue>}:ready        LIST   runnable job ids, no group, priority 0 (the fast lane)
    <prefix>:{<queue>}:prio         ZSET   runnable job ids with a non-zero priority
    <prefix>:{<queue>}:scheduled    ZSET   delayed job ids, score = due time (server ms)
    <prefix>:{<queue>}:active       ZSET   leased job ids, score = lease deadline (server ms)
    <prefix>:{<queue>}:dead         ZSET   dead-lettered job ids, score = time of death (server ms)
    <prefix>:{<queue>}:completed    ZSET   completed job ids whose record is kept, score = finish
                                           time (server ms); the newest 100,000 (for listing)
    <prefix>:{<queue>}:cancelled    ZSET   cancelled job ids, score = time of cancellation (server
                                           ms); the newest 100,000 (for listing). reap drops
                                           the oldest entries of both whose record expired
    <prefix>:{<queue>}:wake         LIST   at most one token: wakes one idle consumer
    <prefix>:{<queue>}:seq          STRING counter for lease tokens and priority FIFO order
    <prefix>:{<queue>}:done         pub/sub channel: ids of awaited jobs as they finish
    <prefix>:{<queue>}:stats        HASH   counters: enqueued, completed, failed, retried, ...
    <prefix>:{<queue>}:backlog      HASH   the exact count of queued and scheduled jobs: field
                                           "t:<task>" (at most 100), the rest in "*" (lib/core)
    <prefix>:{<queue>}:twait        ZSET   task -> the longest wait (ms) of its jobs started
                                           since the last trend sample (lib/core, lib/trends)
    <prefix>:{<queue>}:tp           HASH   jobs completed / dead-lettered per minute, field
                                           "<c|f>:<minute>" (about two hours kept)
    <prefix>:{<queue>}:tr:m:<minute> HASH  trends of a minute (kept 61 minutes), tr:h:<hour> of
                                           an hour (kept 7 days): "<c|f>:<task>" jobs ended
                                           so, b and w the highest backlog and wait (ms)
                                           sampled (lua/lib/trends.lua)
    <prefix>:{<queue>}:reaplock     STRING maintenance lock: one reaper per period
    <prefix>:{<queue>}:testclock    STRING the virtual clock's offset (ms), read only by Apps
                                           made with testing=True (see _store/clock.py)
    <prefix>:{<queue>}:idle         ZSET   workers parked idle, waiting for a hand-off, by the
                                           end of their registration (server ms)
    <prefix>:{<queue>}:idlew        HASH   worker -> "want lease_ms dead_ttl_ms" of its parking
    <prefix>:{<queue>}:hand:<wid>   LIST   jobs leased to a parked worker by enqueue, 7 values
                                           each as in claim's reply (expires with the lease)

Worker registry (see lua/lib/workers.lua and lua/beat.lua)::

    <prefix>:{<queue>}:workers      ZSET   worker id -> deadline of its next heartbeat (server
                                           ms); a worker past it is dead and gets buried
    <prefix>:{<queue>}:worker:<wid> HASH   host, pid, ver, queues, conc, st (started ms), beat
                                           (last beat ms), done, failed, ln and sn (lease
                                           ordinals given and started); expires
    <prefix>:{<queue>}:worker:<wid>:jobs  SET  the jobs leased to that worker
    <prefix>:{<queue>}:tasks        HASH   task name -> "<wid> <wid>...\n<defaults JSON>": the
                                           task table (lua/tasks.lua, _tasktable.py)

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
    <prefix>:{<queue>}:outbox:garbled LIST outbox entries that could not be read, set aside

Dependencies (see lua/lib/deps.lua; docs/workflows.md)::

    <prefix>:{<queue>}:waiting      ZSET   jobs waiting for dependencies, by when they began
    <prefix>:{<queue>}:deps:<id>    SET    the dependencies job <id> still waits for (members:
                                           their queue's key base followed by their id)
    <prefix>:{<queue>}:dependents:<id> SET the jobs waiting for job <id> (members likewise), once
                                       it has two (a lone one is in its record's dd)
A job's extras, which live and die with its record (see extras_of in lua/lib/core.lua)::

    <prefix>:{<queue>}:step:<id>    HASH   its durable steps' results (lua/step.lua): field
                                           "s:<name>", and "ct" its record's creation time
    <prefix>:{<queue>}:log:<id>     LIST   its log lines, the newest last, capped (lua/joblog.lua)
    <prefix>:{<queue>}:depres:<id>  HASH   the results of its completed dependencies, kept for
                                           it (lua/lib/deps.lua): member -> result as stored
    <prefix>:{<queue>}:evt:<key>    SET    jobs parked waiting for event <key> (lua/wait.lua,
                                           lua/signal.lua); expires after its last waiter's end

Job events (see lua/lib/events.lua; off unless qconf has ``events``, the cap)::

    <prefix>:{<queue>}:events       STREAM an entry per event (k kind, j job id, t task, a attempt,
                                           w worker, r reason, d due ms) or per loop of events
                                           (k, n, e: JSON); capped

Garbage (I9: see lua/lib/core.lua)::

    <prefix>:{<queue>}:garbled      HASH   quarantined keys: aside key -> JSON {key, reason, at}
    <key>:garbled:<ms>              any    a key of the wrong type or a garbage counter, renamed
                                           aside by the script that met it (kept for inspection)

Periodic schedules (see lua/schedule.lua and lua/schedules.lua)::

    <prefix>:{<queue>}:cron:defs    HASH   schedule name -> its definition (JSON: task, cron or
                                           every_ms, tz, args, kwargs, missed, jitter_ms, ...)
    <prefix>:{<queue>}:cron:next    ZSET   schedule name -> its next tick (epoch ms); the tick's
                                           job has the id ``cron:<name>:<tick ms>``
    <cron:defs>:<name>:garbled:<ms> STRING a definition set aside (garbled, or unsigned), and
    <cron:next>:garbled:<ms>        ZSET   ticks set aside in one pass; both listed in garbled

Unique jobs (see lua/enqueue.lua, lua/replace.lua and ``unlock`` in lua/lib/core.lua)::

    <prefix>:{<queue>}:unique:<key> STRING the id of the job that holds unique key <key>; its
                                           TTL is ``unique_for``; freed by the script that
                                           ends the job's scope (its record's field ``uk``)
"""

from __future__ import annotations

from dataclasses import dataclass


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
    def testclock(self) -> str:
        """The virtual clock's offset (ms; test mode only, see _store/clock.py)."""
        return self.base + "testclock"

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
    def completed(self) -> str:
        """The index of completed jobs (listing only; trimmed to its newest entries)."""
        return self.base + "completed"

    @property
    def cancelled(self) -> str:
        """The index of cancelled jobs (listing only; trimmed to its newest entries)."""
        return self.base + "cancelled"

    @property
    def waiting(self) -> str:
        """The index of jobs waiting for their dependencies (listing only)."""
        return self.base + "waiting"

    def deps(self, job_id: str) -> str:
        """The dependencies job ``job_id`` still waits for (SET of members)."""
        return f"{self.base}deps:{job_id}"

    def dependents(self, job_id: str) -> str:
        """The jobs waiting for job ``job_id`` (SET of members)."""
        return f"{self.base}dependents:{job_id}"

    def member(self, job_id: str) -> str:
        """Job ``job_id`` of this queue named from any queue (dependencies, batches)."""
        return self.base + job_id

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
    def workers(self) -> str:
        return self.base + "workers"

    def worker(self, worker_id: str) -> str:
        return f"{self.base}worker:{worker_id}"

    def worker_jobs(self, worker_id: str) -> str:
        return f"{self.base}worker:{worker_id}:jobs"

    @property
    def seq(self) -> str:
        return self.base + "seq"

    def batch(self, batch_id: str) -> str:
        return f"{self.base}batch:{batch_id}"

    @property
    def outbox(self) -> str:
        return self.base + "outbox"

    @property
    def outbox_garbled(self) -> str:
        return self.base + "outbox:garbled"

    @property
    def garbled(self) -> str:
        return self.base + "garbled"

    def steps(self, job_id: str) -> str:
        """A job's durable steps' results (built by the scripts as base.."step:"..id)."""
        return f"{self.base}step:{job_id}"

    def event(self, key: str) -> str:
        """The jobs waiting for event ``key`` (built by the scripts as base.."evt:"..key)."""
        return f"{self.base}evt:{key}"

    def dep_results(self, job_id: str) -> str:
        """The results of job ``job_id``'s dependencies kept for it (built by the scripts as
        base.."depres:"..id)."""
        return f"{self.base}depres:{job_id}"

    def job_log(self, job_id: str) -> str:
        """A job's log (built by the scripts as base.."log:"..id)."""
        return f"{self.base}log:{job_id}"

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
    def cron_defs(self) -> str:
        return self.base + "cron:defs"

    @property
    def cron_next(self) -> str:
        return self.base + "cron:next"

    def unique(self, key: str) -> str:
        """The lock of unique key ``key`` (built by the scripts as base.."unique:"..key)."""
        return self.base + "unique:" + key

    @property
    def reap_lock(self) -> str:
        return self.base + "reaplock"

    @property
    def stats(self) -> str:
        return self.base + "stats"

    @property
    def backlog(self) -> str:
        return self.base + "backlog"

    @property
    def task_waits(self) -> str:
        """The longest waits of the jobs started per task since the last trend sample."""
        return self.base + "twait"

    def trend(self, res: str, bucket: int) -> str:
        """The trends of one bucket: ``res`` "m" (minute ``bucket`` of the epoch) or "h" (hour)."""
        return f"{self.base}tr:{res}:{bucket}"

    @property
    def throughput(self) -> str:
        return self.base + "tp"

    @property
    def events(self) -> str:
        return self.base + "events"

    @property
    def lwait(self) -> str:
        """ZSET: limit keys this queue's jobs wait on -> when to look again (limiters.lua)."""
        return self.base + "lwait"

    def limit_waiting(self, state: str) -> str:
        """LIST: this queue's jobs waiting aside on limit key ``state`` (limiters.lua)."""
        return f"{self.base}lw:{state}"

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


# --------------------------------------------------------------------- keys of no one queue
def queues_registry(prefix: str) -> str:
    """``<prefix>:queues`` (ZSET): the real queues, name -> last seen (``_queue/queuereg.py``)."""
    return f"{prefix}:queues"


def limiter_settings(base: str, name: str) -> str:
    """``<base>lim:<name>`` (HASH): limiter ``name``'s run-time settings; ``base`` is the
    prefix's ``<prefix>:`` (shared by its queues) or, on a Cluster, a queue's key base
    (``_store/lua/lib/limiters.lua``)."""
    return f"{base}lim:{name}"


def limiter_state(base: str, name: str, key: str) -> str:
    """``<base>lim:{<name>:<key>}`` (HASH, with ``:h`` and ``:log``): the state of limiter
    ``name``'s key ``key`` (its own hash tag, after the queue's on a Cluster)."""
    return f"{base}lim:{{{name}:{key}}}"


def prefix_testclock(prefix: str) -> str:
    """``<prefix>:testclock`` (STRING): the virtual clock's offset for every queue of the
    prefix whose own ``testclock`` is unset (test mode only, standalone servers; see
    ``_store/clock.py``)."""
    return f"{prefix}:testclock"


def queue_head(prefix: str) -> str:
    """``<prefix>:{``: how every key of every queue under ``prefix`` starts."""
    return f"{prefix}:{{"


def split_queue_member(prefix: str, member: str) -> tuple[str, str] | None:
    """A member written as ``<key base of its queue><id>`` (a batch's sub-job on another
    queue) as (queue name, job id); None for a plain job id."""
    head = queue_head(prefix)
    if member.startswith(head) and "}:" in member:
        name, _, job_id = member[len(head) :].partition("}:")
        return name, job_id
    return None


def schedule_defs_pattern(prefix: str) -> str:
    """SCAN pattern of every queue's ``cron:defs`` key under ``prefix``."""
    return f"{prefix}:{{*}}:cron:defs"


def counters_pattern(prefix: str) -> str:
    """SCAN pattern that matches every queue's ``stats`` and ``workers`` keys under ``prefix``
    (and a few more, which the caller filters)."""
    return f"{prefix}:{{*}}:[sw][to][ar][tk]*"


def aside_key(key: str, ms: int) -> str:
    """``<key>:garbled:<ms>``: where garbage met in ``key`` is set aside (I9)."""
    return f"{key}:garbled:{ms}"
