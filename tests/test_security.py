"""Security: no pickle unless asked for, TLS, a least-privilege ACL user, HMAC-signed payloads,
and key prefixes that keep two apps on one server apart.

TLS runs through ``stunnel4`` in front of an embedded server (the embedded ``valkey-server``
is built without TLS), with a self-signed certificate made by the ``openssl`` CLI; without
them the TLS tests skip, and CI installs them with ``.ci/install-tls.sh``.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import pickle
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.exceptions as rexc
from redis.asyncio import Redis

from aioqueue import (
    App,
    Backoff,
    ConfigurationError,
    EmbeddedServer,
    SerializationError,
    ServerUnavailable,
    Worker,
)
from aioqueue._model.keys import QueueKeys

from .support.apps import unique_prefix
from .support.invariants import check_invariants
from .support.ports import PortTaken, on_a_free_port
from .support.waiting import wait_until

KEY = "k" * 16 + "-current-signing-key"
OLD_KEY = "o" * 16 + "-previous-signing-key"
OTHER_KEY = "x" * 16 + "-someone-elses-key"

#: the commands an aioqueue user needs, found by trial: an ACL user starting from -@all,
#: adding each command the server refused (ACL LOG, which names the command and whether a
#: script ran it), until producers, workers, results awaited by pub/sub, batches across two
#: queues, rate limits, cancellation, result_ttl=0 and the pull API ran with no denial; a
#: script's commands are checked against its caller's rights. See docs/security.md.
ACL_COMMANDS = (
    # on the connection: redis-py's handshake (client|setname only with a client_name)
    "ping",
    "client|setinfo",
    "client|setname",
    # called by aioqueue directly (the scripts are a function library; on a server without
    # functions, Redis 6.2, evalsha and script|load instead)
    "fcall",
    "function|load",
    "blpop",
    "blmpop",
    "lpush",
    "lrange",
    "lrem",
    "lpos",
    "hgetall",
    "hkeys",
    "subscribe",
    # called by the scripts (some also directly: llen, zcard, zrange, hmget, hset)
    "time",
    "exists",
    "del",
    "get",
    "set",
    "incr",
    "incrby",
    "hget",
    "hmget",
    "hset",
    "hsetnx",
    "hdel",
    "hexists",
    "hlen",
    "hincrby",
    "llen",
    "lpop",
    "rpush",
    "zadd",
    "zrem",
    "zcard",
    "zscore",
    "zrange",
    "zpopmin",
    "zrangebyscore",
    "zremrangebyscore",
    # the registry of real queues (<prefix>:queues), trimmed by each worker
    "zremrangebyrank",
    "sadd",
    # the worker registry: a worker's set of held jobs (and Queue.workers() counts it)
    "srem",
    "spop",
    "scard",
    # reap's look at waiting jobs (lib/deps: DQ.sweep)
    "zrandmember",
    "srandmember",
    "pexpire",
    "publish",
    # finishing scripts announce sharded first (SPUBLISH, for a cluster's waiters)
    "spublish",
)


def _app(url: str, prefix: str, **options: Any) -> App:
    options.setdefault("lease", 2.0)
    options.setdefault("max_attempts", 2)
    options.setdefault("backoff", Backoff(base=0.01, factor=1.0, max=0.01, jitter=0.0))
    app = App(url, prefix=prefix, **options)

    @app.task
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task
    async def sub(a: int, b: int) -> int:
        return a - b

    return app


async def finished(redis: Redis, keys: QueueKeys, job_id: str, timeout: float = 10.0) -> str:
    """Wait until the job has finished: ``completed`` or ``failed:<reason type>``."""
    seen: list[Any] = [None, None]

    async def done() -> bool:
        seen[:] = await redis.hmget(keys.job(job_id), ["s", "e"])
        return seen[0] in (b"completed", b"failed", b"cancelled")

    await wait_until(done, timeout=timeout, what=f"job {job_id} to finish: {seen}")
    if seen[0] == b"completed":
        return "completed"
    return f"{seen[0].decode()}:{json.loads(seen[1])['type']}"


@contextlib.asynccontextmanager
async def worker_of(app: App) -> AsyncIterator[Worker]:
    async with app, Worker(app, concurrency=4, idle_block=0.1, grace=1) as worker:
        yield worker


# ---------------------------------------------------------------------- pickle
class Touch:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def evil_payload(marker: Path) -> bytes:
    return pickle.dumps([[Touch(marker)], {}], protocol=pickle.HIGHEST_PROTOCOL)


def test_the_evil_payload_is_live(tmp_path: Path) -> None:
    """The control: unpickling the payload the next tests plant really creates its file."""
    marker = tmp_path / "control"
    pickle.loads(evil_payload(marker))
    assert marker.exists()


async def test_json_is_the_default_and_refuses_arbitrary_objects(
    redis_url: str, redis: Redis, tmp_path: Path
) -> None:
    app = _app(redis_url, unique_prefix())
    assert app.serializer.name == "json"
    async with app:
        for value in (object(), Touch(tmp_path / "x"), {1, 2}, b"bytes"):
            with pytest.raises(SerializationError):
                await app.queue().enqueue("add", args=[value, 1])
        assert not [k async for k in redis.scan_iter(match=app.prefix + ":*", count=1000)]


async def test_a_json_worker_never_unpickles_a_planted_pickle(
    redis_url: str, redis: Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    app = _app(redis_url, unique_prefix())
    async with worker_of(app):
        q = app.queue()
        await q.pause()
        job = await q.enqueue("add", [1, 2])
        await redis.hset(q._keys.job(job.id), "p", evil_payload(marker))
        await q.resume()
        assert await finished(redis, q._keys, job.id) == "failed:CorruptPayload"
        await job.info()  # reading the record decodes the payload too
        assert not await q.reserve(1)  # and the pull API
        assert await (await q.enqueue("add", [2, 2])).result(timeout=5) == 4
    assert not marker.exists(), "the planted pickle ran"


async def test_a_signing_pickle_app_refuses_a_forged_pickle_before_unpickling(
    redis_url: str, redis: Redis, tmp_path: Path
) -> None:
    """Whoever must use pickle should sign: a forged payload is refused unread."""
    marker = tmp_path / "pwned"
    app = _app(redis_url, unique_prefix(), serializer="pickle", signing_key=KEY)
    async with worker_of(app):
        q = app.queue()
        assert await (await q.enqueue("add", [1, 2])).result(timeout=5) == 3
        await q.pause()
        job = await q.enqueue("add", [1, 2])
        await redis.hset(q._keys.job(job.id), "p", evil_payload(marker))
        await q.resume()
        assert await finished(redis, q._keys, job.id) == "failed:BadSignature"
    assert not marker.exists(), "the forged pickle ran"


# ---------------------------------------------------------------------- HMAC signing
async def test_signed_jobs_run_and_tampered_ones_are_dead_lettered(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    worker_app = _app(redis_url, prefix, signing_key=KEY)
    unsigned = _app(redis_url, prefix)
    foreign = _app(redis_url, prefix, signing_key=OTHER_KEY)
    async with worker_of(worker_app), unsigned, foreign:
        q = worker_app.queue()
        keys = q._keys
        await q.pause()
        good = await q.enqueue("add", [1, 2])
        tampered = await q.enqueue("add", [1, 2])
        raw = await redis.hget(keys.job(tampered.id), "p")
        assert isinstance(raw, bytes)
        assert raw.endswith(b"[[1,2],{}]")
        await redis.hset(keys.job(tampered.id), "p", raw.replace(b"[[1,2]", b"[[7,2]"))
        moved = await q.enqueue("add", [5, 5])  # gets another job's (valid) signed payload
        await redis.hset(keys.job(moved.id), "p", raw)
        renamed = await q.enqueue("add", [9, 1])  # same arguments, another task
        await redis.hset(keys.job(renamed.id), "t", "sub")
        no_signature = await unsigned.queue().enqueue("add", [1, 2])
        wrong_key = await foreign.queue().enqueue("add", [1, 2])
        await q.resume()
        assert await good.result(timeout=10) == 3
        for job in (tampered, moved, renamed, no_signature, wrong_key):
            assert await finished(redis, keys, job.id) == "failed:BadSignature", job
        info = await no_signature.info()
        assert info.error is not None
        assert "not signed" in info.error.message
        info = await wrong_key.info()
        assert info.error is not None
        assert "does not match" in info.error.message
        assert await (await q.enqueue("add", [2, 2])).result(timeout=5) == 4  # still running
        await check_invariants(redis, keys)


async def test_key_rotation_accepts_old_signatures_only_while_listed(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    # rotation's first step: the old key still signs, the new one is accepted already (so
    # this producer can verify the results that workers sign with the new key)
    old_producer = _app(redis_url, prefix, signing_key=OLD_KEY, verify_keys=[KEY])
    new_producer = _app(redis_url, prefix, signing_key=KEY)
    rotating = _app(redis_url, prefix, signing_key=KEY, verify_keys=[OLD_KEY])
    async with old_producer, new_producer:
        q = old_producer.queue()
        old_jobs = [await q.enqueue("add", [i, 1]) for i in range(3)]
        new_jobs = [await new_producer.queue().enqueue("add", [i, 2]) for i in range(3)]
        async with worker_of(rotating):
            assert [await j.result(timeout=10) for j in old_jobs] == [1, 2, 3]
            assert [await j.result(timeout=10) for j in new_jobs] == [2, 3, 4]
        # once the old key is dropped, what it signed is refused
        late = await q.enqueue("add", [1, 1])
        async with worker_of(_app(redis_url, prefix, signing_key=KEY)):
            keys = old_producer.queue()._keys
            assert await finished(redis, keys, late.id) == "failed:BadSignature"


async def test_the_pull_api_dead_letters_a_tampered_job_instead_of_returning_it(
    redis_url: str, redis: Redis
) -> None:
    app = _app(redis_url, unique_prefix(), signing_key=KEY)
    async with app:
        q = app.queue()
        bad = await q.enqueue("add", [1, 2])
        good = await q.enqueue("add", [3, 4])
        raw = await redis.hget(q._keys.job(bad.id), "p")
        assert isinstance(raw, bytes)
        await redis.hset(q._keys.job(bad.id), "p", raw[:-3] + b"9}]")
        got = await q.reserve(2)
        assert [(r.id, r.args) for r in got] == [(good.id, (3, 4))]
        assert await finished(redis, q._keys, bad.id) == "failed:BadSignature"


# ---------------------------------------------------------------------- key prefixes
async def test_two_apps_with_one_queue_name_on_one_server_stay_apart(
    redis_url: str, redis: Redis
) -> None:
    ran: dict[str, list[str]] = {"a": [], "b": []}
    apps = {}
    for name in ("a", "b"):
        app = App(redis_url, prefix=unique_prefix(), queue="shared")

        @app.task(name="work")
        async def work(i: int, who: str = name) -> str:
            ran[who].append(f"{i}")
            return who

        apps[name] = app
    a, b = apps["a"], apps["b"]
    async with a, b:
        a_jobs = [await a.queue().enqueue("work", [i], job_id=f"same-{i}") for i in range(10)]
        b_jobs = [await b.queue().enqueue("work", [i], job_id=f"same-{i}") for i in range(10)]
        assert (await b.queue().stats())["enqueued"] == 10  # the same ids: separate jobs
        async with Worker(a, concurrency=4, idle_block=0.1):
            assert {await j.result(timeout=10) for j in a_jobs} == {"a"}
        assert ran == {"a": [str(i) for i in range(10)], "b": []}
        assert (await b.queue().counts())["queued"] == 10  # untouched by a's worker
        async with Worker(b, concurrency=4, idle_block=0.1):
            assert {await j.result(timeout=10) for j in b_jobs} == {"b"}
        assert sorted(ran["b"], key=int) == [str(i) for i in range(10)]
        for app in (a, b):
            other = b if app is a else a
            keys = [k async for k in redis.scan_iter(match=app.prefix + ":*", count=1000)]
            assert keys
            assert not any(k.startswith(other.prefix.encode()) for k in keys)


# ---------------------------------------------------------------------- ACL
@pytest.fixture(scope="module")
def acl_server() -> Iterator[EmbeddedServer]:
    """A private server: the test creates ACL users on it."""
    with EmbeddedServer(appendonly=False) as server:
        yield server


@contextlib.asynccontextmanager
async def admin_of(server: EmbeddedServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(server.url)
    try:
        yield client
    finally:
        await client.aclose()


async def make_user(
    admin: Redis, server: EmbeddedServer, user: str, prefix: str, commands: tuple[str, ...]
) -> str:
    """An ACL user limited to ``prefix``'s keys and channels and ``commands``; its URL."""
    rules = ["reset", "on", f">{user}-pw", f"~{prefix}:*", f"&{prefix}:*", "-@all"]
    rules += [f"+{c}" for c in commands]
    await admin.execute_command("ACL", "SETUSER", user, *rules)  # type: ignore[no-untyped-call]
    return f"redis://{user}:{user}-pw@127.0.0.1:{server.port}/0"


