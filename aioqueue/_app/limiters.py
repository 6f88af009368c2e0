"""Named limiters (docs/flow-control.md): declared, bound to jobs, held by code, changed.

``app.limiter`` declares one; the jobs of the tasks that opt in (``@app.task(limits=[...])``)
carry their limits in their options, and the claim script admits a job only when every limit
it needs does (_store/lua/lib/limiters.lua); ``async with app.limit(...)`` holds them in code;
``app.limiters.set`` changes them at run time and ``app.limiters.state`` reads one (for
``why`` and the dashboard).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, cast

from .._model.checks import check_name
from .._model.exceptions import ConfigurationError
from .._model.keys import QueueKeys, limiter_settings, limiter_state, queues_registry
from .._model.record import JobOptions
from .._store.cluster import is_cluster, server_time
from .._store.loader import SCRIPTS, evalsha

if TYPE_CHECKING:
    import redis.asyncio as aioredis


class App(Protocol):
    """What limiters use of the App (``app.App``; a protocol: no import cycle)."""

    @property
    def prefix(self) -> str: ...
    @property
    def default_queue(self) -> str: ...
    @property
    def lease(self) -> float: ...
    @property
    def redis(self) -> aioredis.Redis: ...

    @property
    def limiters(self) -> Mapping[str, Limiter]: ...

    @property
    def tasks(self) -> Mapping[str, Any]: ...


#: the most limits one job (or one ``app.limit``) may need (_store/lua/lib/limiters.lua agrees)
MAX_JOB_LIMITS = 8
#: the longest limiter name, and limit key (a longer key is replaced by its SHA-1)
MAX_LIMIT_TEXT = 200
#: the highest concurrency a limiter may have (_store/lua/lib/limiters.lua's MAX_HOLDERS)
MAX_CONCURRENCY = 1000


@dataclass(frozen=True, slots=True)
class Limiter:
    """A named limit: at most ``rate[0]`` starts per ``rate[1]`` seconds (GCRA: evenly spaced,
    ``burst`` at once at most) and at most ``concurrency`` running at once; with ``key``, one
    such limit per value of ``key(*args, **kwargs)`` of the job's arguments."""

    name: str
    rate: tuple[int, float] | None
    burst: int
    concurrency: int | None
    key: Callable[..., object] | None

    def entry(self, key: str) -> list[Any]:
        """The job option's entry (_store/lua/lib/limiters.lua): name, key, n, period ms, burst,
        concurrency (0 none)."""
        n, per = self.rate or (0, 0.0)
        return [self.name, key, n, round(per * 1000), self.burst, self.concurrency or 0]


@dataclass(frozen=True, slots=True)
class LimiterState:
    """What one limit key holds now (``app.limiters.state``), by the server's clock."""

    name: str
    key: str
    now_ms: int
    #: GCRA's theoretical arrival time (server ms; None: never used or expired)
    tat_ms: float | None
    #: starts it would admit right now by its rate (None: no rate known yet)
    tokens: int | None
    #: when its rate admits the next start (server ms; now when it admits one now)
    next_admit_ms: int
    #: concurrency slots held now (stale holders included until a claim drops them)
    holders: int
    #: jobs of the given queue waiting aside for this limit key
    waiting: int
    #: run-time settings (``set_limit``) that win over the declared ones
    overrides: dict[str, str]


def make_limiter(
    name: str,
    rate: tuple[int, float] | None,
    burst: int,
    concurrency: int | None,
    key: Callable[..., object] | None,
) -> Limiter:
    """A checked ``Limiter`` (``ConfigurationError`` for anything out of range)."""
    check_name("limiter name", name)
    if len(name.encode()) > MAX_LIMIT_TEXT or ":" in name:
        raise ConfigurationError(f"limiter name {name!r}: at most 200 bytes, no ':'")
    check_settings(rate, burst, concurrency)
    if rate is None and concurrency is None:
        raise ConfigurationError(f"limiter {name!r}: give rate=, concurrency= or both")
    if key is not None and not callable(key):
        raise ConfigurationError(f"limiter {name!r}: key must be a function of the arguments")
    return Limiter(name, rate, burst, concurrency, key)


