"""The door to Redis for blocking producers (``app.sync()``): the same scripts and reads as
``_scripts.QueueScripts``, on redis-py's blocking client, for code that has no event loop
(Django and Flask views, scripts). Only what a producer needs: enqueue, watch, cancel and the
inspection reads. Each call is bounded by the client's socket timeout and raises
``ServerUnavailable`` when the server cannot be reached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import redis
import redis.exceptions as rexc

from .._model.keys import QueueKeys
from .._model.record import JobRecord, Template
from .cluster import MOVING_ERRORS, every_primary, is_cluster, slot_runs
from .loader import (
    SCRIPTS,
    Script,
    ScriptCall,
    enqueue_calls,
    enqueue_run_calls,
    function_missing,
    group_names,
    library_of,
    parse_watch,
    pipeline_failures,
    read_group_names,
    read_lane_counts,
    wrap_redis_error,
)
from .wire import build_of, evalsha_command, use_functions

T = TypeVar("T")


def blocking_call(call: Callable[[], T]) -> T:
    """Run one blocking call to Redis with connection errors wrapped in aioqueue's."""
    try:
        return call()
    except (rexc.ConnectionError, rexc.TimeoutError, *MOVING_ERRORS, OSError) as exc:
        raise wrap_redis_error(exc) from exc


def load_library_blocking(client: redis.Redis) -> None:
    """Load the function library on a new blocking client: its calls are then FCALLs; where
    the server has no functions (or the ACL user may not load them), EVALSHAs."""

    def load() -> None:
        try:
            client.execute_command("FUNCTION", "LOAD", library_of(client).source)  # type: ignore[no-untyped-call]
        except rexc.ResponseError as exc:
            if "already exists" not in str(exc):
                use_functions(client, False)
                return
        use_functions(client, True)

    blocking_call(load)


def evalsha_blocking(
    client: redis.Redis, script: Script, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    """Run a script (FCALL, or EVALSHA) on a blocking client, loading it first if the server
    does not know it (function not found, NOSCRIPT)."""
    command = evalsha_command(client, script, keys, args)

    def run() -> Any:
        try:
            return client.execute_command(*command)  # type: ignore[no-untyped-call]
        except rexc.NoScriptError:
            load = (
                "SCRIPT",
                "LOAD",
                build_of(client, script).source,
            )  # on a cluster, on every primary
            client.execute_command(*load, **every_primary(client))  # type: ignore[no-untyped-call]
        except rexc.ResponseError as exc:
            if not function_missing(exc):
                raise
            client.execute_command("FUNCTION", "LOAD", library_of(client).source)  # type: ignore[no-untyped-call]
        return client.execute_command(*command)  # type: ignore[no-untyped-call]

    return blocking_call(run)


class BlockingScripts:
    """The blocking door to one queue's keys: a method per script and read a producer uses."""

    __slots__ = ("base", "client", "keys", "lanes")

    def __init__(self, client: redis.Redis, keys: QueueKeys) -> None:
        self.client = client
        self.keys = keys
        self.lanes = tuple(keys.lanes())
        self.base = keys.base

    def run(self, name: str, args: Sequence[Any]) -> Any:
        """Call script ``name`` on this queue's lanes: the raw reply."""
        return evalsha_blocking(self.client, SCRIPTS[name], self.lanes, args)

    def _calls(self, calls: Sequence[ScriptCall]) -> None:
        if len(calls) == 1:
            evalsha_blocking(self.client, *calls[0])
        elif is_cluster(self.client):  # a cluster pipeline's nodes run at once: slot by slot
            for run in slot_runs(calls, lambda call: call[1]):
                self._pipeline(run)
        elif calls:
            self._pipeline(calls)

    def _pipeline(self, calls: Sequence[ScriptCall]) -> None:
        if len(calls) == 1:
            evalsha_blocking(self.client, *calls[0])
        else:
            pipe = self.client.pipeline(transaction=False)
            for script, keys, args in calls:
                pipe.execute_command(*evalsha_command(self.client, script, keys, args))  # type: ignore[no-untyped-call]
            results = blocking_call(lambda: pipe.execute(raise_on_error=False))
            for i in pipeline_failures(results):
                evalsha_blocking(self.client, *calls[i])

    def enqueue(self, jobs: Sequence[JobRecord]) -> None:
        self._calls(enqueue_calls(self.lanes, self.base, jobs))

    def enqueue_run(self, template: Template, pairs: list[Any]) -> None:
        self._calls(enqueue_run_calls(self.lanes, self.base, template, pairs))

    def watch(self, job_id: str, register: bool) -> tuple[str, bytes, bytes]:
        return parse_watch(self.run("watch", (self.base, job_id, 1 if register else 0, "job")))

    def cancel(self, ids: Sequence[str], dead_ttl_ms: int) -> tuple[int, int]:
        res = self.run("cancel", (self.base, dead_ttl_ms, *ids))
        return int(res[0]), int(res[1])

    def job_record(self, job_id: str) -> dict[bytes, bytes]:
        key = self.keys.job(job_id)
        return cast(dict[bytes, bytes], blocking_call(lambda: self.client.hgetall(key)))

    def lane_counts(self) -> tuple[int, int, int, int, int]:
        pipe = self.client.pipeline(transaction=False)
        read_lane_counts(pipe, self.keys)
        ready, prio, sched, active, dead = blocking_call(pipe.execute)
        return ready, prio, sched, active, dead

    def group_counts(self) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        read_group_names(pipe, self.keys)
        groups = group_names(blocking_call(pipe.execute))
        pipe = self.client.pipeline(transaction=False)
        for g in groups:
            pipe.zcard(self.keys.lane(g))
        sizes = blocking_call(pipe.execute)
        return {g: n for g, n in zip(groups, sizes, strict=True) if n}