async def denials(admin: Redis) -> list[str]:
    """What the ACL log recorded: ``reason object (context)``."""
    out = []
    for entry in await admin.execute_command("ACL", "LOG", "128"):  # type: ignore[no-untyped-call]
        pairs = (
            entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=True))
        )
        d = {_s(k): _s(v) for k, v in pairs.items()}
        out.append(f"{d['reason']} {d['object']} ({d['context']})")
    return out


async def _gone(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def test_a_least_privilege_acl_user_runs_producers_workers_and_the_pull_api(
    acl_server: EmbeddedServer,
) -> None:
    async with admin_of(acl_server) as admin:
        prefix = unique_prefix()
        url = await make_user(admin, acl_server, "aq-app", prefix, ACL_COMMANDS)
        await admin.execute_command("ACL", "LOG", "RESET")  # type: ignore[no-untyped-call]
        app = _app(url, prefix, lease=1.0, redis_options={"client_name": "aq-app"})

        @app.task(max_attempts=1)
        async def boom() -> None:
            raise ValueError("boom")

        async with app, Worker(app, queues=["default", "other"], concurrency=4, idle_block=0.1):
            add = app.tasks["add"]
            job = await add.enqueue(1, 2)
            assert await job.result(timeout=10) == 3  # pub/sub result waiting as that user
            later = await add.options(delay=0.1, priority=5, group="tenant").enqueue(2, 3)
            many = await add.enqueue_many([{"a": i, "b": 1} for i in range(10)])
            # a batch whose sub-jobs live on two queues (outcomes handed over by the outbox)
            calls = [add.call(1, 1), add.options(queue="other").call(2, 2)]
            batch = await app.batch(calls, on_complete=add.call(0, 0))
            assert await later.result(timeout=10) == 5
            assert [await j.result(timeout=10) for j in many] == list(range(1, 11))
            assert (await batch.wait(timeout=10)).done == 2
            failed = await boom.enqueue()
            with pytest.raises(Exception, match="boom"):
                await failed.result(timeout=10)
            dropped = await add.options(result_ttl=0).enqueue(5, 5)  # record deleted at once
            await app.queue().set_rate_limit(1000, 1.0)  # claims now count in a rate window
            assert await (await add.enqueue(6, 6)).result(timeout=10) == 12
            await wait_until(lambda: _gone(admin, app.queue()._keys.job(dropped.id)))
        q = app.queue()
        async with App(url, prefix=prefix) as puller:
            pq = puller.queue()
            for i in range(3):
                await pq.enqueue("add", [i, i], job_id=f"p{i}")
            r1, r2, r3 = await pq.reserve(3, lease=5)
            await pq.extend(r1, lease=5)
            await pq.complete(r1, 0)
            assert await pq.fail(r2, "no", retry=False) is False
            await pq.release(r3)
            await pq.reap()
            assert (await pq.counts())["failed"] >= 2
            await pq.pause()
            await pq.resume()
            assert await pq.cancel_jobs(["p2"]) == 1  # a queued job: out of the ready list
            assert (await pq.job_info("p0")).state == "completed"
            assert (await pq.stats())["enqueued"] >= 17
        assert await denials(admin) == []
        await check_invariants(admin, q._keys)
        # and the user really is limited: other keys and admin commands are refused
        async with Redis.from_url(url) as limited:
            with pytest.raises(rexc.NoPermissionError):
                await limited.get("some-other-key")
            with pytest.raises(rexc.NoPermissionError):
                await limited.flushall()
            with pytest.raises(rexc.NoPermissionError):
                await limited.keys("*")


async def test_an_app_under_another_acl_user_cannot_touch_the_first_apps_keys(
    acl_server: EmbeddedServer,
) -> None:
    async with admin_of(acl_server) as admin:
        pa, pb = unique_prefix(), unique_prefix()
        url_a = await make_user(admin, acl_server, "tenant-a", pa, ACL_COMMANDS)
        url_b = await make_user(admin, acl_server, "tenant-b", pb, ACL_COMMANDS)
        async with _app(url_a, pa) as a, _app(url_b, pb) as b:
            job = await a.queue().enqueue("add", [1, 2], job_id="secret")
            assert await b.queue().enqueue("add", [3, 4])  # its own prefix: fine
            keys = a.queue()._keys
            async with Redis.from_url(url_b) as raw_b:
                with pytest.raises(rexc.NoPermissionError):
                    await raw_b.hgetall(keys.job("secret"))
                with pytest.raises(rexc.NoPermissionError):
                    await raw_b.lrange(keys.ready, 0, -1)
            # b's App pointed at a's prefix is refused at open (it may not run scripts on
            # those keys)
            with pytest.raises(ConfigurationError, match="No permissions to access a key"):
                await App(url_b, prefix=pa).open()
            assert await a.queue().counts() == {
                "scheduled": 0,
                "queued": 1,
                "active": 0,
                "failed": 0,
            }
            assert (await a.queue().reserve(1))[0].id == job.id


# ---------------------------------------------------------------------- TLS
@dataclass(frozen=True, slots=True)
class TlsEndpoint:
    url: str  # rediss://127.0.0.1:PORT/0
    ca: Path  # the self-signed certificate, usable as its own CA
    server: EmbeddedServer


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsEndpoint]:
    """stunnel terminating TLS in front of a private embedded server."""
    stunnel = shutil.which("stunnel4") or shutil.which("stunnel")
    openssl = shutil.which("openssl")
    if stunnel is None or openssl is None:
        pytest.skip(
            "TLS tests need stunnel4 and openssl (apt-get install stunnel4 openssl; "
            "CI runs .ci/install-tls.sh)"
        )
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with EmbeddedServer(appendonly=False) as server:
        proc, port = _start_stunnel(stunnel, d, cert, key, server.port)
        try:
            yield TlsEndpoint(f"rediss://127.0.0.1:{port}/0", cert, server)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _start_stunnel(
    stunnel: str, d: Path, cert: Path, key: Path, backend: int
) -> tuple[subprocess.Popen[bytes], int]:
    """stunnel terminating TLS on a free port in front of ``backend``, and that port; on a
    new port when the one picked was taken before stunnel bound it (it exits, saying so).
    Up once its log says its configuration (the bind) is done and the port answers."""
    tries = 0

    def start(port: int) -> tuple[subprocess.Popen[bytes], int]:
        nonlocal tries
        tries += 1
        log = d / f"stunnel-{tries}.log"
        conf = d / "stunnel.conf"
        conf.write_text(
            "foreground = yes\npid =\n"
            f"output = {log}\n"
            "[redis]\n"
            f"accept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{backend}\n"
            f"cert = {cert}\nkey = {key}\n"
        )
        errors = d / f"stunnel-{tries}.err"
        with errors.open("wb") as err_out:  # (stunnel keeps its own copy of the file)
            proc = subprocess.Popen(
                [stunnel, str(conf)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err_out,
            )
        deadline = time.monotonic() + 15
        while proc.poll() is None and time.monotonic() < deadline:
            bound = log.exists() and "Configuration successful" in log.read_text()
            if bound:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), timeout=0.5),
                ):
                    return proc, port
            time.sleep(0.05)
        if proc.poll() is None:  # silent for 15 s: not a taken port
            proc.kill()
            proc.wait(10)
            pytest.fail(f"stunnel did not start within 15 s:\n{_read(log)}")
        err = _read(errors)
        if "Address already in use" in err:
            raise PortTaken(port)
        pytest.fail(f"stunnel did not start (exit {proc.returncode}):\n{err}{_read(log)}")

    return on_a_free_port(start)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def _round_trip_over(app: App) -> None:
    """Enqueue, a worker, a result by pub/sub, and the pull API, all over ``app``."""
    async with worker_of(app):
        job = await app.tasks["add"].enqueue(20, 22)
        assert await job.result(timeout=10) == 42
    async with App(app.url, prefix=app.prefix, redis_options=app.redis_options) as puller:
        q = puller.queue()
        await q.enqueue("add", [1, 1], job_id="pull")
        [r] = await q.reserve(1)
        await q.extend(r)
        await q.complete(r, 2)
        assert (await q.job_info("pull")).state == "completed"