def check_settings(
    rate: tuple[int, float] | None, burst: int | None, concurrency: int | None
) -> None:
    if rate is not None:
        n, per = rate
        if not (isinstance(n, int) and 1 <= n <= 1_000_000) or not 0.001 <= per <= 86_400:
            raise ConfigurationError(
                f"rate {rate!r}: (starts, seconds) with 1..1e6 starts per 0.001..86400 s"
            )
    if burst is not None and not (isinstance(burst, int) and 1 <= burst <= 1_000_000):
        raise ConfigurationError(f"burst {burst!r}: an integer 1..1e6")
    if concurrency is not None and not (
        isinstance(concurrency, int) and 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise ConfigurationError(f"concurrency {concurrency!r}: an integer 1..{MAX_CONCURRENCY}")


def key_text(value: object) -> str:
    """A limit key as stored: its text, or the SHA-1 of a text over 200 bytes."""
    text = value if isinstance(value, str) else str(value)
    if len(text.encode()) > MAX_LIMIT_TEXT:
        return "sha1:" + hashlib.sha1(text.encode()).hexdigest()
    return text


def limiter_base(app: App, queue: str) -> str:
    """Where limiters live: under the prefix, shared by every queue (``<prefix>:``); on a
    Cluster in the slot of ``queue`` (its key base), as a script may only touch one slot."""
    if is_cluster(app.redis):
        return QueueKeys(app.prefix, queue).base
    return f"{app.prefix}:"


def state_key(app: App, name: str, key: str, queue: str | None) -> str:
    """The key of the state of limit ``name``'s key ``key`` (lua/lib/limiters.lua)."""
    return limiter_state(limiter_base(app, queue or app.default_queue), name, key)


def bind_limits(task: Any, opts: JobOptions, args: tuple[Any, ...], kwargs: Any) -> JobOptions:
    """``opts`` with the (limiter, key) pairs a job of ``task`` with these arguments needs
    (unchanged when the task needs none, or ``opts`` has them already)."""
    if not task.limits or opts.limits:
        return opts
    out = []
    for name in task.limits:
        lim = declared(task.app, name)
        out.append((name, "" if lim.key is None else key_text(lim.key(*args, **kwargs))))
    return replace(opts, limits=tuple(out))


def limit_option(app: App, queue: str, pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The job options for these (limiter, key) pairs on ``queue``: ``{"lim": ...}``, or
    none without pairs."""
    if not pairs:
        return {}
    entries = [declared(app, name).entry(key) for name, key in pairs]
    return {"lim": {"b": limiter_base(app, queue), "l": entries}}


def declared(app: App, name: str) -> Limiter:
    lim = app.limiters.get(name)
    if lim is None:
        raise ConfigurationError(f"no limiter named {name!r}: declare it with app.limiter()")
    return lim


def limits_of_job(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (limiter, key) pairs a job needs, from its options (its record's ``o``, decoded):
    what ``app.limiters.state`` takes, to tell why a queued job waits. Garbage: none."""
    entries = options.get("lim", {}).get("l") if isinstance(options.get("lim"), dict) else None
    if not isinstance(entries, list):
        return []
    return [
        (e[0], e[1])
        for e in entries
        if isinstance(e, list) and len(e) >= 2 and isinstance(e[0], str) and isinstance(e[1], str)
    ]


def check_task_limits(names: Sequence[str]) -> tuple[str, ...]:
    if isinstance(names, str) or len(names) > MAX_JOB_LIMITS or len(set(names)) != len(names):
        raise ConfigurationError(
            f"limits={names!r}: a list of distinct limiter names, at most {MAX_JOB_LIMITS}"
        )
    return tuple(names)


class Held:
    """``async with app.limit(...)``: waits (without holding anything) until every limit
    admits it, is charged like a job, and gives its concurrency slots back on exit (or, if
    the process dies, after the App's lease)."""

    def __init__(self, app: App, names: Sequence[str], key: object, queue: str) -> None:
        self.app, self.queue = app, queue
        self.names = check_task_limits(names)
        self.key = "" if key is None else key_text(key)
        self.holder = secrets.token_hex(8)

    async def _call(self, op: str, option: str) -> int:
        keys = QueueKeys(self.app.prefix, self.queue)
        args = [keys.base, op, option, self.holder, math.ceil(self.app.lease * 1000)]
        return int(await evalsha(self.app.redis, SCRIPTS["limit"], keys.lanes(), args))

    def _option(self) -> str:
        pairs = [(n, self.key) for n in self.names]
        return json.dumps(limit_option(self.app, self.queue, pairs))

    async def __aenter__(self) -> None:
        option = self._option()
        while True:
            wait = await self._call("acquire", option)
            if wait <= 0:
                return
            await asyncio.sleep(wait / 1000)  # until the limit admits one (the server says when)

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.shield(self._call("release", self._option()))


class Limiters(dict[str, Limiter]):
    """An App's named limiters by name (``app.limiters``), declared with ``app.limiter``;
    ``set`` changes one at run time, ``state`` reads one."""

    def __init__(self, app: App) -> None:
        super().__init__()
        self.app = app

    def declare(
        self,
        name: str,
        rate: tuple[int, float] | None,
        burst: int,
        concurrency: int | None,
        key: Callable[..., object] | None,
    ) -> Limiter:
        """``app.limiter``: see there."""
        if name in self:
            raise ConfigurationError(f"a limiter named {name!r} is already declared")
        lim = self[name] = make_limiter(name, rate, burst, concurrency, key)
        return lim

    async def set(
        self,
        name: str,
        *,
        rate: tuple[int, float] | None = None,
        burst: int | None = None,
        concurrency: int | None = None,
        reset: bool = False,
        queue: str | None = None,
    ) -> None:
        """Change a limiter at run time, for every worker (the settings given win over the
        declared ones until ``reset=True``); on a Cluster, for the limiters in ``queue``'s
        slot."""
        app = self.app
        declared(app, name)
        check_settings(rate, burst, concurrency)
        cfg = limiter_settings(limiter_base(app, queue or app.default_queue), name)
        if reset:
            await app.redis.delete(cfg)
        fields: dict[str | bytes, str | int] = {}
        if rate is not None:
            fields |= {"n": rate[0], "ms": round(rate[1] * 1000)}
        if burst is not None:
            fields["burst"] = burst
        if concurrency is not None:
            fields["conc"] = concurrency
        if fields:
            await app.redis.hset(cfg, mapping=fields)  # type: ignore[arg-type]
        await look_again(app, state_key(app, name, "", queue)[:-1], queue)

    async def state(self, name: str, key: object = "", *, queue: str | None = None) -> LimiterState:
        """What limit ``name`` (its key ``key``) holds now: see ``LimiterState``. A pure read:
        the limiter need not be declared in this App (``why``, the dashboard)."""
        app = self.app
        queue = queue or app.default_queue
        k = key_text(key)
        cfg = limiter_settings(limiter_base(app, queue), name)
        st = state_key(app, name, k, queue)
        pipe = app.redis.pipeline(transaction=False)
        server_time(pipe, app.redis, st)
        pipe.hmget(st, "tat", "T", "tau")
        pipe.hlen(st + ":h")
        pipe.llen(QueueKeys(app.prefix, queue).limit_waiting(st))
        pipe.hgetall(cfg)
        (sec, usec), (tat, T, tau), holders, waiting, over = await pipe.execute()
        now = int(sec) * 1000 + int(usec) // 1000
        return state_of(name, k, now, tat, T, tau, holders, waiting, over)


async def look_again(app: App, states: str, queue: str | None) -> None:
    """After a change of settings: the jobs of every real queue (on a Cluster: of ``queue``)
    waiting on a state key that starts with ``states`` are looked at again now."""
    names = {queue or app.default_queue}
    if not is_cluster(app.redis):
        # the queues declared here and the registry's (at most 1000: I13)
        names |= {t.queue for t in app.tasks.values()} | {app.default_queue}
        seen = await app.redis.zrange(queues_registry(app.prefix), 0, 999)
        names.update(n.decode(errors="replace") for n in cast("list[bytes]", seen))
    for name in names:
        keys = QueueKeys(app.prefix, name)
        lwait = keys.lwait
        waiting = cast("list[bytes]", await app.redis.zrange(lwait, 0, 999))
        mine = {m: 0 for m in waiting if m.startswith(states.encode())}
        if mine:
            await app.redis.zadd(lwait, mine, xx=True)
            await app.redis.lpush(keys.wake, b"1")


def state_of(
    name: str,
    key: str,
    now: int,
    tat: bytes | None,
    T: bytes | None,
    tau: bytes | None,
    holders: int,
    waiting: int,
    over: Mapping[bytes, bytes],
) -> LimiterState:
    """A ``LimiterState`` from what was read (anything unreadable counts as unknown)."""
    try:
        t, step, tol = float(tat or b"nan"), float(T or b"nan"), float(tau or b"0")
    except ValueError:
        t = step = tol = math.nan
    overrides = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in over.items()}
    if math.isnan(t) or math.isnan(step) or step <= 0:
        return LimiterState(name, key, now, None, None, now, holders, waiting, overrides)
    base = max(t, now)
    tokens = max(0, math.floor((now + tol - base) / step) + 1)
    nxt = now if tokens > 0 else math.ceil(base - tol)
    return LimiterState(name, key, now, t, tokens, nxt, holders, waiting, overrides)
