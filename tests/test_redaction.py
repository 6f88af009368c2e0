"""I13, secrets: no password of a Redis URL reaches an exception (its text, its repr, its
causes), a log record or the CLI's output, whatever the URL's form (``_safetext.redact_url``)."""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import App
from aioqueue._model.safetext import HIDDEN, redact_url
from aioqueue.testing import unique_prefix

from .support.ports import free_port
from .support.prewarmed import run_aioqueue

# a base64-like password: "/" and "+" and "=" in it, each piece long enough to be spotted
SECRET = "Zq9x/Wv7+Kp3n="
PIECES = [SECRET, "Zq9x", "Wv7+Kp3n", "Wv7%2BKp3n", "Zq9x%2FWv7"]
PORT = free_port()  # nothing listens there
H = f"127.0.0.1:{PORT}"

#: the URL forms; each holds SECRET (or a piece of it) where a password goes
URLS = {
    "port out of range": f"redis://u:{SECRET}@127.0.0.1:99999/0",
    "query password": f"redis://{H}/0?password={SECRET}",
    "cluster URL with a db": f"redis+cluster://u:{SECRET}@{H}/3",
    "sentinel password with /": f"redis+sentinel://u:{SECRET}@{H}/svc",
    "sentinel's own password": f"redis+sentinel://{H}/svc?sentinel_password={SECRET}",
    "base64 password with /": f"redis://u:{SECRET}@{H}/0",
    "no username": f"redis://:{SECRET}@{H}/0",
    "TLS": f"rediss://u:{SECRET}@{H}/0",
    "unix socket": f"unix://u:{SECRET}@/nonexistent/aioqueue.sock?db=0",
    "a db that is no number": f"redis://u:{SECRET}@{H}/notadb",
    "cluster unreachable": f"redis+cluster://u:{SECRET}@{H}",
    "percent-encoded": "redis://u:Zq9x%2FWv7%2BKp3n%3D@" + H + "/0",
    "bad scheme": f"http://u:{SECRET}@{H}/0",
}


def leaks(text: str) -> list[str]:
    return [piece for piece in PIECES if piece in text]


def chain_text(exc: BaseException) -> str:
    """Everything an exception shows: its traceback with every cause, and each repr."""
    parts = traceback.format_exception(exc)
    seen: BaseException | None = exc
    while seen is not None:
        parts.append(repr(seen))
        parts.append(repr(seen.args))
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


@pytest.mark.parametrize("url", URLS.values(), ids=list(URLS))
def test_redact_url_hides_every_password(url: str) -> None:
    shown = redact_url(url)
    assert not leaks(shown), shown
    if "@" in url:
        assert HIDDEN in shown or "u@" in shown


def test_redact_url_keeps_the_rest() -> None:
    assert (
        redact_url("redis://u:p@h:1/2?db=2&password=x") == "redis://u:***@h:1/2?db=2&password=***"
    )
    assert redact_url("redis://h:1/0") == "redis://h:1/0"
    assert redact_url("redis://u@h:1/0") == "redis://u@h:1/0"
    assert (
        redact_url("redis+sentinel://u:a/b@h1:1,h2:2/svc?sentinel_password=c/d")
        == "redis+sentinel://u:***@h1:1,h2:2/svc?sentinel_password=***"
    )


async def _open_and_close(url: str) -> None:
    app = App(url, socket_timeout=2, redis_options={"socket_connect_timeout": 1})
    try:
        await app.open()
    finally:
        await app.aclose()


@pytest.mark.parametrize("url", URLS.values(), ids=list(URLS))
async def test_no_exception_or_log_record_shows_the_password(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(Exception) as info:  # noqa: PT011 - any error: the text is the point
        await _open_and_close(url)
    text = chain_text(info.value)
    assert not leaks(text), text
    records = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert not leaks(records), records


@pytest.mark.parametrize("url", URLS.values(), ids=list(URLS))
def test_the_cli_never_prints_the_password(url: str) -> None:
    proc = run_aioqueue(
        ["info", "--url", url],
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert proc.returncode != 0
    assert proc.stderr.startswith("aioqueue: error:"), proc.stderr
    assert not leaks(proc.stdout + proc.stderr), proc.stderr


async def test_a_password_holding_slashes_connects(redis: Redis, aioqueue_url: str) -> None:
    """A base64 password with "/" works as written in the URL (it used to end the host)."""
    user = f"u{os.getpid()}"
    await redis.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", user, "on", f">{SECRET}", "~*", "&*", "+@all"
    )
    try:
        host = aioqueue_url.partition("://")[2].partition("/")[0]
        async with App(f"redis://{user}:{SECRET}@{host}/0", prefix=unique_prefix()) as app:
            job = await app.queue().enqueue("noop")
            assert (await job.info()).state.value == "queued"
    finally:
        await redis.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