async def test_tls_without_certificate_verification(tls: TlsEndpoint) -> None:
    app = _app(tls.url + "?ssl_cert_reqs=none", unique_prefix())
    await _round_trip_over(app)
    async with Redis.from_url(tls.server.url) as plain:  # it all went through the tunnel
        assert await plain.exists(f"{app.prefix}:{{default}}:stats")


async def test_tls_with_a_verified_certificate(tls: TlsEndpoint) -> None:
    app = _app(tls.url, unique_prefix(), redis_options={"ssl_ca_certs": str(tls.ca)})
    await _round_trip_over(app)


async def test_tls_refuses_a_certificate_it_cannot_verify(tls: TlsEndpoint) -> None:
    with pytest.raises(ServerUnavailable, match=r"(?i)certificate|ssl"):
        async with App(tls.url, prefix=unique_prefix(), socket_timeout=5):
            pass


async def test_a_plain_connection_to_the_tls_port_fails_with_a_clear_error(
    tls: TlsEndpoint,
) -> None:
    plain_url = tls.url.replace("rediss://", "redis://")
    t0 = time.monotonic()
    with pytest.raises(ServerUnavailable):
        async with App(plain_url, prefix=unique_prefix(), socket_timeout=3):
            pass
    assert time.monotonic() - t0 < 30
